"""mitmproxy flows as event-log exchanges: what the mitmproxy addon and the flow-file
import both record of a flow. Needs mitmproxy (the ``mitm`` extra); only the addon and
``tasktape import`` of a flow file import this module."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from mitmproxy import exceptions, http, io
from mitmproxy.connection import ConnectionState
from mitmproxy.flow import Error
from mitmproxy.net.http.http1 import expected_http_body_size

from tasktape.errors import FlowFileError
from tasktape.eventlog import LogProducer
from tasktape.eventlog.exchange_rows import MAX_BODY, ExchangeSummary
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.producer import MAX_STATUS, MIN_STATUS
from tasktape.eventlog.uids import derived_uuid7

from .failure import dropped
from .kept_body import KeptBody

# What mitmproxy says when the client side went away (HTTP/1; an HTTP/2 stream reset; an
# HTTP/3 stream closed).
_CLIENT_GONE = ("Client disconnected.", "stream reset by client", "stream closed by client")
_KILLED = "killed in mitmproxy (by an addon or by hand)"  # (an exchange's error)

# The note on an SSE exchange whose body mitmproxy buffered whole before saving it.
UNTIMED = (
    "timing unknown: imported from a mitmproxy flow file, where the event stream was buffered "
    "whole; every chunk and event has the offset of the response's end"
)
NOT_KEPT = "the body was streamed through mitmproxy and is not in the flow file"
# The notes on an exchange whose request body a flow file lacks (see missing_request_body).
REQUEST_NOT_KEPT = "the request body was streamed through mitmproxy and is not in the flow file"
REQUEST_CUT = "the request body had not come whole when the flow ended, and is not in the flow file"
# The note on an exchange that mitmproxy stopped during (live, or saved unfinished).
STOPPED = "mitmproxy stopped during the exchange"
# The note on an SSE exchange the addon let mitmproxy buffer whole.
BUFFERED_UNTIMED = (
    "timing unknown: mitmproxy buffered the event stream whole (tasktape_stream_events is off); "
    "every chunk and event has the offset of the response's end"
)

StreamCallable = Callable[[bytes], "bytes | Iterable[bytes]"]


class Side(StrEnum):
    """The message of a flow whose body mitmproxy may stream (``flow.<side>.stream``)."""

    REQUEST = "request"
    RESPONSE = "response"


def late_stream_note(side: Side) -> str:
    """A body of unknown size (chunked, or read to the close) that mitmproxy switched to
    streaming once it had buffered past ``stream_large_bodies``: it calls no hook then, so
    no tee could be set, and the part it had buffered went out unseen too."""
    return (
        f"the {side} body was streamed by mitmproxy (stream_large_bodies) after it began buffering; not kept"
    )


def replaced_stream_note(side: Side) -> str:
    return (
        f"a later addon replaced flow.{side}.stream: the {side} body passed without being recorded "
        "(load tasktape's addon after it)"
    )


def unrecorded_stream(
    side: Side, stream: object, tee: StreamCallable | None, late_possible: bool
) -> str | None:
    """Why a body streamed past the addon's tee, if it did: ``stream`` is the message's at
    the flow's end, ``tee`` the addon's (None if it set none), ``late_possible`` whether
    mitmproxy may have switched to streaming mid-body (``stream_large_bodies`` is set)."""
    if tee is not None:
        return None if stream is tee else replaced_stream_note(side)
    if not stream:
        return None
    return late_stream_note(side) if stream is True and late_possible else replaced_stream_note(side)


def _passed(out: bytes | Iterable[bytes]) -> bytes:
    """What a stream callable passes on, as one piece (mitmproxy takes bytes or an iterable of them)."""
    return out if isinstance(out, bytes) else b"".join(out)


def is_event_stream(response: http.Response) -> bool:
    """``Content-Type: text/event-stream`` with any parameters, as ``tasktape record`` decides."""
    return response.headers.get("content-type", "").split(";")[0].strip().lower() == "text/event-stream"


def request_headers(request: http.Request) -> list[tuple[str, str]]:
    """A request's headers; an HTTP/2 or HTTP/3 request's ``:authority`` first, as the
    ``Host`` an HTTP/1 client sends (readers of the log find the host there)."""
    headers = list(request.headers.items(multi=True))
    if (request.is_http2 or request.is_http3) and request.authority and "host" not in request.headers:
        headers.insert(0, ("Host", request.authority))
    return headers


def request_body(request: http.Request) -> bytes | None:
    """The body mitmproxy buffered; None when it streamed it, or when the request has none
    at all (no Content-Length or 0, not chunked), as ``tasktape record`` stores it."""
    body = request.raw_content
    if body == b"" and "chunked" not in request.headers.get("transfer-encoding", "").lower():
        return None
    return body


def missing_request_body(request: http.Request) -> str | None:
    """Why mitmproxy holds none of a request's body, when the request had one: it streamed
    it (mitmproxy keeps no body it streams, and no other request ends without one), or the
    flow ended before the body its headers announce came whole. None when it holds the
    body, or the request had none. Said as of a flow file's exchange."""
    if request.raw_content is not None:
        return None
    if request.timestamp_end is not None:
        return REQUEST_NOT_KEPT
    return REQUEST_CUT if _announces_body(request) else None


