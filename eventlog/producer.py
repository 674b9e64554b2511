"""The producer side of a log writer: what recorders call, from any thread or the event
loop. Every call only appends an operation to a queue and returns; ids are handed out
in memory. ``LogWriter`` (threads) and ``ProcessLogWriter`` (a child process) consume
the queue."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import math
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, ClassVar

from tasktape.errors import LogError, UnknownExchange, UsageError, WriterClosed
from tasktape.version import __version__

from .exchange_rows import ExchangeSummary, Headers, utc_iso
from .listed import header_problem, headers_listed
from .outcomes import Outcome
from .redact import Redactor
from .resumes import Resume
from .uids import uuid7

# A status as HTTP/1.1 sends it: three digits (RFC 9110 section 15), as a log keeps it
# and a cassette reads it back.
MIN_STATUS, MAX_STATUS = 100, 999
_OUTCOMES = frozenset(Outcome)

# Operations, as tuples whose first element is one of these codes.
CAPTURE, CAPTURE_END, EXCHANGE, BODY, HEAD, CHUNK, END, FLUSH, STOP, MANY, RESUME = range(11)

_REPORT_EVERY = 5.0  # seconds between two reports of failed writes on stderr


@dataclass
class WriterStats:
    rows_written: int = 0
    rows_lost: int = 0
    chunks_dropped: int = 0  # not recorded because the writer fell too far behind (in rows_lost)
    batches: int = 0
    failed_batches: int = 0
    last_error: str | None = None
    errors: list[str] = field(default_factory=list)


class LogProducer:
    """Queue operations for one log; subclasses write them."""

    # Rows that the writers closed in this process could not write: for a host program
    # that runs writers it does not hold and sets its own exit status (mitmdump running
    # tasktape's addon, under tasktape mitm).
    lost_in_process: ClassVar[int] = 0

    def __init__(
        self, path: str | Path, on_error: Callable[[BaseException, int], None] | None, max_backlog: int
    ) -> None:
        if on_error is not None and not callable(on_error):
            raise UsageError(f"on_error is called as on_error(exc, rows_lost), not {type(on_error).__name__}")
        self.path = Path(path)
        self.stats = WriterStats()
        self.max_backlog = max_backlog
        self._on_error = on_error
        self._last_report = -_REPORT_EVERY
        self._queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._closed = False
        # Whether close() was called on one of the writer's own threads (from on_error):
        # then those threads finish closing, and ``_released`` is set once they have.
        self._closing_itself = False
        self._released = threading.Event()
        # The exchanges begun here and not yet ended: calls for any other are refused, as
        # they would write rows of no exchange or change one already finished.
        self._open: set[int] = set()
        self._last_exchange = 0  # the highest id begun here (an id below it not open has ended)
        # Chunk bytes queued and taken by the consumer (one thread): their difference
        # is the backlog, which must not grow without bound when the disk is slower
        # than the traffic.
        self._queued = 0
        self._taken = 0
        # Held while an operation is checked and queued, and while close() queues STOP: no
        # operation can follow STOP, where nobody would write it.
        self._queued_lock = threading.Lock()
        self._dropped: dict[int, int] = {}
        self._bodies_dropped: set[int] = set()
        self._stats_lock = threading.Lock()
        self._capture_ids = count(1)
        self._exchange_ids = count(1)
        self.capture_uids: dict[int, str] = {}  # of the captures begun here

    def _start_ids(self, next_capture: int, next_exchange: int) -> None:
        self._capture_ids = count(next_capture)
        self._exchange_ids = count(next_exchange)
        self._first_exchange = next_exchange
        _open_writers.add(self)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: every call that writes raises WriterClosed."""
        return self._closed

    def begin_capture(
        self,
        *,
        source: str,
        upstream: str | None = None,
        argv: list[str] | None = None,
        tool_version: str | None = None,
        uid: str | None = None,
    ) -> int:
        """Start a recording run (or import); returns its id. The writer's redactor applies
        to the ``upstream`` URL and to ``argv`` (default: ``sys.argv``) as to everything it
        stores. ``uid``: its own (an import's, made from what it imports), else a new one."""
        capture_id, now = next(self._capture_ids), time.time_ns()
        uid = self.capture_uids[capture_id] = uid or uuid7(now)
        self._put(
            (
                CAPTURE,
                capture_id,
                uid,
                utc_iso(now),
                source,
                upstream,
                tool_version or __version__,
                [str(arg) for arg in (sys.argv if argv is None else argv)],
            )
        )
        return capture_id

    def end_capture(self, capture_id: int) -> None:
        self._put((CAPTURE_END, capture_id, utc_iso(time.time_ns())))

    def begin_exchange(
        self,
        capture_id: int,
        *,
        method: str,
        path: str,
        query: str | None = None,
        request_headers: Headers | None = None,
        request_body: bytes | None = None,
        request_body_truncated: bool = False,
        started_ns: int | None = None,
        uid: str | None = None,
        request_decoded_from: str | None = None,
    ) -> int:
        """Start one request/response exchange; returns its id at once. The writer
        classifies the request (binding, operation, task and context) and redacts it.
        ``uid``: its own (an import's), else one made from when it started.
        ``request_decoded_from``: the body is given as a log keeps it, decoded already from
        this Content-Encoding (``"identity"``: kept as sent), and is stored so, not decoded
        by its headers (an import's). None: as the client sent it."""
        _text("method", method, "the request's method, such as 'GET'")
        _text("path", path, "the request's path, such as '/'")
        _text_or_none("request_decoded_from", request_decoded_from, "a Content-Encoding")
        request_body = checked_body(request_body)
        request_headers = _pairs(request_headers, "request_headers")
        _text_or_none("query", query, "the URL's query string")
        exchange_id = next(self._exchange_ids)
        if request_body and not self._admit(len(request_body)):
            request_body = self._drop_body(exchange_id)
        # Open before it is queued: were it opened after, a close() in between would leave
        # it open in a closed writer, and its chunks would be queued after STOP.
        self._open.add(exchange_id)
        self._last_exchange = max(self._last_exchange, exchange_id)
        try:
            self._put(
                (
                    EXCHANGE,
                    exchange_id,
                    capture_id,
                    started_ns or time.time_ns(),
                    method,
                    path,
                    query,
                    request_headers,
                    request_body,
                    request_body_truncated,
                    uid,
                    request_decoded_from,
                )
            )
        except WriterClosed:
            self._open.discard(exchange_id)
            raise
        return exchange_id

    def late_request_body(self, exchange_id: int, body: bytes, *, truncated: bool = False) -> None:
        """The request body of an exchange begun without it (a body streamed through)."""
        self._check_open(exchange_id, "late_request_body()")
        body = checked_body(body)
        if body and not self._admit(len(body)):
            self._drop_body(exchange_id)  # the exchange keeps no body, and says why
            return
        self._put((BODY, exchange_id, body, truncated))

    def response_head(
        self,
        exchange_id: int,
        *,
        status: int,
        headers: Headers | None,
        is_sse: bool,
        ttfb_ns: int,
        content_encoding: str | None = None,
        decoded_from: str | None = None,
        body_truncated: bool = False,
    ) -> None:
        """The response's status and headers. Chunks of a body sent with a
        ``content_encoding`` (gzip, deflate, br) are stored decoded; ``decoded_from``
        says chunks given already decoded were sent with that encoding.
        ``body_truncated``: the chunks given are only the start of the body (cut before
        they were given, as an exported log's): the log flags it cut."""
        if isinstance(status, bool) or not isinstance(status, int) or not MIN_STATUS <= status <= MAX_STATUS:
            raise UsageError(f"status is an HTTP status, {MIN_STATUS} to {MAX_STATUS}, not {status!r}")
        check_bound("ttfb_ns", ttfb_ns, whole=True, least=0)
        if type(is_sse) is not bool:  # the writer's thread would lose the head for it
            raise UsageError(f"is_sse is True or False, not {is_sse!r}")
        pairs = _pairs(headers, "the response headers")
        self._check_open(exchange_id, "response_head()")
        self._put(
            (
                *(HEAD, exchange_id, status, pairs, is_sse, ttfb_ns),
                *(content_encoding, decoded_from, bool(body_truncated)),
            )
        )

    def chunk(self, exchange_id: int, offset_ns: int, data: bytes) -> None:
        """One piece of the response body, exactly as received, ``offset_ns`` after the
        request arrived. SSE bodies are decoded and classified by the writer; other
        bodies are kept up to ``max_body`` bytes."""
        # Bytes at an int offset pass after three comparisons; anything else is checked
        # (and copied) apart.
        if type(data) is not bytes or type(offset_ns) is not int or offset_ns < 0:
            offset_ns, data = checked_piece(offset_ns, data)
        with self._queued_lock:  # _check_open and _admit, inline: this runs for every chunk forwarded
            if exchange_id not in self._open:  # (close() empties it: then WriterClosed)
                raise self._not_open(exchange_id, "chunk()")
            if self._queued - self._taken <= self.max_backlog:
                self._queued += len(data)
                self._queue.put((CHUNK, exchange_id, offset_ns, data))
                return
        self._drop(exchange_id)  # without the lock: on_error may close the writer, which takes it

    def chunks(self, exchange_id: int, pieces: Iterable[tuple[int, bytes]]) -> None:
        """Pieces of one response body, ``(offset_ns, data)`` each, as ``chunk()`` takes
        them one by one (an import has them all at hand); one that ``chunk()`` refuses is
        refused before any is queued."""
        for offset_ns, data in checked_pieces(pieces):
            self.chunk(exchange_id, offset_ns, data)

    def resume(self, resume: Resume, at_ns: int | None = None) -> None:
        """A reconnect of one side of a held stream (a row of ``resumes``), at ``at_ns``
        (default: now)."""
        at_ns = time.time_ns() if at_ns is None else at_ns
        r = resume
        synthesized = json.dumps(r.synthesized) if r.synthesized else None
        self._put(
            (
                RESUME,
                r.exchange_id,
                utc_iso(at_ns),
                at_ns,
                str(r.side),
                r.last_event_id,
                r.events_from_log,
                r.new_exchange_id,
                str(r.outcome),
                r.attempts,
                synthesized,
                r.error,
            )
        )

    def _admit(self, size: int) -> bool:
        """Count ``size`` bytes (a chunk's, a request body's) into the backlog, unless the
        writer is already more than max_backlog behind."""
        with self._queued_lock:
            if self._queued - self._taken > self.max_backlog:
                return False
            self._queued += size
            return True

    @property
    def backlog(self) -> int:
        """Bytes (of chunks and request bodies) queued but not yet taken by the writer."""
        return self._queued - self._taken

    def _drop(self, exchange_id: int) -> None:
        """The writer is more than max_backlog behind: this chunk is not recorded (the
        traffic itself is untouched). Counted, reported, and noted on the exchange."""
        self._dropped[exchange_id] = self._dropped.get(exchange_id, 0) + 1
        self.stats.chunks_dropped += 1
        self._failed(
            f"the log writer is {self.max_backlog // 2**20} MiB behind: chunks are not recorded",
            1,
            batch=False,
        )

    def _drop_body(self, exchange_id: int) -> None:
        """Like _drop, for a request body: the exchange is recorded without it."""
        self._bodies_dropped.add(exchange_id)
        self._failed(
            f"the log writer is {self.max_backlog // 2**20} MiB behind: a request body is not recorded",
            1,
            batch=False,
        )

    def end_exchange(
        self,
        exchange_id: int,
        *,
        duration_ns: int | None,
        outcome: str = Outcome.COMPLETE,
        error: str | None = None,
    ) -> concurrent.futures.Future[ExchangeSummary]:
        """Finish an exchange. The future resolves once its rows are committed (or
        their batch failed: see :attr:`stats`). Once ended, the exchange takes no more
        calls (UnknownExchange)."""
        if duration_ns is not None:
            check_bound("duration_ns", duration_ns, whole=True, least=0)
        if not isinstance(outcome, str) or outcome not in _OUTCOMES:
            raise UsageError(f"outcome is one of {', '.join(Outcome)}, not {outcome!r}")
        _text_or_none("error", error, "text")
        self._ending(exchange_id)
        done: concurrent.futures.Future[ExchangeSummary] = concurrent.futures.Future()
        dropped = self._dropped.pop(exchange_id, 0)
        notes = [f"{dropped} chunks were not recorded: the log writer fell behind"] if dropped else []
        if exchange_id in self._bodies_dropped:
            self._bodies_dropped.discard(exchange_id)
            notes.append("the request body was not recorded: the log writer fell behind")
        if notes:
            error = "; ".join([error, *notes] if error else notes)
        self._put((END, exchange_id, duration_ns, outcome, error, done))
        return done

    def flush(self, timeout: float | None = None) -> None:
        """Block until everything queued so far is committed."""
        done = threading.Event()
        self._put((FLUSH, done.set))
        if not self._alive():
            raise LogError(f"{self.path}: the log writer has stopped")
        if not done.wait(timeout):
            raise LogError(f"{self.path}: flush timed out after {timeout} s")

    async def aflush(self) -> None:
        """Like :meth:`flush`, awaited without blocking the event loop."""
        # Here, not at the top: whoever awaits this has loaded asyncio; a process that only
        # writes a log (an import, the log writer's own) need not.
        import asyncio  # noqa: PLC0415

        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed while we waited
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))

        self._put((FLUSH, wake))
        if not self._alive():
            raise LogError(f"{self.path}: the log writer has stopped")
        await done

    def close(self) -> None:
        """Commit everything queued, finish exchanges still open (outcome
        ``log_closed``), and release the log. Safe to call twice, and from ``on_error``:
        there (one of the writer's own threads, which the shutdown waits for) it only
        stops the writer, whose threads then release the log themselves."""
        on_own_thread = threading.current_thread() in self._own_threads()
        with self._queued_lock:
            first = not self._closed
            if first:
                self._closed = True
                self._closing_itself = on_own_thread
                self._open.clear()
                self._queue.put((STOP,))
        if on_own_thread:
            return
        if not first:  # (another thread closes it, or its own threads do)
            self._released.wait()
            return
        try:
            self._shutdown()
        finally:
            self._done_closing()

    def _done_closing(self) -> None:
        """The log is released: whoever waits on close() returns."""
        _open_writers.discard(self)
        LogProducer.lost_in_process += self.stats.rows_lost
        self._released.set()

    async def aclose(self) -> None:
        import asyncio  # noqa: PLC0415 - see aflush

        await asyncio.to_thread(self.close)

    def __enter__(self) -> LogProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, op: tuple[Any, ...]) -> None:
        with self._queued_lock:
            if self._closed:
                raise WriterClosed(f"{self.path}: the log writer is closed")
            self._queue.put(op)

    def _check_open(self, exchange_id: int, call: str) -> None:
        if exchange_id not in self._open:
            raise self._not_open(exchange_id, call)

    def _ending(self, exchange_id: int) -> None:
        try:
            self._open.remove(exchange_id)  # (atomic: of two ends racing, one is refused)
        except KeyError:
            raise self._not_open(exchange_id, "end_exchange()") from None

    def _not_open(self, exchange_id: int, call: str) -> LogError:
        """What a call for an exchange that is not open here raises: WriterClosed once the
        writer is closed, else UnknownExchange (it has ended, or was never begun here)."""
        if self._closed:
            return WriterClosed(f"{self.path}: {call} after close()")
        ended = self._first_exchange <= exchange_id <= self._last_exchange
        why = "has ended" if ended else "was never begun by this writer"
        return UnknownExchange(f"{self.path}: {call} for exchange {exchange_id}, which {why}")

    def _alive(self) -> bool:
        raise NotImplementedError

    def _own_threads(self) -> tuple[threading.Thread, ...]:
        """The threads that write the log (and call on_error)."""
        raise NotImplementedError

    def _shutdown(self) -> None:
        """Wait until everything queued before STOP is written, then release the log."""
        raise NotImplementedError

    def _failed(
        self,
        error: str,
        rows: int,
        exc: BaseException | None = None,
        *,
        batch: bool = True,
        uncounted: str | None = None,
    ) -> None:
        """Rows could not be written: count them and say so, loudly; ``uncounted`` says
        what else is lost, that no count can tell yet (it is said instead of the count)."""
        stats = self.stats
        with self._stats_lock:  # from the writer's threads and the producers' alike
            stats.failed_batches += batch
            stats.rows_lost += rows
            stats.last_error = error
            if len(stats.errors) < 100:
                stats.errors.append(error)
        told = ""
        if self._on_error is not None:
            try:
                self._on_error(exc or LogError(error), rows)
                return
            except Exception as failed:  # the loss is said here instead, and why
                told = f" (on_error raised {type(failed).__name__}: {failed})"
        if uncounted or time.monotonic() - self._last_report >= _REPORT_EVERY:
            # Loud, but not a line per batch while the disk stays full.
            self._last_report = time.monotonic()
            lost = uncounted or f"{rows} rows lost, {stats.rows_lost} in all so far"
            print(
                f"tasktape: WRITING THE LOG FAILED ({error}); {lost}. Traffic is not affected.{told}",
                file=sys.stderr,
                flush=True,
            )


