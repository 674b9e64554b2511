"""The messages of MCP tool calls on the session's GET stream, in replay time.

What a server sends on the GET stream while a tool call waits for its answer (mcp 1.x
sends a tool's sampling request there) is part of that call. It goes out when, and only
if, the call is made in the replay: on the GET stream of the session that made it, as long
after the call's start as it was recorded; the GET stream keeps its other events on its
own clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tasktape.eventlog.jsonrpc_ids import Edit
from tasktape.eventlog.protocols import ProtocolName, by_name
from tasktape.eventlog.protocols.mcp import Wait, during, is_call, is_standing, sent_for_a_call
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.spans import Chunks, StreamEvent, events_in
from tasktape.eventlog.uids import moment_ns

from .sending import Joined, Message, Outbox, due
from .streams import apply_edits, id_edit


@dataclass(frozen=True)
class CallMessage:
    """A message the GET stream carried while a tool call waited for its answer."""

    stream: int  # the GET stream's recording
    number: int  # its place among the stream's events, from 1
    method: str
    event: StreamEvent
    call: int  # the tool call's recording
    delay_ns: int  # how long after the call was sent it came

    @property
    def label(self) -> str:
        return f"{self.method} (its event {self.number})"


@dataclass
class Read:
    """The call messages of the recordings: of each GET stream, and of each call."""

    by_stream: dict[int, list[CallMessage]] = field(default_factory=dict)
    by_call: dict[int, list[CallMessage]] = field(default_factory=dict)


class CallMessages:
    """The messages of MCP tool calls on GET streams (read on first use), which calls this
    replay made, and each replayed session's outbox (by the Mcp-Session-Id it sends)."""

    def __init__(
        self,
        recorded: list[Recorded],
        events_of: Callable[[int], list[StreamEvent]],
        event_id: Callable[[int, int, StreamEvent], str | None],
    ) -> None:
        self._recorded = recorded
        self._events_of = events_of
        self._event_id = event_id
        self._read: Read | None = None
        self._made: set[int] = set()  # the calls made in this replay
        self._outboxes: dict[str | None, Outbox] = {}

    def changed(self) -> None:
        """Recordings were added: messages are read again."""
        self._read = None

    def reset(self) -> None:
        self._made.clear()
        self._outboxes.clear()

    def of_stream(self, stream: int) -> list[CallMessage]:
        return self._messages().by_stream.get(stream, [])

    def _messages(self) -> Read:
        if self._read is None:
            self._read = self._reading()
        return self._read

    def cut(self, stream: int) -> list[Edit]:
        """Edits leaving a GET stream's call messages out of its own chunks."""
        return [(m.event.start, m.event.end - m.event.start, b"") for m in self.of_stream(stream)]

    def resumed_at(self, stream: int, event_id: str) -> tuple[int, int] | None:
        """For a client resuming a GET stream after one of its call messages: where that
        message was among the stream's own chunks (the byte after which they go on), and
        its offset. None when ``event_id`` names none of them."""
        messages = self.of_stream(stream)
        for n, m in enumerate(messages):
            if self._event_id(stream, m.number, m.event) == event_id:
                removed = sum(b.event.end - b.event.start for b in messages[: n + 1])
                return m.event.end - removed, m.event.offset_ns
        return None

    def joined(self, stream: int, session: str | None) -> Joined | None:
        """What a standing GET stream served to ``session`` sends besides its own events:
        the messages of the session's calls. None for any other recording."""
        recorded = self._recorded[stream]
        if recorded.protocol != ProtocolName.MCP or not is_standing(recorded.as_request()):
            return None
        outbox = self._outbox(session)

        def staying() -> bool:
            # Open while a message is to go, or a call with messages may still be made: by a
            # client in another order than recorded, any session's call may be this one's.
            coming = any(call not in self._made for call in self._messages().by_call)
            return coming or outbox.first_due() is not None

        return Joined(outbox, staying, lambda: self.held_back(stream), recorded.origin)

    def called(self, call: int, session: str | None, at: float, speed: float) -> list[Message]:
        """Recording ``call`` answers a call made at loop time ``at``: its messages go out
        on the session's GET stream, as long after as they came. They are returned: the
        call's own answer waits for them to go out before what it recorded after them."""
        self._made.add(call)
        outbox = self._outbox(session)
        return [
            outbox.put(
                due(at, m.delay_ns, speed),
                self._bytes(m),
                m.delay_ns,
                self._recorded[m.stream].origin,
                m.label,
            )
            for m in self._messages().by_call.get(call, [])
        ]

    def held_back(self, stream: int) -> list[str]:
        """What a GET stream carried for calls this replay has not made, as the report says it."""
        return [
            f"held back: {m.label}, sent during {self._recorded[m.call].rpc_method} "
            f"({self._recorded[m.call].origin}), a call not made while it was open"
            for m in self.of_stream(stream)
            if m.call not in self._made
        ]

    def _outbox(self, session: str | None) -> Outbox:
        if session not in self._outboxes:
            self._outboxes[session] = Outbox()
        return self._outboxes[session]

    def _bytes(self, message: CallMessage) -> bytes:
        """The message's recorded event, with the SSE id it is given (added: --add-ids)."""
        event = message.event
        raw = self._recorded[message.stream].body[event.start : event.end]
        given = self._event_id(message.stream, message.number, event)
        if given is None or event.id is not None:
            return raw
        chunks: Chunks = [(0, raw)]
        return apply_edits(chunks, [id_edit(events_in(chunks)[0], given)])[0][1]

    def _reading(self) -> Read:
        sessions: dict[str, tuple[list[int], list[int]]] = {}
        for index, recorded in enumerate(self._recorded):
            protocol = by_name(recorded.protocol)
            if recorded.protocol != ProtocolName.MCP or protocol is None:
                continue
            request = recorded.as_request()
            session = protocol.request_info(request).session_id
            if session is None:
                continue
            calls, streams = sessions.setdefault(session, ([], []))
            if is_call(request.json()) and _started_ns(recorded) is not None:
                calls.append(index)
            elif recorded.is_sse and is_standing(request) and _started_ns(recorded) is not None:
                streams.append(index)
        read = Read()
        for calls, streams in sessions.values():
            waits = [self._wait(call) for call in calls]
            for stream in streams:
                read.by_stream[stream] = self._stream_messages(stream, calls, waits)
                for m in read.by_stream[stream]:
                    read.by_call.setdefault(m.call, []).append(m)
        return read

    def _stream_messages(self, stream: int, calls: list[int], waits: list[Wait]) -> list[CallMessage]:
        """The messages of ``stream`` that came while a call waited: each is the latest
        such call's (of several under way at once, the one most likely to have caused it)."""
        opened = _started_ns(self._recorded[stream]) or 0
        out = []
        for number, event in enumerate(self._events_of(stream), 1):
            method = sent_for_a_call(event.data) if event.complete else None
            at = opened + event.offset_ns
            waiting = during(waits, at) if method is not None else []
            if method is not None and waiting:
                latest = max(waiting, key=lambda n: waits[n].start)
                delay = int(at - waits[latest].start)
                out.append(CallMessage(stream, number, method, event, calls[latest], delay))
        return out

    def _wait(self, call: int) -> Wait:
        """When a recorded call was sent, and when its answer came (its exchange's end, if
        none came on its own stream), in nanoseconds since the epoch."""
        recorded = self._recorded[call]
        start = _started_ns(recorded) or 0
        protocol = by_name(recorded.protocol)
        events = self._events_of(call) if recorded.is_sse else []
        answer = next(
            (e for e in events if e.complete and protocol is not None and protocol.closes(e.data, e.event)),
            None,
        )
        if answer is not None:
            return Wait(start, start + answer.offset_ns)
        return Wait(start, None if recorded.duration_ns is None else start + recorded.duration_ns)


def _started_ns(recorded: Recorded) -> int | None:
    """When a recording's request was sent, in nanoseconds since the epoch, if it says."""
    return moment_ns(recorded.started_at) if recorded.started_at else None
