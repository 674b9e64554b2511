"""One test's cassette: served by a replay server, recorded into when the record mode says so."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tasktape.errors import TapeError
from tasktape.eventlog import SSEDecoder, SSEEvent
from tasktape.eventlog.cassette import read_cassette, write_cassette
from tasktape.eventlog.recorded import Recorded, read_log
from tasktape.eventlog.redact import Redactor, hide_credentials

from .faults import Faults
from .modes import ReplayMode
from .record_mode import RecordMode
from .server import Miss, ReplayServer

if TYPE_CHECKING:
    from tasktape.eventlog import LogWriter

# Outcomes where the answer came from the recorder, not the agent.
NOT_RECORDINGS = frozenset({"upstream_error", "refused"})


@dataclass(frozen=True)
class TapeOptions:
    """Everything a test's marker and the command line say about its cassette."""

    cassette: Path
    mode: RecordMode = RecordMode.NONE
    upstream: str | None = None
    speed: float = 0.0
    faults: Faults | None = None
    add_ids: bool = False
    allow_repeats: bool = False
    ignore: tuple[str, ...] = ()
    match_headers: tuple[str, ...] = ()
    redactor: Redactor = field(default_factory=Redactor)
    fail_on_unused: bool = False
    in_thread: bool = False


@dataclass
class Tape:
    """What the ``tasktape`` fixture gives a test: where to send requests, and what happened."""

    url: str
    cassette: Path
    mode: RecordMode
    recorded: list[Recorded]
    server: ReplayServer
    recording: bool = False
    fail_on_unused: bool = False

    @property
    def served(self) -> int:
        """Requests answered from the cassette."""
        return self.server.stats.served

    @property
    def missed(self) -> list[Miss]:
        """Requests nothing in the cassette matched, each with the closest recordings."""
        return self.server.stats.missed

    @property
    def unused(self) -> list[Recorded]:
        """Recordings no request asked for (yet)."""
        return self.server.unused()

    @property
    def events(self) -> list[SSEEvent]:
        """The SSE events of the cassette's streams, in recorded order."""
        events: list[SSEEvent] = []
        for recorded in self.recorded:
            if recorded.is_sse:
                decoder = SSEDecoder()
                for _, data in recorded.chunks:
                    events += decoder.feed(data)
                events += decoder.close()
        return events

    def problems(self, *, since: int = 0, unused: bool = True) -> str | None:
        """Why the test should fail: requests that missed the cassette (after the first
        ``since`` of them, already told) and, when asked and ``unused``, recordings left
        unused; None when there is nothing to say."""
        lines = []
        for miss in self.missed[since:]:
            where = _shown(self.cassette)
            lines.append(f"{miss.request} matches nothing in {where}; the closest recordings:")
            lines += [f"  {c['request']} ({c['recorded']}): {'; '.join(c['differs'])}" for c in miss.closest]
        if unused and self.fail_on_unused and not self.recording:
            lines += [f"recorded but never requested: {r.request_line} ({r.origin})" for r in self.unused]
        if not lines:
            return None
        if self.missed[since:]:
            lines.append(
                "record what is missing with --tasktape-record-mode=new_episodes --tasktape-upstream URL, "
                "or ignore what changes between runs with @pytest.mark.tasktape(ignore=[...])"
            )
        return "\n".join(["tasktape: the cassette and the requests disagree", *lines])


def _shown(path: Path) -> Path:
    """The path as the person running pytest would write it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


class TapeSession:
    """A tape's life: ``await start()`` in the loop that will serve it, ``await stop()`` in the
    same loop; a recording run then writes the cassette."""

    def __init__(self, options: TapeOptions, written: set[Path]) -> None:
        self.options = options
        # Cassettes this test session has written: mode all replaces a cassette once, then
        # the other tests that share it add to it.
        self.written = written
        self.tape: Tape | None = None
        self._runner: web.AppRunner | None = None
        self._folder: Path | None = None
        self._writer: LogWriter | None = None

    @property
    def records(self) -> bool:
        o = self.options
        if o.mode is RecordMode.ONCE:
            # A cassette this run created is still being recorded (tests may share one).
            return not o.cassette.exists() or o.cassette in self.written
        return o.mode in (RecordMode.NEW_EPISODES, RecordMode.ALL)

    async def start(self) -> Tape:
        o = self.options
        exists, records = o.cassette.exists(), self.records
        if not records and not exists:
            raise TapeError(
                f"no cassette {o.cassette}; record it with --tasktape-record-mode=once "
                "--tasktape-upstream URL, or name an existing one in @pytest.mark.tasktape"
            )
        if records and not o.upstream:
            raise TapeError(
                f"--tasktape-record-mode={o.mode.value} records {o.cassette} from an agent: "
                "give it with --tasktape-upstream URL"
            )
        recorded = read_cassette(o.cassette) if exists and self._keeps() else []
        common: dict[str, Any] = {
            "speed": o.speed,
            "add_ids": o.add_ids,
            "faults": o.faults,
            "ignore": o.ignore,
            "match_headers": o.match_headers,
            "allow_repeats": o.allow_repeats,
        }
        if records:
            self._folder = Path(tempfile.mkdtemp(prefix="tasktape-"))
            db = self._folder / "recording.db"
            # Here, not at the top: only a recording run needs the writer (and sqlite-utils).
            from tasktape.eventlog import LogWriter  # noqa: PLC0415

            self._writer = LogWriter(db, redactor=o.redactor)
            server = ReplayServer(
                recorded,
                mode=ReplayMode.RECORD_MISSING,
                upstream=o.upstream,
                writer=self._writer,
                log_path=db,
                **common,
            )
        else:
            server = ReplayServer(recorded, **common)
        self._runner = web.AppRunner(
            server.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self.tape = Tape(url, o.cassette, o.mode, recorded, server, records, o.fail_on_unused)
        return self.tape

    def _keeps(self) -> bool:
        """Whether what the cassette holds now stays in it."""
        return self.options.mode is not RecordMode.ALL or self.options.cassette in self.written

    async def stop(self) -> list[str]:
        """Stop serving; a recording run writes the cassette. Returns what could not be
        recorded (the upstream failed to answer), which the cassette does not get."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._writer is None:
            return []
        return await asyncio.to_thread(self._finish)

    def _finish(self) -> list[str]:
        assert self._writer is not None and self._folder is not None
        o = self.options
        try:
            self._writer.close()
            recorded = read_log(self._folder / "recording.db")
            # tasktape's own answer to a failed upstream is no recording of the agent.
            new = [r for r in recorded if r.outcome not in NOT_RECORDINGS]
            failed = [f"{r.request_line}: {r.error}" for r in recorded if r.outcome in NOT_RECORDINGS]
            if new:
                o.cassette.parent.mkdir(parents=True, exist_ok=True)
                with _locked(o.cassette.parent):
                    # Read again: a test sharing this cassette (in this process or another
                    # worker) may have added to it meanwhile.
                    kept = read_cassette(o.cassette) if o.cassette.exists() and self._keeps() else []
                    upstream = hide_credentials(o.upstream) if o.upstream else None
                    write_cassette(o.cassette, [*kept, *new], source="pytest", upstream=upstream)
                self.written.add(o.cassette)
            return failed
        finally:
            self._writer = None
            shutil.rmtree(self._folder, ignore_errors=True)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (no lock file left behind)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
