"""Cassettes in any test suite: the ``tasktape`` fixture and marker (loaded by pytest
through the ``pytest11`` entry point; nothing to import).

    @pytest.mark.tasktape("cassettes/answer.jsonl")
    async def test_answer(tasktape):
        events = await my_client(tasktape.url).stream("What does J45.909 mean?")

The fixture serves the cassette (in the test's event loop for pytest-asyncio tests, in a
thread for the others and for those whose sync fixtures, or async fixtures in another
loop, use it) and
fails the test when a request missed it, whether the test or one of its fixtures sent it.
A test that talks to several upstreams (an agent and the LLM API it calls) names a tape
for each, ``@pytest.mark.tasktape(name="llm")``, and gets them from the ``tasktapes``
fixture: ``tasktapes["llm"].url``.
``--tasktape-record-mode`` records cassettes through the recording proxy from
``--tasktape-upstream``; ``--tasktape-strict`` fails tests that leave recordings unused;
``--tasktape-max-age`` holds cassettes to an age. The run ends with one line summing up
what the tapes served.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tasktape.counted import counted
from tasktape.errors import CassetteError, CassetteExpired, TapeError, TasktapeError, UsageError

from .cassette_age import FORMS, created_at, describe
from .loop_stalls import LoopStalls
from .marker import (
    MARKER,
    SIGNATURE,
    TAPES_FIXTURE,
    command_line_max_age,
    command_line_upstreams,
    marker_name,
    tape_names,
    tape_options,
    upstream_option,
)
from .on_expired import OnExpired
from .record_mode import RecordMode

if TYPE_CHECKING:
    from tasktape.eventlog.recorded import Recorded

    from .tape import Tape, TapeOptions, Tapes, TapeSession, Told

LOOP_SCOPES = ("function", "class", "module", "package", "session")
# A test's tapes are keyed by name: None for the unnamed one (the tasktape fixture's).
_TAPES = pytest.StashKey[dict[str | None, "Tape"]]()
_OPTIONS = pytest.StashKey[dict[str | None, "TapeOptions"]]()
# Cassettes are known by their files (TapeOptions.file), however the tests write their paths.
_WRITTEN = pytest.StashKey[dict[Path, set[str | None]]]()  # cassettes written, by which tests
_RERECORDED = pytest.StashKey[set[Path]]()  # expired cassettes recorded again in this run
_TOLD = pytest.StashKey[dict[str | None, "Told"]]()  # what of each tape's misses was reported
_STALLS = pytest.StashKey[LoopStalls]()  # the test's loop, when it serves tapes: how long it stalled
_TOTALS = pytest.StashKey["Totals"]()
_COLLECTED = pytest.StashKey["Collected"]()  # the session's tests, deselected ones too
_SELECTED = pytest.StashKey[frozenset[str]]()  # the node ids of the tests this run runs
_NOT_PASSED = pytest.StashKey[bool]()  # the test failed (or was skipped) in setup or call
WORKER_OUTPUT = "tasktape"  # the key of a pytest-xdist worker's totals in its workeroutput


# A cassette's recording, across tests: the cassette, its origin there, its request's method
# and path, and its query as recorded ("" for none).
Recording = tuple[str, str, str, str]


@dataclasses.dataclass
class Collected:
    """What the session collected (every node, deselected or not): enough to tell that a
    recording's test is gone. Each pytest-xdist worker collects every test, so each knows."""

    root: Path  # pytest's rootdir, which node ids are relative to
    known: set[str] = dataclasses.field(default_factory=set)  # every node collected
    # The collectors whose every child was collected (not those --lf left empty).
    walked: set[str] = dataclasses.field(default_factory=set)

    def add(self, report: pytest.CollectReport) -> None:
        children = {node.nodeid for node in report.result}
        self.known |= children
        if report.passed and children:
            self.walked.add(report.nodeid)

    def gone(self, test: str) -> bool:
        """Whether the node id ``test`` names no test any more: its file is not there, or
        the module (or class) it would be in was collected without it. A test of a file
        or class the session did not collect (run by node id, say) is not judged gone."""
        if test in self.known:
            return False
        parts = test.split("[", 1)[0].split("::")  # parameters may hold "::"
        for end in range(len(parts) - 1, 0, -1):
            parent = "::".join(parts[:end])
            if parent in self.walked or parent in self.known:
                return parent in self.walked
        return not (self.root / parts[0]).is_file()


