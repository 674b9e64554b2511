"""``@pytest.mark.tasktape``: what the marker may say, merged and checked."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import re
from collections.abc import Iterable
from datetime import timedelta
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tasktape.errors import MarkerError, UsageError

from .cassette_age import FORMS, parse_max_age
from .on_expired import OnExpired
from .record_mode import RecordMode

if TYPE_CHECKING:
    from .tape import TapeOptions

MARKER = "tasktape"
TAPES_FIXTURE = "tasktapes"  # a test's named tapes, by name
OPTIONS = (
    "cassette",
    "name",
    "speed",
    "faults",
    "add_ids",
    "allow_repeats",
    "ignore",
    "match_headers",
    "redact_headers",
    "redact_query",
    "redact_json",
    "strict",
    "fail_on_unused",  # strict's older name
    "max_age",
    "in_thread",
    "upstream",
)
SIGNATURE = (
    "tasktape(cassette=None, *, name=None, speed=0, faults=None, add_ids=False, allow_repeats=False, "
    "ignore=(), match_headers=(), redact_headers=(), redact_query=(), redact_json=(), strict=None, "
    "max_age=None, in_thread=False, upstream=None)"
)


_NAME = re.compile(r"[A-Za-z_][\w-]*", re.ASCII)  # a file name's part, and NAME= of --tasktape-upstream
_NAMED_UPSTREAM = re.compile(r"([A-Za-z_][\w-]*)=(.*)", re.ASCII | re.DOTALL)


def tape_names(item: pytest.Item) -> list[str]:
    """The names of the test's named tapes, sorted (the order they start in)."""
    names = {_name(marker.kwargs.get("name")) for marker in item.iter_markers(MARKER)}
    return sorted(name for name in names if name is not None)


def merged(item: pytest.Item, name: str | None = None) -> dict[str, Any]:
    """Every tasktape marker of the tape ``name`` (None: the markers that name no tape) on
    the test, its class and its module: the closest says each option (a module's cassette,
    a test's speed); a subclass's, what its bases' would; a parametrized case's
    (``pytest.param(..., marks=...)``), what its test's would. Two markers of a test, a
    class or a module that say an option otherwise (two cassettes on a test) are a mistake:
    neither is closer."""
    options: dict[str, Any] = {}
    for holder, markers in _levels(item, name):  # the closest first
        said: dict[str, Any] = {}
        for marker in markers:
            for option, value in _given(marker).items():
                if option in said and said[option] != value:
                    raise MarkerError(
                        f"{option} is given twice on {holder}, by two markers ({said[option]!r} and "
                        f"{value!r}): give it once"
                    )
                said[option] = value
                options.setdefault(option, value)
    return options


def _levels(item: pytest.Item, name: str | None) -> list[tuple[str, list[pytest.Mark]]]:
    """The markers of the tape ``name``, by how close they are to the test: its case's, its
    own, its class's, its class's bases', its module's... each with the name of what holds them."""
    ours = (pair for pair in item.iter_markers_with_node(MARKER) if _name(pair[1].kwargs.get("name")) == name)
    levels: list[tuple[str, list[pytest.Mark]]] = []
    for node, pairs in itertools.groupby(ours, key=lambda pair: pair[0]):  # the closest node first
        markers = [marker for _, marker in pairs]
        if isinstance(node, pytest.Class):
            levels += _by_class(node.obj, markers)
            continue
        case = getattr(node, "callspec", None)
        of_case = [m for m in markers if case is not None and m in case.marks]
        if of_case:  # (pytest puts a case's markers after its test's, on one node)
            levels.append((node.name, of_case))
            markers = [m for m in markers if m not in of_case]
        levels.append((node.name, markers))
    return levels


def _by_class(cls: type, markers: list[pytest.Mark]) -> list[tuple[str, list[pytest.Mark]]]:
    """A class node's ``markers`` (pytest gives it its bases' too) by the class that holds
    them, the closest first: the class's own (and any added to its node), then each base's
    along its MRO. A class's own markers clash among themselves, as a test's do."""
    holder: dict[int, type] = {}
    for klass in reversed(cls.__mro__):  # the closest last: it keeps a marker a base holds too
        for mark in _marks_of(klass):
            holder[id(mark)] = klass
    by_class: dict[type, list[pytest.Mark]] = {klass: [] for klass in cls.__mro__}
    for marker in markers:
        by_class[holder.get(id(marker), cls)].append(marker)
    return [(klass.__name__, held) for klass, held in by_class.items() if held]


def _marks_of(cls: type) -> list[pytest.Mark]:
    """The marks a class holds itself (its ``pytestmark``, not its bases'), as pytest reads them."""
    held = cls.__dict__.get("pytestmark", [])
    return [getattr(mark, "mark", mark) for mark in (held if isinstance(held, list) else [held])]


