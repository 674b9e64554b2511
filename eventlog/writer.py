"""One writer per event log: producers queue operations without touching the disk;
background threads decode, classify and commit them in short batched transactions.

Producers (event-loop callbacks, threads) only append to a queue, so forwarding never
waits on SQLite. A row-building thread drains everything queued (at most
``max_batch_seconds`` of work, 20 ms by default) into one batch; a commit thread writes
each batch in one transaction and commits at once, so a row is committed within about
one batch time of being queued.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import fcntl
import json
import os
import queue
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count
from pathlib import Path
from typing import Any

import orjson

from .classify import classify
from .errors import LogBusy, LogError, WriterClosed
from .schema import open_db
from .sse import SSEDecoder
from .version import __version__

Headers = Mapping[str, str] | Iterable[tuple[str, str]]
Body = bytes | str | None

_CAPTURE, _CAPTURE_END, _EXCHANGE, _HEAD, _CHUNK, _END, _FLUSH, _STOP = range(8)

_INSERT_CHUNK = "INSERT INTO chunks (exchange_id, seq, offset_ns, data) VALUES (?, ?, ?, ?)"
_INSERT_EVENT = (
    "INSERT INTO events (exchange_id, seq, offset_ns, event_id, last_event_id, event_type, data,"
    " retry, complete, kind, task_id, context_id, state, artifact_id, artifact_type, append,"
    " last_chunk, text, usage, parse_error) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_EXCHANGE = (
    "INSERT INTO exchanges (id, capture_id, started_at, started_ns, method, path, query,"
    " request_headers, request_body, binding, rpc_method, task_id, context_id)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_CAPTURE = (
    "INSERT INTO captures (id, started_at, source, upstream, tool_version, argv) VALUES (?,?,?,?,?,?)"
)
_UPDATE_HEAD = "UPDATE exchanges SET status = ?, response_headers = ?, is_sse = ?, ttfb_ns = ? WHERE id = ?"
_UPDATE_END = (
    "UPDATE exchanges SET duration_ns = coalesce(?, duration_ns), outcome = ?, error = ?,"
    " response_body = coalesce(?, response_body), binding = coalesce(binding, ?),"
    " task_id = coalesce(task_id, ?), context_id = coalesce(context_id, ?) WHERE id = ?"
)


@dataclass(slots=True)
class ExchangeSummary:
    """What the writer learnt from one finished exchange's stream."""

    exchange_id: int
    chunks: int = 0
    bytes: int = 0
    events: int = 0
    task_id: str | None = None
    context_id: str | None = None
    binding: str | None = None
    final_state: str | None = None
    first_event_ns: int | None = None
    outcome: str | None = None


@dataclass
class WriterStats:
    rows_written: int = 0
    rows_lost: int = 0
    batches: int = 0
    failed_batches: int = 0
    last_error: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Batch:
    """Rows and waiters gathered for one transaction."""

    statements: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    chunk_rows: list[tuple[Any, ...]] = field(default_factory=list)
    event_rows: list[tuple[Any, ...]] = field(default_factory=list)
    wakers: list[Callable[[], None]] = field(default_factory=list)
    finished: list[tuple[concurrent.futures.Future[ExchangeSummary], ExchangeSummary]] = field(
        default_factory=list
    )
    stop: bool = False


class _Stream:
    __slots__ = ("chunk_seq", "decoder", "event_seq", "last_offset", "summary")

    def __init__(self, exchange_id: int) -> None:
        self.decoder: SSEDecoder | None = None
        self.chunk_seq = 0
        self.event_seq = 0
        self.last_offset = 0
        self.summary = ExchangeSummary(exchange_id)


