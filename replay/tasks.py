"""A2A tasks, and the messages of MCP tool calls on the session's GET stream, in replay time.

MCP: what a server sends on the GET stream while a tool call waits for its answer (mcp
1.x sends a tool's sampling request there) is part of that call. It goes out when, and only
if, the call is made in the replay: on the GET stream of the session that made it, as long
after the call's start as it was recorded; the GET stream keeps its other events on its
own clock.

A2A: tasks, for subscriptions nothing recorded answers.

A task runs in the replay as it ran when recorded: from the moment a request is served
the stream that carries it (or, if none was, from the moment it is subscribed to), each
event happening at its recorded offset (over the speed). It keeps running when its client
drops, as an agent's task does, into the streams recorded as resuming that one. A
subscriber gets a Task snapshot of what has happened by then, as the agent would hold it,
then the events still to come at their recorded moments (the recorded bytes when it speaks
the recorded binding; only a JSON-RPC id changes); a finished task's final snapshot closes
the stream."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tasktape.eventlog import classify
from tasktape.eventlog.a2a_terms import Binding
from tasktape.eventlog.classify import json_or_none
from tasktape.eventlog.jsonrpc_ids import NO_ID, Edit, jsonrpc_id_edits, rpc_id, same_id
from tasktape.eventlog.protocols import ProtocolName, by_name
from tasktape.eventlog.protocols.mcp import Wait, during, is_call, is_standing, sent_for_a_call
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.requests import SUBSCRIBE_METHODS, classify_request
from tasktape.eventlog.spans import Chunks, StreamEvent, events_in
from tasktape.eventlog.task_snapshot import stream_response, task_after

from .fidelity import Divergence
from .sending import Joined, Message, Outbox, due
from .streams import apply_edits, id_edit

_SPACED = re.compile(r'\{\s*"[^"\\]*":\s')  # the official SDK writes ", " and ": "


@dataclass(frozen=True)
class TaskEvent:
    index: int  # the recording it is in
    event: StreamEvent
    id: str | None  # its SSE id (recorded, or added)
    raw: bytes
    frame: dict[str, Any] | None  # its StreamResponse
    binding: str | None
    rpc_id: Any  # the recorded request's JSON-RPC id (what its frames carry)


@dataclass
class Run:
    """One recording's events of a task. A run recorded as resuming another (its request
    had a Last-Event-ID of that run) goes on from it: ``shift_ns`` after it started."""

    index: int
    events: list[TaskEvent]
    continues: Run | None = None
    shift_ns: int = 0


@dataclass
class Timeline:
    runs: list[Run] = field(default_factory=list)

    def find(self, event_id: str) -> TaskEvent | None:
        return next((e for run in self.runs for e in run.events if e.id == event_id), None)


@dataclass
class Subscription:
    chunks: Chunks  # offsets from the moment of the subscribe
    recorded: bytes  # the recorded bytes of the events it stands for
    reasons: list[tuple[Divergence, str]]
    exchange: str


class Tasks:
    """Every task's timeline (read on first use) and when each recording started in this replay."""

    def __init__(
        self,
        recorded: list[Recorded],
        events_of: Callable[[int], list[StreamEvent]],
        event_id: Callable[[int, int, StreamEvent], str | None],
    ) -> None:
        self._recorded = recorded
        self._events_of = events_of
        self._event_id = event_id  # (recording, event number, event): its id
        self.started: dict[int, float] = {}  # recording: loop time it started at
        self._timelines: dict[str, Timeline] | None = None

    def serving(self, index: int, at: float) -> None:
        """Recording ``index`` is served from its start at ``at``: its tasks run from then."""
        self.started[index] = at

    def resuming(self, index: int, at: float) -> None:
        """Recording ``index`` is served from some event on, as if it had started at ``at``
        (it may have been: then that stands)."""
        self.started.setdefault(index, at)

    def changed(self) -> None:
        """Recordings were added: timelines are read again."""
        self._timelines = None

    def reset(self) -> None:
        self.started.clear()

    def timeline(self, task_id: str) -> Timeline | None:
        if self._timelines is None:
            self._timelines = self._read()
        return self._timelines.get(task_id)

    def _read(self) -> dict[str, Timeline]:
        timelines: dict[str, Timeline] = {}
        for index, recorded in enumerate(self._recorded):
            if not recorded.is_sse or _is_subscribe(recorded):
                continue  # a recorded subscription repeats the run it joined
            body = recorded.body
            request_id = rpc_id(recorded.request_body)
            runs: dict[str, list[TaskEvent]] = {}
            for n, event in enumerate(self._events_of(index), 1):
                c = classify(event.data) if event.complete else None
                if c is None or c.task_id is None:
                    continue
                runs.setdefault(c.task_id, []).append(
                    TaskEvent(
                        index,
                        event,
                        self._event_id(index, n, event),
                        body[event.start : event.end],
                        stream_response(json_or_none(event.data)),
                        c.binding,
                        None if request_id is NO_ID else request_id,
                    )
                )
            resumed_from = recorded.resumed_from
            for task_id, events in runs.items():
                timeline = timelines.setdefault(task_id, Timeline())
                timeline.runs.append(self._run(index, events, timeline, resumed_from))
        return timelines

    def _run(self, index: int, events: list[TaskEvent], timeline: Timeline, resumed_from: str | None) -> Run:
        """A recording's events of a task, as a run of its own or one resuming another."""
        earlier = timeline.find(resumed_from) if resumed_from is not None else None
        if earlier is None:
            return Run(index, events)
        (continued,) = [r for r in timeline.runs if earlier in r.events]
        known = {e.id for e in continued.events}
        # A resumed stream sends what followed the event it resumed from; what it repeats is known.
        events = [e for e in events if e.id is None or e.id not in known]
        shift = _gap_ns(self._recorded[continued.index], self._recorded[index])
        if shift is None:  # no start times: it goes on right after the event it resumed from
            shift = earlier.event.offset_ns
        return Run(index, events, continued, shift)

    def _start(self, run: Run, speed: float) -> float | None:
        """When ``run`` started in this replay (None: not yet)."""
        if run.index in self.started:
            return self.started[run.index]
        if run.continues is not None:
            before = self._start(run.continues, speed)
            return None if before is None else due(before, run.shift_ns, speed)
        return None

    def subscribe(
        self,
        task_id: str,
        binding: str | None,
        rpc_id: Any,
        last_id: str | None,
        now: float,
        speed: float,
    ) -> Subscription | str | None:
        """The answer to a subscribe at loop time ``now``; an error message when
        ``last_id`` names no event of the task; None when the task never streamed."""
        timeline = self.timeline(task_id)
        if timeline is None or not any(run.events for run in timeline.runs):
            return None
        if last_id is not None and timeline.find(last_id) is None:
            return f"Last-Event-ID {last_id!r} names no recorded event of task {task_id}"
        first = next(run for run in timeline.runs if run.events)
        fresh = all(self._start(run, speed) is None for run in timeline.runs)
        if fresh:
            self.started[first.index] = now  # nothing started it: it starts now, its whole run to come
        happened: list[tuple[float, TaskEvent]] = []
        coming: list[tuple[float, TaskEvent]] = []
        for run in timeline.runs:
            start = self._start(run, speed)
            if start is None:
                continue
            for event in run.events:
                when = due(start, event.event.offset_ns, speed)
                (happened if when <= now and not fresh else coming).append((when, event))
        happened.sort(key=lambda pair: pair[0])
        coming.sort(key=lambda pair: pair[0])
        reasons: list[tuple[Divergence, str]] = []
        chunks: Chunks = []
        if last_id is not None:
            seen = _through(timeline, last_id)
            happened = [(w, e) for w, e in happened if id(e) not in seen]
            coming = [(w, e) for w, e in coming if id(e) not in seen]
            chunks += [(0, self._encode(e, binding, rpc_id)) for _, e in happened]
            reasons.append((Divergence.RESUME, f"after event {last_id}"))
        elif happened:
            last = happened[-1][1]
            snapshot = task_after(e.frame for _, e in happened if e.frame)
            chunks.append((0, _snapshot_event(snapshot, last, binding, rpc_id)))
            reasons.append(
                (Divergence.SUBSCRIBE, f"a Task snapshot after {len(happened)} events, then the rest")
            )
        elif coming and not (coming[0][1].frame or {}).get("task"):
            # A v1.0 subscription opens with a Task: the first state, made of the first event.
            when, opening = coming.pop(0)
            happened = [(when, opening)]
            snapshot = task_after([opening.frame] if opening.frame else [])
            chunks.append((_after(when, now, speed), _snapshot_event(snapshot, opening, binding, rpc_id)))
            reasons.append((Divergence.SUBSCRIBE, "a Task snapshot of the first event, then the rest"))
        chunks += [(_after(when, now, speed), self._encode(e, binding, rpc_id)) for when, e in coming]
        events = [e for _, e in happened] + [e for _, e in coming]
        if any(e.binding != binding for e in events):
            reasons.append((Divergence.REWRITE, f"events recorded on another binding, sent on {binding}"))
        origin = self._recorded[first.index].origin
        return Subscription(chunks, b"".join(e.raw for e in events), reasons, origin)

    def _encode(self, event: TaskEvent, binding: str | None, rpc_id: Any) -> bytes:
        """The event for this subscriber: its recorded bytes on its recorded binding (the
        JSON-RPC id changed), else its StreamResponse in the subscriber's binding."""
        if event.binding == binding:
            chunks: Chunks = [(0, event.raw)]
            spans = events_in(chunks)
            edits = []
            if binding == Binding.JSONRPC and not same_id(event.rpc_id, rpc_id):
                edits += jsonrpc_id_edits(chunks, spans, event.rpc_id, rpc_id)
            if event.id is not None and event.event.id is None:
                edits.append(id_edit(spans[0], event.id))  # an id added (--add-ids)
            return apply_edits(chunks, edits)[0][1] if edits else event.raw
        return _block(event, _framed(event.frame, binding, rpc_id, event), event.id)


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
    """When a recording's request was sent, in nanoseconds since the epoch (its log says
    to the microsecond), if it says."""
    try:
        started = datetime.fromisoformat(recorded.started_at or "")
    except ValueError:
        return None
    return int(started.timestamp()) * 1_000_000_000 + started.microsecond * 1000


