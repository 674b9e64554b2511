"""One exchange turned into rows, in the writer's thread: request classification,
content decoding, SSE decoding and classification, body caps and redaction."""

from __future__ import annotations

import contextlib
import copy
import json
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson

from .classify import Classification
from .content_coding import MAX_DECODED, REST_AS_RECEIVED, Inflate, TooLarge, decode_body, too_large
from .exchange_statements import INSERT_EXCHANGE, UPDATE_BODY, UPDATE_END, UPDATE_HEAD, Statement
from .http_fields import joined
from .protocols import recognise, recognise_stream
from .protocols.base import Protocol, Request, RequestInfo, StreamReader, Summary
from .recorded import AS_SENT
from .redact import Redactor
from .sse import SSEDecoder, SSEEvent, written
from .uids import uuid7

Headers = Mapping[str, str] | Iterable[tuple[str, str]]
Rows = list[tuple[Any, ...]]

# The columns of a chunk's and of an event's row, in the order the rows are built.
CHUNK_COLUMNS = ("exchange_id", "seq", "offset_ns", "data")
EVENT_COLUMNS = (
    *("exchange_id", "seq", "offset_ns", "event_id", "last_event_id", "event_type", "data"),
    *("retry", "complete", "chunk_seq", "chunk_crlf", "chunk_events", "kind", "task_id", "context_id"),
    *("state", "artifact_id", "artifact_type", "append", "last_chunk", "text", "usage", "parse_error"),
)

# Headers as the log stores them: json.dumps(..., ensure_ascii=False)'s text, by one
# encoder (dumps makes an encoder for every call given an option: a microsecond).
_headers_json = json.JSONEncoder(ensure_ascii=False).encode

# Bytes of a request body, or of a response that is no event stream, the log keeps by default.
MAX_BODY = 16 * 1024 * 1024
# SQLite stores a bound NaN as NULL, and Python's sqlite3 binds a float several
# times faster than None (which goes through its adapter lookup): most event
# columns are NULL, so this roughly halves the cost of inserting an event row.
NULL = float("nan")
_NO_CHUNK = (NULL, NULL, NULL)  # an event whose bytes are in stored chunks


class Kept(StrEnum):
    """How much of a finished exchange the log holds, when not all of it."""

    ROW = "recorded without its body"  # its row, not its bodies, chunks or events
    UNFINISHED = "its end is not in the log"  # its row, as it was before it ended
    NOTHING = "not recorded"


@dataclass(slots=True)
class ExchangeSummary:
    """What the writer learnt from one finished exchange."""

    exchange_id: int
    is_sse: bool = False
    method: str | None = None
    path: str | None = None
    status: int | None = None
    chunks: int = 0
    bytes: int = 0
    events: int = 0
    task_id: str | None = None
    context_id: str | None = None
    binding: str | None = None
    rpc_method: str | None = None
    protocol: str | None = None
    session_id: str | None = None
    final_state: str | None = None
    first_event_ns: int | None = None
    duration_ns: int | None = None
    outcome: str | None = None
    undecoded: str | None = None  # why (part of) a body is stored as received, not decoded
    error: str | None = None  # why it did not end as it meant to, as the recorder tells it
    kept: Kept | None = None  # what of it the log holds, when not all (None: all of it)
    lost: str | None = None  # and why the rest is not there
    body_cut_at: int | None = None  # the bytes of a response body kept, when max_body cut it
    request_cut_at: int | None = None  # and of a request body

    def undecoded_note(self, option: str) -> str | None:
        """What a console says of a body the log could not decode (None: it could), naming
        ``option``, the bound a user can raise, when the body was past it."""
        why = self.undecoded
        if not why:
            return None
        bound = f" ({option})" if isinstance(why, TooLarge) else ""
        return f"exchange {self.exchange_id} ({self.method} {self.path}): {why}{bound}; see exchanges.error"