@dataclasses.dataclass
class Totals:
    """What the tapes of a run did, summed up for the line that ends the run."""

    tapes: int = 0
    served: int = 0
    missed: int = 0
    refused: int = 0
    recorded: int = 0  # exchanges recording runs wrote into cassettes
    cassettes: set[str] = dataclasses.field(default_factory=set)  # those there once used
    # A recording is unused when a test left it so and no test of the run requested it
    # (tests sharing a cassette each request their own part of it).
    unused: set[Recording] = dataclasses.field(default_factory=set)
    requested: set[Recording] = dataclasses.field(default_factory=set)
    # The query parameters the misses of each cassette's tapes hide the values of (tests
    # may redact others): its unused recordings are listed with all of them hidden.
    hidden: dict[str, set[str]] = dataclasses.field(default_factory=dict)

    def add(self, tape: Tape, selected: frozenset[str]) -> None:
        """Add ``tape``'s counts; its unused recordings of the tests the run runs (``selected``)."""
        self.tapes += 1
        self.served += tape.server.stats.served  # from cassettes: what was recorded is counted apart
        self.missed += len(tape.missed)
        self.refused += len(tape.refused)
        self.recorded += tape.written
        # One file, however the tests sharing it write its path ("..", a symlink).
        cassette = str(tape.cassette.resolve())
        if _is_file(tape.cassette):  # not one a recording run failed to write
            self.cassettes.add(cassette)
        # A recording run records what it was asked for: what it left alone says nothing.
        if not tape.recording:
            unused = {_recording(cassette, r) for r in tape.unused_of(selected)}
            self.unused |= unused
            self.requested |= {_recording(cassette, r) for r in tape.server.recorded} - unused
            self.hidden.setdefault(cassette, set()).update(tape.server.recordings.shown.query_names)

    def as_sent(self) -> dict[str, Any]:
        """As a pytest-xdist worker sends it (execnet carries plain values)."""
        return {
            **dataclasses.asdict(self),
            "cassettes": sorted(self.cassettes),
            "unused": sorted(self.unused),
            "requested": sorted(self.requested),
            "hidden": {cassette: sorted(names) for cassette, names in self.hidden.items()},
        }

    def merge(self, sent: dict[str, Any]) -> None:
        for name in ("tapes", "served", "missed", "refused", "recorded"):
            setattr(self, name, getattr(self, name) + sent[name])
        self.cassettes.update(sent["cassettes"])
        self.unused.update((c, origin, head, query) for c, origin, head, query in sent["unused"])
        self.requested.update((c, origin, head, query) for c, origin, head, query in sent["requested"])
        for cassette, names in sent["hidden"].items():
            self.hidden.setdefault(cassette, set()).update(names)

    def named_unused(self) -> list[str]:
        """Each recording left unused, as a person finds it: its request (no credential's
        value, as its cassette's misses show it), cassette and line."""
        # (Loaded by now: a test used a tape.)
        from .matching import Shown  # noqa: PLC0415
        from .tape import shown  # noqa: PLC0415

        lines = []
        for cassette, origin, head, query in sorted(self.unused - self.requested):
            hides = Shown(frozenset(self.hidden[cassette]))
            request = head + (f"?{hides.query(query)}" if query else "")
            lines.append(f"  {request} ({shown(Path(cassette).parent / origin)})")
        return lines

    def line(self) -> str:
        asked = self.served + self.missed
        rate = f"{100 * self.served // asked}%" if asked else "n/a"  # rounded down: 100% is all
        recorded = f", {self.recorded} recorded" if self.recorded else ""
        unused = len(self.unused - self.requested)
        return (
            f"tasktape: {self.served} served, {self.missed} missed, {unused} unused, "
            f"{self.refused} refused{recorded}, match rate {rate} ({counted(asked, 'request')}) "
            f"across {counted(len(self.cassettes), 'cassette')}"
        )