def _announces_body(request: http.Request) -> bool:
    """Whether a request's headers announce a body (a Content-Length above 0, or chunked);
    an HTTP/2 or HTTP/3 request's may not, and is taken to have none."""
    try:
        size = expected_http_body_size(request)
    except ValueError:  # (a malformed Content-Length: mitmproxy refuses the request)
        return False
    return size is None or size > 0


def request_fields(request: http.Request, max_body: int) -> dict[str, Any]:
    """``begin_exchange`` arguments for a request (with its body when it was buffered; cut
    when mitmproxy holds none of the body it had)."""
    path, _, query = request.path.partition("?")
    body = request_body(request)
    truncated = missing_request_body(request) is not None if body is None else len(body) > max_body
    return {
        "method": request.method,
        "path": path or "/",
        "query": query or None,
        "request_headers": request_headers(request),
        "request_body": None if body is None else body[:max_body],
        "request_body_truncated": truncated,
        "started_ns": round(request.timestamp_start * 1e9),
    }


def unkept_status(response: http.Response) -> str | None:
    """Why the log keeps no answer of a response whose status no HTTP status is (mitmproxy
    passes any number on: ``HTTP/1.1 42 X``); None for one in HTTP's range."""
    status = response.status_code
    if MIN_STATUS <= status <= MAX_STATUS:
        return None
    return (
        f"the upstream answered with status {status}, outside HTTP's {MIN_STATUS} to {MAX_STATUS}: the "
        "client was sent it, the log keeps none of the answer"
    )


def head_fields(response: http.Response) -> dict[str, Any]:
    """``response_head`` arguments, except the time to first byte."""
    return {
        "status": response.status_code,
        "headers": list(response.headers.items(multi=True)),
        "is_sse": is_event_stream(response),
        "content_encoding": response.headers.get("content-encoding"),
    }


def _client_gone(message: str) -> str:
    return f"the client went away mid-exchange: {message}"


def ending(flow: http.HTTPFlow) -> tuple[str, str]:
    """The outcome and error of a flow that mitmproxy ended with an error, named as
    ``tasktape record`` names them."""
    assert flow.error is not None
    message = flow.error.msg
    if message == Error.KILLED_MESSAGE:
        return Outcome.KILLED, _KILLED
    # A live flow also tells by its connections: mitmproxy stops reading the client's as
    # the client leaves, before this hook (and may have closed the upstream's on passing
    # that on). An HTTP/2 client's close or GOAWAY has no message of its own ("peer closed
    # connection" is an upstream's too); a saved flow's connections are all closed.
    client_gone = message.startswith(_CLIENT_GONE) or (
        flow.live and not flow.client_conn.state & ConnectionState.CAN_READ
    )
    if client_gone:
        return Outcome.CLIENT_DISCONNECTED, _client_gone(message)
    if flow.response is None:
        return Outcome.UPSTREAM_ERROR, f"the upstream failed before answering: {message}"
    if not _head_sent(flow, flow.response):
        why = "the upstream broke off mid-response, whose head mitmproxy had kept (buffering the body)"
        return Outcome.UPSTREAM_ERROR, f"{why}: {message}"
    return Outcome.UPSTREAM_DISCONNECTED, dropped(message)


