"""One test's cassette: served by a replay server, recorded into when the record mode says so."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tasktape.choices import parse_choice
from tasktape.errors import TapeError, Unfaithful
from tasktape.eventlog import SSEDecoder, SSEEvent
from tasktape.eventlog.cassette import read_cassette, read_header, write_cassette
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.recorded import Recorded, read_log
from tasktape.eventlog.redact import Redactor, hide_credentials
from tasktape.proxy.hosts import allowed_hosts

from .faults import Faults
from .fidelity import Divergence
from .matching import Incoming, mismatches
from .modes import ReplayMode
from .on_expired import OnExpired
from .record_mode import RecordMode
from .server import Miss, ReplayServer, Unapplied, is_card

if TYPE_CHECKING:
    from tasktape.eventlog import LogWriter

# Outcomes where the answer came from the recorder, not the agent.
NOT_RECORDINGS = frozenset({Outcome.UPSTREAM_ERROR, Outcome.REFUSED})


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
    strict: bool = False
    max_age: timedelta | None = None
    on_expired: OnExpired = OnExpired.WARN
    in_thread: bool = False


@dataclass(frozen=True)
class Told:
    """How many of a tape's misses, refused requests and faults not made were reported already."""

    missed: int = 0
    refused: int = 0
    unapplied: int = 0


@dataclass
class Tape:
    """What the ``tasktape`` fixture gives a test: where to send requests, and what happened."""

    url: str
    cassette: Path
    mode: RecordMode
    recorded: list[Recorded]
    server: ReplayServer
    recording: bool = False
    strict: bool = False

    @property
    def served(self) -> int:
        """Requests answered from the cassette."""
        return self.server.stats.served

    @property
    def missed(self) -> list[Miss]:
        """Requests nothing in the cassette matched, each with the closest recordings."""
        return self.server.stats.missed

    @property
    def refused(self) -> list[str]:
        """Requests the replay answered with an error of its own (a Last-Event-ID naming no
        recorded event, a malformed X-Tasktape-Fault), each with what made it refuse."""
        return self.server.stats.refused

    @property
    def unapplied(self) -> list[Unapplied]:
        """The faults requests asked for (X-Tasktape-Fault) that were not made: a recording
        run forwarded those requests live to the upstream."""
        return self.server.stats.unapplied

    @property
    def unused(self) -> list[Recorded]:
        """Recordings no request asked for (yet). A card is the same however often it is
        read, so a card recorded twice is used once a request got either recording."""
        server = self.server
        read = [r for r, n in zip(server.recorded, server.used, strict=True) if n and is_card(r)]

        def answered(recorded: Recorded) -> bool:
            """Whether a card read that ``recorded`` would have answered got another recording."""
            request = _as_request(recorded)
            return is_card(recorded) and any(not mismatches(request, card, server.rules) for card in read)

        return [r for r in server.unused() if not answered(r)]

    def told(self) -> Told:
        """What :meth:`problems` has said once it said everything up to now."""
        return Told(len(self.missed), len(self.refused), len(self.unapplied))

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

    def fault(self, spec: str | Faults) -> None:
        """Arm a fault spec from the test, as ``POST /_tasktape/faults`` does: its scope
        (``times=1`` for once) counts from now."""
        faults = Faults.parse(spec) if isinstance(spec, str) else spec
        self.server.arm(faults, "tasktape.fault()")

    def reset(self) -> None:
        """Faults back to those the marker gave, every task back to not started."""
        self.server.reset()

    def report(self) -> dict[str, Any]:
        """The fidelity report: every answer so far, its bytes against the recording's,
        why they differ, how late its chunks went out, its faults."""
        return self.server.report()

    def assert_faithful(
        self, *, allow: str | Iterable[str] = (), max_lateness_ms: float | None = None
    ) -> None:
        """Fail unless every answer was the recording byte for byte, but for the kinds of
        difference in ``allow`` (``"fault"``, ``"resume"``, ``"rewrite"``, ``"subscribe"``,
        ``"client-left"``, ``"stopped"``: one, or a list of them), and, given ``max_lateness_ms``, on time
        to within it."""
        kinds = (allow,) if isinstance(allow, str) else allow  # one kind, never its letters
        allowed = {parse_choice(Divergence, kind, "a kind of difference") for kind in kinds}
        lines = []
        for stream in self.report()["streams"]:
            where = f"{stream['method']} {stream['path']} ({stream['exchange']})"
            if not stream["identical"]:
                kept = [r for r in stream["reasons"] if r.partition(":")[0] not in allowed]
                if kept or not stream["reasons"]:
                    lines.append(f"{where}: {'; '.join(kept) or 'the bytes differ from the recording'}")
            late = stream["lateness_ms"]["max"]
            if max_lateness_ms is not None and late > max_lateness_ms:
                lines.append(
                    f"{where}: a chunk went out {late:.1f} ms late (allowed: {max_lateness_ms:g} ms)"
                )
        if lines:
            raise Unfaithful("tasktape: the replay was not the recording:\n  " + "\n  ".join(lines))

    def problems(self, *, since: Told | None = None, unused: bool = True) -> str | None:
        """Why the test should fail: requests that missed the cassette, requests the replay
        refused and faults a request asked for that were not made (those after ``since``,
        already told) and, when strict and ``unused``, recordings left unused; None when
        there is nothing to say."""
        since = since or Told()
        lines = []
        missed = self.missed[since.missed :]
        for miss in missed:
            where = shown(self.cassette)
            lines.append(f"{miss.request} matches nothing in {where}; the closest recordings:")
            lines += [f"  {c['request']} ({c['recorded']}): {'; '.join(c['differs'])}" for c in miss.closest]
        lines += [
            f"the replay refused {refused}, answering with an error of its own, not a recording"
            for refused in self.refused[since.refused :]
        ]
        # The test meant to see how its client copes with them: what it saw says nothing of that.
        lines += [
            f"{unapplied}; run the test again to replay it with them"
            for unapplied in self.unapplied[since.unapplied :]
        ]
        if unused and self.strict and not self.recording:
            lines += [f"recorded but never requested: {r.request_line} ({r.origin})" for r in self.unused]
        if not lines:
            return None
        if missed:
            lines.append(
                "record what is missing with --tasktape-record-mode=new_episodes --tasktape-upstream URL, "
                "or ignore what changes between runs with @pytest.mark.tasktape(ignore=[...])"
            )
        return "\n".join(["tasktape: the cassette and the requests disagree", *lines])


def _as_request(recorded: Recorded) -> Incoming:
    """The request a recording answered, as it would arrive again."""
    return Incoming(
        recorded.method, recorded.path, recorded.query, recorded.request_body, recorded.request_headers
    )


def shown(path: Path) -> Path:
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
            # On loopback, it answers loopback names only: a page cannot rebind one to it.
            "allowed_hosts": allowed_hosts(()),
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
        self.tape = Tape(url, o.cassette, o.mode, recorded, server, records, o.strict)
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
                    header: dict[str, Any] = {"source": "pytest"}
                    if kept:
                        # The recordings it keeps are as old as they were: so is the cassette
                        # (the age --tasktape-max-age measures).
                        created = read_header(o.cassette).get("created_at")
                        if created is not None:
                            header["created_at"] = created
                    header["upstream"] = hide_credentials(o.upstream) if o.upstream else None
                    write_cassette(o.cassette, [*kept, *new], **header)
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
