"""A log writer in a child process, for recorders that must not share their CPU (and
GIL) with decoding, classifying and SQLite.

The producer API is the same as ``LogWriter``'s. A feeder thread sends queued operations
to the child in batches over a pipe; the child runs a ``LogWriter`` on them and answers
with exchange summaries, flush acknowledgements and failure reports, which a reader
thread hands back. If the recorder is killed, the child sees the pipe close, commits
everything it received, and exits.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import pickle
import queue
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tasktape.errors import LogError

from .interpreter import child_python
from .producer import BODY, CHUNK, END, EXCHANGE, FLUSH, HEAD, STOP, LogProducer, check_options

_BATCH = 4096  # operations per message at most
_GATHER = 0.002  # seconds: how long operations gather before they are sent, at first
# At most this long, which bounds what a recorder killed outright can lose (the child
# keeps everything sent to it).
_MAX_GATHER = 0.016
_STARTUP_TIMEOUT = 60.0
# The operations of one exchange, whose second element is its id.
_OF_EXCHANGE = frozenset({EXCHANGE, HEAD, BODY, CHUNK, END})
# What a dead writer process loses, as said when it is found dead.
_GONE = (
    "what it had not yet written is lost, and so is every row from now on (counted when the log is closed)"
)
# Ctrl-C, timeout(1) and systemd signal the whole process group: the recorder decides when
# to stop, and the child commits what it was sent once the recorder is done. The child starts
# with these blocked (Python would turn a SIGINT into a KeyboardInterrupt traceback in the
# middle of its start-up) and ignores them before it does anything else.
_GROUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The child runs tasktape's writer and nothing else. sqlite-utils imports numpy and pandas
# when they are installed, only to convert their values on insert, which the writer never
# has: without them the child starts with 12 MiB less (numpy alone) and no BLAS threads.
_CHILD_MAIN = (
    f"import signal; s = ({', '.join(f'signal.{sig.name}' for sig in _GROUP_SIGNALS)}); "
    "[signal.signal(n, signal.SIG_IGN) for n in s]; signal.pthread_sigmask(signal.SIG_UNBLOCK, s); "
    "import sys; sys.modules.update(numpy=None, pandas=None); "
    "from tasktape.eventlog.child_writer import main; main(int(sys.argv[1]))"
)


class ProcessLogWriter(LogProducer):
    """Like :class:`LogWriter` (same methods, same keyword options), but the writing
    happens in a child process."""

    def __init__(
        self,
        path: str | Path,
        *,
        on_error: Callable[[BaseException, int], None] | None = None,
        max_backlog: int = 256 * 1024 * 1024,
        **options: Any,
    ) -> None:
        # Here, before the child starts: the parent needs the tap's fds.
        check_options(options.get("redactor"), options.get("tap"))
        super().__init__(path, on_error, max_backlog)
        ours, theirs = socket.socketpair()
        # A plain child process (not multiprocessing's spawn, which re-imports the
        # caller's main module): it gets one end of the socket pair, then its settings.
        python, env = child_python()
        tap = options.get("tap")  # it travels to the child, where the writer opens it
        # (One that comes meanwhile reaches this process once they are unblocked again.)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
        try:
            self._process = subprocess.Popen(
                [*python, "-c", _CHILD_MAIN, str(theirs.fileno())],
                pass_fds=[theirs.fileno(), *(tap.fds if tap is not None else ())],
                env=env,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._name = f"tasktape-writer:{self.path.name}"
        try:
            self._conn.send((str(self.path), {**options, "max_backlog": max_backlog}))
            if not self._conn.poll(_STARTUP_TIMEOUT):
                raise LogError(f"{self.path}: the log writer process did not start")
            reply = self._conn.recv()
        except (OSError, EOFError, LogError) as exc:
            self._process.kill()
            self._process.wait()
            self._conn.close()
            raise LogError(f"{self.path}: the log writer process failed to start ({exc})") from None
        except BaseException:  # interrupted (Ctrl-C) while it started
            self._conn.close()  # (the child, its pipe closed, closes the log and exits)
            self._release_log()
            raise
        if reply[0] == "failed":  # (the child released what it opened, and exits)
            self._process.wait()
            self._conn.close()
            raise reply[1]
        _, next_capture, next_exchange = reply
        self._waiting: dict[int, Any] = {}  # token -> Future or waker
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._child_gone = False
        # Read and written by the feeder only: exchanges with an operation that could not
        # be sent to the child, and why. What follows for them is not sent; their end is,
        # to finish what the log has of them, but the recorder hears it was not recorded.
        self._unsent: dict[int, str] = {}
        self._feeder = threading.Thread(target=self._feed, name=f"{self._name}:feed", daemon=True)
        self._reader = threading.Thread(target=self._read, name=f"{self._name}:read", daemon=True)
        self._feeder.start()
        self._reader.start()
        self._start_ids(next_capture, next_exchange)

    def _alive(self) -> bool:
        return self._process.poll() is None and not self._child_gone

    def _own_threads(self) -> tuple[threading.Thread, ...]:
        return self._feeder, self._reader

    def _shutdown(self) -> None:
        self._feeder.join()
        self._reader.join()
        self._release_log()

    def _release_log(self) -> None:
        """Once the child has written everything and exits: the log is released."""
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._conn.close()

    def _token(self, waiter: Any) -> int:
        token = next(self._tokens)
        with self._lock:
            self._waiting[token] = waiter
        return token

    def _feed(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        gather = _GATHER
        batch = [get()]
        while True:
            # Let a few milliseconds of operations gather: one wake-up and one message
            # per batch keeps this thread from contending with the event loop per chunk.
            time.sleep(gather)
            while len(batch) < _BATCH:
                try:
                    batch.append(get_nowait())
                except queue.Empty:
                    break
            if not batch:
                # Idle: wait for the next operation, then gather. While streams flow, the
                # loop only sleeps between batches: a producer never has to wake it, and
                # it never takes the GIL from the event loop at the moment it was woken.
                batch = [get()]
                continue
            # Token-paced streams bring an operation or two per wake-up: wait longer, so
            # that each wake-up carries more; under load, shorter again.
            if len(batch) < 16:
                gather = min(gather * 2, _MAX_GATHER)
            elif len(batch) > 256:
                gather = max(gather / 2, _GATHER)
            stop = False
            for i, op in enumerate(batch):
                code = op[0]
                if code == CHUNK:
                    self._taken += len(op[3])
                elif code == EXCHANGE:  # request bodies count against the backlog too
                    self._taken += len(op[8] or b"")
                elif code == BODY:
                    self._taken += len(op[2])
                elif code == END:
                    batch[i] = (*op[:5], self._token(op[5]))
                elif code == FLUSH:
                    batch[i] = (FLUSH, self._token(op[1]))
                elif code == STOP:
                    stop = True
            self._send(batch)
            if stop:
                return
            batch = []

    def _send(self, batch: list[tuple[Any, ...]]) -> None:
        if self._child_gone:
            self._lost("the log writer process is gone", len(batch))
            return
        if self._unsent:
            batch = self._sendable(batch, check=False)
        try:
            message = pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)
        except Exception:  # something a producer passed that cannot travel: it alone is lost
            message = pickle.dumps(self._sendable(batch, check=True), pickle.HIGHEST_PROTOCOL)
        try:
            self._conn.send_bytes(message)
        except OSError as exc:
            self._lost(f"the log writer process is gone ({exc})", len(batch))

    def _sendable(self, batch: list[tuple[Any, ...]], *, check: bool) -> list[tuple[Any, ...]]:
        """The operations of ``batch`` that go to the child: not those that cannot be
        pickled (looked for when ``check``), nor what follows them for their exchange but
        its end, which the recorder hears was not recorded."""
        sendable, lost, first = [], 0, None
        for op in batch:
            exchange_id = op[1] if op[0] in _OF_EXCHANGE else None
            failed = _unpicklable(op) if check and exchange_id not in self._unsent else None
            if failed is not None:
                lost, first = lost + 1, first or failed
                if exchange_id is None:
                    continue
                self._unsent[exchange_id] = f"cannot send it to the log writer: {failed}"
            if exchange_id in self._unsent:
                if op[0] == END:
                    end = self._refused(op, self._unsent.pop(exchange_id))
                    if failed is None:  # (an end that cannot travel is not sent)
                        sendable.append(end)
                continue
            sendable.append(op)
        if first is not None:
            self._failed(f"cannot send {lost} operations to the log writer: {first}", lost, first)
        return sendable

    def _refused(self, end: tuple[Any, ...], why: str) -> tuple[Any, ...]:
        """The end of an exchange not wholly sent: its future raises now, and the child's
        answer goes to nobody."""
        future = self._pop(end[5])
        if future.set_running_or_notify_cancel():
            future.set_exception(LogError(f"{self.path}: exchange {end[1]} could not be recorded: {why}"))
        return (*end[:5], self._token(concurrent.futures.Future()))

    def _read(self) -> None:
        self._read_answers()
        if self._closing_itself:  # close() was called on this thread or the feeder
            self._feeder.join()
            self._release_log()
            self._done_closing()

    def _read_answers(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._lost("the log writer process is gone", 0)
                return
            kind = message[0]
            if kind == "done":
                future = self._pop(message[1])
                if future.set_running_or_notify_cancel():
                    future.set_result(message[2])
            elif kind == "not_done":  # the exchange could not be recorded: why
                future = self._pop(message[1])
                if future.set_running_or_notify_cancel():
                    future.set_exception(LogError(message[2]))
            elif kind == "flushed":
                self._pop(message[1])()
            elif kind == "failed_batch":
                self._failed(message[1], message[2])
            elif kind == "closed":
                stats = message[1]
                self.stats.rows_written, self.stats.batches = stats.rows_written, stats.batches
                return

    def _pop(self, token: int) -> Any:
        with self._lock:
            return self._waiting.pop(token)

    def _lost(self, error: str, rows: int) -> None:
        """The child died: say so once, and release everyone waiting on it."""
        if not self._child_gone:
            self._child_gone = True
            # What the child had not committed when it died is lost too, and nobody can
            # count it: the total, of what is lost from now on, comes when the log closes.
            self._failed(error, rows, uncounted=_GONE)
        elif rows:
            self.stats.rows_lost += rows
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if isinstance(waiter, concurrent.futures.Future):
                if waiter.set_running_or_notify_cancel():
                    waiter.set_exception(LogError(f"{self.path}: {error}"))
            else:
                waiter()


def _unpicklable(op: tuple[Any, ...]) -> Exception | None:
    """Why ``op`` cannot be sent to the child, if it cannot."""
    try:
        pickle.dumps(op, pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return exc
    return None