def checked_piece(offset_ns: Any, data: Any) -> tuple[int, bytes]:
    """A piece of a body as the writers take it, or UsageError at the call: the writer's
    thread would lose its exchange for it, or store rows no reader can read back. Data
    given as a bytearray or memoryview is copied (the caller may reuse its buffer, and a
    memoryview cannot travel to a writer process)."""
    check_bound("offset_ns", offset_ns, whole=True, least=0)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise UsageError(f"a chunk's data is bytes (or a bytearray or memoryview), not {type(data).__name__}")
    return int(offset_ns), bytes(data)


def _text(name: str, value: Any, meaning: str) -> None:
    """A UsageError at the call for a value that is not text: the log would keep an exchange
    that no replay or cassette can take."""
    if not isinstance(value, str):
        raise UsageError(f"{name} is {meaning} (str), not {type(value).__name__}")


def _text_or_none(name: str, value: Any, meaning: str) -> None:
    """A UsageError at the call for a value that is neither text nor None."""
    if value is not None and type(value) is not str:
        raise UsageError(f"{name} is {meaning} (str) or None, not {type(value).__name__}")


def checked_body(body: Any) -> bytes | None:
    """A request body as the writers take it (bytes, or None), or UsageError at the call:
    the writer's thread would lose its exchange for it. A bytearray or memoryview is
    copied, as a chunk's data is."""
    if body is None or type(body) is bytes:
        return body
    if not isinstance(body, bytes | bytearray | memoryview):
        raise UsageError(
            f"a request body is bytes (or a bytearray or memoryview), not {type(body).__name__}"
            + (": encode it" if isinstance(body, str) else "")
        )
    return bytes(body)