def _through(timeline: Timeline, event_id: str) -> set[int]:
    """The events up to and including ``event_id``, in recorded order (as ``id()``s)."""
    seen: set[int] = set()
    for run in timeline.runs:
        for event in run.events:
            seen.add(id(event))
            if event.id == event_id:
                return seen
    return seen


def _after(when: float, now: float, speed: float) -> int:
    """An offset from ``now`` in recorded nanoseconds, for something due at ``when``."""
    return int(max(0.0, when - now) * speed * 1e9)


def _is_subscribe(recorded: Recorded) -> bool:
    info = classify_request(recorded.method, recorded.path, recorded.request_body)
    return info.rpc_method in SUBSCRIBE_METHODS


def _gap_ns(first: Recorded, later: Recorded) -> int | None:
    """How long after ``first`` ``later`` was recorded, when both say when."""
    try:
        a = datetime.fromisoformat(first.started_at or "")
        b = datetime.fromisoformat(later.started_at or "")
        return max(0, int((b - a).total_seconds() * 1e9))
    except (ValueError, TypeError):
        return None


def _framed(frame: Any, binding: str | None, rpc_id: Any, like: TaskEvent) -> str:
    """A StreamResponse in ``binding``, written as the recording writes its JSON."""
    if binding == Binding.JSONRPC:
        recorded = json_or_none(like.event.data) if like.binding == Binding.JSONRPC else None
        keys = list(recorded) if isinstance(recorded, dict) else ["jsonrpc", "id", "result"]
        values = {"jsonrpc": "2.0", "id": rpc_id, "result": frame}
        frame = {k: values[k] for k in keys if k in values} | values
    spaced = _SPACED.match(like.event.data) is not None
    return json.dumps(frame, separators=(", ", ": ") if spaced else (",", ":"), ensure_ascii=False)


def _snapshot_event(task: dict[str, Any] | None, last: TaskEvent, binding: str | None, rpc_id: Any) -> bytes:
    """The Task as an event written like the recording's (its line ends and spacing),
    with the id of the last event it includes, so a resume from it continues after."""
    return _block(last, _framed({"task": task or {}}, binding, rpc_id, last), last.id)


def _block(like: TaskEvent, data: str, event_id: str | None) -> bytes:
    end = like.event.terminator.decode()
    head = f"id: {event_id}{end}" if event_id is not None else ""
    return f"{head}data: {data}{end}{end}".encode()