def _given(marker: pytest.Mark) -> dict[str, Any]:
    """The options one marker gives, but its tape's name; its cassette under ``cassette``."""
    given = dict(marker.kwargs)
    given.pop("name", None)
    if len(marker.args) > 1:
        raise MarkerError(f"it takes one cassette path, not {len(marker.args)}")
    if marker.args:
        if "cassette" in given:
            raise MarkerError("the cassette is given twice (as the argument and as cassette=)")
        given["cassette"] = marker.args[0]
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise MarkerError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(OPTIONS)}")
    if "fail_on_unused" in given:
        if "strict" in given:
            raise MarkerError("strict is given twice (as strict= and as fail_on_unused=, its older name)")
        given["strict"] = given.pop("fail_on_unused")
    return given


def tape_options(item: pytest.Item, config: pytest.Config, name: str | None = None) -> TapeOptions:
    """The test's tape ``name`` (None: its unnamed one) as its markers and the command line say."""
    # Here, not at the top: pytest imports the plugin in every run, and a run whose
    # tests use no cassette should not pay for the replay server.
    from tasktape.eventlog.redact import Redactor, parse_pointer  # noqa: PLC0415

    from .faults import Faults  # noqa: PLC0415 - its parser loads the event log's package
    from .tape import TapeOptions  # noqa: PLC0415

    o = merged(item, name)
    cassette = o.get("cassette")
    if cassette is not None and not isinstance(cassette, str | PathLike):
        raise MarkerError(f"the cassette is a path, not {cassette!r}")
    speed = o.get("speed", 0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0 <= speed < float("inf"):
        raise MarkerError(f"speed is 0 (as fast as possible) or a number above it, not {speed!r}")
    faults = o.get("faults")
    if faults is not None and not isinstance(faults, str | Faults):
        raise MarkerError(f"faults are written as a string, such as 'drop-after=3', not {faults!r}")
    ignore = _strings("ignore", o.get("ignore", ()))
    for pointer in ignore:
        parse_pointer(pointer)
    strict = o.get("strict")
    max_age = o.get("max_age")
    return TapeOptions(
        cassette=inside(
            Path(item.path).parent / cassette if cassette is not None else default_cassette(item, name),
            config.rootpath,
        ),
        mode=RecordMode.parse(config.getoption("--tasktape-record-mode")),
        upstream=_upstream(o.get("upstream")) or command_line_upstreams(config).get(name),
        speed=float(speed),
        faults=Faults.parse(faults) if isinstance(faults, str) else faults,
        add_ids=_flag("add_ids", o.get("add_ids", False)),
        allow_repeats=_flag("allow_repeats", o.get("allow_repeats", False)),
        ignore=ignore,
        match_headers=_strings("match_headers", o.get("match_headers", ())),
        redactor=Redactor(
            _strings("redact_headers", o.get("redact_headers", ())),
            _strings("redact_json", o.get("redact_json", ())),
            query=_strings("redact_query", o.get("redact_query", ())),
        ),
        strict=_flag("strict", config.getoption("--tasktape-strict") if strict is None else strict),
        max_age=command_line_max_age(config) if max_age is None else _max_age(max_age),
        on_expired=OnExpired.parse(config.getoption("--tasktape-on-expired")),
        in_thread=_flag("in_thread", o.get("in_thread", False)),
        test=item.nodeid,
        name=name,
    )


def default_cassette(item: pytest.Item, tape: str | None = None) -> Path:
    """``cassettes/<module>/<Outer.Class.>test[params].jsonl`` beside the test module
    (``...test[params].<tape>.jsonl`` for a named tape); a name that had to change to be
    a file name gets a short hash of the original, so two tests never share a cassette
    by accident."""
    raw = item.name
    name = re.sub(r"[^\w.\-\[\]]", "_", raw)
    if name != raw or len(name) > 120:
        name = f"{name[:100]}-{_short_hash(raw)}"
    prefix = "".join(f"{part}." for part in _class_path(item))
    test_file = Path(item.path)
    suffix = f".{tape}" if tape else ""
    return test_file.parent / "cassettes" / test_file.stem / _within_bound(f"{prefix}{name}{suffix}", raw)


# The most bytes a default cassette's file name takes: under the 255 of most file systems,
# with room for what a temporary file beside it adds to the name while it is written.
NAME_BYTES = 200
_EXTENSION = ".jsonl"


def _within_bound(stem: str, raw: str) -> str:
    """``stem.jsonl``, or, when that is over ``NAME_BYTES`` in UTF-8 (classes nest deep,
    a letter of Japanese takes 3 bytes), as much of ``stem`` as fits, cut between letters,
    and a short hash of it whole and of the test's name as written (``raw``: ``stem`` may
    hold it changed), so that two tests cut to the same start keep apart."""
    whole = f"{stem}{_EXTENSION}"
    if len(whole.encode()) <= NAME_BYTES:
        return whole
    tail = f"-{_short_hash(stem + chr(0) + raw)}{_EXTENSION}"
    room = NAME_BYTES - len(tail.encode())
    kept = stem.encode()[:room].decode(errors="ignore")  # (a letter cut in half is dropped)
    return f"{kept}{tail}"


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _class_path(item: pytest.Item) -> list[str]:
    """The classes the test is in, outermost first: ``TestOuter``, ``TestInner``. The
    innermost is named as its class is (as it always was: the cassettes of tests in
    classes that nest in none keep their names); the ones around it as pytest names them."""
    cls = getattr(item, "cls", None)
    if cls is None:
        return []
    outer = [node.name for node in item.listchain() if isinstance(node, pytest.Class)][:-1]
    return [*outer, cls.__name__]


def inside(cassette: Path, root: Path) -> Path:
    """``cassette`` when it stays inside ``root`` (pytest's rootdir) once '..' and symlinks
    are followed: a marker cannot have the plugin read, or record over, any other file."""
    if not cassette.resolve().is_relative_to(root.resolve()):
        raise MarkerError(
            f"the cassette {cassette} is outside the test's directory tree ({root}); keep cassettes under it"
        )
    return cassette


def upstream_option(name: str | None) -> str:
    """The command-line option that gives the tape ``name`` its upstream."""
    return f"--tasktape-upstream {name}=URL" if name else "--tasktape-upstream URL"


def marker_name(name: str | None) -> str:
    """``name=...,`` as the tape ``name``'s marker starts (nothing for the unnamed tape)."""
    return f"name={name!r}, " if name else ""


def command_line_upstreams(config: pytest.Config) -> dict[str | None, str]:
    """``--tasktape-upstream``'s agents: ``URL`` for the unnamed tape, ``NAME=URL`` for the
    tape ``NAME``; the last given for a name wins, as with every option (the command line's
    over ``addopts``')."""
    found: dict[str | None, str] = {}
    for given in config.getoption("--tasktape-upstream") or ():
        named = _NAMED_UPSTREAM.fullmatch(given)
        name, url = (named[1], named[2]) if named else (None, given)
        found[name] = url
    return found


def command_line_max_age(config: pytest.Config) -> timedelta | None:
    given = config.getoption("--tasktape-max-age")
    return None if given is None else parse_max_age(given)


def _max_age(value: Any) -> timedelta:
    """A duration as text (``"30d"``), a number of seconds, or a timedelta."""
    if isinstance(value, str):
        try:
            return parse_max_age(value)
        except UsageError as exc:
            raise MarkerError(f"max_age: {exc}") from None
    if isinstance(value, timedelta) and value >= timedelta(0):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        with contextlib.suppress(OverflowError):  # infinity, or past what a timedelta holds
            return timedelta(seconds=value)
    raise MarkerError(f"max_age is an age such as {FORMS}, or a number of seconds, not {value!r}")


def _upstream(value: Any) -> str | None:
    """The marker's agent to record from, checked as ``--tasktape-upstream`` is (its
    credentials, if any, left out of the error)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise MarkerError(f"upstream is a URL written as a string, not {type(value).__name__}")
    # Here: the recorder (aiohttp) loads only for a test that names an upstream.
    from tasktape.proxy.recorder import upstream_url  # noqa: PLC0415

    try:
        upstream_url(value)
    except UsageError as exc:
        raise MarkerError(f"upstream: {exc}") from None
    return value


def _name(value: Any) -> str | None:
    """A tape's name: letters, digits, ``_`` and ``-`` (it goes into a file name, and
    into ``--tasktape-upstream NAME=URL``)."""
    if value is None or (isinstance(value, str) and _NAME.fullmatch(value)):
        return value
    raise MarkerError(
        f"name is a tape's name (letters, digits, _ and -, starting with a letter or _), not {value!r}"
    )


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise MarkerError(f"{name} is True or False, not {value!r}")
    return value


def _strings(name: str, value: Any) -> tuple[str, ...]:
    """One string, or a list of them (a lone string is one item, never its letters)."""
    if isinstance(value, str):
        return (value,)
    values = list(value) if isinstance(value, Iterable) else [value]
    if all(isinstance(v, str) for v in values):
        return tuple(values)
    raise MarkerError(f"{name} is a string or a list of strings, not {value!r}")
