"""The rows a log writer hands its shipper as it commits them (hints): the same rows the
log holds, and shipping through them, with the log read for whatever they leave out, ships
every row exactly once."""

from __future__ import annotations

import asyncio
import math
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from fleet_runs import collect_until, raw_messages, raw_rows
from log_rows import MS, SSE, shipped_rows, write_log
from nats_servers import NatsCluster

from tasktape.eventlog import LogWriter
from tasktape.fleet.hints import HintReader, HintSender
from tasktape.fleet.names import parse_servers
from tasktape.fleet.shipper import ROUND_ROWS, Shipper
from tasktape.fleet.wire import Rows, Table, decode

HINTED = (Table.STORED_CHUNKS, Table.EVENTS)


def write_streams(w: LogWriter, name: str, events: int = 30) -> None:
    """Two captures whose exchanges interleave (so one batch holds rows of both): a
    stream each, one event a chunk then an event cut across two chunks, and a JSON answer
    (a chunk stored as it came)."""
    caps = [w.begin_capture(source="record", upstream=f"http://{name}{i}") for i in range(2)]
    streams = []
    for cap in caps:
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        streams.append(ex)
    for n in range(events):
        for ex in streams:
            w.chunk(ex, (n + 1) * MS, f'data: {{"n": {n}, "text": "{name} \u00e9"}}\n\n'.encode())
    for ex in streams:
        w.chunk(ex, 90 * MS, b'data: {"cut": ')
        w.chunk(ex, 91 * MS, b"true}\n\n")
        w.end_exchange(ex, duration_ns=100 * MS)
    get = w.begin_exchange(caps[0], method="GET", path="/tasks/t1", started_ns=time.time_ns())
    w.response_head(get, status=200, headers={"content-type": "application/json"}, is_sse=False, ttfb_ns=MS)
    w.chunk(get, MS, b'{"id": "t1"}')
    w.end_exchange(get, duration_ns=2 * MS)
    for cap in caps:
        w.end_capture(cap)


def log_rows(log: Path, table: Table) -> list[dict[str, Any]]:
    """The rows of a table as the log holds them, their exchange named by uid."""
    db = sqlite3.connect(log)
    uids = dict(db.execute("SELECT id, uid FROM exchanges"))
    cursor = db.execute(f"SELECT * FROM {table}")
    columns = [d[0] for d in cursor.description]
    rows = [dict(zip(columns, row, strict=True)) for row in cursor]
    db.close()
    for row in rows:
        row["exchange_uid"] = uids[row.pop("exchange_id")]
    return sorted(rows, key=_by_value)


def _by_value(row: dict[str, Any]) -> str:
    return repr(sorted(row.items()))


def message_rows(messages: list[Rows]) -> list[dict[str, Any]]:
    return sorted((dict(zip(m.columns, row, strict=True)) for m in messages for row in m.rows), key=_by_value)


async def held_hints(reader: HintReader, log: Path) -> dict[Table, list[Any]]:
    """Every hint of the log's chunks and events, in rowid order (waiting for them)."""
    db = sqlite3.connect(log)
    ends = {t: db.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0] for t in HINTED}
    db.close()
    found: dict[Table, list[Any]] = {t: [] for t in HINTED}
    deadline = time.monotonic() + 10
    for table in HINTED:
        at = 0
        while at < ends[table]:
            assert time.monotonic() < deadline, f"no hint of {table} from rowid {at + 1}"
            hint = reader.take(table, at + 1)
            if hint is None:
                await asyncio.sleep(0.01)
                continue
            found[table].append(hint)
            at = hint.last
    return found


async def test_hints_hold_the_rows_the_log_holds_one_capture_a_message(tmp_path: Path) -> None:
    log = tmp_path / "a.db"
    read_end, write_end = os.pipe()
    reader = HintReader(read_end)
    reader.start()
    try:
        with LogWriter(log, tap=HintSender(write_end)) as w:
            write_streams(w, "a")
        hints = await held_hints(reader, log)
    finally:
        reader.close()
    captures = dict(sqlite3.connect(log).execute("SELECT uid, id FROM captures"))
    for table in HINTED:
        messages = [m for hint in hints[table] for m in hint.messages]
        assert hints[table], table
        rows = [decode(m.payload) for m in messages]
        # Exactly the log's rows, every column (a NULL is None again, not the NaN the writer binds).
        assert message_rows(rows) == log_rows(log, table), table
        for m, decoded in zip(messages, rows, strict=True):
            assert m.capture in captures and decoded.capture == m.capture
            assert m.rows == len(decoded.rows) and m.first <= m.last
        # Each message holds one capture's rows, and some batch held both captures'.
    assert len({m.capture for h in hints[Table.EVENTS] for m in h.messages}) == 2
    assert any(len({m.capture for m in h.messages}) == 2 for h in hints[Table.EVENTS])