def utc_iso(ns: int) -> str:
    """Nanoseconds since the epoch as ``2026-11-30T10:18:28.123456Z``."""
    seconds, rest = divmod(ns, 1_000_000_000)
    second = _SECOND[0]  # (read once: another thread may replace it)
    if second[0] != seconds:  # the date and time to the second, made once a second
        second = _SECOND[0] = (seconds, datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{second[1]}.{rest // 1000:06d}Z"


_SECOND: list[tuple[int, str]] = [(-1, "")]  # the last second utc_iso wrote, and its text


def stored_body(body: bytes | None) -> bytes | str | None:
    """Bodies that are UTF-8 are stored as text so they read well in SQL and Datasette;
    anything else as a BLOB. Both round-trip to the exact bytes."""
    if body is None:
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return body


class ExchangeRows:
    """The rows of one exchange, built as its parts arrive."""

    def __init__(
        self,
        exchange_id: int,
        redactor: Redactor,
        max_body: int,
        max_decoded: int = MAX_DECODED,
        spill: Callable[[], None] | None = None,
    ) -> None:
        self.summary = ExchangeSummary(exchange_id)
        self._redactor = redactor
        self._max_body = max_body
        self._max_decoded = max_decoded
        self._spill = spill  # lets the writer commit what a decoded body has brought so far
        self._request_encoding: str | None = None
        # How a request body given already as a log keeps it was decoded (an import's):
        # it is stored as given, not decoded again. None: given as sent.
        self._request_decoded: str | None = None
        self._request_type: str | None = None  # its Content-Type: how a form's fields are spelt
        self._encoding: str | None = None
        self._response_type: str | None = None  # the response's Content-Type (a form is redacted too)
        self._redacts_body = False  # redaction may change the response body: it is held, redacted whole
        self._is_sse = False
        self._withheld = False
        self._decoder: SSEDecoder | None = None
        self._inflate: Inflate | None = None
        self._chunk_seq = 0
        self._event_seq = 0
        self._last_offset = 0
        self._error: str | None = None  # what could not be done with the response body
        self._request_error: str | None = None  # and with the request body
        self._protocol: Protocol | None = None
        self._reader: StreamReader | None = None
        # What the reader made of the events the client was sent, taken before the tail of
        # a stream cut short (an event whose blank line never came: no client dispatched
        # it), which is classified for its row but counts for nothing in the summary.
        self._sent: Summary | None = None
        self._recognised = False  # whether the protocol is settled (else the first event may tell)
        self._headers_seen: list[tuple[str, str]] = []
        # SSE chunks waiting for their events to complete before JSON redaction, as
        # [arrival number, offset, bytes]; or a non-streamed body (kept up to max_body).
        self._held: deque[list[Any]] = deque()
        self._arrivals = 0
        self._body: list[bytes] = []
        self._body_len = 0
        self._truncated = False
        self._cut_before = False  # a body given cut already (an import's): flagged so

    def request(
        self,
        capture_id: int,
        started_ns: int,
        method: str,
        path: str,
        query: str | None,
        headers: Headers | None,
        body: bytes | None,
        body_truncated: bool,
        uid: str | None = None,
        decoded_from: str | None = None,
    ) -> Statement:
        pairs = _pairs(headers)
        # Every line of it, joined (RFC 9110 section 5.3): two lines of gzip are gzip, gzip.
        self._request_encoding = joined(pairs, "Content-Encoding")
        self._request_decoded = decoded_from
        self._request_type = next((v for k, v in pairs if k.lower() == "content-type"), None)
        # The protocols read them redacted too: a redacted value is kept nowhere (an
        # Mcp-Session-Id given to --redact-header was the row's session_id).
        self._headers_seen = self._redactor.header_pairs(pairs)
        s = self.summary
        if body_truncated and body is not None:
            s.request_cut_at = len(body)
        body, encoding = self._request_body(body)
        s.method, s.path = method, path
        info = self._recognise(body)
        return INSERT_EXCHANGE, (
            s.exchange_id,
            uid or uuid7(started_ns),
            capture_id,
            utc_iso(started_ns),
            started_ns,
            method,
            path,
            self._redactor.query(query),
            None if headers is None else self._headers(self._headers_seen),
            stored_body(body),
            int(body_truncated),
            encoding,
            info.binding,
            info.rpc_method,
            info.task_id,
            info.context_id,
            s.protocol,
            s.session_id,
        )

    def _recognise(self, body: bytes | None) -> RequestInfo:
        """Which protocol the request speaks, and what it says (once its body is here: a
        body that comes late tells what the request is of the protocol already known, by
        its headers or by the first event)."""
        s = self.summary
        request = Request(s.method or "", s.path or "", self._headers_seen, body)
        known = self._protocol
        protocol = known if known is not None and known.claims(request) else recognise(request)
        if protocol is None or (known is not None and protocol is not known):
            return RequestInfo()
        if known is None:
            self._use(protocol)
        info = protocol.request_info(request)
        s.binding = info.binding or s.binding
        s.rpc_method, s.session_id = info.rpc_method or s.rpc_method, info.session_id or s.session_id
        s.task_id, s.context_id = s.task_id or info.task_id, s.context_id or info.context_id
        return info

    def _use(self, protocol: Protocol) -> None:
        self._protocol, self._reader, self._recognised = protocol, protocol.reader(), True
        self.summary.protocol = protocol.name

    def late_request_body(self, body: bytes, truncated: bool) -> Statement:
        s = self.summary
        if truncated:
            s.request_cut_at = len(body)
        stored, encoding = self._request_body(body)
        if stored is not None:
            self._recognise(stored)
        return UPDATE_BODY, (
            stored_body(stored),
            int(truncated),
            encoding,
            s.binding,
            s.rpc_method,
            s.task_id,
            s.context_id,
            s.protocol,
            s.session_id,
            s.exchange_id,
        )

    def _request_body(self, body: bytes | None) -> tuple[bytes | None, str | None]:
        """The request body as the log keeps it: decoded from its Content-Encoding (and
        the encoding it was decoded from), then redacted (a form's fields as its
        Content-Type says they are spelt). The client's bytes went to the
        upstream as they were; one that cannot be decoded is kept as sent, or not at all
        when redaction could change a body of its type (JSON fields, a form's fields)."""
        if body is None:
            return None, None
        if self._request_decoded is not None:
            return self._given_body(body)
        decoded, why = decode_body(body, self._request_encoding, self._max_decoded)
        if why is not None:
            self.summary.undecoded = why
            if self._redactor.changes_body(self._request_type):
                self._request_error = f"request body: {why}: it is not stored, since it could not be redacted"
                return None, None
            self._request_error = f"request body: {why}: it is stored as sent"
            return body, None
        encoding = self._request_encoding if decoded is not body else None
        return self._redactor.body_bytes(decoded, self._request_type), encoding

    def _given_body(self, body: bytes) -> tuple[bytes | None, str | None]:
        """A request body given as a log keeps it: decoded already (redacted as decoded
        bodies are), or kept as sent (its error, that it could not be decoded, is given
        with it: when redaction could change it it is not stored, as then)."""
        if self._request_decoded != AS_SENT:
            return self._redactor.body_bytes(body, self._request_type), self._request_decoded
        if self._redactor.changes_body(self._request_type):
            self._request_error = (
                "request body: kept as sent: it is not stored, since it could not be redacted"
            )
            return None, None
        return body, None

    def head(
        self,
        status: int,
        headers: Headers | None,
        is_sse: bool,
        ttfb_ns: int,
        content_encoding: str | None,
        decoded_from: str | None,
        body_truncated: bool = False,
    ) -> Statement:
        self.summary.status = status
        self._cut_before = body_truncated
        self.summary.is_sse = is_sse
        pairs = _pairs(headers)
        self._response_type = next((v for k, v in pairs if k.lower() == "content-type"), None)
        self._redacts_body = self._redactor.changes_body(self._response_type)
        redacted = None if headers is None else self._redactor.header_pairs(pairs)
        if self._protocol is not None and self.summary.session_id is None and redacted is not None:
            self.summary.session_id = self._protocol.session(redacted)
        # A response that is not a stream is read whole: no first event to recognise it by.
        self._recognised = self._recognised or not is_sse
        # A head given again (a 502 in place of an answer that could not be sent) starts afresh.
        self._encoding, self._inflate, self._decoder = None, None, None
        if content_encoding and content_encoding.strip().lower() != "identity":
            self._encoding = content_encoding
            self._inflate = Inflate.for_encoding(content_encoding, self._max_decoded)
            if self._inflate is None:
                self._undecodable(f"cannot decode Content-Encoding {content_encoding}")
            else:
                decoded_from = content_encoding
        self._is_sse = is_sse
        if is_sse and self._error is None:
            # Raw event bytes are only needed to redact them inside the stored chunks.
            self._decoder = SSEDecoder(keep_raw=bool(self._redactor.json_pointers))
        return UPDATE_HEAD, (
            status,
            None if redacted is None else self._headers(redacted),
            int(is_sse),
            ttfb_ns,
            decoded_from,
            self.summary.exchange_id,
        )

    def chunk(self, offset_ns: int, data: bytes, chunk_rows: Rows, event_rows: Rows) -> None:
        inflate = self._inflate
        if inflate is None:
            self._decoded(offset_ns, data, chunk_rows, event_rows)
            return
        # A compressed chunk can decode to a thousand times its size: piece by piece, each
        # piece's rows handed on (spill) before the next is decoded.
        try:
            for piece in inflate.pieces(data):
                self._decoded(offset_ns, piece, chunk_rows, event_rows)
                if self._spill is not None:
                    self._spill()
        except zlib.error as exc:
            self._undecodable(f"content decoding failed ({exc})", rest=True)
        else:
            if not inflate.exceeded:
                return
            self._undecodable(too_large(self._encoding or "", inflate.limit), rest=True)
        # From this chunk on, the wire bytes as they came.
        self._inflate = None
        self._decoded(offset_ns, data, chunk_rows, event_rows)

    def _decoded(self, offset_ns: int, data: bytes, chunk_rows: Rows, event_rows: Rows) -> None:
        """A piece of the body as the log keeps it (decoded from its Content-Encoding)."""
        if not data or self._withheld:
            return
        self._last_offset = offset_ns
        self.summary.chunks += 1
        self.summary.bytes += len(data)
        if self._decoder is None:
            if self._is_sse:  # a stream we cannot decode: kept whole, without events
                self._chunk_row(offset_ns, data, chunk_rows)
            else:
                self._body_chunk(offset_ns, data, chunk_rows)
        elif self._redactor.json_pointers:
            self._held.append([self._arrivals, offset_ns, data])
            self._arrivals += 1
            self._release(self._decoder.feed(data), offset_ns, chunk_rows, event_rows)
        else:
            decoder = self._decoder
            events = decoder.feed(data)
            if events and data.endswith(b"\n"):
                crlf = data.endswith(b"\r\n\r\n")
                if decoder.as_written or _written_back(data, events, crlf):
                    # Whole events alone: stored once, in their rows, which write the chunk back.
                    chunk, ends = self._chunk_seq, int(crlf)
                    self._chunk_seq += 1
                    held = NULL if len(events) == 1 else len(events)  # on the first: how many it holds
                    self._event(events[0], events[0].data, offset_ns, event_rows, (chunk, ends, held))
                    for event in events[1:]:
                        self._event(event, event.data, offset_ns, event_rows, (chunk, ends, 0))
                    return
            self._chunk_row(offset_ns, data, chunk_rows)
            for event in events:
                self._event(event, event.data, offset_ns, event_rows)

    def end(
        self, duration_ns: int | None, outcome: str, error: str | None, chunk_rows: Rows, event_rows: Rows
    ) -> Statement:
        if self._inflate is not None:
            with contextlib.suppress(zlib.error):
                tail = self._inflate.flush()
                if tail:
                    self._decoded(self._last_offset, tail, chunk_rows, event_rows)
        body = None
        if self._decoder is not None:
            self._release(self._decoder.close(), self._last_offset, chunk_rows, event_rows)
        elif not self._is_sse:
            body = b"".join(self._body)
            if self._redacts_body:
                redacted = self._redactor.body_bytes(body, self._response_type)
                if redacted is body:
                    for _, offset, data in self._held:
                        self._chunk_row(offset, data, chunk_rows)
                elif self._held:
                    self._chunk_row(self._held[-1][1], redacted, chunk_rows)
                body = redacted
            self._classify_body(body)
        s = self.summary
        s.outcome, s.duration_ns, s.error = outcome, duration_ns, error
        read = self._read()
        if read is not None and self._protocol is not None:  # (an LLM's: the finish stored)
            s.final_state = self._protocol.final_state(s.final_state, read)
        return UPDATE_END, (
            duration_ns,
            outcome,
            "; ".join(filter(None, (error, self._error, self._request_error))) or None,
            stored_body(body) if s.chunks else None,
            int(self._truncated or self._cut_before),
            s.binding,
            s.task_id,
            s.context_id,
            s.protocol,
            s.session_id,
            *(
                (
                    *(read.model, read.answer, read.input_tokens, read.output_tokens, read.finish),
                    *(read.tool_calls, read.cached_input_tokens),
                )
                if read
                else (None,) * 7
            ),
            s.exchange_id,
        )

    def _read(self) -> Summary | None:
        """What the reader made of the response: of a stream, the events its client was sent."""
        if self._sent is not None:
            return self._sent
        return self._reader.finished() if self._reader is not None else None

    def _classify_body(self, body: bytes) -> None:
        """A non-streamed answer is read by its protocol: an A2A task, message or JSON-RPC
        result names the task and its state just as a stream does."""
        if not body or self._truncated or self._cut_before:
            return
        if self._reader is None:
            protocol = recognise_stream(body.decode("utf-8", "replace"), None)
            if protocol is None:
                return
            self._use(protocol)
        c = self._reader.body(body)
        if c is None:
            return
        s = self.summary
        s.task_id = s.task_id or c.task_id
        s.context_id = s.context_id or c.context_id
        s.binding = s.binding or c.binding
        s.final_state = c.state or s.final_state

    def _undecodable(self, why: str, *, rest: bool = False) -> None:
        """A body that cannot be decoded is stored as received, unless JSON fields are to
        be redacted from it: then it is not stored at all, since it cannot be redacted."""
        part = "the rest of the body" if rest else "the body"
        self.summary.undecoded = why
        if self._redacts_body:
            self._withheld = True
            self._error = f"{why}: {part} is not stored, since it could not be redacted"
        else:  # (the rest's words are what replay reads: rest_undecoded)
            self._error = f"{why}: {REST_AS_RECEIVED if rest else 'the body is stored as received'}"

    @staticmethod
    def _headers(redacted: list[tuple[str, str]]) -> str:
        """Redacted headers as stored: their bytes that are not UTF-8 read as Latin-1."""
        return _headers_json([(k, v) if v.isascii() else (k, _header_text(v)) for k, v in redacted])

    def _chunk_row(self, offset_ns: int, data: bytes, chunk_rows: Rows) -> None:
        chunk_rows.append((self.summary.exchange_id, self._chunk_seq, offset_ns, data))
        self._chunk_seq += 1

    def _body_chunk(self, offset_ns: int, data: bytes, chunk_rows: Rows) -> None:
        """A chunk of a body that is not an event stream: kept up to max_body."""
        if self._truncated:
            return
        room = self._max_body - self._body_len
        if len(data) > room:
            data, self._truncated = data[:room], True
            self.summary.body_cut_at = self._max_body
            if not data:
                return
        self._body_len += len(data)
        self._body.append(data)
        if self._redacts_body:
            self._held.append([0, offset_ns, data])  # redacted as a whole at the end
        else:
            self._chunk_row(offset_ns, data, chunk_rows)

    def _release(self, events: list[SSEEvent], offset_ns: int, chunk_rows: Rows, event_rows: Rows) -> None:
        """Emit the held bytes that these completed events cover, redacted. Chunks keep
        their boundaries; an event whose data was redacted becomes a chunk of its own."""
        pieces: list[list[Any]] = []  # [arrival number or None, offset, bytes]
        for event in events:
            data = self._redactor.json_text(event.data) if event.data else event.data
            taken = self._take(len(event.raw))
            if data is event.data:
                pieces.extend(taken)
            else:
                pieces.append([None, taken[-1][1] if taken else offset_ns, _reframe(event, data)])
            if event.complete or event.data:  # sse.is_event, inline: this runs for every event
                self._event(event, data, offset_ns, event_rows)
        merged: list[list[Any]] = []
        for piece in pieces:
            if merged and piece[0] is not None and merged[-1][0] == piece[0]:
                merged[-1][2] += piece[2]
            else:
                merged.append(piece)
        for _, offset, data in merged:
            self._chunk_row(offset, data, chunk_rows)

    def _take(self, size: int) -> list[list[Any]]:
        """The first ``size`` held bytes, as pieces of the chunks they arrived in."""
        taken = []
        while size > 0 and self._held:
            arrival, offset, data = self._held[0]
            if len(data) <= size:
                self._held.popleft()
                taken.append([arrival, offset, data])
                size -= len(data)
            else:
                taken.append([arrival, offset, data[:size]])
                self._held[0][2] = data[size:]
                size = 0
        return taken

    def _event(
        self,
        event: SSEEvent,
        data: str,
        offset_ns: int,
        event_rows: Rows,
        chunk: tuple[float, float, float] = _NO_CHUNK,
    ) -> None:
        """An event's row; ``chunk``: the seq of the chunk of whole events it is in, whether
        that chunk's lines end in CRLF, and (for a chunk of several) how many events it holds
        on its first event, 0 on the others. That chunk is written back from its events'
        rows, not stored."""
        if not self._recognised and data:
            self._recognised = True
            protocol = recognise_stream(data, event.event)
            if protocol is not None:
                self._use(protocol)
        if not event.complete and self._reader is not None:
            self._sent = copy.copy(self._reader.finished())
        c = self._reader.event(data, event.event) if self._reader is not None else _OTHER
        s = self.summary
        seq = self._event_seq
        self._event_seq = seq + 1
        s.events += 1
        if s.first_event_ns is None:
            s.first_event_ns = offset_ns
        if c.task_id and s.task_id is None:
            s.task_id = c.task_id
        if c.context_id and s.context_id is None:
            s.context_id = c.context_id
        if c.binding and s.binding is None:
            s.binding = c.binding
        if c.state and event.complete:
            s.final_state = c.state
        ident, event_type, retry = event.id, event.event, event.retry
        event_rows.append(
            (
                s.exchange_id,
                seq,
                offset_ns,
                NULL if ident is None else ident,
                event.last_event_id,
                NULL if event_type is None else event_type,
                data,
                NULL if retry is None else retry,
                1 if event.complete else 0,
                *chunk,
                *event_columns(c),
            )
        )


def _written_back(data: bytes, events: list[SSEEvent], crlf: bool) -> bool:
    """Whether ``data`` is exactly these events, each in the one form its fields write back
    (sse.written), all with the chunk's line ends (``crlf``)."""
    if len(events) == 1:  # the commonest, without a list to join
        event = events[0]
        return data == written(event.data, event.id, event.event, crlf)
    return data == b"".join([written(e.data, e.id, e.event, crlf) for e in events])


_OTHER = Classification("other")  # an event of a stream no protocol claimed


def _pairs(headers: Headers | None) -> list[tuple[str, str]]:
    if headers is None:
        return []
    return list(headers.items() if isinstance(headers, Mapping) else headers)


def _header_text(value: str) -> str:
    """Header bytes that are not UTF-8 reach us surrogate-escaped (aiohttp): store them
    as the Latin-1 text HTTP defines them to be."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("latin-1")
    return value


def event_columns(c: Classification) -> tuple[Any, ...]:
    """An event's classified columns, ``kind`` to ``parse_error``, as the events table binds
    them: NULL as NaN, flags as 0 or 1 (see ``NULL``; a bool binds slowly too)."""
    (
        kind,
        _,
        task_id,
        context_id,
        state,
        artifact_id,
        artifact_type,
        append,
        last_chunk,
        text,
        usage,
        error,
    ) = c
    if type(kind) is not str:  # a protocol's StrEnum member: sqlite3 binds a plain str twice as fast
        kind = str(kind)
    return (
        kind,
        NULL if task_id is None else task_id,
        NULL if context_id is None else context_id,
        NULL if state is None else state,
        NULL if artifact_id is None else artifact_id,
        NULL if artifact_type is None else artifact_type,
        NULL if append is None else 1 if append else 0,
        NULL if last_chunk is None else 1 if last_chunk else 0,
        NULL if text is None else text,
        NULL if usage is None else usage_json(usage),
        NULL if error is None else error,
    )


def usage_json(usage: dict[str, Any]) -> str:
    try:
        return orjson.dumps(usage).decode()
    except TypeError:  # lone surrogates, from escapes in the JSON: ASCII escapes keep them
        return json.dumps(usage, ensure_ascii=True)


def _reframe(event: SSEEvent, data: str) -> bytes:
    """An event's bytes with its data replaced: in place when the data is one line of
    the original bytes, else written afresh (comments before it are dropped)."""
    old = event.data.encode()
    if "\n" not in event.data and event.raw.count(old) == 1:
        return event.raw.replace(old, data.encode())
    lines = [
        f"id: {event.id}" if event.id is not None else None,
        f"event: {event.event}" if event.event is not None else None,
        f"retry: {event.retry}" if event.retry is not None else None,
        *(f"data: {line}" for line in data.split("\n")),
    ]
    return ("\n".join(line for line in lines if line is not None) + "\n\n").encode()
