"""The log writer: operations queued by recorders (see ``producer``) become rows on two
background threads, committed in short batched transactions.

A row-building thread gathers what is queued into one batch for ``max_batch_seconds``
(0.1 s by default) after the batch's first operation, or until a flush or close asks for
its rows, or an exchange has ended and nothing more is queued; a commit thread writes each
batch in one transaction and commits at once, so a row is committed within about one batch
time of being queued. Each commit writes every page it touched again: a token-paced
stream's events are written in transactions of a tenth of a second, not one per event or
two. Python work (decoding, classifying) holds the GIL and SQLite steps without it, but the
commit thread needs the GIL back after every statement (of up to 64 rows, ``RowInserts``)
and waits out the row-building thread's switch interval for it, so the two threads mostly
take turns a batch at a time rather than overlap.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import re
import resource
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from tasktape.errors import LogError, UnknownExchange

from .commit_tap import CommitTap
from .content_coding import MAX_DECODED
from .exchange_rows import (
    CHUNK_COLUMNS,
    EVENT_COLUMNS,
    MAX_BODY,
    NULL,
    ExchangeRows,
    ExchangeSummary,
    Kept,
)
from .exchange_statements import (
    BODY_COLUMNS,
    END_COLUMNS,
    HEAD_COLUMNS,
    UPDATE_BODY,
    UPDATE_END,
    UPDATE_HEAD,
    Statement,
    fold,
)
from .outcomes import Outcome
from .producer import (
    BODY,
    CAPTURE,
    CAPTURE_END,
    CHUNK,
    END,
    EXCHANGE,
    FLUSH,
    HEAD,
    MANY,
    RESUME,
    STOP,
    LogProducer,
    WriterStats,
    check_bound,
    check_options,
    checked_pieces,
)
from .redact import Redactor
from .resumes import INSERT_RESUME
from .row_inserts import RowInserts
from .schema import INDEX_TEXT, INDEXED_THROUGH, check_log_size, open_db
from .writer_lock import release_writer_lock, take_writer_lock

__all__ = ["LogWriter", "WriterStats", "take_back"]

_INSERT_CAPTURE = (
    "INSERT INTO captures (id, uid, started_at, source, upstream, tool_version, argv) VALUES (?,?,?,?,?,?,?)"
)


# What a full log says, on the exchanges it keeps without their bytes and to whoever waits.
LOG_FULL = "the log is full"
# Of a log with a size cap, the part kept for closing the exchanges under way when the rest
# is full: an eighth, at most this much.
_RESERVE = 1024 * 1024
# What SQLite says of a write that failed where it does not say SQLITE_FULL: past the
# process's file size limit (EFBIG), or out of room growing the -shm file or at fsync
# (ENOSPC). Whether the log had no room for it is told by its files and their disk.
_WRITE_ERRORS = frozenset(
    {
        sqlite3.SQLITE_IOERR_WRITE,
        sqlite3.SQLITE_IOERR_FSYNC,
        sqlite3.SQLITE_IOERR_SHMSIZE,
        sqlite3.SQLITE_IOERR_TRUNCATE,
    }
)
# A disk with less than this free for the writer after a failed write is full: what it
# reports free lags what it can give (delayed allocation, its own metadata).
_LOW_ROOM = 1024 * 1024
# What a file of the log grows by at a time, but for its page size: a WAL frame's header
# (24 bytes) with a page, or a region of the -shm file (32 KiB).
_FRAME_HEADER = 24
_SHM_REGION = 32 * 1024


@dataclass(slots=True)
class _Batch:
    """Rows and waiters gathered for one transaction."""

    statements: list[Statement] = field(default_factory=list)
    chunk_rows: list[tuple[Any, ...]] = field(default_factory=list)
    event_rows: list[tuple[Any, ...]] = field(default_factory=list)
    wakers: list[Callable[[], None]] = field(default_factory=list)
    finished: list[tuple[concurrent.futures.Future[ExchangeSummary], ExchangeSummary]] = field(
        default_factory=list
    )
    stop: bool = False
    cleaned: bool = False
    stripped: bool = False  # of what a full log no longer takes
    failed: str | None = None  # why it could not be written
    # Where each exchange inserted in this batch has its INSERT in ``statements``: what
    # follows for it (head, late body, end) is folded into that INSERT.
    inserts: dict[int, int] = field(default_factory=dict)

    def update(self, exchange_id: int, statement: Statement) -> None:
        """An UPDATE of an exchange's row: folded into its INSERT if that is here."""
        at = self.inserts.get(exchange_id)
        if at is None:
            self.statements.append(statement)
        else:
            self.statements[at] = fold(self.statements[at], statement)

    def take(self) -> _Batch:
        """What the batch holds so far, as a batch of its own; this one goes on empty
        (its lists are the same objects, which the rows being built append to)."""
        taken = _Batch(
            self.statements[:], self.chunk_rows[:], self.event_rows[:], self.wakers[:], self.finished[:]
        )
        for part in (self.statements, self.chunk_rows, self.event_rows, self.wakers, self.finished):
            part.clear()
        self.inserts.clear()
        return taken