async def test_shipping_takes_hints_and_reads_the_log_for_what_they_leave_out(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    log, fleet = tmp_path / "rec.db", tmp_path / "fleet.db"
    write_log(log, "before")  # rows committed before the shipper started: never hinted
    read_end, write_end = os.pipe()
    reader = HintReader(read_end)
    shipper = Shipper(log, parse_servers(nats_node.url), hints=reader)
    stop = asyncio.Event()
    shipping = asyncio.ensure_future(shipper.run(stop, drain=30))

    def record() -> None:
        with LogWriter(log, tap=HintSender(os.dup(write_end))) as w:
            write_streams(w, "hinted")
        with LogWriter(log) as w:  # a writer that hints nothing, between two that do
            write_streams(w, "unhinted")
        with LogWriter(log, tap=HintSender(os.dup(write_end))) as w:
            write_streams(w, "hinted again")
        os.close(write_end)

    try:
        await asyncio.to_thread(record)
        await asyncio.sleep(1)  # the shipper takes the last hints, as it would while running
        stop.set()
        stats = await shipping
    finally:
        shipper.close()
        reader.close()
    assert stats.waiting == 0 and stats.duplicates == 0
    # The rows before the shipper and those of the writer without hints, read from the log.
    db = sqlite3.connect(log)
    unhinted = db.execute(
        "SELECT (SELECT count(*) FROM events e JOIN exchanges x ON x.id = e.exchange_id"
        "        JOIN captures c ON c.id = x.capture_id WHERE c.upstream LIKE 'http://unhinted%'"
        "           OR c.upstream = 'http://before')"
        " + (SELECT count(*) FROM stored_chunks s JOIN exchanges x ON x.id = s.exchange_id"
        "    JOIN captures c ON c.id = x.capture_id WHERE c.upstream LIKE 'http://unhinted%'"
        "       OR c.upstream = 'http://before')"
    ).fetchone()[0]
    db.close()
    assert stats.read_back == unhinted
    published = await raw_messages(nats_node.url)
    events = [m for m in map(decode, published) if m.table is Table.EVENTS]
    # Every event once: what the hints held was not read from the log as well.
    (in_log,) = sqlite3.connect(log).execute("SELECT count(*) FROM events").fetchone()
    assert sum(len(m.rows) for m in events) == in_log
    hinted = [bool(raw_rows(p).exchanges) for p in published if decode(p).table is Table.EVENTS]
    assert any(hinted) and not all(hinted)
    await collect_until(
        nats_node.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == shipped_rows(log)
    )


async def test_a_backlog_no_hint_holds_goes_out_round_after_round_said_as_it_does(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """Rows committed before the shipper started, while the log writer's hints come (its
    pipe open): once they have waited for hints, every round reads a round's worth of them
    back from the log, until none is left; not one look in two, every LOOK_EVERY seconds.
    The shipper says how many wait while they do, though every round ships."""
    log = tmp_path / "rec.db"
    with LogWriter(log) as w:
        write_streams(w, "before", events=30_000)
    read_end, write_end = os.pipe()
    reader = HintReader(read_end)
    said: list[str] = []
    shipper = Shipper(log, parse_servers(nats_node.url), hints=reader, on_status=said.append)
    backlog = shipper.waiting()
    stop = asyncio.Event()
    shipping = asyncio.ensure_future(shipper.run(stop))
    deadline = time.monotonic() + 120  # (only against a hang: what is asserted is counted)
    try:
        while shipper.waiting():
            assert time.monotonic() < deadline, shipper.stats
            await asyncio.sleep(0.01)
        rounds = shipper.stats.rounds
    finally:
        stop.set()
        await shipping
        shipper.close()
        reader.close()
        os.close(write_end)
    read_back = backlog - 5  # all but the 2 captures and 3 exchanges: chunks and events
    assert shipper.stats.read_back == read_back > 60_000
    # The rounds before the first look that reads (the rows wait HINT_GRACE for their
    # hints), then a read each round, and the one that finds none left.
    assert rounds <= math.ceil(read_back / ROUND_ROWS) + 15, shipper.stats
    assert any(line.startswith("shipping: ") and line.endswith(" (catching up)") for line in said), said
    assert said[-1] == f"shipping: caught up ({backlog:,} rows shipped in all)", said


class FailingTap:
    """A tap that breaks on the first commit it is told of."""

    fds: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.told = 0
        self.closed = False

    def open(self, conn: sqlite3.Connection) -> None:
        pass

    def changed(self) -> None:
        pass

    def committed(self, table: str, columns: Any, rows: list[tuple[Any, ...]], last: int) -> None:
        self.told += 1
        raise OSError("the tap broke")

    def close(self) -> None:
        self.closed = True


def test_a_tap_that_fails_is_told_nothing_more_loudly_and_the_rows_are_kept(
    tmp_path: Path, capfd: Any
) -> None:
    log, tap = tmp_path / "a.db", FailingTap()
    with LogWriter(log, tap=tap) as w:
        write_streams(w, "a", events=5)
        w.flush()
        write_streams(w, "b", events=5)
    assert tap.told == 1 and tap.closed
    assert "stopped telling FailingTap of its commits (OSError: the tap broke)" in capfd.readouterr().err
    (events,) = sqlite3.connect(log).execute("SELECT count(*) FROM events").fetchone()
    assert events == 2 * 2 * 6
