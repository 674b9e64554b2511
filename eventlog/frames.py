"""Recorded exchanges as the checker reads them: each A2A response split into frames
(the SSE events of a stream, or the one JSON body of a plain response), classified."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .classify import Classification, classify, load_json
from .models import is_jsonrpc
from .recorded import Recorded
from .requests import classify_request
from .spans import events_in


@dataclass(frozen=True)
class Frame:
    """One SSE event (``seq`` numbered as the log's events table does), or a whole body."""

    seq: int | None  # None for the body of a response that is not a stream
    sse_id: str | None
    complete: bool  # False: the tail of a stream that ended mid-event
    at_ns: int | None  # when it arrived (absolute when the exchange's start is known)
    c: Classification
    task_id: str | None  # the frame's own task id, else the one its exchange is about
    payload: dict[str, Any] | None  # the StreamResponse object (a JSON-RPC result unwrapped)
    envelope: dict[str, Any] | None  # the JSON-RPC response object around it


@dataclass
class Stream:
    """One A2A exchange: a stream of events, or a plain response."""

    index: int  # position among the exchanges checked
    where: str
    exchange_id: int | None
    is_sse: bool
    outcome: str | None
    error: str | None
    rpc_id: Any  # the JSON-RPC request's id (None when not JSON-RPC)
    jsonrpc: bool
    frames: list[Frame] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether the response ended as it meant to (a missing outcome: hand-made, so yes)."""
        return self.outcome in (None, "complete")

    @property
    def task_id(self) -> str | None:
        """The task the exchange is about: the first one its frames name."""
        return next((f.task_id for f in self.frames if f.task_id), None)

    def label(self, frame: Frame | None = None) -> str:
        """``exchange 13 event 4`` or ``completed.jsonl:5 event 4``, for messages."""
        place = self.where if self.exchange_id is None else f"exchange {self.where}"
        return place if frame is None or frame.seq is None else f"{place} event {frame.seq}"


def streams_of(items: list[tuple[Recorded, str, int | None]]) -> list[Stream]:
    """The A2A exchanges among ``(recorded, where, exchange id)``: SSE responses, and the
    JSON bodies of successful A2A operations (a GetTask, a cancel, a message:send)."""
    streams = []
    for recorded, where, exchange_id in items:
        request = classify_request(recorded.method, recorded.path, recorded.request_body)
        if not recorded.is_sse and (request.rpc_method is None or not _ok(recorded)):
            continue  # an agent card, or an error the agent answered with: no lifecycle in it
        jsonrpc = request.binding == "jsonrpc"
        stream = Stream(
            len(streams),
            where,
            exchange_id,
            recorded.is_sse,
            recorded.outcome,
            recorded.error,
            request.rpc_id if jsonrpc else None,
            jsonrpc,
        )
        start = _start_ns(recorded.started_at)
        task_id = request.task_id
        if recorded.is_sse:
            for seq, event in enumerate(events_in(recorded.chunks)):
                frame = _frame(
                    seq, event.id, event.complete, event.data, _at(start, event.offset_ns), task_id
                )
                task_id = frame.task_id
                stream.frames.append(frame)
        elif recorded.chunks and stream.complete and not recorded.response_body_truncated:
            body = recorded.body.decode("utf-8", "replace")
            stream.frames.append(_frame(None, None, True, body, _at(start, recorded.chunks[-1][0]), task_id))
        streams.append(stream)
    return streams


def _ok(recorded: Recorded) -> bool:
    return recorded.status is not None and 200 <= recorded.status < 300


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
    seq: int | None, sse_id: str | None, complete: bool, data: str, at_ns: int | None, task_id: str | None
) -> Frame:
    c = classify(data, bare_task=seq is None)
    payload = envelope = None
    if c.parse_error is None and data:
        obj = load_json(data)
        if isinstance(obj, dict):
            envelope = obj if is_jsonrpc(obj) else None
            payload = obj.get("result") if envelope is not None else obj
            payload = payload if isinstance(payload, dict) else None
    return Frame(seq, sse_id, complete, at_ns, c, c.task_id or task_id, payload, envelope)
