"""The shipper in a process of its own, beside the recorder and its log writer, so that a
broker that is slow or down costs the traffic nothing, not even the GIL.

The recorder starts it once the log exists and stops it by closing its stdin (so does
dying: the pipe closes either way). It then ships what was committed for at most ``drain``
seconds more, and exits; rows still waiting stay in the log, and go out the next time the
log is shipped. It says what it waits for on stderr, as the recorder's own lines. Should it
stop before it is told to (it failed, or was killed), the recorder says so at once, and
again when it stops, with the rows left waiting.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import IO, Any

from tasktape.errors import UsageError
from tasktape.eventlog.interpreter import child_python

from .hints import HintReader
from .names import STREAM
from .shipper import Shipper

_CHILD_MAIN = "import sys; from tasktape.fleet.ship_process import main; main(sys.argv[1])"


class ShipperProcess:
    """Ships the log at ``path`` to ``servers`` from a child process until ``close()``;
    ``hints_fd`` is the read end of the pipe its log writer sends hints to (``hints``)."""

    def __init__(
        self,
        path: str | Path,
        servers: list[str],
        *,
        stream: str = STREAM,
        drain: float = 10.0,
        prefix: str = "",
        hints_fd: int | None = None,
    ) -> None:
        self.drain = drain
        settings = {
            **{"path": str(path), "servers": servers, "stream": stream},
            **{"drain": drain, "prefix": prefix, "hints_fd": hints_fd},
        }
        self._path, self._servers, self._stream, self._prefix = Path(path), servers, stream, prefix
        python, env = child_python()
        self._process = subprocess.Popen(
            [*python, "-c", _CHILD_MAIN, json.dumps(settings)],
            stdin=subprocess.PIPE,
            env=env,
            pass_fds=[hints_fd] if hints_fd is not None else [],
        )
        self._closing = False
        threading.Thread(target=self._watch, name="tasktape:shipper-watch", daemon=True).start()

    def _watch(self) -> None:
        """Say at once when the child stops before it was told to: nothing ships after that,
        and the recorder would otherwise record on as if all went out."""
        code = self._process.wait()
        if not self._closing:
            self._say(
                f"WARNING: shipping stopped: the shipper {_ended(code)}; every row recorded from now "
                "on waits in the log for its next shipping"
            )

    def close(self) -> int:
        """Stop shipping (after the drain); the child's exit status: 0 when every row
        committed before was shipped, 1 when some wait in the log (the child says how many).
        Any other, it failed (or was killed): said here, with the rows left waiting."""
        self._closing = True
        stdin: IO[bytes] | None = self._process.stdin
        if stdin is not None:
            stdin.close()
        try:
            code = self._process.wait(timeout=self.drain + 15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        if code not in (0, 1):
            self._say(
                f"WARNING: shipping failed (the shipper {_ended(code)}): {self._waiting():,} rows "
                "wait in the log for its next shipping"
            )
        return code

    def _say(self, line: str) -> None:
        print(f"{self._prefix}{line}", file=sys.stderr, flush=True)

    def _waiting(self) -> int:
        """Rows committed to the log and not shipped, as far as the cursor the child last saved says."""
        shipper = Shipper(self._path, self._servers, stream=self._stream)
        try:
            return shipper.waiting()
        finally:
            shipper.close()


def _ended(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"


def main(settings_json: str) -> None:
    settings: dict[str, Any] = json.loads(settings_json)
    # A signal to the recorder's whole process group (a terminal's Ctrl-C, timeout, systemd)
    # is the recorder's to act on: it closes the pipe once its writer has committed.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    prefix = settings["prefix"]

    def say(line: str) -> None:
        print(f"{prefix}{line}", file=sys.stderr, flush=True)

    async def ship() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wait_for_eof() -> None:
            sys.stdin.buffer.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_eof, daemon=True).start()
        fd = settings["hints_fd"]
        hints = HintReader(fd) if fd is not None else None
        shipper = Shipper(
            settings["path"], settings["servers"], stream=settings["stream"], on_status=say, hints=hints
        )
        try:
            stats = await shipper.run(stop, drain=settings["drain"])
        except UsageError as exc:  # the broker will not take the stream: nothing can be shipped
            say(f"WARNING: shipping stopped: {exc}; rows wait in the log for its next shipping")
            return 2
        finally:
            shipper.close()
            if hints is not None:
                hints.close()
        if stats.waiting:
            say(f"shipping: {stats.waiting:,} rows not shipped; they wait in the log for its next shipping")
            return 1
        return 0

    try:
        code = asyncio.run(ship())
    except Exception:  # a failure nothing above expects: said, and the recorder says what it means
        traceback.print_exc()
        code = 3
    sys.stderr.flush()
    # Not sys.exit: a thread may still be reading stdin (when shipping stopped on its own),
    # and finalizing the interpreter under it aborts the process. Everything is closed.
    os._exit(code)
