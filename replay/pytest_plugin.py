"""Cassettes in any test suite: the ``tasktape`` fixture and marker (loaded by pytest
through the ``pytest11`` entry point; nothing to import).

    @pytest.mark.tasktape("cassettes/answer.jsonl")
    async def test_answer(tasktape):
        events = await my_client(tasktape.url).stream("What does J45.909 mean?")

The fixture serves the cassette (in the test's event loop for pytest-asyncio tests, in a
thread for the others) and fails the test when a request missed it, whether the test or
one of its fixtures sent it.
``--tasktape-record-mode`` records cassettes through the recording proxy from
``--tasktape-upstream``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from tasktape.errors import CassetteError, TapeError, TasktapeError, UsageError

from .marker import MARKER, SIGNATURE, tape_options
from .record_mode import RecordMode

if TYPE_CHECKING:
    from .tape import Tape, TapeOptions, TapeSession

LOOP_SCOPES = ("function", "class", "module", "package", "session")
_TAPE = pytest.StashKey["Tape"]()
_OPTIONS = pytest.StashKey["TapeOptions"]()
_WRITTEN = pytest.StashKey[set[Path]]()
_TOLD = pytest.StashKey[int]()  # how many of the test's misses have been reported


def pytest_addoption(parser: pytest.Parser) -> None:
    """The record mode, the agent to record from, and strictness about unused recordings."""
    group = parser.getgroup("tasktape", "tasktape cassettes")
    group.addoption(
        "--tasktape-record-mode",
        default="none",
        metavar="MODE",
        help="none (replay only, the default), once (record cassettes that do not exist yet), "
        "new_episodes (record what misses, add it to the cassette), all (record everything again).",
    )
    group.addoption("--tasktape-upstream", metavar="URL", help="The agent to record from.")
    group.addoption(
        "--tasktape-fail-on-unused",
        action="store_true",
        help="Fail a test that left recorded requests of its cassette unused.",
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
    parallel = hasattr(config, "workerinput") or bool(getattr(config.option, "numprocesses", None))
    if mode is RecordMode.ALL and parallel:
        # Each worker would replace the cassettes the others wrote.
        raise pytest.UsageError(
            "--tasktape-record-mode=all replaces cassettes: run it without pytest-xdist's -n"
        )
    config.stash[_WRITTEN] = set()


def _options(request: pytest.FixtureRequest) -> TapeOptions:
    """The test's options (read once, kept on the test); a mistake fails the test."""
    options = request.node.stash.get(_OPTIONS, None)
    if options is None:
        try:
            options = request.node.stash[_OPTIONS] = tape_options(request.node, request.config)
        except TasktapeError as exc:
            pytest.fail(f"@pytest.mark.{MARKER}: {exc}", pytrace=False)
    return options


def _session(request: pytest.FixtureRequest) -> TapeSession:
    from .tape import TapeSession  # noqa: PLC0415 - loaded once a test asks for a tape

    return TapeSession(_options(request), request.config.stash[_WRITTEN])


async def _started(session: TapeSession) -> Tape:
    try:
        return await session.start()
    except (TapeError, CassetteError) as exc:  # a CassetteError names the file and line
        await session.stop()
        pytest.fail(f"tasktape: {exc}", pytrace=False)
    except OSError as exc:
        await session.stop()
        _cassette_refused(session, exc)


def _cassette_refused(session: TapeSession, exc: OSError) -> NoReturn:
    """A cassette path the file system refuses (too long, a folder, no permission)."""
    where = exc.filename or session.options.cassette
    pytest.fail(f"tasktape: cannot use the cassette {where}: {exc.strerror or exc}", pytrace=False)


async def _stopped(session: TapeSession) -> None:
    try:
        failed = await session.stop()
    except OSError as exc:
        _cassette_refused(session, exc)
    if failed:
        where = session.options.cassette
        pytest.fail(
            f"tasktape: the upstream failed to answer, so {where} did not get:\n  " + "\n  ".join(failed),
            pytrace=False,
        )


def _loop_fixture(scope: str) -> Any:
    """The tape, served in the event loop pytest-asyncio runs the test in (``scope``)."""

    async def fixture(request: pytest.FixtureRequest) -> AsyncIterator[Tape]:
        session = _session(request)
        tape = await _started(session)
        try:
            yield tape
        finally:
            await _stopped(session)

    fixture.__name__ = f"_tasktape_in_{scope}_loop"
    return pytest_asyncio.fixture(fixture, loop_scope=scope)  # type: ignore[call-overload]


try:
    import pytest_asyncio
except ImportError:  # sync tests need nothing more
    pytest_asyncio = None
else:
    for _scope in LOOP_SCOPES:
        globals()[f"_tasktape_in_{_scope}_loop"] = _loop_fixture(_scope)


@pytest.fixture
def tasktape(request: pytest.FixtureRequest) -> Iterator[Tape]:
    """A replay server for this test's cassette (see ``@pytest.mark.tasktape``): ``.url`` to
    point the client at, then ``.served``, ``.missed``, ``.unused`` and ``.events``."""
    if not _options(request).in_thread and _in_test_loop(request):
        tape = request.getfixturevalue(f"_tasktape_in_{_loop_scope(request)}_loop")
        request.node.stash[_TAPE] = tape
        yield tape
        return
    # Its own loop in a thread: the test may block (a sync client) while the server answers.
    session = _session(request)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tasktape-replay", daemon=True)
    thread.start()

    def run(coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    try:
        tape = run(_started(session))
        request.node.stash[_TAPE] = tape
        yield tape
    finally:
        try:
            run(_stopped(session))
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
    return (config.getoption("asyncio_mode", None) or config.getini("asyncio_mode")) == "auto"


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
    own = any(m.name == MARKER for m in getattr(item, "own_markers", ()))
    if own and MARKER not in getattr(item, "fixturenames", ()):
        pytest.fail(
            f"@pytest.mark.{MARKER} on {item.name} serves its cassette to the {MARKER} fixture, "
            f"which the test does not ask for: add `{MARKER}` to its arguments",
            pytrace=False,
        )
    try:
        return (yield)
    except (Exception, pytest.fail.Exception):
        _tell(item, "setup", unused=False)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A request that missed the cassette fails the test, saying what was closest."""
    try:
        result = yield
    except (Exception, pytest.fail.Exception):
        # The test failed on its own (most likely because of the miss): keep its error,
        # and add what the cassette lacked beside it.
        _tell(item, "call")
        raise
    problems = _problems(item)
    if problems:
        pytest.fail(problems, pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Any:
    """A miss in a fixture's teardown, after the test ran, fails the teardown."""
    try:
        result = yield
    except (Exception, pytest.fail.Exception):
        _tell(item, "teardown", unused=False)
        raise
    problems = _problems(item, unused=False)
    if problems:
        pytest.fail(problems, pytrace=False)
    return result


def _tell(item: pytest.Item, when: str, *, unused: bool = True) -> None:
    problems = _problems(item, unused=unused)
    if problems:
        item.add_report_section(when, "tasktape", problems)


def _problems(item: pytest.Item, *, unused: bool = True) -> str | None:
    """What the test's tape has to say that was not said yet (it is then said)."""
    tape = item.stash.get(_TAPE, None)
    if tape is None:
        return None
    problems = tape.problems(since=item.stash.get(_TOLD, 0), unused=unused)
    item.stash[_TOLD] = len(tape.missed)
    return problems