def checked_pieces(pieces: Iterable[tuple[Any, Any]]) -> list[tuple[int, bytes]]:
    """Pieces of a body, each as :func:`checked_piece` has it: all checked before any is
    queued."""
    return [
        (offset_ns, data)
        if type(data) is bytes and type(offset_ns) is int and offset_ns >= 0
        else checked_piece(offset_ns, data)
        for offset_ns, data in pieces
    ]


def check_bound(name: str, value: Any, *, whole: bool, least: int) -> None:
    """A bound given as something else fails at once, not in the writer's thread later."""
    kinds = int if whole else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or not least <= value < math.inf:
        what = "a whole number" if whole else "a number"
        unit = "" if whole else " of seconds"
        raise UsageError(f"{name} is {what}{unit}, at least {least}, not {value!r}")


# What a commit tap has (``commit_tap.CommitTap``).
_TAP_METHODS = ("open", "committed", "changed", "close")


def check_options(redactor: Any, tap: Any) -> None:
    """A redactor or tap of another kind fails at once: in the writer's thread, every
    exchange would be lost to it."""
    if redactor is not None and not isinstance(redactor, Redactor):
        raise UsageError(
            f"redactor must be a tasktape Redactor (Redactor(headers=[...])), not {type(redactor).__name__}"
        )
    if tap is not None and not (
        hasattr(tap, "fds") and all(callable(getattr(tap, name, None)) for name in _TAP_METHODS)
    ):
        raise UsageError(
            "tap must be a CommitTap (with fds, open(), committed(), changed() and close()), "
            f"not {type(tap).__name__}"
        )