# An operation that brings more rows than this (a compressed chunk decoding to megabytes)
# has them committed as it goes, so the writer never holds much more than this many.
_SPILL_ROWS = 4096


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: Any) -> Any:
    """A lone surrogate (no UTF-8 spelling) becomes U+FFFD, as invalid UTF-8 does."""
    return _SURROGATE.sub("\ufffd", value) if isinstance(value, str) else value


def _clean_batch(batch: _Batch) -> None:
    batch.statements = [(sql, tuple(map(_clean, params))) for sql, params in batch.statements]
    batch.event_rows = [tuple(map(_clean, row)) for row in batch.event_rows]


class LogWriter(LogProducer):
    """Writes one event log from this process; safe to call from any thread and from the
    event loop::

        w = LogWriter("captures.db")
        cap = w.begin_capture(source="record", upstream="http://agent")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers=headers, is_sse=True, ttfb_ns=1_000_000)
        w.chunk(ex, 2_000_000, b"data: {}\\n\\n")
        summary = w.end_exchange(ex, duration_ns=3_000_000).result()
        w.close()

    Writers still open when the interpreter exits are closed then.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        on_error: Callable[[BaseException, int], None] | None = None,
        max_batch_seconds: float = 0.1,
        busy_timeout: float = 5.0,
        max_bytes: int | None = None,
        redactor: Redactor | None = None,
        max_body: int = MAX_BODY,
        max_decoded: int = MAX_DECODED,
        max_backlog: int = 256 * 1024 * 1024,
        tap: CommitTap | None = None,
    ) -> None:
        """``on_error(exc, rows_lost)`` is called from the writer's threads when rows
        cannot be written (default, or when it raises: a loud line on stderr), and may
        close() the writer; ``busy_timeout`` is how long
        to wait for another process's lock; ``max_bytes`` caps the log file's size (at
        least what an empty log takes, ``least_log_size()``);
        ``redactor`` says what never reaches the log (default: credential headers);
        ``max_body`` caps what is kept of a body that is not an event stream;
        ``max_decoded`` caps how much of an exchange's compressed bodies is decoded (what
        is past it is stored as it came, and the exchange says so);
        ``max_backlog`` is how many chunk bytes may wait for the writer before new chunks
        are dropped (and reported) rather than held in memory; ``tap`` is told of the
        chunks and events of each commit (``CommitTap``)."""
        for name, value, whole, least in (
            ("max_batch_seconds", max_batch_seconds, False, 0),
            ("busy_timeout", busy_timeout, False, 0),
            ("max_body", max_body, True, 0),
            ("max_decoded", max_decoded, True, 0),
            ("max_backlog", max_backlog, True, 0),
        ) + ((("max_bytes", max_bytes, True, 1),) if max_bytes is not None else ()):
            check_bound(name, value, whole=whole, least=least)
        if max_bytes is not None:
            check_log_size(max_bytes)
        check_options(redactor, tap)
        super().__init__(path, on_error, max_backlog)
        self._max_batch = max_batch_seconds
        self._redactor = redactor or Redactor()
        self._max_body = max_body
        self._max_decoded = max_decoded
        self._lock_fd = take_writer_lock(self.path)
        conn = None
        try:
            self._db = open_db(self.path, check_same_thread=False)
            conn = self._conn = self._db.conn
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            self._max_pages: int | None = None
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            self._growth = max(page_size + _FRAME_HEADER, _SHM_REGION)
            if max_bytes is not None:
                self._max_pages = max(1, max_bytes // page_size)
                reserve = min(self._max_pages // 8, _RESERVE // page_size)
                conn.execute(f"PRAGMA max_page_count = {self._max_pages - reserve}")
            (self._indexed_through,) = conn.execute(INDEXED_THROUGH).fetchone()
            self._insert_chunks = RowInserts(conn, "stored_chunks", CHUNK_COLUMNS)
            self._insert_events = RowInserts(conn, "events", EVENT_COLUMNS)
            self.first_ids = (_next_id(conn, "captures"), _next_id(conn, "exchanges"))
            self._tap = tap
            if tap is not None:  # last: nothing after it can fail and leave it open
                tap.open(conn)
        except BaseException:
            # Whatever was opened is released: else the log stays locked (LogBusy) for as
            # long as this process lives.
            if conn is not None:
                conn.close()
            release_writer_lock(self._lock_fd)
            raise
        self._exchanges: dict[int, ExchangeRows] = {}
        # Read and written by the row-building thread only: exchanges whose request could
        # not be turned into rows, and why. They are lost alone: what follows for them is
        # skipped, and their end says so.
        self._unbuilt: dict[int, str] = {}
        # Read and written by the commit thread only. Once the log is full, it takes nothing
        # new: only what closes the exchanges already in it, without their bytes.
        self._full = False
        self._lost: dict[int, str] = {}  # exchanges whose row is not in the log, and why
        self._cut: set[int] = set()  # exchanges in the log that lost bytes to a full log
        self._cut_response: set[int] = set()  # of those, the ones that lost response bytes
        self._full_error: Exception = LogError(LOG_FULL)  # what SQLite said when it was full
        self._batches: queue.Queue[_Batch] = queue.Queue(maxsize=2)
        self._building = _Batch()  # the batch the writer thread is filling
        name = f"tasktape-writer:{self.path.name}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._committer = threading.Thread(target=self._commit_loop, name=f"{name}:commit", daemon=True)
        self._thread.start()
        self._committer.start()
        self._start_ids(*self.first_ids)

    def _alive(self) -> bool:
        return self._thread.is_alive() and self._committer.is_alive()

    def chunks(self, exchange_id: int, pieces: Iterable[tuple[int, bytes]]) -> None:
        """Pieces of one response body, ``(offset_ns, data)`` each, handed to the writer's
        thread as one operation rather than one each, when they fit in the backlog bound
        all together; else one by one, as ``chunk()`` takes them (and drops them)."""
        self._check_open(exchange_id, "chunks()")
        pieces = checked_pieces(pieces)
        if not pieces:
            return
        size = sum(len(data) for _, data in pieces)
        with self._queued_lock:
            fits = self._queued - self._taken + size <= self.max_backlog
            if fits:
                self._queued += size
        if fits:
            self._put((MANY, [(CHUNK, exchange_id, offset_ns, data) for offset_ns, data in pieces]))
        else:
            super().chunks(exchange_id, pieces)

    def put_many(self, ops: list[tuple[Any, ...]]) -> None:
        """Queue operations already in the writer's form (another process's producer sent
        them) as one: a queue hand-over per message rather than per chunk."""
        size = sum(len(op[3]) for op in ops if op[0] == CHUNK)
        with self._queued_lock:
            self._queued += size
        self._put((MANY, ops))

    def _own_threads(self) -> tuple[threading.Thread, ...]:
        return self._thread, self._committer

    def _shutdown(self) -> None:
        self._thread.join()
        self._committer.join()
        self._release_log()

    def _release_log(self) -> None:
        """Once everything is committed: the log file alone holds it, and is released."""
        self._checkpoint()
        if self._tap:
            self._tap.close()
        self._conn.close()
        release_writer_lock(self._lock_fd)

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        batch = _Batch()
        while not batch.stop:
            batch = self._building = _Batch()
            self._apply_safely(get(), batch)
            # Take what comes until the batch has had its time or someone waits for its
            # rows (a flush, close), then commit: transactions stay short under any load,
            # and few while streams trickle. An exchange's end commits as soon as nothing
            # more is queued: at once when it is the last word, and not one transaction an
            # exchange when many come back to back (an import).
            deadline = time.monotonic() + self._max_batch
            while not (batch.stop or batch.wakers):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    op = get_nowait() if batch.finished else get(timeout=left)
                except queue.Empty:
                    break
                self._apply_safely(op, batch)
            self._batches.put(batch)

    def _apply_safely(self, op: tuple[Any, ...], batch: _Batch) -> None:
        """An operation that cannot be turned into rows (a bug, or content nothing
        expected) loses its own rows, loudly, and never stops the writer."""
        try:
            self._apply(op, batch)
        except Exception as exc:
            self._not_applied(op, exc, batch)

    def _not_applied(self, op: tuple[Any, ...], exc: Exception, batch: _Batch) -> None:
        """Say that ``op`` failed, and release whoever waits on it."""
        if not isinstance(exc, UnknownExchange):  # (an exchange not begun: said once, as it failed)
            self._failed(f"{type(exc).__name__} while recording: {exc}", 1, exc)
        if op[0] == EXCHANGE:
            self._unbuilt[op[1]] = f"{type(exc).__name__}: {exc}"
        elif op[0] == END:
            self._exchanges.pop(op[1], None)
            if op[5].set_running_or_notify_cancel():
                op[5].set_exception(LogError(f"{self.path}: exchange {op[1]} could not be recorded: {exc}"))
        elif op[0] == FLUSH:
            batch.wakers.append(op[1])
        elif op[0] == STOP:
            batch.stop = True

    def _commit_loop(self) -> None:
        while True:
            batch = self._batches.get()
            self._commit(batch)
            if batch.stop:
                break
        if self._closing_itself:  # close() was called here or on the row-building thread
            self._release_log()
            self._done_closing()

    def _apply(self, op: tuple[Any, ...], batch: _Batch) -> None:
        """Turn one queued operation into rows (pure Python: nothing here touches the
        disk, so a failing disk loses exactly the rows of the batch it failed in)."""
        code = op[0]
        if code == CHUNK:
            self._taken += len(op[3])
            self._exchange(op[1]).chunk(op[2], op[3], batch.chunk_rows, batch.event_rows)
        elif code == MANY:
            # Mostly chunks (what another process's producer sends): each applied here,
            # without the two calls that dispatch an operation.
            exchanges, chunk_rows, event_rows = self._exchanges, batch.chunk_rows, batch.event_rows
            for one in op[1]:
                if one[0] != CHUNK:
                    self._apply_safely(one, batch)
                    continue
                try:
                    self._taken += len(one[3])
                    rows = exchanges.get(one[1]) or self._exchange(one[1])
                    rows.chunk(one[2], one[3], chunk_rows, event_rows)
                except Exception as exc:
                    self._not_applied(one, exc, batch)
        elif code == EXCHANGE:
            self._taken += len(op[8] or b"")  # the request body counts against the backlog too
            rows = self._rows(op[1])
            statement = rows.request(*op[2:])  # first: a request that fails leaves nothing of it
            self._exchanges[op[1]] = rows
            batch.inserts[op[1]] = len(batch.statements)
            batch.statements.append(statement)
        elif code == HEAD:
            batch.update(op[1], self._exchange(op[1]).head(*op[2:]))
        elif code == BODY:
            self._taken += len(op[2])
            batch.update(op[1], self._exchange(op[1]).late_request_body(*op[2:]))
        elif code == END:
            rows = self._exchanges.pop(op[1], None) or self._exchange(op[1], ending=True)
            batch.update(op[1], rows.end(*op[2:5], batch.chunk_rows, batch.event_rows))
            batch.finished.append((op[5], rows.summary))
        elif code == CAPTURE:
            batch.statements.append((_INSERT_CAPTURE, self._capture_row(op)))
        elif code == RESUME:
            batch.statements.append((INSERT_RESUME, op[1:]))
        elif code == CAPTURE_END:
            batch.statements.append(("UPDATE captures SET ended_at = ? WHERE id = ?", (op[2], op[1])))
        elif code == FLUSH:
            batch.wakers.append(op[1])
        elif code == STOP:
            for rows in self._exchanges.values():
                batch.statements.append(
                    rows.end(
                        None,
                        Outcome.LOG_CLOSED,
                        "the log was closed before the exchange ended",
                        batch.chunk_rows,
                        batch.event_rows,
                    )
                )
            self._exchanges.clear()
            self._unbuilt.clear()
            batch.stop = True

    def _capture_row(self, op: tuple[Any, ...]) -> tuple[Any, ...]:
        """A capture's row, its upstream URL and its argv redacted as everything stored is."""
        _, *head, upstream, tool_version, argv = op
        upstream = upstream and self._redactor.url(upstream)
        return (*head, upstream, tool_version, json.dumps(self._redactor.argv(argv)))

    def _checkpoint(self) -> None:
        """Move everything from the -wal file into the log file, so that the log file alone
        holds every row once the writer is done, even while readers (tasktape inspect) keep
        it open. If a reader's open transaction prevents that, say what to copy."""
        try:
            busy, frames, copied = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            busy, frames, copied, why = 1, -1, -1, str(exc)
        else:
            why = "another process is reading it"
        if busy or frames != copied:
            print(
                f"tasktape: WARNING: the newest rows of {self.path} are still in {self.path.name}-wal "
                f"({why}): copy {self.path.name} and {self.path.name}-wal together, or stop the "
                "readers (tasktape inspect) and open the log once to fold it in.",
                file=sys.stderr,
                flush=True,
            )

    def _rows(self, exchange_id: int) -> ExchangeRows:
        return ExchangeRows(exchange_id, self._redactor, self._max_body, self._max_decoded, self._spill)

    def _spill(self) -> None:
        """Hand the rows built so far to the committer, when there are many: what the
        transaction holds is committed in order, in more than one transaction."""
        batch = self._building
        if len(batch.chunk_rows) + len(batch.event_rows) >= _SPILL_ROWS:
            self._batches.put(batch.take())

    def _exchange(self, exchange_id: int, *, ending: bool = False) -> ExchangeRows:
        """The rows of an exchange begun, or that goes on without its beginning (lost with
        a failed batch, or never queued); an exchange whose request could not be turned
        into rows takes nothing more (UnknownExchange: it is none open)."""
        rows = self._exchanges.get(exchange_id)
        if rows is not None:
            return rows
        why = self._unbuilt.pop(exchange_id, None) if ending else self._unbuilt.get(exchange_id)
        if why is not None:
            raise UnknownExchange(why)
        rows = self._rows(exchange_id)
        if not ending:
            self._exchanges[exchange_id] = rows
        return rows

    def _commit(self, batch: _Batch) -> None:
        """Write the batch in one transaction; wake its waiters whatever happens."""
        if self._full and not batch.stripped:
            self._strip(batch, keep_new=False)
        elif self._lost:
            self._drop_rows_of_lost(batch)
        chunk_rows, event_rows, statements = batch.chunk_rows, batch.event_rows, batch.statements
        rows = len(chunk_rows) + len(event_rows) + sum(s[0].startswith("INSERT") for s in statements)
        conn = self._conn
        last_chunk = last_event = 0
        try:
            conn.execute("BEGIN")
            for sql, params in statements:
                # None as NaN, which SQLite stores as NULL: None goes through the sqlite3
                # module's adapter lookup, about 3,300 instructions a parameter.
                conn.execute(sql, [NULL if value is None else value for value in params])
            if chunk_rows:
                self._insert_chunks(chunk_rows)
                if self._tap:
                    (last_chunk,) = conn.execute("SELECT max(rowid) FROM stored_chunks").fetchone()
            if event_rows:
                self._insert_events(event_rows)
                conn.execute(INDEX_TEXT, (self._indexed_through,))
                (last_event,) = conn.execute("SELECT max(rowid) FROM events").fetchone()
            conn.execute("COMMIT")
            if event_rows:
                self._indexed_through = last_event
            self.stats.rows_written += rows
            self.stats.batches += 1
            if self._tap:
                self._tell_tap(last_chunk, last_event, batch)
        except UnicodeEncodeError:
            # A string SQLite cannot take (a lone surrogate, from an escape in JSON):
            # store the batch again with such characters replaced.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not batch.cleaned:
                batch.cleaned = True
                _clean_batch(batch)
                self._commit(batch)
                return
            self._lose(batch, "UnicodeEncodeError: text that is not valid Unicode", rows)
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if _is_full(exc, self.path, self._growth) and not batch.stripped:
                # What the exchanges are (their rows, status, outcome) is a few hundred
                # bytes, and fits in the room kept for it where their bodies did not.
                self._fill(exc)
                self._strip(batch, keep_new=True)
                self._commit(batch)
                return
            self._lose(batch, f"{type(exc).__name__}: {exc}", rows, exc)
        self._finish(batch)

    def _fill(self, exc: Exception) -> None:
        """The log is full: from now on it takes only what closes the exchanges in it,
        in the room kept for that."""
        self._full, self._full_error = True, exc
        if self._max_pages is not None:
            self._conn.execute(f"PRAGMA max_page_count = {self._max_pages}")
        else:
            # No room was kept (a full disk, a file size limit): what the -wal file holds
            # goes into the log file now and after every commit, so that what follows is
            # written over it rather than past it, where there is no room.
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("PRAGMA wal_autocheckpoint = 1")
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _strip(self, batch: _Batch, *, keep_new: bool) -> None:
        """Take out of the batch what a full log does not take: chunks, events, bodies, and
        new rows, but for those of the batch that found it full (``keep_new``)."""
        batch.stripped = True
        cut = {row[0] for rows in (batch.chunk_rows, batch.event_rows) for row in rows}
        self._cut |= cut
        self._cut_response |= cut
        dropped = len(batch.chunk_rows) + len(batch.event_rows)
        batch.chunk_rows, batch.event_rows = [], []
        statements = []
        for statement in batch.statements:
            kept = self._without_bytes(statement, keep_new)
            if kept is None:
                dropped += 1
            else:
                statements.append(kept)
        batch.statements = statements
        if dropped:
            exc = self._full_error
            self._failed(f"{type(exc).__name__}: {exc}", dropped, exc)

    def _without_bytes(self, statement: Statement, keep_new: bool) -> Statement | None:
        """A statement as a full log takes it: an exchange's without its bodies (its end
        saying so), none for a new row unless ``keep_new``."""
        sql, params = statement
        columns = _columns(sql)
        if columns is None:  # a capture's or a resume's
            return statement if keep_new or not sql.startswith("INSERT") else None
        values = list(params)
        exchange_id = values[columns.index("id")]
        if exchange_id in self._lost:
            return None
        if not keep_new and sql.startswith("INSERT"):
            self._lost[exchange_id] = LOG_FULL
            return None
        for body, truncated in _BODIES:
            if body in columns and values[columns.index(body)] is not None:
                values[columns.index(body)], values[columns.index(truncated)] = None, 1
                self._cut.add(exchange_id)
                if body == "response_body":
                    self._cut_response.add(exchange_id)
        if "outcome" in columns and exchange_id in self._cut:
            if exchange_id in self._cut_response:
                values[columns.index("response_body_truncated")] = 1
            at = columns.index("error")
            values[at] = "; ".join(filter(None, (values[at], f"{LOG_FULL}: its bytes are not all in it")))
        return sql, tuple(values)

    def _drop_rows_of_lost(self, batch: _Batch) -> None:
        """Chunks and events of an exchange whose row is not in the log are not written:
        a row of no exchange would say nothing true."""
        lost = self._lost
        gone = [row[0] for rows in (batch.chunk_rows, batch.event_rows) for row in rows if row[0] in lost]
        if gone:
            batch.chunk_rows = [row for row in batch.chunk_rows if row[0] not in lost]
            batch.event_rows = [row for row in batch.event_rows if row[0] not in lost]
            # Why the first of them is not in the log: said as it was when its row was
            # lost, however many batches bring rows of it after.
            self._failed(f"rows of exchanges not in the log: {lost[gone[0]]}", len(gone))

    def _lose(self, batch: _Batch, error: str, rows: int, exc: BaseException | None = None) -> None:
        """The batch could not be written: its exchanges say so to whoever waits on them."""
        why = LOG_FULL if self._full else f"the log could not be written ({error})"
        batch.failed = why
        for sql, params in batch.statements:
            if sql.startswith(_INSERT_EXCHANGE):
                self._lost[params[0]] = why
        self._failed(error, rows, exc)

    def _finish(self, batch: _Batch) -> None:
        """Tell whoever waits on the batch's exchanges what the log keeps of each."""
        for future, summary in batch.finished:
            answer = self._kept(summary, batch.failed)
            if future.set_running_or_notify_cancel():
                future.set_result(answer)
        for wake in batch.wakers:
            wake()

    def _kept(self, summary: ExchangeSummary, failed: str | None) -> ExchangeSummary:
        """The summary of a finished exchange, saying what of it the log does not keep."""
        exchange_id = summary.exchange_id
        cut = exchange_id in self._cut
        self._cut.discard(exchange_id)
        self._cut_response.discard(exchange_id)
        if exchange_id in self._lost:
            return _partly(summary, Kept.NOTHING, self._lost.pop(exchange_id))
        if failed is not None:
            return _partly(summary, Kept.UNFINISHED, failed)
        return _partly(summary, Kept.ROW, LOG_FULL) if cut else summary

    def _tell_tap(self, last_chunk: int, last_event: int, batch: _Batch) -> None:
        """Tell the tap of the chunks and events just committed. They are in the log
        whatever the tap does: a tap that fails is told nothing more, loudly."""
        tap = self._tap
        assert tap is not None
        try:
            if batch.statements:
                tap.changed()
            tap.committed("stored_chunks", CHUNK_COLUMNS, batch.chunk_rows, last_chunk)
            tap.committed("events", EVENT_COLUMNS, batch.event_rows, last_event)
        except Exception as exc:
            self._tap = None
            tap.close()
            print(
                f"tasktape: WARNING: the log writer of {self.path} stopped telling {type(tap).__name__}"
                f" of its commits ({type(exc).__name__}: {exc}); the rows are in the log",
                file=sys.stderr,
                flush=True,
            )


