"""A slice of a fleet's ClickHouse record brought into a local event log (``tasktape
pull``), to browse with Datasette and replay: the exchanges of a task, of a context, or of
a time range, with their captures, chunks, events and resumes, written as a collector
writes them (so pulling the same slice again adds nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tasktape.errors import UsageError
from tasktape.eventlog.exchange_rows import stored_body
from tasktape.eventlog.uids import read_time

from .clickhouse_sink import TABLES, ClickHouseSink, answered, blob_columns, shown
from .sqlite_sink import Applied, SqliteSink
from .wire import Rows, Table

# A row's nanoseconds since the epoch, as ClickHouse keeps them (Int64).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Slice:
    """Which exchanges: of a task, of a context, or started in ``[since, until)``."""

    task: str | None = None
    context: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        chosen = [self.task is not None, self.context is not None, (self.since or self.until) is not None]
        if sum(chosen) != 1:
            raise UsageError("choose one slice: a task, a context, or a time range (since and/or until)")
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise UsageError(
                f"until ({self.until.isoformat()}) is not after since ({self.since.isoformat()}):"
                " the range holds no time"
            )

    def exchange_uids(self, sink: ClickHouseSink) -> list[str]:
        db = sink.database
        if self.task is not None or self.context is not None:
            column = "task_id" if self.task is not None else "context_id"
            sql = (
                f"SELECT uid FROM {db}.exchanges FINAL WHERE {column} = {{v:String}}"
                f" UNION DISTINCT SELECT exchange_uid FROM {db}.events FINAL WHERE {column} = {{v:String}}"
            )
            found = sink.client.query(sql, parameters={"v": self.task or self.context})
        else:
            found = sink.client.query(
                f"SELECT uid FROM {db}.exchanges FINAL"
                " WHERE started_ns >= {a:Int64} AND started_ns < {b:Int64}",
                parameters={"a": _ns(self.since, INT64_MIN), "b": _ns(self.until, INT64_MAX)},
            )
        return sorted(row[0] for row in found.result_rows)


def parse_time(text: str) -> datetime:
    """An ISO 8601 time; UTC unless it says otherwise."""
    moment = read_time(text)
    if moment is None:
        raise UsageError(f"{text!r} is not an ISO 8601 time (2026-12-01T09:00:00Z)")
    return moment


def _ns(moment: datetime | None, default: int) -> int:
    """``moment`` in nanoseconds since the epoch, exactly (a float's would be off by
    microseconds, and past 2262 overflow Int64), held to the range a row's time has."""
    if moment is None:
        return default
    ns = (moment - _EPOCH) // timedelta(microseconds=1) * 1000
    return min(max(ns, INT64_MIN), INT64_MAX)


def pull_slice(url: str, chosen: Slice, output: str | Path) -> Applied:
    """Bring the exchanges ``chosen`` of the ClickHouse at ``url`` into the log ``output``
    (the ClickHouse side only read: what no collector made there is not made)."""
    with ClickHouseSink(url, create=False) as sink, answered(url):
        uids = chosen.exchange_uids(sink)
        if not uids:
            raise UsageError(f"nothing in {shown(url)} matches the slice chosen")
        # With the reconnects and rejoins of their streams, which the resumes name.
        uids = sorted({*uids, *_resumed_by(sink, uids)})
        exchanges = _rows(sink, Table.EXCHANGES, "uid", uids, "started_ns, uid")
        at = exchanges.columns.index("capture_uid")
        captures = sorted({row[at] for row in exchanges.rows})
        capture_of = {row[exchanges.columns.index("uid")]: row[at] for row in exchanges.rows}
        messages = [_rows(sink, Table.CAPTURES, "uid", captures, "uid"), exchanges]
        for table in (Table.STORED_CHUNKS, Table.EVENTS, Table.RESUMES):
            order = "exchange_uid, at_ns" if table is Table.RESUMES else "exchange_uid, seq"
            messages.append(_rows(sink, table, "exchange_uid", uids, order))
    # One message per table and capture, as a collector gets them.
    split: list[Rows] = []
    for m in messages:
        by_capture: dict[str, list[tuple[Any, ...]]] = {}
        named = {Table.CAPTURES: "uid", Table.EXCHANGES: "capture_uid"}.get(m.table)
        key = m.columns.index(named or "exchange_uid")
        for row in m.rows:
            capture = row[key] if named else capture_of[row[key]]
            by_capture.setdefault(capture, []).append(row)
        split += [Rows(m.table, capture, m.columns, rows) for capture, rows in by_capture.items()]
    with SqliteSink(output) as local:
        return local.apply(split)


def _resumed_by(sink: ClickHouseSink, uids: list[str]) -> list[str]:
    found = sink.client.query(
        f"SELECT new_exchange_uid FROM {sink.database}.resumes FINAL"
        " WHERE exchange_uid IN {keys:Array(String)} AND new_exchange_uid IS NOT NULL",
        parameters={"keys": uids},
    )
    return [row[0] for row in found.result_rows]


def _rows(sink: ClickHouseSink, table: Table, key: str, values: Sequence[str], order: str) -> Rows:
    columns = sink.columns[table]
    names = [c for c, _ in columns]
    blobs = blob_columns(columns)
    found = sink.client.query(
        f"SELECT {', '.join(names)} FROM {sink.database}.{TABLES[table][0]} FINAL"
        f" WHERE {key} IN {{keys:Array(String)}} ORDER BY {order}",
        parameters={"keys": list(values)},
        column_formats=dict.fromkeys(blobs, "bytes"),
    )
    # A body was kept as text where it was UTF-8, as the log keeps it; a chunk as bytes.
    bodies = [names.index(c) for c in blobs if table is Table.EXCHANGES]
    rows = [list(row) for row in found.result_rows]
    for row in rows:
        for i in bodies:
            row[i] = stored_body(row[i])
    return Rows(table, "", tuple(names), [tuple(row) for row in rows])
