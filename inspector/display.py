"""How the inspector shows values (task state colours and names, durations in ms, JSON),
reads the numbers in its URLs, and reads a log for a page: as it was at one moment."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from tasktape.eventlog import EventLog
from tasktape.eventlog.a2a_terms import short_state
from tasktape.eventlog.classify import json_or_none
from tasktape.eventlog.protocols import ProtocolName

# One colour per task state, shared by the pages (inspector.css defines the same as CSS
# variables; a test holds the two together) and the charts (a Vega-Lite scale).
STATE_COLOURS = {
    "TASK_STATE_SUBMITTED": "#607d8b",
    "TASK_STATE_WORKING": "#1e88e5",
    "TASK_STATE_COMPLETED": "#2e7d32",
    "TASK_STATE_FAILED": "#c62828",
    "TASK_STATE_REJECTED": "#880e4f",
    "TASK_STATE_CANCELED": "#757575",
    "TASK_STATE_INPUT_REQUIRED": "#ef6c00",
    "TASK_STATE_AUTH_REQUIRED": "#b8860b",
}
UNKNOWN_STATE_COLOUR = "#9e9e9e"
# One colour per protocol, for the charts.
PROTOCOL_COLOURS = {
    ProtocolName.A2A.value: "#00897b",
    ProtocolName.MCP.value: "#1e88e5",
    ProtocolName.OPENAI.value: "#7cb342",
    ProtocolName.ANTHROPIC.value: "#d4813b",
}

T = TypeVar("T")


@dataclass(frozen=True)
class Excerpt(Generic[T]):
    """The first and the last of many rows, and how many between them a page leaves out
    (a page of every row of a big log would take megabytes and seconds to draw)."""

    head: Sequence[T]
    left_out: int
    tail: Sequence[T]


def excerpt(rows: Sequence[T], head: int, tail: int) -> Excerpt[T]:
    """``rows`` whole if there are at most ``head + tail``, else their first and last."""
    if len(rows) <= head + tail:
        return Excerpt(rows, 0, [])
    return Excerpt(rows[:head], len(rows) - head - tail, rows[len(rows) - tail :])


STATE_COLUMNS = frozenset({"state", "final_state"})
NS_COLUMNS = frozenset({"offset_ns", "ttfb_ns", "duration_ns"})
JSON_COLUMNS = frozenset(
    {
        "data",
        "usage",
        "request_headers",
        "response_headers",
        "request_body",
        "response_body",
        "argv",
        "task",
        "synthesized",
    }
)


def state_class(state: str | None) -> str:
    """The CSS class of a state's colour (``tt-s-completed``); unknown states get ``tt-s-other``."""
    if state in STATE_COLOURS:
        return "tt-s-" + short_state(state).lower().replace("_", "-")
    return "tt-s-other"


def ms(ns: float | None, digits: int = 1) -> str:
    """Nanoseconds as milliseconds for people: ``1382087899`` -> ``1,382.1 ms``."""
    if ns is None:
        return "-"
    return f"{ns / 1e6:,.{digits}f} ms"


def ms_or_none(ns: int | None) -> float | None:
    """Nanoseconds as milliseconds, for a page's numbers (None stays None)."""
    return None if ns is None else ns / 1e6


def pretty_json(value: Any) -> str | None:
    """Indented JSON when ``value`` is a JSON object or array (as text), else None: JSON
    nested too deep to indent is shown as it is."""
    if not isinstance(value, str) or not value.lstrip().startswith(("{", "[")):
        return None
    try:
        pretty = json.dumps(json.loads(value), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return None
    # A lone surrogate (JSON may escape one) is no character a page can send: escaped again.
    return pretty.encode("utf-8", "backslashreplace").decode("utf-8")


def parse_json(data: Any) -> Any:
    """Parsed JSON, or None for anything that is not JSON text (or UTF-8 bytes of it)."""
    return json_or_none(data) if isinstance(data, str | bytes) else None


def row_number(text: str) -> int | None:
    """A URL's row number (an exchange's, a capture's), or None: not one the log can hold
    (ASCII digits only, up to SQLite's largest INTEGER)."""
    if not (text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if number < 2**63 else None


@contextmanager
def one_moment(path: str | Path) -> Iterator[EventLog]:
    """The log, every read of it in one read transaction: a recorder may be writing it
    while a page is read, and a page read over several moments disagrees with itself (the
    events it lists, and those task_summary counts)."""
    with EventLog(path) as log:
        conn = log.db.conn
        conn.execute("BEGIN")  # deferred: the first read fixes the rows every later one sees
        try:
            yield log
        finally:
            conn.rollback()  # (it only read)
