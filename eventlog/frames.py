"""Recorded exchanges as the checker reads them: each response of a known protocol split
into frames (the SSE events of a stream, or the one JSON body of a plain response),
classified by its protocol."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, NamedTuple

from .a2a_terms import Binding, is_jsonrpc
from .classify import Classification, load_json
from .outcomes import Outcome
from .protocols import by_name, recognise_exchange
from .protocols.base import Protocol, RequestInfo
from .recorded import Recorded
from .spans import events_in
from .sse import is_event


@dataclass(frozen=True)
class Frame:
    """One SSE event (``seq`` numbered as the log's events table does), or a whole body."""

    seq: int | None  # None for the body of a response that is not a stream
    sse_id: str | None
    complete: bool  # False: the tail of a stream that ended mid-event
    at_ns: int | None  # when it arrived (absolute when the exchange's start is known)
    c: Classification
    task_id: str | None  # the frame's own task id, else the one its exchange is about
    event_type: str | None = None  # the SSE event field
    data: str = ""

    @cached_property
    def _json(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The payload and the envelope, read from the data when a rule first asks (most
        frames of a long stream are never asked: their classification says enough)."""
        if self.c.parse_error is not None or not self.data:
            return None, None
        try:
            obj = load_json(self.data)
        except (ValueError, RecursionError):
            return None, None
        if not isinstance(obj, dict):
            return None, None
        envelope = obj if is_jsonrpc(obj) else None
        payload = obj.get("result") if envelope is not None else obj
        return (payload if isinstance(payload, dict) else None), envelope

    @property
    def payload(self) -> dict[str, Any] | None:
        """The JSON object (a JSON-RPC result unwrapped)."""
        return self._json[0]

    @property
    def envelope(self) -> dict[str, Any] | None:
        """The JSON-RPC message around it."""
        return self._json[1]


class SseEvent(NamedTuple):
    """What a frame takes of one SSE event: decoded from a stream's chunks, or as the log's
    events table holds it (the writer decoded the same bytes, and numbered them alike)."""

    seq: int
    id: str | None
    data: str
    complete: bool
    offset_ns: int  # when the chunk that completed it arrived
    event: str | None  # the SSE event field


def decoded(chunks: list[tuple[int, bytes]]) -> list[SseEvent]:
    """The events of a recorded stream, decoded from its chunks (what dispatches nothing,
    after the last event, left out but numbered)."""
    return [
        SseEvent(seq, e.id, e.data, e.complete, e.offset_ns, e.event)
        for seq, e in enumerate(events_in(chunks))
        if is_event(e.complete, e.data)
    ]


@dataclass
class Stream:
    """One exchange of a known protocol: a stream of events, or a plain response."""

    index: int  # position among the exchanges checked
    where: str
    exchange_id: int | None
    is_sse: bool
    outcome: str | None
    error: str | None
    rpc_id: Any  # the JSON-RPC request's id (None when not JSON-RPC)
    jsonrpc: bool
    protocol: str  # the protocol's name
    request: RequestInfo = field(default_factory=RequestInfo)
    request_body: Any = None  # the request body as JSON
    last_event_id: str | None = None  # the Last-Event-ID the request resumed from
    status: int | None = None
    started_ns: int | None = None  # when the request was sent (None when the log does not say)
    frames: list[Frame] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether the response ended as it meant to (a missing outcome: a hand-made
        cassette's, so yes; a log's exchanges under way are cut short by ``at_log_end``)."""
        return self.outcome in (None, Outcome.COMPLETE)

    @property
    def task_id(self) -> str | None:
        """The task the exchange is about: the first one its frames name."""
        return next((f.task_id for f in self.frames if f.task_id), None)

    def label(self, frame: Frame | None = None) -> str:
        """``exchange 13 event 4`` or ``completed.jsonl:5 event 4``, for messages."""
        place = self.where if self.exchange_id is None else f"exchange {self.where}"
        return place if frame is None or frame.seq is None else f"{place} event {frame.seq}"


# A log's exchange as ``Stream.label`` names it in a message.
_LABELLED_EXCHANGE = re.compile(r"\bexchange (\d+)\b")


def renumbered(message: str, ids: Mapping[int, int]) -> str:
    """``message`` with each log exchange it names (as ``Stream.label`` does) by its id in
    ``ids`` (old id to new): a finding copied into a log that numbers its exchanges
    otherwise names them as that log does. An id ``ids`` lacks is left as it is."""

    def new_id(found: re.Match[str]) -> str:
        old = int(found[1])
        return f"exchange {ids[old]}" if old in ids else found[0]

    return _LABELLED_EXCHANGE.sub(new_id, message)


# The error of a log's exchange the log held no end of when it was read.
UNDER_WAY = (
    "the log held no end of this exchange when it was read (its recorder was still writing "
    "it, or was killed): cut short there"
)


def at_log_end(recorded: Iterable[Recorded]) -> list[Recorded]:
    """Exchanges read from a log that it holds no end of (no outcome: a recorder still
    writes them, or was killed) cut short where the log stops, as ``log_closed``: so every
    reader of a log (a check, an export) takes them. Returns those exchanges."""
    under_way = [r for r in recorded if r.outcome is None]
    for r in under_way:
        r.outcome, r.error = Outcome.LOG_CLOSED, UNDER_WAY
    return under_way


class Repeats:
    """Tells an event sent again from a new one, over the streams of one scope (an MCP
    session, an A2A task) in the order they were opened. An event is sent again only on a
    stream that continues an earlier one (a request carrying Last-Event-ID continues the
    latest that sent that id) and only with the id of an event that one sent; any other
    event is new, whatever its id (a server may number each stream's events from 1). A
    reconnect the resume gateway answered from a stream it held
    (``EventLog.reconnects_answered``) sends every event again, under the gateway's ids
    where the server gave none. The log's task views follow the same rules
    (``schema._sent_before``, ``schema.SLICES``), a subscribe to a task continuing its
    latest stream. ``in_frames`` also tells the events a subscribe sends again without ids
    (the official a2a-sdk's server sends none) by their content, which the views do not:
    they count such an event twice."""

    def __init__(self) -> None:
        self._sent: list[set[str]] = []  # each earlier stream's event ids
        self._frames: dict[int, Sequence[Frame]] = {}  # by position in _sent: the frames, when given

    def of(
        self,
        ids: Sequence[str | None],
        last_event_id: str | None,
        subscribe: bool = False,
        answered: bool = False,
    ) -> set[str]:
        """The ids, among a stream's event ids (``ids``, all of them), that stand for
        events sent again (``subscribe``: the stream subscribes to a task, and continues its
        latest one; ``answered``: a reconnect the resume gateway answered, all of whose
        events are); the stream's ids are noted for the streams after it."""
        own = {i for i in ids if i is not None}
        continued = self._continued(last_event_id, subscribe)
        earlier = self._sent[continued] if continued is not None else set()
        self._sent.append(own)
        return own if answered else own & earlier

    def in_frames(
        self,
        frames: Sequence[Frame],
        last_event_id: str | None,
        subscribe: bool = False,
        since_ns: int | None = None,
    ) -> set[int]:
        """The positions, among a stream's frames, of the events sent again: by their ids,
        as ``of`` tells them; and on a subscribe (sent at ``since_ns``, when known), each
        event without an id whose content (its payload: a JSON-RPC envelope's id is the
        request's) an event without an id of the stream it continues carried once the
        subscribe was sent, each of those standing for one (what came before it, the
        subscribe's snapshot holds: a delta alike then, "ha" and "ha", is a new one)."""
        continued = self._continued(last_event_id, subscribe)
        again_ids = self.of([f.sse_id for f in frames], last_event_id, subscribe)
        self._frames[len(self._sent) - 1] = frames
        again = {i for i, f in enumerate(frames) if f.sse_id is not None and f.sse_id in again_ids}
        earlier = self._frames.get(continued) if subscribe and continued is not None else None
        if earlier:
            sent = Counter(
                _content(f)
                for f in earlier
                if f.sse_id is None and (since_ns is None or f.at_ns is None or f.at_ns >= since_ns)
            )
            for i, frame in enumerate(frames):
                if frame.sse_id is None and sent[key := _content(frame)] > 0:
                    sent[key] -= 1
                    again.add(i)
        return again

    def _continued(self, last_event_id: str | None, subscribe: bool) -> int | None:
        """The position of the earlier stream a stream continues, if it continues one."""
        if last_event_id is not None:
            found = next(
                (i for i in reversed(range(len(self._sent))) if last_event_id in self._sent[i]), None
            )
            if found is not None:
                return found
        return len(self._sent) - 1 if subscribe and self._sent else None


def _content(frame: Frame) -> str:
    """What an event says, however it is enveloped: its payload (else its data) as JSON."""
    payload = frame.payload
    return frame.data if payload is None else json.dumps(payload, sort_keys=True)


@dataclass(frozen=True)
class Problem:
    """A broken rule, and where."""

    stream: Stream
    frame: Frame | None  # None: the stream as a whole
    message: str


Rule = Callable[[Sequence[Stream]], Iterator[Problem]]


def readable(stream: Stream) -> Iterator[tuple[Frame, Problem | None]]:
    """Each frame of a stream with what makes it unreadable, if anything: cut off mid-way
    though the stream ran to its end, or not parsed (a frame cut off by a broken
    connection is left out: nothing can be said of it). The body of an HTTP error that is
    not a stream is the protocol's only if it reads as one: a server's or an intermediary's
    plain-text "404: Not Found" breaks no protocol."""
    http_error = not stream.is_sse and stream.status is not None and stream.status >= 400
    for frame in stream.frames:
        if not frame.complete:
            if stream.complete:
                yield (
                    frame,
                    Problem(
                        stream, frame, "the stream ended in the middle of this event (no blank line after it)"
                    ),
                )
        elif frame.c.parse_error and not http_error:
            yield frame, Problem(stream, frame, frame.c.parse_error)
        else:
            yield frame, None


def protocol_of(recorded: Recorded) -> Protocol | None:
    """The protocol of a recorded exchange: as the log named it, else as its request (or,
    when that says nothing, its response) shows, as the log writer tells it."""
    if recorded.protocol is not None:
        return by_name(recorded.protocol)
    request = recorded.as_request()
    response: tuple[str, str | None] | None = None
    if recorded.is_sse:
        first = next((e for e in events_in(recorded.chunks[:8]) if e.data), None)
        response = None if first is None else (first.data, first.event)
    elif recorded.chunks and not recorded.response_body_truncated:
        response = (recorded.body.decode("utf-8", "replace"), None)
    return recognise_exchange(request, response)


def streams_of(
    items: list[tuple[Recorded, str, int | None]],
    only: set[str] | None = None,
    held: Mapping[int, list[SseEvent]] | None = None,
) -> list[Stream]:
    """The exchanges of known protocols among ``(recorded, where, exchange id)`` (of the
    protocols named in ``only``, when given): SSE responses, and the JSON bodies of
    successful operations (an A2A GetTask, an MCP result, a completion). ``held``: the
    events of streams, by exchange id, read from the log's events table rather than
    decoded from their chunks again."""
    held = held or {}
    streams = []
    for recorded, where, exchange_id in items:
        protocol = protocol_of(recorded)
        if protocol is None or (only is not None and protocol.name not in only):
            continue
        request = recorded.as_request()
        info = protocol.request_info(request)
        if info.session_id is None:  # a session's first request: the response names it
            info = info._replace(session_id=protocol.session(recorded.response_headers))
        if not protocol.checked(info, recorded.is_sse, recorded.status):
            continue
        jsonrpc = info.rpc_id is not None or info.binding == Binding.JSONRPC
        stream = Stream(
            len(streams),
            where,
            exchange_id,
            recorded.is_sse,
            recorded.outcome,
            recorded.error,
            info.rpc_id if jsonrpc else None,
            jsonrpc,
            protocol.name,
            info,
            request.json(),
            request.header("Last-Event-ID"),
            recorded.status,
            _start_ns(recorded.started_at),
        )
        reader = protocol.reader()
        start = stream.started_ns
        task_id = info.task_id
        if recorded.is_sse:
            events = held.get(exchange_id) if exchange_id is not None else None
            for event in decoded(recorded.chunks) if events is None else events:
                c = reader.event(event.data, event.event)
                frame = _frame(
                    event.seq,
                    event.id,
                    event.complete,
                    event.data,
                    event.event,
                    _at(start, event.offset_ns),
                    c,
                    task_id,
                )
                task_id = frame.task_id
                stream.frames.append(frame)
        elif (
            recorded.chunks
            and stream.complete
            and not recorded.response_body_truncated
            and not recorded.still_encoded  # (as kept: not what the client read)
        ):
            body = recorded.body.decode("utf-8", "replace")
            c = reader.body(body)
            if c is not None:
                at = _at(start, recorded.chunks[-1][0])
                stream.frames.append(_frame(None, None, True, body, None, at, c, task_id))
        streams.append(stream)
    return streams


def _start_ns(started_at: str | None) -> int | None:
    if not started_at:
        return None
    try:
        moment = datetime.fromisoformat(started_at)
    except ValueError:
        return None
    return round(moment.timestamp() * 1_000_000) * 1000


def _at(start: int | None, offset_ns: int) -> int | None:
    return None if start is None else start + offset_ns


def _frame(
    seq: int | None,
    sse_id: str | None,
    complete: bool,
    data: str,
    event_type: str | None,
    at_ns: int | None,
    c: Classification,
    task_id: str | None,
) -> Frame:
    return Frame(seq, sse_id, complete, at_ns, c, c.task_id or task_id, event_type, data)
