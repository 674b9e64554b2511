"""A2A tasks in replay time, for subscriptions nothing recorded answers.

A task runs in the replay as it ran when recorded: from the moment a request is served
the stream that carries it (or, if none was, from the moment it is subscribed to), each
event happening at its recorded offset (over the speed). It keeps running when its client
drops, as an agent's task does. A subscriber gets a Task snapshot of what has happened by
then, as the agent would hold it, then the events still to come at their recorded
moments (the recorded bytes when it speaks the recorded binding; only a JSON-RPC id
changes); a finished task's final snapshot closes the stream."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tasktape.eventlog import classify
from tasktape.eventlog.classify import load_json
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.requests import classify_request
from tasktape.eventlog.spans import Chunks, StreamEvent, events_in
from tasktape.eventlog.task_snapshot import stream_response, task_after

from .fidelity import Divergence
from .streams import apply_edits, jsonrpc_id_edits

SUBSCRIBE_METHODS = ("SubscribeToTask", "tasks/resubscribe")


@dataclass(frozen=True)
class TaskEvent:
    index: int  # the recording it is in
    id: str | None  # its SSE id (recorded, or added)
    offset_ns: int
    raw: bytes
    data: str
    binding: str | None
    rpc_id: Any  # the recorded request's JSON-RPC id (what its frames carry)


@dataclass
class Timeline:
    """A task's events, one list per recording that streamed them, in recorded order."""

    runs: list[list[TaskEvent]] = field(default_factory=list)

    def find(self, event_id: str) -> tuple[int, int] | None:
        for r, run in enumerate(self.runs):
            for n, event in enumerate(run):
                if event.id == event_id:
                    return r, n
        return None


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
        """Recording ``index`` starts being served at ``at``: its tasks run from then."""
        self.started.setdefault(index, at)

    def changed(self) -> None:
        """Recordings were added: timelines are read again."""
        self._timelines = None

    def reset(self) -> None:
        self.started.clear()

    def timeline(self, task_id: str) -> Timeline | None:
        if self._timelines is None:
            self._timelines = dict(self._read())
        return self._timelines.get(task_id)

    def _read(self) -> Iterator[tuple[str, Timeline]]:
        timelines: dict[str, Timeline] = {}
        seen: dict[str, set[str]] = {}
        for index, recorded in enumerate(self._recorded):
            if not recorded.is_sse or _is_subscribe(recorded):
                continue  # a recorded subscription repeats the run it joined
            body = recorded.body
            rpc_id = _request_rpc_id(recorded.request_body)
            runs: dict[str, list[TaskEvent]] = {}
            for n, event in enumerate(self._events_of(index), 1):
                if not event.complete:
                    continue
                c = classify(event.data)
                if c.task_id is None:
                    continue
                event_id = self._event_id(index, n, event)
                ids = seen.setdefault(c.task_id, set())
                if event_id is not None and event_id in ids:
                    continue  # a resumed stream's events already known from the first
                if event_id is not None:
                    ids.add(event_id)
                runs.setdefault(c.task_id, []).append(
                    TaskEvent(
                        index,
                        event_id,
                        event.offset_ns,
                        body[event.start : event.end],
                        event.data,
                        c.binding,
                        rpc_id,
                    )
                )
            for task_id, run in runs.items():
                timelines.setdefault(task_id, Timeline()).runs.append(run)
        yield from timelines.items()

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
        if timeline is None:
            return None
        first = timeline.runs[0][0].index
        fresh = not any(run[0].index in self.started for run in timeline.runs)
        if fresh:
            self.started[first] = now  # nothing started it: it starts now, its whole run to come
        happened, coming = [], []
        for run in timeline.runs:
            start = self.started.get(run[0].index)
            if start is None:
                continue
            for event in run:
                when = start + (event.offset_ns / 1e9 / speed if speed else 0)
                (happened if when <= now and not fresh else coming).append((when, event))
        coming.sort(key=lambda pair: pair[0])
        reasons: list[tuple[Divergence, str]] = []
        chunks: Chunks = []
        if last_id is not None:
            found = timeline.find(last_id)
            if found is None:
                return f"Last-Event-ID {last_id!r} names no recorded event of task {task_id}"
            r, n = found
            after = {id(e) for e in timeline.runs[r][n + 1 :]} | {
                id(e) for run in timeline.runs[r + 1 :] for e in run
            }
            happened = [(w, e) for w, e in happened if id(e) in after]
            coming = [(w, e) for w, e in coming if id(e) in after]
            chunks += [(0, self._encode(e, binding, rpc_id)) for _, e in happened]
            reasons.append((Divergence.RESUME, f"after event {last_id}"))
        elif happened:
            last = happened[-1][1]
            snapshot = task_after(f for f in (stream_response(_json(e.data)) for _, e in happened) if f)
            chunks.append((0, _snapshot_event(snapshot, last, binding, rpc_id)))
            reasons.append(
                (Divergence.SUBSCRIBE, f"a Task snapshot after {len(happened)} events, then the rest")
            )
        chunks += [
            (int(max(0.0, when - now) * speed * 1e9), self._encode(e, binding, rpc_id)) for when, e in coming
        ]
        events = [e for _, e in happened] + [e for _, e in coming]
        if any(e.binding != binding for e in events):
            reasons.append((Divergence.REWRITE, f"events recorded on another binding, sent on {binding}"))
        origin = self._recorded[first].origin
        return Subscription(chunks, b"".join(e.raw for e in events), reasons, origin)

    def _encode(self, event: TaskEvent, binding: str | None, rpc_id: Any) -> bytes:
        """The event for this subscriber: its recorded bytes on its recorded binding (the
        JSON-RPC id changed), else its StreamResponse in the subscriber's binding."""
        if event.binding == binding:
            raw = event.raw
            if binding == "jsonrpc" and event.rpc_id != rpc_id:
                chunks = [(0, raw)]
                edits = jsonrpc_id_edits(chunks, events_in(chunks), event.rpc_id, rpc_id)
                raw = apply_edits(chunks, edits)[0][1]
            return _with_id(raw, event.id)
        frame = stream_response(_json(event.data))
        return _block(event, _framed(frame, binding, rpc_id, event), event.id)