def utc_iso(ns: int) -> str:
    """Nanoseconds since the epoch as ``2026-11-30T10:18:28.123456Z``."""
    seconds, rest = divmod(ns, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest // 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _headers_json(headers: Headers | None) -> str | None:
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    return json.dumps([[k, v] for k, v in items], ensure_ascii=False)


def _body(body: Body) -> bytes | str | None:
    """Bodies that are UTF-8 are stored as text so they read well in SQL and Datasette;
    anything else as a BLOB. Both round-trip to the exact bytes."""
    if isinstance(body, bytes):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return body
    return body


class LogWriter:
    """Writes one event log; safe to call from any thread and from the event loop::

        w = LogWriter("captures.db")
        cap = w.begin_capture(source="record", upstream="http://agent")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers=headers, is_sse=True, ttfb_ns=1_000_000)
        w.chunk(ex, 2_000_000, b"data: {}\\n\\n")
        summary = w.end_exchange(ex, duration_ns=3_000_000).result()
        w.close()

    Writers still open when the interpreter exits are closed then, so nothing queued
    is lost to a forgotten ``close()``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        on_error: Callable[[BaseException, int], None] | None = None,
        max_batch_seconds: float = 0.02,
        busy_timeout: float = 5.0,
        max_bytes: int | None = None,
    ) -> None:
        """``on_error(exc, rows_lost)`` is called from the writer thread when a batch
        cannot be written (default: a loud line on stderr); ``busy_timeout`` is how long
        to wait for another process's lock; ``max_bytes`` caps the log file's size."""
        self.path = Path(path)
        self.stats = WriterStats()
        self._on_error = on_error
        self._max_batch = max_batch_seconds
        self._lock_fd = _take_writer_lock(self.path)
        try:
            self._db = open_db(self.path, check_same_thread=False)
        except BaseException:
            os.close(self._lock_fd)
            raise
        conn = self._db.conn
        self._conn = conn
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        if max_bytes is not None:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {max(1, max_bytes // page_size)}")
        self._capture_ids = count(_next_id(conn, "captures"))
        self._exchange_ids = count(_next_id(conn, "exchanges"))
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._streams: dict[int, _Stream] = {}
        self._closed = False
        # Two threads: one turns queued operations into rows (Python, holds the GIL),
        # the other commits them (SQLite, mostly without the GIL), so the two overlap.
        self._batches: queue.Queue[_Batch] = queue.Queue(maxsize=2)
        name = f"tasktape-writer:{self.path.name}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._committer = threading.Thread(target=self._commit_loop, name=f"{name}:commit", daemon=True)
        self._thread.start()
        self._committer.start()
        _open_writers.add(self)

    # -- producer side: never blocks on the disk -------------------------------------------

    def begin_capture(
        self,
        *,
        source: str,
        upstream: str | None = None,
        argv: list[str] | None = None,
        tool_version: str | None = None,
    ) -> int:
        """Start a recording run (or import); returns its id."""
        capture_id = next(self._capture_ids)
        self._put(
            (
                _CAPTURE,
                capture_id,
                utc_iso(time.time_ns()),
                source,
                upstream,
                tool_version or __version__,
                json.dumps(sys.argv if argv is None else argv),
            )
        )
        return capture_id

    def end_capture(self, capture_id: int) -> None:
        self._put((_CAPTURE_END, capture_id, utc_iso(time.time_ns())))

    def begin_exchange(
        self,
        capture_id: int,
        *,
        method: str,
        path: str,
        query: str | None = None,
        request_headers: Headers | None = None,
        request_body: Body = None,
        started_ns: int | None = None,
        binding: str | None = None,
        rpc_method: str | None = None,
        task_id: str | None = None,
        context_id: str | None = None,
    ) -> int:
        """Start one request/response exchange; returns its id at once."""
        exchange_id = next(self._exchange_ids)
        self._put(
            (
                _EXCHANGE,
                exchange_id,
                capture_id,
                started_ns or time.time_ns(),
                method,
                path,
                query,
                request_headers,
                request_body,
                binding,
                rpc_method,
                task_id,
                context_id,
            )
        )
        return exchange_id

    def response_head(
        self, exchange_id: int, *, status: int, headers: Headers | None, is_sse: bool, ttfb_ns: int
    ) -> None:
        self._put((_HEAD, exchange_id, status, headers, is_sse, ttfb_ns))

    def chunk(self, exchange_id: int, offset_ns: int, data: bytes) -> None:
        """One piece of the response body, exactly as received, ``offset_ns`` after the
        request arrived. SSE bodies are decoded and classified by the writer."""
        if self._closed:
            raise WriterClosed(f"{self.path}: chunk() after close()")
        self._queue.put((_CHUNK, exchange_id, offset_ns, data))

    def end_exchange(
        self,
        exchange_id: int,
        *,
        duration_ns: int,
        outcome: str = "complete",
        error: str | None = None,
        response_body: Body = None,
    ) -> concurrent.futures.Future[ExchangeSummary]:
        """Finish an exchange. The future resolves once its rows are committed (or
        their batch failed: see :attr:`stats`)."""
        done: concurrent.futures.Future[ExchangeSummary] = concurrent.futures.Future()
        self._put((_END, exchange_id, duration_ns, outcome, error, response_body, done))
        return done

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued so far is committed."""
        done = threading.Event()
        self._put((_FLUSH, done.set))
        if not (self._thread.is_alive() and self._committer.is_alive()):
            raise LogError(f"{self.path}: the writer thread has stopped")
        if not done.wait(timeout):
            raise LogError(f"{self.path}: flush timed out after {timeout} s")

    async def aflush(self) -> None:
        """Like :meth:`flush`, awaited without blocking the event loop."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed while we waited
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        self._put((_FLUSH, wake))
        await done

    def close(self) -> None:
        """Commit everything queued, finish exchanges still open (outcome
        ``log_closed``), and release the log. Safe to call twice."""
        if self._closed:
            return
        self._put((_STOP,))
        self._closed = True
        self._thread.join()
        self._committer.join()
        _open_writers.discard(self)
        self._conn.close()
        os.close(self._lock_fd)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, op: tuple[Any, ...]) -> None:
        if self._closed:
            raise WriterClosed(f"{self.path}: the log writer is closed")
        self._queue.put(op)

    # -- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        get, get_nowait = self._queue.get, self._queue.get_nowait
        batch = _Batch()
        while not batch.stop:
            batch = _Batch()
            self._apply(get(), batch)
            # Take what is queued until the queue is empty or the batch has used its
            # time, then commit: transactions stay short under any load.
            deadline = time.monotonic() + self._max_batch
            while not batch.stop and time.monotonic() < deadline:
                try:
                    op = get_nowait()
                except queue.Empty:
                    break
                self._apply(op, batch)
            self._batches.put(batch)

    def _commit_loop(self) -> None:
        while True:
            batch = self._batches.get()
            self._commit(batch)
            if batch.stop:
                return

    def _apply(self, op: tuple[Any, ...], batch: _Batch) -> None:
        """Turn one queued operation into rows (pure Python: nothing here touches the
        disk, so a failing disk loses exactly the rows of the batch it failed in)."""
        code = op[0]
        if code == _CHUNK:
            self._chunk(op[1], op[2], op[3], batch.chunk_rows, batch.event_rows)
        elif code == _EXCHANGE:
            batch.statements.append(self._begin(op))
        elif code == _HEAD:
            _, exchange_id, status, headers, is_sse, ttfb_ns = op
            batch.statements.append(
                (_UPDATE_HEAD, (status, _headers_json(headers), int(is_sse), ttfb_ns, exchange_id))
            )
            if is_sse:
                self._stream(exchange_id).decoder = SSEDecoder()
        elif code == _END:
            summary, statement = self._end(op[1:6], batch.event_rows)
            batch.statements.append(statement)
            batch.finished.append((op[6], summary))
        elif code == _CAPTURE:
            batch.statements.append((_INSERT_CAPTURE, op[1:]))
        elif code == _CAPTURE_END:
            batch.statements.append(("UPDATE captures SET ended_at = ? WHERE id = ?", (op[2], op[1])))
        elif code == _FLUSH:
            batch.wakers.append(op[1])
        elif code == _STOP:
            for exchange_id in list(self._streams):
                args = (exchange_id, None, "log_closed", "the log was closed before the exchange ended", None)
                batch.statements.append(self._end(args, batch.event_rows)[1])
            batch.stop = True

    def _commit(self, batch: _Batch) -> None:
        """Write the batch in one transaction; wake its waiters whatever happens."""
        chunk_rows, event_rows, statements = batch.chunk_rows, batch.event_rows, batch.statements
        rows = len(chunk_rows) + len(event_rows) + sum(s[0].startswith("INSERT") for s in statements)
        conn = self._conn
        try:
            conn.execute("BEGIN")
            for sql, params in statements:
                conn.execute(sql, params)
            if chunk_rows:
                conn.executemany(_INSERT_CHUNK, chunk_rows)
            if event_rows:
                conn.executemany(_INSERT_EVENT, event_rows)
            conn.execute("COMMIT")
            self.stats.rows_written += rows
            self.stats.batches += 1
        except Exception as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._failed(exc, rows)
        for future, summary in batch.finished:
            if future.set_running_or_notify_cancel():
                future.set_result(summary)
        for wake in batch.wakers:
            wake()

    def _stream(self, exchange_id: int) -> _Stream:
        stream = self._streams.get(exchange_id)
        if stream is None:
            stream = self._streams[exchange_id] = _Stream(exchange_id)
        return stream

    def _begin(self, op: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
        (
            _,
            exchange_id,
            capture_id,
            started_ns,
            method,
            path,
            query,
            req_headers,
            req_body,
            binding,
            rpc_method,
            task_id,
            context_id,
        ) = op
        summary = self._stream(exchange_id).summary
        summary.binding, summary.task_id, summary.context_id = binding, task_id, context_id
        return _INSERT_EXCHANGE, (
            exchange_id,
            capture_id,
            utc_iso(started_ns),
            started_ns,
            method,
            path,
            query,
            _headers_json(req_headers),
            _body(req_body),
            binding,
            rpc_method,
            task_id,
            context_id,
        )

    def _chunk(
        self, exchange_id: int, offset_ns: int, data: bytes, chunk_rows: list, event_rows: list
    ) -> None:
        stream = self._stream(exchange_id)
        seq = stream.chunk_seq
        stream.chunk_seq = seq + 1
        stream.last_offset = offset_ns
        summary = stream.summary
        summary.chunks += 1
        summary.bytes += len(data)
        chunk_rows.append((exchange_id, seq, offset_ns, data))
        if stream.decoder is not None:
            for event in stream.decoder.feed(data):
                self._event(stream, offset_ns, event, event_rows)

    def _event(self, stream: _Stream, offset_ns: int, event: Any, event_rows: list) -> None:
        c = classify(event.data)
        summary = stream.summary
        seq = stream.event_seq
        stream.event_seq = seq + 1
        summary.events += 1
        if summary.first_event_ns is None:
            summary.first_event_ns = offset_ns
        if c.task_id and summary.task_id is None:
            summary.task_id = c.task_id
        if c.context_id and summary.context_id is None:
            summary.context_id = c.context_id
        if c.binding and summary.binding is None:
            summary.binding = c.binding
        if c.state:
            summary.final_state = c.state
        row = (
            summary.exchange_id,
            seq,
            offset_ns,
            event.id,
            event.last_event_id,
            event.event,
            event.data,
            event.retry,
            int(event.complete),
            c.kind,
            c.task_id,
            c.context_id,
            c.state,
            c.artifact_id,
            c.artifact_type,
            _int(c.append),
            _int(c.last_chunk),
            c.text,
            None if c.usage is None else orjson.dumps(c.usage).decode(),
            c.parse_error,
        )
        event_rows.append(tuple([_NULL if v is None else v for v in row]))

    def _end(
        self, args: tuple[Any, ...], event_rows: list
    ) -> tuple[ExchangeSummary, tuple[str, tuple[Any, ...]]]:
        exchange_id, duration_ns, outcome, error, response_body = args
        stream = self._streams.pop(exchange_id, None) or _Stream(exchange_id)
        if stream.decoder is not None:
            for event in stream.decoder.close():
                self._event(stream, stream.last_offset, event, event_rows)
        summary = stream.summary
        summary.outcome = outcome
        return summary, (
            _UPDATE_END,
            (
                duration_ns,
                outcome,
                error,
                _body(response_body),
                summary.binding,
                summary.task_id,
                summary.context_id,
                exchange_id,
            ),
        )

    def _failed(self, exc: BaseException, rows: int) -> None:
        stats = self.stats
        stats.failed_batches += 1
        stats.rows_lost += rows
        stats.last_error = f"{type(exc).__name__}: {exc}"
        if len(stats.errors) < 100:
            stats.errors.append(stats.last_error)
        if self._on_error is not None:
            with contextlib.suppress(Exception):
                self._on_error(exc, rows)
        else:
            print(
                f"tasktape: WRITING THE LOG FAILED ({stats.last_error}); {rows} rows lost, "
                f"{stats.rows_lost} in all. Traffic is not affected.",
                file=sys.stderr,
            )


# SQLite stores a bound NaN as NULL, and Python's sqlite3 binds a float several
# times faster than None (which goes through its adapter lookup): most event
# columns are NULL, so this roughly halves the cost of inserting an event row.
_NULL = float("nan")


def _int(flag: bool | None) -> int | None:
    return None if flag is None else int(flag)  # a bool is bound through the slow path too


_open_writers: weakref.WeakSet[LogWriter] = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    for writer in list(_open_writers):
        writer.close()


def _next_id(conn: sqlite3.Connection, table: str) -> int:
    (value,) = conn.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {table}").fetchone()
    return int(value)


def _take_writer_lock(path: Path) -> int:
    """Exchange ids are handed out in memory, so two writers on one log would clash:
    hold an exclusive lock on ``<log>-lock`` for the writer's lifetime."""
    lock_path = path.with_name(path.name + "-lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogBusy(f"{path} is being written by another tasktape writer (lock: {lock_path})") from None
    return fd