_INSERT_EXCHANGE = "INSERT INTO exchanges ("
_UPDATED_COLUMNS = {UPDATE_HEAD: HEAD_COLUMNS, UPDATE_BODY: BODY_COLUMNS, UPDATE_END: END_COLUMNS}
_BODIES = (("request_body", "request_body_truncated"), ("response_body", "response_body_truncated"))


@cache
def _columns(sql: str) -> tuple[str, ...] | None:
    """The columns of ``exchanges`` a statement sets, in the order of its parameters (an
    UPDATE's last is the row's id); None for a statement of another table."""
    if sql.startswith(_INSERT_EXCHANGE):
        return tuple(sql[len(_INSERT_EXCHANGE) : sql.index(")")].split(", "))
    updated = _UPDATED_COLUMNS.get(sql)
    return None if updated is None else (*updated, "id")


def _is_full(exc: BaseException, path: Path, growth: int) -> bool:
    """Whether SQLite failed for want of room: a full disk, the log's size cap, or a write
    that failed where a file of the log cannot grow by ``growth`` bytes."""
    code = getattr(exc, "sqlite_errorcode", 0) if isinstance(exc, sqlite3.Error) else 0
    if code & 0xFF == sqlite3.SQLITE_FULL:
        return True
    return code in _WRITE_ERRORS and _no_room(path, growth)