def _recording(cassette: str, recorded: Recorded) -> Recording:
    return cassette, recorded.origin, f"{recorded.method} {recorded.path}", recorded.query or ""


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file: not when the file system refuses it (a name too long)."""
    try:
        return path.is_file()
    except OSError:
        return False


def pytest_addoption(parser: pytest.Parser) -> None:
    """The record mode, the agent to record from, strictness, and the cassettes' age limit."""
    group = parser.getgroup("tasktape", "tasktape cassettes")
    group.addoption(
        "--tasktape-record-mode",
        default="none",
        metavar="MODE",
        help="none (replay only, the default), once (record cassettes that do not exist yet), "
        "new_episodes (record what misses, add it to the cassette), all (record everything again).",
    )
    group.addoption(
        "--tasktape-upstream",
        action="append",
        metavar="[NAME=]URL",
        help="The agent to record from; NAME=URL for the tapes named NAME (a test of several "
        "upstreams). Repeat it for each.",
    )
    group.addoption(
        "--tasktape-strict",
        "--tasktape-fail-on-unused",  # its older name
        action="store_true",
        dest="tasktape_strict",
        help="Fail a test that left recordings of its cassette unused (--tasktape-fail-on-unused "
        "is its older name). Requests the replay refused fail a test in any case.",
    )
    group.addoption(
        "--tasktape-max-age",
        metavar="AGE",
        help=f"The age past which a cassette has expired ({FORMS}), from its header's created_at.",
    )
    group.addoption(
        "--tasktape-on-expired",
        default=OnExpired.WARN.value,
        metavar="ACTION",
        help="warn (the default: the test runs, a CassetteExpired warning names the cassette), "
        "fail (the test fails before it runs), rerecord (the test records its cassette again, as "
        "--tasktape-record-mode=all would; needs --tasktape-upstream).",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker; a misspelt record mode stops the run before any test."""
    config.addinivalue_line(
        "markers",
        f"{SIGNATURE}: serve this cassette (a path relative to the test file; by default "
        "cassettes/<module>/<test>.jsonl beside it) to the tasktape fixture.",
    )
    try:
        mode = RecordMode.parse(config.getoption("--tasktape-record-mode"))
    except UsageError as exc:
        raise pytest.UsageError(f"--tasktape-record-mode: {exc}") from None
    try:
        on_expired = OnExpired.parse(config.getoption("--tasktape-on-expired"))
    except UsageError as exc:
        raise pytest.UsageError(f"--tasktape-on-expired: {exc}") from None
    try:
        command_line_max_age(config)
    except UsageError as exc:
        raise pytest.UsageError(f"--tasktape-max-age: {exc}") from None
    upstreams = command_line_upstreams(config)
    if upstreams:
        # Here: the recorder (aiohttp) loads only for a run that may record.
        from tasktape.proxy.recorder import upstream_url  # noqa: PLC0415

        for name, upstream in upstreams.items():
            try:
                upstream_url(upstream)
            except UsageError as exc:
                raise pytest.UsageError(f"--tasktape-upstream{f' {name}=' if name else ''}: {exc}") from None
    parallel = hasattr(config, "workerinput") or bool(getattr(config.option, "numprocesses", None))
    # Each worker would replace the cassettes the others wrote.
    if mode is RecordMode.ALL and parallel:
        raise pytest.UsageError(
            "--tasktape-record-mode=all replaces cassettes: run it without pytest-xdist's -n"
        )
    if on_expired is OnExpired.RERECORD and parallel:
        raise pytest.UsageError(
            "--tasktape-on-expired=rerecord replaces cassettes: run it without pytest-xdist's -n"
        )
    config.stash[_WRITTEN] = {}
    config.stash[_RERECORDED] = set()
    config.stash[_TOTALS] = Totals()
    config.stash[_COLLECTED] = Collected(config.rootpath)
    config.stash[_SELECTED] = frozenset()


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """Note what was collected, before other plugins (--lf) leave some of it out."""
    report = yield
    collector.config.stash[_COLLECTED].add(report)
    return report


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note the tests the run runs: recordings of the others are not counted unused."""
    session.config.stash[_SELECTED] = frozenset(item.nodeid for item in session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Any:
    """Note a test that did not pass: what it recorded of nothing is not written."""
    report = yield
    if report.when in ("setup", "call") and not report.passed:
        item.stash[_NOT_PASSED] = True
    return report


def _passed(request: pytest.FixtureRequest) -> bool:
    """Whether the test passed its setup and call (asked in the teardown of its fixtures)."""
    return not request.node.stash.get(_NOT_PASSED, False)


def _options(request: pytest.FixtureRequest, name: str | None) -> TapeOptions:
    """The options of the test's tape ``name`` (read once, kept on the test); a mistake
    fails the test."""
    known = request.node.stash.setdefault(_OPTIONS, {})
    if name not in known:
        try:
            options = tape_options(request.node, request.config, name)
        except TasktapeError as exc:
            where = f"({marker_name(name).removesuffix(', ')})" if name else ""
            raise _failed(f"@pytest.mark.{MARKER}{where}: {exc}") from None
        known[name] = _aged(request, options)
    return known[name]


def _aged(request: pytest.FixtureRequest, options: TapeOptions) -> TapeOptions:
    """The options as the cassette's age leaves them: one older than its limit warns,
    fails the test, or is recorded again (``--tasktape-on-expired``)."""
    rerecorded = request.config.stash[_RERECORDED]
    if options.file in rerecorded:
        # A test sharing it recorded it again in this run: this one adds to it, as mode all would.
        return dataclasses.replace(options, mode=RecordMode.ALL)
    if options.max_age is None or options.mode is RecordMode.ALL or not _is_file(options.cassette):
        # Mode all records every cassette again; a missing one is recorded or fails, and so
        # does one the file system refuses (a name too long), saying so as it starts.
        return options
    try:
        expired = _expired(options)
    except CassetteError as exc:
        raise _failed(f"tasktape: {_said(exc)}") from None
    if expired is None:
        return options
    if options.on_expired is OnExpired.WARN:
        request.node.warn(CassetteExpired(f"tasktape: {expired}"))
        return options
    if options.on_expired is OnExpired.FAIL:
        pytest.fail(
            f"tasktape: {expired}; record it again with --tasktape-on-expired=rerecord "
            f"{upstream_option(options.name)} (or every cassette with --tasktape-record-mode=all)",
            pytrace=False,
        )
    if not options.upstream:
        pytest.fail(
            f"tasktape: {expired}; --tasktape-on-expired=rerecord records it again from an agent: "
            f"give it with {upstream_option(options.name)}",
            pytrace=False,
        )
    rerecorded.add(options.file)
    return dataclasses.replace(options, mode=RecordMode.ALL)


def _expired(options: TapeOptions) -> str | None:
    """Why the test's cassette is past its age limit, or None when it is not."""
    from .tape import shown  # noqa: PLC0415 - loaded once a test asks for a tape

    assert options.max_age is not None
    where, limit = shown(options.cassette), describe(options.max_age)
    created = created_at(options.cassette)
    if created is None:
        # What cannot be shown to be younger than the limit is taken to be older.
        return f"{where} has no created_at in its header to tell its age by (the limit is {limit})"
    age = datetime.now(UTC) - created
    if age <= options.max_age:
        return None
    written = created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{where} is {describe(age)} old (created_at {written}), past the limit of {limit}"


def _names(request: pytest.FixtureRequest, named: bool) -> list[str | None]:
    """The names of the tapes a fixture serves: the unnamed one, or the named ones."""
    if not named:
        return [None]
    try:
        names: list[str | None] = [*tape_names(request.node)]
    except TasktapeError as exc:
        raise _failed(f"@pytest.mark.{MARKER}: {exc}") from None
    if not names:
        raise _failed(
            f"the {TAPES_FIXTURE} fixture serves a test's named tapes, and this test names none: "
            f'name each with @pytest.mark.{MARKER}(name="...")'
        )
    return names


def _sessions(request: pytest.FixtureRequest, named: bool) -> list[TapeSession]:
    """The sessions of the tapes a fixture serves: the test's unnamed tape (``tasktape``),
    or its named ones (``tasktapes``). Two tapes of a test never share a cassette; while
    some tape of the test records, one without an upstream of its own replays."""
    from .tape import TapeSession, shown  # noqa: PLC0415 - loaded once a test asks for a tape

    names = _names(request, named)
    fixtures = request.fixturenames
    others = [None] if named and MARKER in fixtures else []
    others += _names(request, True) if not named and TAPES_FIXTURE in fixtures else []
    every = {name: _options(request, name) for name in [*names, *others]}
    sharing: dict[Path, list[str | None]] = {}
    for o in every.values():
        sharing.setdefault(o.file, []).append(o.name)
    for cassette, sharers in sharing.items():
        if len(sharers) > 1:
            sharers.sort(key=lambda n: n or "")  # the unnamed tape first
            tapes = " and ".join(f"tape {n}" if n else "the unnamed tape" for n in sharers)
            raise _failed(f"tasktape: {tapes} share the cassette {shown(cassette)}: give each its own")
    # new_episodes or all for the tapes given an upstream (the model's), the others (an
    # agent not running) as they were recorded.
    recording = any(o.upstream for o in every.values())
    written, gone = request.config.stash[_WRITTEN], request.config.stash[_COLLECTED].gone
    return [TapeSession(_replaying(every[name], recording), written, gone) for name in names]


def _replaying(options: TapeOptions, recording: bool) -> TapeOptions:
    """A tape's options once a mode that records every tape (new_episodes, all) left alone
    the tapes given no upstream, while others of the test record."""
    if recording and not options.upstream and options.mode in (RecordMode.NEW_EPISODES, RecordMode.ALL):
        return dataclasses.replace(options, mode=RecordMode.NONE)
    return options


async def _started(sessions: list[TapeSession]) -> dict[str | None, Tape]:
    """Start every session; when one cannot start, those started stop, and the test fails."""
    tapes: dict[str | None, Tape] = {}
    for session in sessions:
        try:
            tapes[session.options.name] = await session.start()
        except (TapeError, CassetteError) as exc:  # a CassetteError names the file and line
            error = _failed(f"tasktape: {_said(exc)}")
        except OSError as exc:
            error = _cassette_refused(session, exc)
        else:
            continue
        for started in sessions:
            await started.stop(passed=False)  # the test fails before it runs
        raise error from None
    return tapes


def _failed(message: str) -> BaseException:
    """The test's failure, saying ``message`` alone: raised ``from None`` where another
    error led to it, which pytest would otherwise show first, as a second error."""
    return pytest.fail.Exception(message, pytrace=False)


def _cassette_refused(session: TapeSession, exc: OSError) -> BaseException:
    """A cassette path the file system refuses (too long, a folder, no permission)."""
    where = exc.filename or session.options.cassette
    return _failed(f"tasktape: cannot use the cassette {where}: {exc.strerror or exc}")


async def _stopped(sessions: list[TapeSession], passed: bool) -> list[str]:
    """Stop every tape (each, whatever another's stop says), the test having ``passed`` or
    not; what they recorded cut short (to warn of: in the test's thread)."""
    cut_short: list[str] = []
    failures: list[BaseException] = []
    for session in sessions:
        try:
            finished = await session.stop(passed=passed)
        except CassetteError as exc:  # one that cannot be written (a folder, a disk full)
            failures.append(_failed(f"tasktape: {_said(exc)}"))
            continue
        except OSError as exc:
            failures.append(_cassette_refused(session, exc))
            continue
        if finished.failed:
            where = session.options.cassette
            failures.append(
                _failed(
                    f"tasktape: the upstream failed to answer, so {where} did not get:\n  "
                    + "\n  ".join(finished.failed)
                )
            )
        cut_short += finished.cut_short
    if failures:
        raise _failed("\n".join(str(f) for f in failures))
    return cut_short


def _warn_of_unreadable(request: pytest.FixtureRequest, tapes: dict[str | None, Tape]) -> None:
    """A cassette mode all cannot read (a folder, a broken file) is recorded anew: what it
    held, if anything, is not kept."""
    for tape in tapes.values():
        if tape.unreadable is not None:
            request.node.warn(
                pytest.PytestWarning(
                    f"tasktape: {tape.unreadable}; recorded anew, it keeps nothing of what was there"
                )
            )


def _warn_of_changes(request: pytest.FixtureRequest, tapes: dict[str | None, Tape]) -> None:
    """What the replay sent otherwise than recorded (a Content-Length edited by hand, a body
    cut when recorded) is said where the test's warnings are, not only logged: once the
    test ran, of what it was served."""
    for tape in tapes.values():
        for said in tape.not_as_recorded:
            request.node.warn(pytest.PytestWarning(f"tasktape: {said}"))


def _warn_of_cut_short(request: pytest.FixtureRequest, cut_short: list[str]) -> None:
    """A response the client left mid-way (the test failing, most likely) is kept as it
    happened; the test's next runs would break off there with no word of why."""
    for recording in cut_short:
        request.node.warn(
            pytest.PytestWarning(
                f"tasktape: {recording}; it is kept as it happened, so its replays break off at the "
                "same byte: if the test failed mid-stream, record it again once it passes"
            )
        )


def _loop_fixture(scope: str, named: bool) -> Any:
    """The tapes, served in the event loop pytest-asyncio runs the test in (``scope``)."""

    async def fixture(request: pytest.FixtureRequest) -> AsyncIterator[dict[str | None, Tape]]:
        sessions = _sessions(request, named)
        tapes = await _started(sessions)
        _warn_of_unreadable(request, tapes)
        # One watch of the loop, however many tapes it serves.
        stalls = None if _STALLS in request.node.stash else LoopStalls(asyncio.get_running_loop())
        if stalls is not None:
            request.node.stash[_STALLS] = stalls
        try:
            yield tapes
        finally:
            if stalls is not None:
                stalls.stop()
            _warn_of_changes(request, tapes)
            _warn_of_cut_short(request, await _stopped(sessions, _passed(request)))

    fixture.__name__ = _loop_fixture_name(scope, named)
    return pytest_asyncio.fixture(fixture, loop_scope=scope)  # type: ignore[call-overload]


def _loop_fixture_name(scope: str, named: bool) -> str:
    return f"_{TAPES_FIXTURE if named else MARKER}_in_{scope}_loop"


try:
    import pytest_asyncio
except ImportError:  # sync tests need nothing more
    pytest_asyncio = None
else:
    for _scope in LOOP_SCOPES:
        for _named in (False, True):
            globals()[_loop_fixture_name(_scope, _named)] = _loop_fixture(_scope, _named)


@pytest.fixture
def tasktape(request: pytest.FixtureRequest) -> Iterator[Tape]:
    """A replay server for this test's cassette (see ``@pytest.mark.tasktape``): ``.url`` to
    point the client at, then ``.served``, ``.missed``, ``.refused``, ``.unused`` and ``.events``."""
    for tapes in _served(request, named=False):
        yield tapes[None]


@pytest.fixture
def tasktapes(request: pytest.FixtureRequest) -> Iterator[Tapes]:
    """The test's named tapes (``@pytest.mark.tasktape(name="llm")``), one per upstream it
    talks to, by name: ``tasktapes["llm"].url``; each a tape as ``tasktape`` gives."""
    from .tape import Tapes  # noqa: PLC0415 - loaded once a test asks for a tape

    for tapes in _served(request, named=True):
        yield Tapes({name: tape for name, tape in tapes.items() if name is not None})


def _served(request: pytest.FixtureRequest, named: bool) -> Iterator[dict[str | None, Tape]]:
    """Serve a fixture's tapes for the test's length, in its loop or in a thread of their own."""
    threaded = any(_options(request, name).in_thread for name in _names(request, named))
    # A sync fixture, or one that awaits in another loop than the test's, would get no
    # answer from a server in the test's loop, which does not run meanwhile.
    if not threaded and _in_test_loop(request) and not _used_outside_test_loop(request, named):
        tapes = request.getfixturevalue(_loop_fixture_name(_loop_scope(request), named))
        request.node.stash.setdefault(_TAPES, {}).update(tapes)
        yield tapes
        return
    # Their own loop in a thread: the test may block (a sync client) while the servers answer.
    sessions = _sessions(request, named)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tasktape-replay", daemon=True)
    thread.start()

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    tapes: dict[str | None, Tape] = {}
    try:
        tapes = run(_started(sessions))
        _warn_of_unreadable(request, tapes)
        request.node.stash.setdefault(_TAPES, {}).update(tapes)
        yield tapes
    finally:
        try:
            _warn_of_changes(request, tapes)
            _warn_of_cut_short(request, run(_stopped(sessions, _passed(request))))
        finally:
            run(loop.shutdown_default_executor())
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def _in_test_loop(request: pytest.FixtureRequest) -> bool:
    """Whether pytest-asyncio runs this test (anyio and others run theirs in loops of their own)."""
    function = getattr(request.node, "function", None)
    config = request.config
    if pytest_asyncio is None or not inspect.iscoroutinefunction(function):
        return False
    # Before the asyncio marker: in auto mode pytest-asyncio marks anyio's tests too.
    if request.node.get_closest_marker("anyio") is not None or not config.pluginmanager.has_plugin("asyncio"):
        return False
    if request.node.get_closest_marker("asyncio") is not None:
        return True
    return _auto_mode(config)


def _auto_mode(config: pytest.Config) -> bool:
    """Whether pytest-asyncio runs every async test and fixture (its auto mode)."""
    return (config.getoption("asyncio_mode", None) or config.getini("asyncio_mode")) == "auto"


def _used_outside_test_loop(request: pytest.FixtureRequest, named: bool) -> bool:
    """Whether a fixture of the test that uses the tapes (asking for the fixture, or for a
    fixture that does) runs outside the test's loop: a sync fixture (run while that loop
    does not, it would wait on the server for its own timeout), or an async one in another
    of pytest-asyncio's loops."""
    test_scope = _loop_scope(request)
    # The closure's fixtures: pytest says what they are nowhere else (a pytest without it
    # serves in the test's loop, as before).
    info = getattr(request.node, "_fixtureinfo", None)
    defined = getattr(info, "name2fixturedefs", {})
    users = _users(defined, TAPES_FIXTURE if named else MARKER)
    scopes = {_fixture_loop_scope(request, defined[name][-1]) for name in users}
    return bool(scopes - {test_scope})


def _users(defined: Mapping[str, Sequence[pytest.FixtureDef[Any]]], fixture: str) -> set[str]:
    """The fixtures among ``defined`` that ask for ``fixture``, or for one that does."""
    users: set[str] = set()
    asked = {fixture}
    while asked:
        asked = {
            name
            for name, definitions in defined.items()
            if name not in users and name != fixture and asked & set(definitions[-1].argnames)
        }
        users |= asked
    return users


def _fixture_loop_scope(request: pytest.FixtureRequest, definition: pytest.FixtureDef[Any]) -> str | None:
    """The loop scope pytest-asyncio runs a fixture in (as it works it out); None for a
    fixture it does not run (a sync one)."""
    function = getattr(definition.func, "__func__", definition.func)
    asynchronous = inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)
    # A sync one runs outside the loop, even as a @pytest_asyncio.fixture.
    if not asynchronous or not (
        getattr(function, "_force_asyncio_fixture", False) or _auto_mode(request.config)
    ):
        return None
    default = request.config.getini("asyncio_default_fixture_loop_scope")
    if default == "fixture-scope":  # pytest-asyncio's word for "the fixture's own scope"
        default = definition.scope
    return getattr(function, "_loop_scope", None) or default or definition.scope


def _loop_scope(request: pytest.FixtureRequest) -> str:
    """The loop an async test runs in (pytest-asyncio's marker, or its default)."""
    marker = request.node.get_closest_marker("asyncio")
    scope = marker and (marker.kwargs.get("loop_scope") or marker.kwargs.get("scope"))
    try:
        default = request.config.getini("asyncio_default_test_loop_scope")
    except ValueError:  # a pytest-asyncio from before the setting
        default = None
    return scope or default or "function"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """A fixture that failed on a miss keeps its error, with what was closest beside it;
    a test marked itself but not asking for the fixture (it would replay nothing,
    silently) fails, saying so."""
    own = [m for m in getattr(item, "own_markers", ()) if m.name == MARKER]
    fixtures = getattr(item, "fixturenames", ())
    for fixture, mine in ((MARKER, "its cassette"), (TAPES_FIXTURE, "its named tapes")):
        named = fixture == TAPES_FIXTURE
        if any((m.kwargs.get("name") is not None) == named for m in own) and fixture not in fixtures:
            pytest.fail(
                f"@pytest.mark.{MARKER} on {item.name} serves {mine} to the {fixture} fixture, "
                f"which the test does not ask for: add `{fixture}` to its arguments",
                pytrace=False,
            )
    try:
        return (yield)
    except (Exception, pytest.fail.Exception):
        _tell(item, "setup", unused=False)
        _note(item, "setup")
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A request that missed the cassette fails the test, saying what was closest."""
    try:
        result = yield
    except (Exception, pytest.fail.Exception):
        # The test failed on its own (most likely because of the miss): keep its error,
        # and add what the cassette lacked beside it, and what may explain it.
        _tell(item, "call")
        _note(item, "call")
        raise
    # Recordings unused now may be asked for yet, by a fixture's teardown: they wait for it,
    # unless the test fails now anyway (then it is told of them, as one that failed on its own).
    if _pending(item):
        pytest.fail(_problems(item) or "", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    """A miss in a fixture's teardown, after the test ran, fails the teardown, and so do
    recordings left unused (strict mode) once every fixture is torn down; the tape,
    stopped by now, is counted in the run's totals."""
    try:
        try:
            result = yield
        except (Exception, pytest.fail.Exception):
            _tell(item, "teardown", unused=False)
            _note(item, "teardown")
            raise
        # A test that failed was told of them beside its error.
        problems = _problems(item, unused=not item.stash.get(_NOT_PASSED, False))
        if problems:
            pytest.fail(problems, pytrace=False)
        return result
    finally:
        for tape in item.stash.get(_TAPES, {}).values():
            item.config.stash[_TOTALS].add(tape, item.config.stash[_SELECTED])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker sends its totals to the controller, which prints the line."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[WORKER_OUTPUT] = session.config.stash[_TOTALS].as_sent()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """The controller adds up what each pytest-xdist worker sent (none, if it crashed)."""
    sent = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT)
    if sent is not None:
        node.config.stash[_TOTALS].merge(sent)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """One line for the run, when a test used a tape."""
    totals = config.stash[_TOTALS]
    if totals.tapes and not hasattr(config, "workeroutput"):
        terminalreporter.write_line(totals.line())
        named = totals.named_unused()
        if named and (config.get_verbosity() > 0 or config.getoption("tasktape_strict")):
            terminalreporter.write_line("tasktape: unused recordings:")
            for line in named:
                terminalreporter.write_line(line)


def _tell(item: pytest.Item, when: str, *, unused: bool = True) -> None:
    problems = _problems(item, unused=unused)
    if problems:
        item.add_report_section(when, "tasktape", problems)


def _note(item: pytest.Item, when: str) -> None:
    """Beside a failure (of the test or of a fixture): the recordings served that broke off
    when recorded, and how long the test's loop stalled while it served them."""
    notes = [tape.notes() for tape in item.stash.get(_TAPES, {}).values()]
    stalls = item.stash.get(_STALLS, None)
    notes.append(stalls and stalls.note())
    if any(notes):
        item.add_report_section(when, "tasktape notes", "\n".join(n for n in notes if n))


def _pending(item: pytest.Item) -> bool:
    """Whether the test's tapes have a miss, a refused request or a fault not made to tell."""
    told = item.stash.get(_TOLD, {})
    tapes = item.stash.get(_TAPES, {})
    return any(tape.problems(since=told.get(name), unused=False) for name, tape in tapes.items())


def _problems(item: pytest.Item, *, unused: bool = True) -> str | None:
    """What the test's tapes have to say that was not said yet (it is then said)."""
    told = item.stash.setdefault(_TOLD, {})
    problems = []
    for name, tape in item.stash.get(_TAPES, {}).items():
        problems.append(tape.problems(since=told.get(name), unused=unused))
        told[name] = tape.told()
    return "\n".join(p for p in problems if p) or None


def _said(exc: BaseException) -> str:
    """An error's words as a console line shows them (a cassette's name and keys)."""
    # Here, not at the top: a run whose tests use no cassette loads no event log package.
    from tasktape.eventlog.console_text import shown  # noqa: PLC0415

    return shown(str(exc))
