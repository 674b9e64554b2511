"""Shipping a log's committed rows to NATS JetStream, through an outbox cursor.

The shipper follows the local log, never the traffic: rows the writer committed past the
cursor are taken from the writer's hints (chunks and events, see ``hints``) or read in one
snapshot of the log (the rest, and what has no hint), published (a window of messages at
a time, each until JetStream acknowledges it, the same message again after an unanswered
publish), and only then is the cursor moved on, saved in the log's ``shipments`` table
every few seconds. A broker that is slow or down leaves the rows in the log, where they
wait; they go out when it is back, from where the saved cursor stands, after a restart
too. So when the servers refuse its user and password: it says so once, and asks them again
and again (``Backoff``), until they take them. At-least-once on the wire: what a lost
acknowledgement or an unsaved cursor makes a collector see twice, its sink holds once.

Rows that change after they are written (a capture's end, an exchange's head and end) are
shipped again once they have: the shipper keeps the exchanges it shipped still under way,
and from ``open_from`` on (the first of them), every exchange is looked at again after a
restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors

from tasktape.errors import Unauthorized
from tasktape.eventlog.exchange_rows import utc_iso
from tasktape.eventlog.protocols import ProtocolName

from .hints import HintReader
from .jetstream import FIRST_CONNECT, RETRY, failure, refused, stream_ready
from .names import STREAM, SUBJECTS, shown
from .wire import (
    LOCAL_COLUMNS,
    MSG_ID,
    Message,
    Rows,
    Table,
    encoded,
    first_row,
    message_id,
    subject,
    trimmed,
    wire_columns,
    within,
    without_text,
)

_IN_PROCESS = 10158  # JetStream: "duplicate message id is in process"
ROUND_ROWS = 5000  # rows of a table read in one round at most
POLL = 0.05  # seconds from a round's start to the next one's (unless it read a full round)
IDLE_POLL = 0.5  # and at most this long while rounds find nothing (or until a hint comes)
# Every this long, the stream is asked whether it is still the one the cursor is of: one
# deleted and made again (by a collector) meanwhile takes the rows after the cursor, with
# nothing in its answers to say it is another (its numbers start again, as they may).
RECHECK = 1.0
SAVE_EVERY = 2.0  # seconds between saves of the cursor (a shipper killed sends them again)
HINTED = (Table.STORED_CHUNKS, Table.EVENTS)  # tables the log writer sends hints of
HINT_GRACE = 0.5  # seconds rows wait for their hint before they are read from the log
LOOK_EVERY = 1.0  # with hints coming, seconds between looks at the whole log
WAIT_REPORT = 1.0  # rows waiting longer than this are reported
REPORT_EVERY = 5.0  # and again this often while they wait
WINDOW = 8 << 20  # bytes published before their acknowledgements are awaited


@dataclass
class Cursor:
    """How far a log has been shipped to one destination (a row of ``shipments``)."""

    captures: int = 0  # ids: every capture up to this one was shipped as written
    exchanges: int = 0
    open_from: int = 1  # exchanges from this id on may have changed since they were shipped
    stored_chunks: int = 0  # rowids
    events: int = 0
    resumes: int = 0
    rows: int = 0  # rows shipped in all

    COLUMNS = ("captures", "exchanges", "open_from", "stored_chunks", "events", "resumes", "rows")


@dataclass(frozen=True)
class Backoff:
    """Seconds between tries while the servers refuse the user and password given: ``first``,
    doubling each time, up to ``most`` (a password put right on the servers is taken up by
    then, with no one to ship the log again by hand)."""

    first: float = 1.0
    most: float = 30.0

    def after(self, wait: float | None) -> float:
        """The wait after ``wait`` (None: the first)."""
        return self.first if wait is None else min(wait * 2, self.most)


@dataclass
class ShipStats:
    rows: int = 0  # rows acknowledged by JetStream (this run)
    messages: int = 0
    duplicates: int = 0  # messages JetStream had already (a resend)
    retries: int = 0
    waiting: int = 0  # rows committed and not yet shipped, when last counted
    read_back: int = 0  # chunks and events read from the log, for want of their hints
    rounds: int = 0  # rounds that read what was to ship (shipped it, or found nothing)
    too_large: int = 0  # rows bigger than the servers take (max_payload): not shipped, said loudly
    trimmed: int = 0  # exchanges' rows shipped without their bodies, which alone the servers did not take


def _of(alias: str, columns: list[str]) -> str:
    return ", ".join(f"{alias}.{c}" for c in columns)


def _slices(ids: list[int], size: int = 500) -> Iterator[list[int]]:
    for at in range(0, len(ids), size):
        yield ids[at : at + size]


# A destination's row in shipments: its name, then the stream's identity after a space (no
# stream name holds one); a log shipped before streams were told apart has none.
_CURSOR_ROWS = "(sink = ? OR sink LIKE ? || ' %')"


def saved_cursor(conn: sqlite3.Connection, sink: str = f"nats:{STREAM}") -> tuple[Cursor, str | None] | None:
    """The cursor saved in a log's ``shipments`` table for the destination ``sink`` (by
    default the one ``tasktape record --ship`` ships to), and the identity of the stream it
    is of (None: shipped before streams were told apart); None when nothing was saved."""
    row = conn.execute(
        f"SELECT sink, {', '.join(Cursor.COLUMNS)} FROM shipments WHERE {_CURSOR_ROWS}"
        " ORDER BY shipped_at DESC LIMIT 1",
        (sink, sink),
    ).fetchone()
    return None if row is None else (Cursor(*row[1:]), row[0][len(sink) + 1 :] or None)


def stream_identity(info: Any) -> str:
    """What tells a stream from another of its name (a JetStream ``StreamInfo``): when it
    was made, and in which cluster."""
    cluster = info.cluster.name if info.cluster is not None else None
    return f"{info.created}" if not cluster else f"{info.created}@{cluster}"


@dataclass
class _Round:
    messages: list[Message] = field(default_factory=list)
    cursor: Cursor = field(default_factory=Cursor)
    opened: set[int] = field(default_factory=set)  # exchanges shipped under way this round
    closed: set[int] = field(default_factory=set)  # open exchanges shipped again, ended
    open_captures: set[int] = field(default_factory=set)
    closed_captures: set[int] = field(default_factory=set)
    full: bool = False  # a table had more rows than one round reads
    read_back: int = 0  # chunks and events read from the log, for want of their hints


class Shipper:
    """Ships the log at ``path`` to the JetStream ``stream`` on ``servers``, as the
    destination named ``sink`` in the log's ``shipments`` table. Its row there names the
    stream it was shipped to by when the stream was made (and its cluster): shipping to
    another one (another broker, or the stream made again) starts over from the first row,
    which every sink holds once."""

    def __init__(
        self,
        path: str | Path,
        servers: list[str],
        *,
        stream: str = STREAM,
        subjects: str = SUBJECTS,
        sink: str | None = None,
        on_status: Callable[[str], None] | None = None,
        publish_timeout: float = 2.0,
        hints: HintReader | None = None,
        refused_backoff: Backoff = Backoff(),
        first_connect: float = FIRST_CONNECT,
    ) -> None:
        self.path = Path(path)
        self.servers = servers
        self.stream = stream
        self.subjects = subjects
        self.sink = sink or f"nats:{stream}"
        self.stats = ShipStats()
        self._on_status = on_status or (lambda line: None)
        self._publish_timeout = publish_timeout
        self._hints = hints
        self._backoff = refused_backoff
        self._first_connect = first_connect  # seconds a connection is tried for, each time
        self._refused_wait: float | None = None  # the last wait for servers that refused the credentials
        self._paused = False  # their refusal was said, and not yet that they took them
        self._unhinted: dict[Table, float] = {}  # since when rows of a table wait for a hint
        self._stopping = False
        self._looking = True  # this round reads the whole log
        self._looked_at = 0.0
        # The last look read rows back from the log (or more than a round reads): every round
        # looks, without HINT_GRACE, until one reads none (a backlog goes out at full speed).
        self._catching_up = False
        self._read = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None
        )
        # The cursor is saved every few seconds, when the log writer lets it (never waited
        # for on the event loop, which reads the writer's hints meanwhile), and at the end:
        # each write to the log empties the log writer's page cache.
        self._write = sqlite3.connect(self.path, isolation_level=None)
        self._unsaved = False
        self._saved_at = 0.0
        # Folding the -wal file into the log is the log writer's work, as it is without
        # shipping: the cursor's small commits must not take it on.
        self._write.execute("PRAGMA wal_autocheckpoint = 0")
        # A cursor lost to a power cut only sends rows again, which every sink holds once.
        self._write.execute("PRAGMA synchronous = NORMAL")
        self._selects = {t: self._select(t) for t in Table}
        self._shipped_to: str | None = None  # the stream the cursor is of (stream_identity)
        self._start_at(self._load_cursor())
        self._acked_seq = 0  # the stream's last sequence number this shipper was told of
        # The stream did not answer a publish, or is not the one it was (deleted, or made
        # again): the round stops, and is shipped again after a reconnect.
        self._gone = False
        self._checked_at = time.monotonic()  # when the stream was last asked what it is
        self._nc: Any = None
        self._progress_at = time.monotonic()  # when a round last shipped, or found nothing to
        self._reported_at: float | None = None  # when rows were last said to wait
        # The tables' last rowids as the watch saw them over the last WAIT_REPORT seconds.
        self._ends: deque[tuple[float, list[int]]] = deque()
        self._last_error: BaseException | None = None

    # -- the log ------------------------------------------------------------------------------

    def _select(self, table: Table) -> tuple[str, tuple[str, ...]]:
        """The SELECT of a table's rows as shipped (its rowid, its capture's uid, then the
        values), and the columns the values are of."""
        local = [(row[1], row[2]) for row in self._read.execute(f"PRAGMA table_info({table})")]
        columns = [c for c, _ in wire_columns(local)]
        if table is Table.CAPTURES:
            return f"SELECT t.rowid, t.uid, {_of('t', columns)} FROM captures t", tuple(columns)
        # The uid columns first: the capture's, or the exchange's (and a resume's new one);
        # the capture and the exchange are joined already.
        joined = {"capture_id": "c.uid", "exchange_id": "x.uid"}
        joins = [LOCAL_COLUMNS[c] for c in columns if c in LOCAL_COLUMNS]
        picked = [joined.get(c, f"j{i}.uid") for i, c in enumerate(joins)]
        picked += [f"t.{c}" for c in columns[len(joins) :]]
        outer = " ".join(
            f"LEFT JOIN exchanges j{i} ON j{i}.id = t.{c}" for i, c in enumerate(joins) if c not in joined
        )
        parent = "t" if table is Table.EXCHANGES else "x"
        inner = "" if table is Table.EXCHANGES else "JOIN exchanges x ON x.id = t.exchange_id"
        sql = (
            f"SELECT t.rowid, c.uid, {', '.join(picked)} FROM {table} t {inner}"
            f" JOIN captures c ON c.id = {parent}.capture_id {outer}"
        )
        return sql, tuple(columns)

    def _start_at(self, cursor: Cursor) -> None:
        self.cursor = cursor
        # Every exchange from open_from on may have changed since it was shipped.
        self._open = set(range(cursor.open_from, cursor.exchanges + 1))
        self._open_captures = set(range(1, cursor.captures + 1))

    def _load_cursor(self) -> Cursor:
        saved = saved_cursor(self._read, self.sink)
        if saved is None:
            return Cursor()
        cursor, self._shipped_to = saved
        return cursor

    def _save_when_due(self) -> None:
        if self._unsaved and time.monotonic() - self._saved_at >= SAVE_EVERY:
            self._save_cursor(self.cursor)

    def _save_cursor(self, cursor: Cursor, *, wait: float = 0.0) -> None:
        """Save the cursor, waiting at most ``wait`` seconds for the log writer's lock;
        if it does not come, the cursor is saved later."""
        names = ", ".join(Cursor.COLUMNS)
        marks = ", ".join("?" * len(Cursor.COLUMNS))
        news = ", ".join(f"excluded.{c}" for c in Cursor.COLUMNS)
        row = self.sink if self._shipped_to is None else f"{self.sink} {self._shipped_to}"
        self._write.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
        try:
            self._write.execute(
                f"INSERT INTO shipments (sink, {names}, shipped_at) VALUES (?, {marks}, ?)"
                f" ON CONFLICT(sink) DO UPDATE SET ({names}, shipped_at) = ({news}, excluded.shipped_at)",
                (row, *(getattr(cursor, c) for c in Cursor.COLUMNS), utc_iso(time.time_ns())),
            )
            # The cursor of the stream shipped to before, if another: it was started over.
            self._write.execute(
                f"DELETE FROM shipments WHERE {_CURSOR_ROWS} AND sink != ?", (self.sink, self.sink, row)
            )
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode not in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or wait:
                raise
            self._unsaved = True
        else:
            self._unsaved = False
            self._saved_at = time.monotonic()

    def waiting(self) -> int:
        """Rows committed to the log and not yet shipped (changed rows not counted)."""
        return self._waiting(self._last_rowids())

    def _waiting(self, ends: list[int]) -> int:
        return sum(max(end - getattr(self.cursor, t), 0) for t, end in zip(Table, ends, strict=True))

    def _last_rowids(self) -> list[int]:
        """Each table's last rowid, in the order of ``Table``."""
        ends = ", ".join(f"(SELECT coalesce(max(rowid), 0) FROM {t})" for t in Table)
        return list(self._read.execute(f"SELECT {ends}").fetchone())

    def _read_round(self) -> _Round:
        """What is to be shipped now, read in one snapshot, as messages in the order they
        must go (a capture before its exchanges, an exchange before its rows).

        While the log writer sends hints, the log itself is read only when the writer
        says it wrote other rows than chunks and events, and once every LOOK_EVERY
        seconds: a reader keeps SQLite from starting its -wal file over, and the writer
        slows as the file grows. A look that reads rows back (a backlog no hint holds)
        is followed by another each round, until one reads none."""
        r = _Round(cursor=Cursor(**{c: getattr(self.cursor, c) for c in Cursor.COLUMNS}))
        hints, now = self._hints, time.monotonic()
        self._looking = (
            hints is None
            or not hints.open
            or self._stopping
            or self._catching_up
            or now - self._looked_at >= LOOK_EVERY
        )
        changed = self._looking or (hints is not None and hints.changed)
        if hints is not None:
            hints.changed = False
        if not changed:
            for table in HINTED:
                self._read_table(r, table)
            return r
        if self._looking:
            self._looked_at = now
        self._read.execute("BEGIN")
        try:
            for table in Table:
                self._read_table(r, table)
        finally:
            self._read.execute("COMMIT")
        if self._looking:
            self._catching_up = r.full or r.read_back > 0
        return r

    def _read_table(self, r: _Round, table: Table) -> None:
        select, columns = self._selects[table]
        start = getattr(r.cursor, table)
        bound = ""
        if self._hints is not None and table in HINTED:
            while (hint := self._hints.take(table, start + 1)) is not None:
                r.messages += hint.messages
                start = hint.last
            if start > getattr(r.cursor, table):
                self._unhinted.pop(table, None)
                setattr(r.cursor, table, start)
                return
            if not self._looking or not (self._catching_up or self._overdue(table, start)):
                return
            self._unhinted.pop(table, None)
            until = self._hints.next_first(table, start)
            bound = "" if until is None else f" AND t.rowid < {until}"
        new = self._read.execute(
            f"{select} WHERE t.rowid > ?{bound} ORDER BY t.rowid LIMIT {ROUND_ROWS}", (start,)
        )
        rows = new.fetchall()
        r.full |= len(rows) == ROUND_ROWS
        if table in HINTED:
            r.read_back += len(rows)
            self.stats.read_back += len(rows)
        if rows:
            setattr(r.cursor, table, rows[-1][0])
        if table in (Table.CAPTURES, Table.EXCHANGES):
            rows += self._changed(r, table, select, rows)
        by_capture: dict[str, tuple[list[tuple[Any, ...]], list[int]]] = {}
        for row in rows:  # (rowid, capture uid, *values)
            values, rowids = by_capture.setdefault(row[1], ([], []))
            values.append(row[2:])
            rowids.append(row[0])
        for capture, (values, rowids) in by_capture.items():
            r.messages += encoded(Rows(table, capture, columns, values), rowids)

    def _overdue(self, table: Table, shipped: int) -> bool:
        """Rows past ``shipped`` have waited for their hint for HINT_GRACE already (or the
        shipper is stopping, and waits no longer)."""
        (end,) = self._read.execute(f"SELECT coalesce(max(rowid), 0) FROM {table}").fetchone()
        if end <= shipped:
            self._unhinted.pop(table, None)
            return False
        since = self._unhinted.setdefault(table, time.monotonic())
        return self._stopping or time.monotonic() - since >= HINT_GRACE

    def _changed(
        self, r: _Round, table: Table, select: str, new: list[tuple[Any, ...]]
    ) -> list[tuple[Any, ...]]:
        """Captures and exchanges shipped under way that have ended since; the new rows
        still under way join them."""
        captures = table is Table.CAPTURES
        ended = "ended_at" if captures else "outcome"
        at = self._selects[table][1].index(ended) + 2
        still, was_open = (r.open_captures, self._open_captures) if captures else (r.opened, self._open)
        closed = r.closed_captures if captures else r.closed
        still.update(row[0] for row in new if row[at] is None)
        changed = [
            row
            for ids in _slices(sorted(was_open))
            for row in self._read.execute(
                f"{select} WHERE t.rowid IN ({', '.join('?' * len(ids))}) AND t.{ended} IS NOT NULL", ids
            )
        ]
        closed.update(row[0] for row in changed)
        return changed

    # -- the broker ---------------------------------------------------------------------------

    async def _connect(self) -> Any:
        """Connected, with the stream there (made if missing), and the cursor of that stream:
        until then, tried again and again."""
        while True:
            try:
                self._nc, (js, identity) = await stream_ready(
                    self.servers,
                    self.stream,
                    self.subjects,
                    self._publish_timeout,
                    then=self._identify,
                    within=self._first_connect,
                )
            except RETRY as exc:
                self._last_error = exc
                await asyncio.sleep(0.25)
                continue
            except Unauthorized as exc:
                self._refused(exc)
                self._refused_wait = self._backoff.after(self._refused_wait)
                await asyncio.sleep(self._refused_wait)
                continue
            self._refused_wait = None
            self._ship_to(identity)
            return js

    def _refused(self, exc: Unauthorized) -> None:
        """The servers refused the credentials: said loudly once, until they take them."""
        self._last_error = exc
        if not self._paused:
            self._paused = True
            self._on_status(
                f"WARNING: shipping paused: {exc}; rows wait in the log, and go out once the servers"
                f" take them (asked again after {self._backoff.first:g} s, then less and less often,"
                f" every {self._backoff.most:g} s at most)"
            )

    def _refused_meanwhile(self) -> None:
        """Said when the servers refuse the credentials as the connection comes back (their
        configuration changed): it tries again by itself."""
        err = self._nc.last_error if self._nc is not None and self._nc.is_reconnecting else None
        if err is not None and refused(err):
            said = str(err).removeprefix("nats: ").strip("'")
            self._refused(Unauthorized(f"{shown(self.servers)} refused the user and password given: {said}"))

    async def _identify(self, js: Any) -> tuple[Any, str]:
        return js, stream_identity(await js.stream_info(self.stream))

    def _ship_to(self, identity: str) -> None:
        """The cursor started over if it is of another stream than ``identity``: rows
        shipped to that one are not in this one."""
        known, self._shipped_to = self._shipped_to, identity
        self._acked_seq, self._checked_at = 0, time.monotonic()
        if known is None or known == identity:
            return
        self._on_status(
            f"shipping: the stream {self.stream} on {shown(self.servers)} is not the one this log was"
            f" shipped to (made {identity}, not {known}): shipping the whole log to it"
        )
        self._start_at(Cursor())  # (rows no hint holds any more are read back from the log)
        self._unsaved = True

    async def _stream_changed(self, js: Any) -> bool:
        """Whether the stream is gone, or made again, since the cursor was of it."""
        try:
            return stream_identity(await js.stream_info(self.stream)) != self._shipped_to
        except nats.js.errors.NotFoundError:
            return True
        except RETRY:  # (the publish finds out what is the matter)
            return False

    async def _reconnect(self) -> Any:
        """The stream again, after it did not answer a publish, or numbered a message
        lower than one before: deleted, or made again (by another shipper or a collector)."""
        if self._nc is not None:
            with contextlib.suppress(*RETRY):
                await self._nc.close()
        return await self._connect()

    async def _publish_all(self, js: Any, messages: list[Message]) -> int:
        """Every message of a round, until JetStream has each; returns how many rows were
        left out (bigger than the servers take). They go out a window at a time, and the
        window's acknowledgements are awaited together: a round trip each would pace
        shipping by the brokers' latency."""
        left_out, window, size = 0, [], 0
        for m in messages:
            parts, out = self._fitting(m)
            left_out += out
            for part in parts:
                window.append(part)
                size += len(part.payload)
                if size >= WINDOW:
                    left_out += await self._publish_window(js, window)
                    window, size = [], 0
                    if self._gone:
                        return left_out
        if window:
            left_out += await self._publish_window(js, window)
        return left_out

    async def _publish_window(self, js: Any, parts: list[Message]) -> int:
        """``parts`` published at once; each that fails, or has no acknowledgement within
        the publish timeout, published again on its own (the same message id: JetStream
        stores it once). Sinks take messages in any order."""
        sent: list[asyncio.Future[Any] | None] = []
        for part in parts:
            try:
                future = await js.publish_async(
                    subject(self.subjects, part.table, part.capture),
                    part.payload,
                    headers={MSG_ID: message_id(part)},
                )
            except (*RETRY, nats.errors.MaxPayloadError) as exc:
                self._last_error, future = exc, None
            sent.append(future)
        waiting = [f for f in sent if f is not None]
        if waiting:
            await asyncio.wait(waiting, timeout=self._publish_timeout)
        # Every answer read now (one left unread is logged as lost when the round is given
        # up midway); those that did not come in time, given up on, and published again below.
        answers: dict[asyncio.Future[Any] | None, BaseException | None] = {}
        for future in waiting:
            if future.done() and not future.cancelled():
                answers[future] = future.exception()
            else:
                future.cancel()
        again: list[Message] = []
        for part, future in zip(parts, sent, strict=True):
            if self._gone:
                break
            if future in answers and answers[future] is None:
                self._acknowledged(part, future.result())
                continue
            if answers.get(future) is not None:  # it failed: why, for the report of rows waiting
                self._last_error = answers[future]
            again.append(part)
        # Published again once every answer is in: a part stored now comes after the window's
        # others in the stream, and its number taken before theirs would look like a stream
        # made again (a reconnect, and the round shipped again, for nothing).
        left_out = 0
        for part in again:
            if self._gone:
                break
            self.stats.retries += 1
            left_out += await self._publish(js, part)
        return left_out

    async def _publish(self, js: Any, m: Message) -> int:
        """Until JetStream has the message, in parts if it is bigger than the servers take;
        the rows it holds that no server takes, alone, are left out, loudly. Returns how
        many were left out."""
        parts, left_out = self._fitting(m)
        for part in parts:
            if self._gone:
                break
            try:
                await self._publish_part(js, part)
            except nats.errors.MaxPayloadError:  # a server that takes less than the last one
                left_out += await self._publish(js, part)
        return left_out

    def _fitting(self, m: Message) -> tuple[list[Message], int]:
        """``m`` in parts the servers take, and how many rows were left out: a row alone
        bigger than they take, loudly (it stays in the log)."""
        limit, parts, left_out = self._nc.max_payload, [], 0
        for part in within(m, limit):
            if len(part.payload) <= limit:
                parts.append(part)
                continue
            cut = self._cut(part, limit)
            if cut is not None:
                parts.append(cut)
                continue
            left_out += 1
            self.stats.too_large += 1
            self._on_status(
                f"WARNING: {first_row(part)}, {len(part.payload):,} bytes"
                f" encoded) is bigger than the servers take (max_payload {limit:,}): it stays in the"
                " log and is not shipped; raise max_payload on the servers to ship rows this large"
            )
        return parts, left_out

    def _cut(self, part: Message, limit: int) -> Message | None:
        """A row alone bigger than the servers take, as one they take, if it can be: an
        event's without the text a collector derives again from its data, an exchange's
        without its bodies (said)."""
        untexted = without_text(part, limit, self._protocol_of)
        if untexted is not None:
            return untexted
        cut = trimmed(part, limit)
        if cut is not None:
            self.stats.trimmed += 1
            self._on_status(
                f"{first_row(part)}, {len(part.payload):,} bytes encoded) is bigger"
                f" than the servers take (max_payload {limit:,}): shipped without its bodies, flagged"
                " as cut (the log keeps them)"
            )
        return cut

    def _protocol_of(self, exchange: str) -> ProtocolName | None:
        """The built-in protocol the exchange ``exchange`` (a uid) speaks, if any: a collector
        that knows ``TEXT_FROM`` knows how each derives an event's text."""
        row = self._read.execute("SELECT protocol FROM exchanges WHERE uid = ?", (exchange,)).fetchone()
        return ProtocolName(row[0]) if row is not None and row[0] in set(ProtocolName) else None

    async def _publish_part(self, js: Any, m: Message) -> None:
        """Until JetStream has the message (the same message id each time)."""
        payload, headers = m.payload, {MSG_ID: message_id(m)}
        to = subject(self.subjects, m.table, m.capture)
        delay = 0.05
        while True:
            try:
                ack = await js.publish(to, payload, headers=dict(headers))
            except nats.js.errors.NoStreamResponseError:
                self._gone = True
                return
            except nats.js.errors.APIError as exc:
                if exc.err_code != _IN_PROCESS:
                    raise
                # The same message is being stored (an earlier publish, unanswered): ask again.
                self.stats.retries += 1
                self._last_error = exc
                await asyncio.sleep(delay)
                continue
            except RETRY as exc:
                self.stats.retries += 1
                self._last_error = exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self._acknowledged(m, ack)
            return

    def _acknowledged(self, m: Message, ack: Any) -> None:
        if not ack.duplicate:  # (a duplicate's is the first copy's)
            if ack.seq < self._acked_seq:  # a stream made again, or a resend stored later
                self._gone = True
                return
            self._acked_seq = ack.seq
        self.stats.messages += 1
        self.stats.duplicates += bool(ack.duplicate)
        self.stats.rows += m.rows

    async def _watch(self) -> None:
        """Say how many rows wait once no round has shipped them for a second, or rows
        committed a second ago still wait though rounds ship (a backlog going out), again
        every few seconds while they do, and when they have all gone out."""
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            stalled = now - self._progress_at >= WAIT_REPORT
            if stalled:
                self._refused_meanwhile()
            ends = self._last_rowids()
            behind = self._behind(now, ends)
            waiting = self._waiting(ends)
            if not waiting or not (stalled or behind):
                if self._reported_at is not None and not stalled:
                    self._caught_up()
                continue
            if self._reported_at is None or now - self._reported_at >= REPORT_EVERY:
                self._reported_at = now
                self._say_waiting(waiting, stalled)

    def _behind(self, now: float, ends: list[int]) -> bool:
        """Whether rows committed WAIT_REPORT seconds ago (``ends`` the tables' last rowids
        now) are not all shipped yet."""
        self._ends.append((now, ends))
        while len(self._ends) > 1 and now - self._ends[1][0] >= WAIT_REPORT:
            self._ends.popleft()
        at, then = self._ends[0]
        return now - at >= WAIT_REPORT and any(
            getattr(self.cursor, t) < end for t, end in zip(Table, then, strict=True)
        )

    def _say_waiting(self, waiting: int, stalled: bool) -> None:
        why = self._last_error
        if not stalled:
            reason = "catching up"
        elif why:
            reason = failure(why)
        else:
            reason = "connecting" if self._nc is None else "not acknowledged yet"
        rows = f"{waiting:,} row waits" if waiting == 1 else f"{waiting:,} rows wait"
        self._on_status(f"shipping: {rows} for {shown(self.servers)} ({reason})")

    def _caught_up(self) -> None:
        self._reported_at = None
        self._on_status(f"shipping: caught up ({self.cursor.rows:,} rows shipped in all)")

    def _shipped(self) -> None:
        """A round shipped all it found, or found nothing."""
        self._progress_at = time.monotonic()
        self._last_error = None
        if self._paused:
            self._paused = False
            self._on_status(f"shipping: {shown(self.servers)} took the user and password: shipping again")
        if self._reported_at is not None and not self.waiting():
            self._caught_up()

    # -- running ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, drain: float = 10.0) -> ShipStats:
        """Ship until ``stop`` is set, then for at most ``drain`` seconds more, until every
        row committed by then is shipped. What is left waits in the log, for the next run."""
        shipping = asyncio.ensure_future(self._ship(stop))
        stopped = asyncio.ensure_future(stop.wait())
        watching = asyncio.ensure_future(self._watch())
        try:
            await asyncio.wait([shipping, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not shipping.done():
                await asyncio.wait([shipping], timeout=drain)
            if shipping.done():
                shipping.result()  # raise what went wrong
        finally:
            for task in (shipping, stopped, watching):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._unsaved:
                self._save_cursor(self.cursor, wait=10.0)
            self.stats.waiting = self.waiting()
            if self._nc is not None:
                with contextlib.suppress(*RETRY):
                    await self._nc.close()
        return self.stats

    async def _ship(self, stop: asyncio.Event) -> None:
        """Rounds, until one finds nothing to ship once ``stop`` is set."""
        if self._hints is not None:
            self._hints.start()
        js = await self._connect()
        idle = POLL
        while True:
            self._stopping = stop.is_set()
            started = time.monotonic()
            if self._hints is not None:
                self._hints.arrived.clear()
            r = self._read_round()
            self.stats.rounds += 1
            if started - self._checked_at > RECHECK:
                self._checked_at = started
                if await self._stream_changed(js):
                    js = await self._reconnect()  # (the cursor starts over) and the round again
                    continue
            if r.messages:
                left_out = await self._publish_all(js, r.messages)
                if self._gone:
                    self._gone = False
                    js = await self._reconnect()  # and the round again, from where the cursor is
                    continue
                self._advance(r, left_out)
            elif stop.is_set():
                self._shipped()
                return
            self._shipped()
            self._save_when_due()
            # A round costs a few queries: rounds come at most every POLL
            # seconds (rows gather meanwhile), but back to back through a backlog; while
            # there is nothing to ship, less and less often, unless a hint comes.
            idle = POLL if r.messages else min(idle * 2, IDLE_POLL)
            if not r.full and not stop.is_set():
                await self._pause(stop, (POLL if r.messages else idle) - (time.monotonic() - started))

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        """Until ``stop`` is set, or ``seconds`` have passed, or (when idle) a hint comes."""
        wakers = [asyncio.ensure_future(stop.wait())]
        if self._hints is not None and seconds > POLL:
            wakers.append(asyncio.ensure_future(self._hints.arrived.wait()))
        try:
            await asyncio.wait(wakers, timeout=max(seconds, 0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waker in wakers:
                waker.cancel()

    def _advance(self, r: _Round, left_out: int) -> None:
        r.cursor.rows = self.cursor.rows + sum(m.rows for m in r.messages) - left_out
        self._open = (self._open - r.closed) | r.opened
        self._open_captures = (self._open_captures - r.closed_captures) | r.open_captures
        r.cursor.open_from = min(self._open, default=r.cursor.exchanges + 1)
        self.cursor = r.cursor
        self._unsaved = True
        if self._hints is not None:
            for table in HINTED:
                self._hints.forget(table, getattr(r.cursor, table))

    def close(self) -> None:
        self._read.close()
        self._write.close()