def _pairs(headers: Headers | Mapping[str, str] | None, what: str) -> list[tuple[str, str]] | None:
    """Headers as a plain list of pairs: what any writer can keep, or send to a process. Pairs
    of another kind (bytes, None values, three items) are a UsageError at the call: they were
    kept as Python's writing of them ("b'X-N'", "None")."""
    if headers is None:
        return None
    pairs = list(headers.items()) if isinstance(headers, Mapping) else headers_listed(headers, what)
    problem = header_problem(pairs, what)
    if problem is not None:
        raise UsageError(problem)
    return [(str(k), str(v)) for k, v in pairs]  # (str: a name as multidict's istr, kept as plain text)


_open_writers: weakref.WeakSet[LogProducer] = weakref.WeakSet()


@atexit.register
def close_open_writers() -> None:
    """Writers still open when the interpreter exits are closed then, so nothing queued
    is lost to a forgotten ``close()``."""
    for writer in list(_open_writers):
        writer.close()


class NullWriter(LogProducer):
    """Takes every operation and writes nothing: for forwarding without recording."""

    def __init__(self, path: str | Path = "(nowhere)") -> None:
        """``path``: the log it stands in for (a recorder's, once that log was closed)."""
        super().__init__(path, None, max_backlog=0)
        self._start_ids(1, 1)

    def chunk(self, exchange_id: int, offset_ns: int, data: bytes) -> None:
        return None

    # Any id, ended or not: nothing is written for it.
    def _check_open(self, exchange_id: int, call: str) -> None:
        return None

    def _ending(self, exchange_id: int) -> None:
        self._open.discard(exchange_id)

    def _put(self, op: tuple[Any, ...]) -> None:
        if op[0] == END and op[5].set_running_or_notify_cancel():
            op[5].set_result(ExchangeSummary(op[1]))
        elif op[0] == FLUSH:
            op[1]()

    def _alive(self) -> bool:
        return True

    def _own_threads(self) -> tuple[threading.Thread, ...]:
        return ()

    def _shutdown(self) -> None:
        return None