def _no_room(path: Path, growth: int) -> bool:
    """Whether a file of the log at ``path`` cannot grow by ``growth`` bytes: it is at the
    process's file size limit (``ulimit -f``), or its disk is full."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                if os.path.getsize(f"{path}{suffix}") + growth > limit:
                    return True
    try:
        disk = os.statvfs(path.parent)
    except OSError:
        return False
    return disk.f_bavail * disk.f_frsize < _LOW_ROOM


def _partly(summary: ExchangeSummary, kept: Kept, why: str) -> ExchangeSummary:
    return replace(summary, kept=kept, lost=why)


def _next_id(conn: sqlite3.Connection, table: str) -> int:
    (value,) = conn.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {table}").fetchone()
    return int(value)


# The rows of the exchanges taken back (``take_back``), table by table: each exchange's own
# rows first, then the exchanges.
_TAKEN = "SELECT id FROM exchanges WHERE capture_id = :capture AND id >= :first"
_TAKE_BACK = (
    # The text index has no trigger (``INDEX_TEXT``): its entries go as they came.
    "INSERT INTO events_fts (events_fts, rowid, text) SELECT 'delete', rowid, text FROM events"
    f" WHERE text IS NOT NULL AND exchange_id IN ({_TAKEN})",
    f"DELETE FROM events WHERE exchange_id IN ({_TAKEN})",
    f"DELETE FROM stored_chunks WHERE exchange_id IN ({_TAKEN})",
    f"DELETE FROM findings WHERE exchange_id IN ({_TAKEN})",
    f"DELETE FROM resumes WHERE exchange_id IN ({_TAKEN}) OR new_exchange_id IN ({_TAKEN})",
    f"DELETE FROM exchanges WHERE id IN ({_TAKEN})",
)


def take_back(path: str | Path, captures: Iterable[tuple[int, int | None]]) -> None:
    """Take rows of captures left unfinished (their writer stopped before it ended them) out
    of the log, to be written again, in one transaction: of each ``(capture, from_exchange)``,
    its exchanges from ``from_exchange`` on, or (None) the whole capture. A capture ended
    since is left as it is. Done before a writer opens the log: a writer reads, as it opens,
    where its ids and its text index go on."""
    fd = take_writer_lock(Path(path))
    try:
        conn = open_db(path).conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            unfinished = "SELECT 1 FROM captures WHERE id = ? AND ended_at IS NULL"
            for capture_id, from_exchange in captures:
                if not conn.execute(unfinished, (capture_id,)).fetchone():
                    continue
                taken = {"capture": capture_id, "first": from_exchange or 0}
                for statement in _TAKE_BACK:
                    conn.execute(statement, taken)
                if from_exchange is None:
                    conn.execute("DELETE FROM captures WHERE id = ?", (capture_id,))
            conn.execute("COMMIT")
        finally:
            conn.close()
    finally:
        release_writer_lock(fd)