def unsent(flow: http.HTTPFlow) -> tuple[str, str]:
    """The outcome and error of a flow that mitmproxy, once every addon's response hook
    had run, found with an error: it sent the client nothing more and called no error
    hook. It looks for two things only: the flow killed (by an addon or by hand), or its
    client gone meanwhile (a request protocol error queued)."""
    assert flow.error is not None
    message = flow.error.msg
    if message == Error.KILLED_MESSAGE:
        return Outcome.KILLED, _KILLED
    return Outcome.CLIENT_DISCONNECTED, _client_gone(message)


# A flow's metadata key: its response was streamed through by tasktape's addon.
STREAMED = "tasktape_streamed"


def _head_sent(flow: http.HTTPFlow, response: http.Response) -> bool:
    """Whether the client was sent the response's head: only when its body streamed (a
    live flow's says so; a saved one's, if tasktape's addon streamed it, its metadata; else
    mitmproxy buffered it, as it does by default). mitmproxy keeps the head of a body it
    buffers until the body is whole, and answers with its 502 if it never is."""
    return bool(response.stream) or bool(flow.metadata.get(STREAMED))


def record_failure(
    writer: LogProducer, exchange: int, flow: http.HTTPFlow, offset_ns: int
) -> tuple[str, str]:
    """The outcome and error to end an exchange with that mitmproxy ended with an error.
    When the upstream failed before the client was sent an answer, the client got
    mitmproxy's 502: that is recorded as the answer (in place of a head the upstream sent
    and mitmproxy kept), as ``tasktape record`` records its own 502."""
    outcome, error = ending(flow)
    if outcome == Outcome.UPSTREAM_ERROR:
        writer.response_head(exchange, status=502, headers=None, is_sse=False, ttfb_ns=offset_ns)
    return outcome, error


@dataclass
class InFlight:
    """A live flow being recorded: its exchange once begun, the clock its offsets count
    from (the request headers' arrival), its response head until the client is sent it,
    the addon's stream tees, what was kept of a streamed request body, and notes for the
    exchange's end."""

    t0: int
    exchange: int = 0  # ids start at 1: 0 until the exchange is begun
    ended: bool = False  # no more rows: the exchange ended, or the log was closed under it
    body: KeptBody | None = None  # of a streamed request
    request_tee: StreamCallable | None = None
    response_tee: StreamCallable | None = None
    buffered_events: bool = False  # an event stream left to mitmproxy's buffering (tasktape_stream_events)
    answer_unkept: bool = False  # a response whose status the log cannot keep (unkept_status)
    # A response and its head's ``response_head`` arguments, held until the client is sent
    # the head: mitmproxy keeps the head of a body it buffers until the body is whole, and
    # never sends it if the body never is (the client leaves, mitmproxy stops), as a flow
    # file's import records it.
    held: tuple[http.Response, dict[str, Any]] | None = None
    notes: list[str] = field(default_factory=list)

    def offset(self) -> int:
        return time.perf_counter_ns() - self.t0

    def send_head(self, writer: LogProducer) -> None:
        """Record the response head held, once: the client is sent it."""
        if self.held is not None:
            writer.response_head(self.exchange, **self.held[1])
            self.held = None

    def tee_request(self, inner: StreamCallable | None, cap: int) -> StreamCallable:
        """A ``request.stream`` callable keeping the first ``cap`` bytes that pass on (what
        ``inner``, an earlier addon's callable, returns) for the log."""
        body = self.body = KeptBody(cap)

        def tee(data: bytes) -> bytes | Iterable[bytes]:
            if not data:  # mitmproxy's call for the end of the body
                body.whole = True
            if inner is not None:
                data = _passed(inner(data))
            body.keep(data)
            return data

        self.request_tee = tee
        return tee

    def tee_response(self, writer: LogProducer, inner: StreamCallable | None) -> StreamCallable:
        """A ``response.stream`` callable handing each chunk that passes on (what ``inner``,
        an earlier addon's callable, returns), as received, to the log (one queue append:
        the writer does the rest on its own threads)."""
        chunk, clock, t0 = writer.chunk, time.perf_counter_ns, self.t0

        def tee(data: bytes) -> bytes | Iterable[bytes]:
            if inner is not None:
                data = _passed(inner(data))
            if data and not self.ended:
                chunk(self.exchange, clock() - t0, data)
            return data

        self.response_tee = tee
        return tee

    def note_unrecorded(self, flow: http.HTTPFlow, late_possible: bool) -> None:
        """Note each body that streamed past the tees (a streamed request body's then counts
        as cut: not all of it, if any, was kept)."""
        messages = (
            (Side.REQUEST, flow.request, self.request_tee),
            (Side.RESPONSE, flow.response, self.response_tee),
        )
        for side, message, tee in messages:
            note = None if message is None else unrecorded_stream(side, message.stream, tee, late_possible)
            if note is None:
                continue
            self.notes.append(note)
            if side is Side.REQUEST and self.body is None:
                self.body = KeptBody(0)

    def end(
        self, writer: LogProducer, *, outcome: str = Outcome.COMPLETE, error: str | None = None
    ) -> Future[ExchangeSummary]:
        """End the exchange: what the writer learns of it, once written."""
        self.ended = True
        # A body mitmproxy switched to streaming after the response headers hook (past
        # stream_large_bodies, or by a later addon's callable) had its head sent then.
        if self.held is not None and self.held[0].stream:
            self.send_head(writer)
        if self.body is not None:
            self.body.log(writer, self.exchange)
        error = "; ".join(filter(None, (error, *self.notes))) or None
        return writer.end_exchange(self.exchange, duration_ns=self.offset(), outcome=outcome, error=error)


