"""Cassettes in any test suite: the ``tasktape`` fixture and marker (loaded by pytest
through the ``pytest11`` entry point; nothing to import).

    @pytest.mark.tasktape("cassettes/answer.jsonl")
    async def test_answer(tasktape):
        events = await my_client(tasktape.url).stream("What does J45.909 mean?")

The fixture serves the cassette (in the test's event loop for pytest-asyncio tests, in a
thread for the others) and fails the test when a request missed it.
``--tasktape-record-mode`` records cassettes through the recording proxy from
``--tasktape-upstream``.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .record_mode import RecordMode

if TYPE_CHECKING:
    from .tape import Tape, TapeOptions, TapeSession

MARKER = "tasktape"
MARKER_OPTIONS = (
    "speed",
    "faults",
    "add_ids",
    "allow_repeats",
    "ignore",
    "redact_headers",
    "redact_json",
    "fail_on_unused",
)
LOOP_SCOPES = ("function", "class", "module", "package", "session")
_TAPE = pytest.StashKey["Tape"]()
_WRITTEN = pytest.StashKey[set[Path]]()


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
        "tasktape(cassette=None, *, speed=0, faults=None, add_ids=False, allow_repeats=False, ignore=(), "
        "redact_headers=(), redact_json=(), fail_on_unused=None): serve this cassette (a path relative to "
        "the test file; by default cassettes/<module>/<test>.jsonl beside it) to the tasktape fixture.",
    )
    try:
        RecordMode.parse(config.getoption("--tasktape-record-mode"))
    except ValueError as exc:
        raise pytest.UsageError(f"--tasktape-record-mode: {exc}") from None
    config.stash[_WRITTEN] = set()


def default_cassette(item: pytest.Item) -> Path:
    """``cassettes/<module>/<Class.>test[params].jsonl`` beside the test module."""
    test_file = Path(item.path)
    name = re.sub(r"[^\w.\-\[\]]", "_", item.name)
    cls = getattr(item, "cls", None)
    prefix = f"{cls.__name__}." if cls else ""
    return test_file.parent / "cassettes" / test_file.stem / f"{prefix}{name}.jsonl"


def _options(request: pytest.FixtureRequest) -> TapeOptions:
    """The marker's word for this test, with the command line's; a mistake fails the test."""
    # Here, not at the top: a run whose tests use no cassette never loads any of it.
    from eventlog.redact import Redactor, parse_pointer  # noqa: PLC0415

    from .faults import FaultError, Faults  # noqa: PLC0415
    from .tape import TapeOptions  # noqa: PLC0415

    marker = request.node.get_closest_marker(MARKER)
    args, kwargs = (marker.args, dict(marker.kwargs)) if marker else ((), {})
    where = f"@pytest.mark.{MARKER}"
    if len(args) > 1:
        pytest.fail(f"{where} takes one cassette path, not {len(args)}", pytrace=False)
    unknown = sorted(set(kwargs) - set(MARKER_OPTIONS))
    if unknown:
        pytest.fail(
            f"{where}: unknown option(s) {', '.join(unknown)}; known: {', '.join(MARKER_OPTIONS)}",
            pytrace=False,
        )
    config = request.config
    fail_on_unused = kwargs.get("fail_on_unused")
    try:
        speed = float(kwargs.get("speed", 0))
        if not 0 <= speed < float("inf"):
            raise ValueError(f"speed must be 0 (as fast as possible) or more, not {speed}")
        faults = kwargs.get("faults")
        ignore = tuple(kwargs.get("ignore", ()))
        for pointer in ignore:
            parse_pointer(pointer)
        redactor = Redactor(kwargs.get("redact_headers", ()), kwargs.get("redact_json", ()))
        return TapeOptions(
            cassette=Path(request.node.path).parent / args[0] if args else default_cassette(request.node),
            mode=RecordMode.parse(config.getoption("--tasktape-record-mode")),
            upstream=config.getoption("--tasktape-upstream"),
            speed=speed,
            faults=Faults.parse(faults) if isinstance(faults, str) else faults,
            add_ids=bool(kwargs.get("add_ids", False)),
            allow_repeats=bool(kwargs.get("allow_repeats", False)),
            ignore=ignore,
            redactor=redactor,
            fail_on_unused=bool(
                config.getoption("--tasktape-fail-on-unused") if fail_on_unused is None else fail_on_unused
            ),
        )
    except (FaultError, ValueError, TypeError) as exc:
        pytest.fail(f"{where}: {exc}", pytrace=False)


def _session(request: pytest.FixtureRequest) -> TapeSession:
    from .tape import TapeSession  # noqa: PLC0415 - see _options

    return TapeSession(_options(request), request.config.stash[_WRITTEN])


async def _started(session: TapeSession) -> Tape:
    from .tape import TapeError  # noqa: PLC0415 - see _options

    try:
        return await session.start()
    except TapeError as exc:
        await session.stop()
        pytest.fail(f"tasktape: {exc}", pytrace=False)


def _loop_fixture(scope: str) -> Any:
    """The tape, served in the event loop pytest-asyncio runs the test in (``scope``)."""

    async def fixture(request: pytest.FixtureRequest) -> AsyncIterator[Tape]:
        session = _session(request)
        tape = await _started(session)
        try:
            yield tape
        finally:
            await session.stop()

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
    if _in_test_loop(request):
        tape = request.getfixturevalue(f"_tasktape_in_{_loop_scope(request)}_loop")
        request.node.stash[_TAPE] = tape
        yield tape
        return
    # Its own loop in a thread: the test may block (a sync client) while the server answers.
    session = _session(request)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tasktape-replay", daemon=True)
    thread.start()
    try:
        tape = asyncio.run_coroutine_threadsafe(_started(session), loop).result()
        request.node.stash[_TAPE] = tape
        yield tape
    finally:
        asyncio.run_coroutine_threadsafe(session.stop(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _in_test_loop(request: pytest.FixtureRequest) -> bool:
    """Whether pytest-asyncio runs this test (anyio and others run theirs in loops of their own)."""
    function = getattr(request.node, "function", None)
    if pytest_asyncio is None or not inspect.iscoroutinefunction(function):
        return False
    if request.node.get_closest_marker("asyncio") is not None:
        return True
    mode = request.config.getoption("asyncio_mode", None) or request.config.getini("asyncio_mode")
    return mode == "auto" and request.node.get_closest_marker("anyio") is None


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
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A request that missed the cassette fails the test, saying what was closest."""
    try:
        result = yield
    except BaseException as exc:
        problems = _problems(item)
        if problems is None or isinstance(exc, pytest.skip.Exception):
            raise
        # The miss is most likely why the test failed: say it first, then what the test said.
        message = f"{problems}\n\nand the test failed: {type(exc).__name__}: {exc}"
    else:
        message = _problems(item)
        if message is None:
            return result
    pytest.fail(message, pytrace=False)


def _problems(item: pytest.Item) -> str | None:
    tape = item.stash.get(_TAPE, None)
    return tape.problems() if tape is not None else None
