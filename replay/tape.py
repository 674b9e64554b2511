"""One test's cassette: served by a replay server, recorded into when the record mode says so."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import math
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from tasktape.choices import parse_choice
from tasktape.errors import CassetteError, TapeError, TasktapeError, Unfaithful, UnknownTape, UsageError
from tasktape.eventlog import SSEDecoder, SSEEvent
from tasktape.eventlog.cassette import read_cassette, read_header, write_cassette
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.recorded import Recorded, read_log
from tasktape.eventlog.redact import Redactor, hide_credentials
from tasktape.proxy.hosts import allowed_hosts

from .choosing import is_card
from .faults import Faults
from .fidelity import Divergence
from .marker import marker_name, upstream_option
from .matching import Incoming, Shown, mismatches
from .misses import Miss
from .modes import ReplayMode
from .on_expired import OnExpired
from .record_mode import RecordMode
from .server import ReplayServer, Unapplied

if TYPE_CHECKING:
    from tasktape.eventlog import LogWriter

# Outcomes where the answer came from the recorder, not the agent.
NOT_RECORDINGS = frozenset({Outcome.UPSTREAM_ERROR, Outcome.REFUSED})


def recordings_in(db: Path, requests: Shown | None = None) -> tuple[list[Recorded], list[str]]:
    """What a tape's log recorded of the agent, and what failed (tasktape's own answer to
    a failed upstream, or a refusal: no recording of the agent), its request as ``requests``
    shows it (the redaction defaults' names hidden, if not given). The recordings are read
    on their own: a reconnect names its stream by its place among the exchanges read,
    which leaving some out of a list read whole would shift."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        outcomes = conn.execute("SELECT id, outcome FROM exchanges ORDER BY id").fetchall()
    kept = read_log(db, [n for n, outcome in outcomes if outcome not in NOT_RECORDINGS])
    left_out = read_log(db, [n for n, outcome in outcomes if outcome in NOT_RECORDINGS])
    shown = Shown.of(Redactor()) if requests is None else requests
    return kept, [f"{shown.request_line(r)}: {r.error}" for r in left_out]


def miss_hint(name: str | None) -> str:
    """What a miss's answer (and the failure it leads to) suggests, in the plugin's own options."""
    return (
        f"record what is missing with --tasktape-record-mode=new_episodes {upstream_option(name)}, "
        f"or ignore what changes between runs with @pytest.mark.tasktape({marker_name(name)}ignore=[...])"
    )


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
    test: str | None = None  # the node id of the test: what it records is tagged with it
    name: str | None = None  # the tape's name, for a test of several (``name=`` on its marker)

    @property
    def file(self) -> Path:
        """The cassette as one file, however its marker wrote the path (``..``, a symlink):
        what the tests sharing it know it by. ``cassette`` stays as written, for messages."""
        return self.cassette.resolve()


@dataclass(frozen=True)
class Finished:
    """What a tape's stop has to tell: the requests the upstream failed to answer (the
    cassette did not get them), and the recordings it got cut short."""

    failed: list[str] = field(default_factory=list)
    cut_short: list[str] = field(default_factory=list)


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
    test: str | None = None  # the node id of the test it serves
    name: str | None = None  # its name among the test's tapes (None: the unnamed one)
    # Whether a node id names no test of the session any more (renamed, moved, deleted).
    gone: Callable[[str], bool] = field(kw_only=True, repr=False)
    # Why mode all could not read the cassette it records anew (not a file, broken); None: it could.
    unreadable: str | None = field(default=None, kw_only=True)
    written: int = 0  # the exchanges a recording run wrote into the cassette, once stopped
    # What a recording run has recorded so far (none when the tape only replays).
    anew: Callable[[], list[Recorded]] = field(default=list, kw_only=True, repr=False)

    @property
    def served(self) -> int:
        """Requests answered: from the cassette, and in a recording run those the upstream
        answered too, forwarded and recorded (a stream still coming in among them)."""
        return self.server.stats.served + len(self.anew())

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

    @property
    def unused_own(self) -> list[Recorded]:
        """The unused recordings the test answers for (strict mode fails it on them): those it
        recorded, those that name no test, and those of a test that is gone (renamed, moved,
        deleted: no test will ask for them); not those of other tests sharing the cassette."""
        return [r for r in self.unused if r.recorded_by in (None, self.test) or self._left(r)]

    def unused_of(self, tests: frozenset[str]) -> list[Recorded]:
        """The unused recordings a run of ``tests`` could have asked for: those of ``tests``,
        those that name no test, and those of a test that is gone; not those of tests left
        out of the run (``-k``, a node id, a file not run)."""
        return [r for r in self.unused if r.recorded_by is None or r.recorded_by in tests or self._left(r)]

    def _line(self, recorded: Recorded) -> str:
        """``recorded``'s request line as a miss shows it: no credential's value."""
        return self.server.recordings.shown.request_line(recorded)

    def _left(self, recorded: Recorded) -> bool:
        """Whether ``recorded`` was left by a test that is gone."""
        return recorded.recorded_by is not None and self.gone(recorded.recorded_by)

    @property
    def cut_short(self) -> list[Recorded]:
        """Recordings served that broke off when recorded: their replays break off alike."""
        server = self.server
        return [r for r, n in zip(server.recorded, server.used, strict=True) if n and r.cut_short]

    @property
    def not_as_recorded(self) -> list[str]:
        """What the replay sent otherwise than recorded, and why, of the recordings it served:
        a Content-Length that is not the length of the body it holds (an edit by hand, most
        likely: sent without it), a body cut when recorded (sent cut), one decoded only in
        part (a 502)."""
        used = self.server.used
        return [said for index, said in self.server.not_as_recorded if used[index]]

    def told(self) -> Told:
        """What :meth:`problems` has said once it said everything up to now."""
        return Told(len(self.missed), len(self.refused), len(self.unapplied))

    @property
    def events(self) -> list[SSEEvent]:
        """The SSE events of the cassette's streams, in recorded order; in a recording run,
        of the recordings it keeps and then of those the test recorded so far (a stream
        still coming in, up to what has come), as the cassette is written. Their ids are
        those a client is sent (with add_ids, the ones added to events recorded without)."""
        # A recording is known to the server by its place among those it serves.
        served = {id(r): index for index, r in enumerate(self.server.recorded)}
        events: list[SSEEvent] = []
        for recorded in [*self.recorded, *self.anew()]:
            if recorded.is_sse:
                decoder = SSEDecoder()
                decoded = [e for _, data in recorded.chunks for e in decoder.feed(data)]
                events += self._as_sent(served.get(id(recorded)), [*decoded, *decoder.close()])
        return events

    def _as_sent(self, index: int | None, decoded: list[SSEEvent]) -> list[SSEEvent]:
        """``decoded``, the events of the server's recording ``index``, with the ids its replay
        gives them (add_ids: those recorded without one get the server's); as recorded when
        the server does not serve it (``index`` None: what a recording run forwarded)."""
        if index is None:
            return decoded
        spans = self.server.events_of(index)  # the same decoder's events: one span each
        given = [self.server._event_id(index, n, span) for n, span in enumerate(spans, 1)]
        return [
            msgspec.structs.replace(event, id=event_id) if event.complete else event
            for event, event_id in zip(decoded, given, strict=True)
        ]

    def fault(self, spec: str | Faults) -> None:
        """Arm a fault spec from the test, as ``POST /_tasktape/faults`` does: its scope
        (``times=1`` for once) counts from now."""
        __tracebackhide__ = True  # a mistake in the spec is shown at the test's line
        try:
            faults = Faults.parse(spec) if isinstance(spec, str) else spec
        except TasktapeError as exc:
            raise exc.with_traceback(None) from None  # without tasktape's frames below
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
        __tracebackhide__ = True  # a failure (or a mistake in ``allow``) is shown at the test's line
        try:
            allowed = {parse_choice(Divergence, kind, "a kind of difference") for kind in _kinds(allow)}
            _check_lateness(max_lateness_ms)
        except TasktapeError as exc:
            raise exc.with_traceback(None) from None  # without tasktape's frames below
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
        already told) and, when strict and ``unused``, recordings it answers for left unused;
        None when there is nothing to say."""
        since = since or Told()
        lines = []
        missed = self.missed[since.missed :]
        for miss in missed:
            where = shown(self.cassette)
            if not miss.closest:  # none to be close: the cassette is its header alone
                lines.append(f"{miss.request} matches nothing in {where}, which holds no recordings")
                continue
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
            lines += [
                f"recorded but never requested: {self._line(r)} ({r.origin})"
                + (f", by {r.recorded_by}, which is no test any more" if self._left(r) else "")
                for r in self.unused_own
            ]
        if not lines:
            return None
        if missed:
            lines.append(miss_hint(self.name))
        whose = f" (tape {self.name})" if self.name else ""
        return "\n".join([f"tasktape{whose}: the cassette and the requests disagree", *lines])

    def notes(self) -> str | None:
        """What may explain a failure without being one: recordings served that break off
        where they broke off when recorded (a client that left a stream, the test having
        failed, records it so). None when there is nothing to say."""
        lines = [
            f"{self._line(r)} ({r.origin}) was recorded cut short ({r.outcome}): its replay breaks "
            "off at the same byte; if the test failed while recording it, record it again"
            for r in self.cut_short
        ]
        return "\n".join(lines) or None


def _kinds(allow: object) -> list[str]:
    """The kinds of difference ``allow`` names: one (never its letters), or an iterable of them."""
    if isinstance(allow, str):
        return [allow]
    said = f"allow={allow!r}: give a kind of difference (a str) or an iterable of them"
    if not isinstance(allow, Iterable):
        raise UsageError(said)
    kinds = list(allow)
    if not all(isinstance(kind, str) for kind in kinds):
        raise UsageError(said)
    return kinds


def _check_lateness(max_lateness_ms: object) -> None:
    """Refuse a ``max_lateness_ms`` no lateness compares with as meant: not a number (a bool
    would pass for 0 or 1 ms), NaN (every comparison false: nothing would fail), negative."""
    if max_lateness_ms is None:
        return
    if (
        isinstance(max_lateness_ms, bool)
        or not isinstance(max_lateness_ms, int | float)
        or not math.isfinite(max_lateness_ms)
        or max_lateness_ms < 0
    ):
        raise UsageError(
            f"max_lateness_ms={max_lateness_ms!r}: give a finite number of milliseconds, 0 or more (or None)"
        )


class Tapes(Mapping[str, Tape]):
    """What the ``tasktapes`` fixture gives a test: its named tapes, one per upstream it
    talks to (``@pytest.mark.tasktape(name="llm")``), each its own server and cassette."""

    def __init__(self, tapes: dict[str, Tape]) -> None:
        self._tapes = tapes

    def __getitem__(self, name: str) -> Tape:
        __tracebackhide__ = True  # a name the test does not have is shown at the test's line
        try:
            return self._tapes[name]
        except KeyError:
            known = ", ".join(self._tapes) or "none"
            raise UnknownTape(f"no tape named {name!r}; this test's tapes: {known}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._tapes)

    def __len__(self) -> int:
        return len(self._tapes)

    def __repr__(self) -> str:
        return f"Tapes({', '.join(f'{n}={t.url}' for n, t in self._tapes.items())})"


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

    def __init__(
        self,
        options: TapeOptions,
        written: dict[Path, set[str | None]],
        gone: Callable[[str], bool],
    ) -> None:
        self.options = options
        # Cassettes this test session has written (by ``TapeOptions.file``), and the tests that
        # recorded into them: mode all replaces a cassette once, then the tests sharing it add to it.
        self.written = written
        self.gone = gone  # whether a node id names no test of the session any more
        self.tape: Tape | None = None
        self.unreadable: str | None = None  # why mode all could not read the cassette
        self._runner: web.AppRunner | None = None
        self._folder: Path | None = None
        self._writer: LogWriter | None = None
        self._anew: list[Recorded] = []  # what a recording run recorded, once stopped

    async def start(self) -> Tape:
        o = self.options
        existing = self._existing()
        records = self._records(existing)
        if not records and existing is None:
            # (An upstream the marker gives needs no option.)
            upstream = "" if o.upstream else f" {upstream_option(o.name)}"
            raise TapeError(
                f"no cassette {o.cassette}; record it with --tasktape-record-mode=once{upstream},"
                " or name an existing one in @pytest.mark.tasktape"
            )
        if records and not o.upstream:
            raise TapeError(
                f"--tasktape-record-mode={o.mode.value} records {o.cassette} from an agent: "
                f"give it with {upstream_option(o.name)}"
            )
        recorded = self._kept(existing or [])
        common: dict[str, Any] = {
            "speed": o.speed,
            "add_ids": o.add_ids,
            "faults": o.faults,
            "ignore": o.ignore,
            "match_headers": o.match_headers,
            "allow_repeats": o.allow_repeats,
            # On loopback, it answers loopback names only: a page cannot rebind one to it.
            "allowed_hosts": allowed_hosts(()),
            "prefer": o.test,
            "miss_hint": miss_hint(o.name),
            "redactor": o.redactor,  # what a recording run redacts, a miss's report hides
            # The report lists every answer of the test, which assert_faithful reads: the
            # server lives as long as the test (a long-running one keeps the latest only).
            "every_answer": True,
        }
        if records:
            self._folder = Path(tempfile.mkdtemp(prefix="tasktape-"))
            db = self._folder / "recording.db"
            # Here, not at the top: only a recording run needs the writer (and sqlite-utils).
            from tasktape.eventlog import LogWriter  # noqa: PLC0415

            self._writer = LogWriter(db, redactor=o.redactor)
            server = ReplayServer(
                self._answering(recorded),
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
        self.tape = Tape(
            url,
            o.cassette,
            o.mode,
            recorded,
            server,
            records,
            o.strict,
            o.test,
            o.name,
            gone=self.gone,
            unreadable=self.unreadable,
            anew=self._recorded_so_far,
        )
        return self.tape

    def _recorded_so_far(self) -> list[Recorded]:
        """What a recording run has recorded up to now: its log, once everything the recorder
        handed it is committed (every byte a client was sent is handed over before it is sent)."""
        writer, folder = self._writer, self._folder
        if writer is None or folder is None:
            return self._anew
        writer.flush()
        return recordings_in(folder / "recording.db")[0]

    def _existing(self) -> list[Recorded] | None:
        """The cassette's recordings now; None when there is no cassette. Mode all, which
        records a cassette again, takes one it cannot read for one with nothing to keep
        (noting why, for the test to be told)."""
        o = self.options
        if not o.cassette.exists():
            return None
        if o.mode is RecordMode.ALL:
            try:
                return read_cassette(o.cassette)
            except CassetteError as exc:
                self.unreadable = str(exc)
                return []
        return read_cassette(o.cassette)

    def _records(self, existing: list[Recorded] | None) -> bool:
        o = self.options
        if o.mode is RecordMode.ONCE:
            # A cassette this run created is still being recorded (tests may share one), and
            # so is one the plugin wrote that has nothing of this test yet (another worker, or
            # another run, recorded the tests sharing it before this one).
            return (
                existing is None
                or o.file in self.written
                or (o.upstream is not None and _awaits(existing, o.test))
            )
        return o.mode in (RecordMode.NEW_EPISODES, RecordMode.ALL)

    def _answering(self, kept: list[Recorded]) -> list[Recorded]:
        """What of the cassette answers a recording run's requests before the upstream does.
        Mode all asks the upstream every time: the other tests' recordings it keeps answer
        none of the test's requests, which would then go unrecorded."""
        return [] if self.options.mode is RecordMode.ALL else kept

    def _kept(self, existing: list[Recorded]) -> list[Recorded]:
        """What of the cassette's recordings stays in it. Mode all records the test's own
        again, and those that name no test too unless a test of this run recorded the
        cassette already; other tests' recordings stay (a run of some of the tests that
        share a cassette does not take the others' recordings away), but for those of tests
        that are gone, which no run will record again."""
        o = self.options
        if o.mode is not RecordMode.ALL:
            return existing
        replaced = o.file not in self.written

        def stays(recorded: Recorded) -> bool:
            if recorded.recorded_by is None:
                return not replaced
            return recorded.recorded_by != o.test and not self.gone(recorded.recorded_by)

        return [r for r in existing if stays(r)]

    async def stop(self, *, passed: bool) -> Finished:
        """Stop serving; a recording run writes the cassette (the test having ``passed`` or
        not). Says what could not be recorded (the upstream failed to answer), which the
        cassette does not get, and what it got cut short."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._writer is None:
            return Finished()
        return await asyncio.to_thread(self._finish, passed)

    def _finish(self, passed: bool) -> Finished:
        assert self._writer is not None and self._folder is not None
        o = self.options
        try:
            self._writer.close()
            requests = self._requests()
            recorded, failed = recordings_in(self._folder / "recording.db", requests)
            self._anew = recorded
            new = [dataclasses.replace(r, recorded_by=o.test) for r in recorded]
            cut_short: list[str] = []
            if self._writes(new, failed, passed):
                o.cassette.parent.mkdir(parents=True, exist_ok=True)
                with _locked(o.cassette.parent):
                    # Read again: a test sharing this cassette (in this process or another
                    # worker) may have added to it meanwhile.
                    kept = self._kept(self._existing() or [])
                    header: dict[str, Any] = {"source": "pytest"}
                    ours = self.written.get(o.file, set())
                    if any(r.recorded_by not in ours for r in kept):
                        # The recordings it keeps from before this run are as old as they
                        # were: so is the cassette (the age --tasktape-max-age measures).
                        created = read_header(o.cassette).get("created_at")
                        if created is not None:
                            header["created_at"] = created
                    header["upstream"] = hide_credentials(o.upstream) if o.upstream else None
                    write_cassette(o.cassette, [*kept, *new], **header)
                self.written.setdefault(o.file, set()).add(o.test)
                if self.tape is not None:
                    self.tape.written = len(new)
                cut_short = [
                    f"{requests.request_line(r)} (exchange {n} of {shown(o.cassette)}) was recorded "
                    f"cut short ({r.outcome})"
                    for n, r in enumerate(new, len(kept) + 1)
                    if r.cut_short
                ]
            return Finished(failed, cut_short)
        finally:
            self._writer = None
            shutil.rmtree(self._folder, ignore_errors=True)

    def _requests(self) -> Shown:
        """How a recording run's lines show requests: as its replay's misses do (what the
        cassette holds redacted hidden too, which the log's redaction may not know of)."""
        if self.tape is None:  # (it did not start: what it redacts is all it knows)
            return Shown.of(self.options.redactor)
        return self.tape.server.recordings.shown

    def _writes(self, new: list[Recorded], failed: list[str], passed: bool) -> bool:
        """Whether the recording run writes the cassette: when it recorded something, and,
        the upstream having answered every request, when mode all records the cassette again
        (what the test no longer asks goes) or there is none yet: a test that passed sending
        nothing (its client answered from a cache) gets a cassette of no recordings, which
        its next runs replay. One that failed (or was skipped) before it sent anything
        leaves the cassette as it was, so that its next run records it."""
        again = self.options.mode is RecordMode.ALL or not self.options.cassette.exists()
        return bool(new) or (again and not failed and passed)


def _awaits(existing: list[Recorded], test: str | None) -> bool:
    """Whether a cassette the plugin recorded (its recordings name their tests) has none of ``test``'s."""
    tests = {r.recorded_by for r in existing}
    return test is not None and test not in tests and bool(tests - {None})


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (no lock file left behind)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