def read_flow_file(path: Path) -> tuple[list[http.HTTPFlow], int]:
    """The HTTP flows of a mitmproxy flow file, and how many other flows (TCP, UDP, DNS) it
    holds. A file damaged after some flows (cut short: mitmdump killed as it wrote, or still
    writing) is refused all the same, saying how many are intact and how to keep them: its
    import is identified by its bytes, so the whole file, once there, would be another. So
    is one holding a flow the log cannot take (see ``unimportable``): checked here, before
    anything is written. A flow saved more than once is imported once, as last saved."""
    flows: list[Any] = []
    try:
        with path.open("rb") as f:
            for flow in io.FlowReader(f).stream():
                flows.append(flow)
    except exceptions.FlowReadException as exc:
        raise FlowFileError(_unreadable(path, len(flows), str(exc))) from None
    except _MALFORMED:
        raise FlowFileError(_unreadable(path, len(flows), _INVALID)) from None
    # mitmdump -w saves a flow whose client left mid-body twice: at its error hook, then at
    # the response hook mitmproxy calls after it.
    by_id: dict[str, http.HTTPFlow] = {}
    others = 0
    for number, flow in enumerate(flows, 1):
        if not isinstance(flow, http.HTTPFlow):
            others += 1
        elif (why := unimportable(flow)) is not None:
            raise FlowFileError(f"{path}: flow {number} cannot be imported ({why}): nothing imported")
        else:
            by_id[flow.id] = flow
    return list(by_id.values()), others


# What mitmproxy's FlowReader raises, besides its FlowReadException, for a flow whose parts
# are missing (KeyError), of the wrong kind (AttributeError), unknown (its asserts), a
# number no float holds, or nesting past Python's recursion limit.
_MALFORMED = (KeyError, AttributeError, AssertionError, OverflowError, RecursionError)
_INVALID = "Invalid data format."  # (what mitmproxy's FlowReader says of the rest)

# The log holds times as nanoseconds since 1970 in a signed 64-bit integer (to 2262).
_LAST_NS = 2**63 - 1


def unimportable(flow: http.HTTPFlow) -> str | None:
    """Why a flow read from a file cannot be recorded, though mitmproxy reads it: parts of
    the wrong kind, or a time the log cannot hold; None when it can be."""
    if not isinstance(flow.id, str) or not isinstance(flow.metadata, dict):
        return _INVALID
    if flow.error is not None and not isinstance(flow.error, Error):
        return _INVALID
    for name, moment in _moments(flow):
        if moment is not None and not _loggable(moment):
            return f"its {name} {moment!r} is no time the log can hold, 1970 to 2262"
    return None


def _moments(flow: http.HTTPFlow) -> Iterator[tuple[str, float | None]]:
    """The times of a flow that its exchange is timed by, named."""
    request, response = flow.request, flow.response
    yield "request timestamp_start", request.timestamp_start
    yield "request timestamp_end", request.timestamp_end
    if response is not None:
        yield "response timestamp_start", response.timestamp_start
        yield "response timestamp_end", response.timestamp_end
    if flow.error is not None:
        yield "error timestamp", flow.error.timestamp


