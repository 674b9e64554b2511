"""A2A tasks in replay time, for subscriptions nothing recorded answers.

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
from tasktape.eventlog.jsonrpc_ids import NO_ID, jsonrpc_id_edits, rpc_id, same_id
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.requests import SUBSCRIBE_METHODS, classify_request
from tasktape.eventlog.spans import Chunks, StreamEvent, events_in
from tasktape.eventlog.task_snapshot import stream_response, task_after

from .fidelity import Divergence
from .sending import due
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