def _is_subscribe(recorded: Recorded) -> bool:
    info = classify_request(recorded.method, recorded.path, recorded.request_body)
    return info.rpc_method in SUBSCRIBE_METHODS


def _request_rpc_id(body: bytes | None) -> Any:
    obj = _json(body) if body else None
    return obj.get("id") if isinstance(obj, dict) else None


def _json(data: str | bytes) -> Any:
    try:
        return load_json(data)
    except ValueError:
        return None


def _spaced(event: TaskEvent) -> bool:
    """Whether the recording writes JSON as the official SDK does (", " and ": ")."""
    return '": ' in event.data


def _framed(frame: Any, binding: str | None, rpc_id: Any, like: TaskEvent) -> str:
    if binding == "jsonrpc":
        recorded = _json(like.data) if like.binding == "jsonrpc" else None
        keys = list(recorded) if isinstance(recorded, dict) else ["jsonrpc", "id", "result"]
        values = {"jsonrpc": "2.0", "id": rpc_id, "result": frame}
        frame = {k: values[k] for k in keys if k in values} | values
    separators = (", ", ": ") if _spaced(like) else (",", ":")
    return json.dumps(frame, separators=separators, ensure_ascii=False)


def _snapshot_event(task: dict[str, Any] | None, last: TaskEvent, binding: str | None, rpc_id: Any) -> bytes:
    """The Task as an event written like the recording's (its line ends and spacing),
    with the id of the last event it includes, so a resume from it continues after."""
    return _block(last, _framed({"task": task or {}}, binding, rpc_id, last), last.id)


def _block(like: TaskEvent, data: str, event_id: str | None) -> bytes:
    end = "\r\n" if like.raw.endswith(b"\r\n") else "\n"
    head = f"id: {event_id}{end}" if event_id is not None else ""
    return f"{head}data: {data}{end}{end}".encode()


def _with_id(raw: bytes, event_id: str | None) -> bytes:
    """The recorded event with an (added) id line, when it has none."""
    if event_id is None or any(line.startswith(b"id:") for line in raw.splitlines()):
        return raw
    end = b"\r\n" if raw.endswith(b"\r\n") else b"\n"
    return raw[: -len(end)] + f"id: {event_id}".encode() + end + end