def _loggable(moment: float) -> bool:
    # (Compared before multiplying: NaN compares false, and an int too large for a float
    # never becomes one.)
    return 0 <= moment <= _LAST_NS / 1e9 and round(moment * 1e9) <= _LAST_NS


def _unreadable(path: Path, intact: int, why: str) -> str:
    if not intact:
        return f"{path}: not a readable mitmproxy flow file ({why})"
    return (
        f"{path}: damaged after {intact} flows ({why}), the rest cannot be read: nothing imported. "
        f"A file mitmdump is still writing can be imported once it stops; "
        f"`mitmdump -nr {path} -w INTACT.mitm` writes the {intact} intact flows to a file of their own"
    )


def _answer(
    writer: LogProducer, exchange: int, response: http.Response, offset: Callable[[float | None], int]
) -> tuple[str | None, bool]:
    """A saved flow's response, the client's, recorded: what the exchange's end says of it,
    and whether it is an event stream whose per-event timing is unknown (buffered whole)."""
    unkept = unkept_status(response)
    if unkept is not None:
        return unkept, False
    head = head_fields(response)
    writer.response_head(exchange, **head, ttfb_ns=offset(response.timestamp_start))
    body = response.raw_content
    if body:
        writer.chunk(exchange, offset(response.timestamp_end), body)
        return (UNTIMED, True) if head["is_sse"] else (None, False)
    return (NOT_KEPT if body is None else None), False


def record_saved_flow(
    writer: LogProducer,
    capture_id: int,
    flow: http.HTTPFlow,
    max_body: int = MAX_BODY,
    capture_uid: str | None = None,
    ended: Callable[[Future[ExchangeSummary]], None] | None = None,
) -> bool:
    """Write one saved flow as an exchange (with ``capture_uid``, an import's, its uid
    follows from that and the flow's id; ``ended`` is handed what the writer learns of it,
    once written); True when it is an event stream whose per-event timing is unknown
    (mitmproxy buffered it whole)."""
    request, response = flow.request, flow.response
    start = request.timestamp_start

    def offset(moment: float | None) -> int:
        return max(0, round(((moment or start) - start) * 1e9))

    fields = request_fields(request, max_body)
    uid = (
        None
        if capture_uid is None
        else derived_uuid7(fields["started_ns"] or 0, "flow", capture_uid, flow.id)
    )
    exchange = writer.begin_exchange(capture_id, **fields, uid=uid)
    note, untimed = None, False
    if response is not None and (_finished(flow) or _head_sent(flow, response)):
        note, untimed = _answer(writer, exchange, response, offset)
    duration, outcome, failure = _saved_ending(writer, exchange, flow, offset)
    # (A body not kept is still not kept, whatever the ending.)
    note = "; ".join(filter(None, (failure, missing_request_body(request), note))) or None
    done = writer.end_exchange(exchange, duration_ns=duration, outcome=outcome, error=note)
    if ended is not None:
        ended(done)
    return untimed


def _finished(flow: http.HTTPFlow) -> bool:
    """Whether a saved flow's response came to its end (mitmproxy then sends what it buffered)."""
    return flow.error is None and flow.response is not None and flow.response.timestamp_end is not None


def _saved_ending(
    writer: LogProducer, exchange: int, flow: http.HTTPFlow, offset: Callable[[float | None], int]
) -> tuple[int, str, str | None]:
    """How a saved flow's exchange ended: its duration, outcome and error. mitmdump -w, as
    it stops, saves the flows still in flight, with neither an error nor a response's end:
    they never finished, as the addon records them when mitmproxy stops under them, timed
    to the last moment the file has of them."""
    request, response = flow.request, flow.response
    if flow.error is not None:
        duration = offset(flow.error.timestamp)
        outcome, error = record_failure(writer, exchange, flow, duration)
        return duration, outcome, error
    if _finished(flow):
        assert response is not None
        return offset(response.timestamp_end), Outcome.COMPLETE, None
    last = request.timestamp_end if response is None else response.timestamp_start
    return offset(last), Outcome.PROXY_STOPPED, STOPPED
