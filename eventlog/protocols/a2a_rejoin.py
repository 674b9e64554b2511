"""A2A: picking a task's stream up again after the connection to the agent broke.

The stream goes on through ``tasks/{id}:subscribe`` (REST) or ``SubscribeToTask``
(JSON-RPC), whose first event is a Task snapshot. What the clients were sent is read back
into a Task the way the SDK's task manager builds one (``task_snapshot.task_after``); the
snapshot is compared with it, and what clients lack is made up as the events that would
have carried it: an ``artifactUpdate`` appending the parts they were not sent (the whole
artifact, replacing theirs, when the agent has since restated it in other parts, or when
they had none of it), a ``statusUpdate`` with a status they lack. An artifact they were
sent that the snapshot leaves out is a gap: nothing tells what became of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ..a2a_terms import ENDS_A_STREAM, Binding, is_jsonrpc
from ..classify import load_json
from ..jsonrpc_ids import NO_ID
from ..requests import classify_request
from ..task_snapshot import stream_response, task_after
from .base import CatchUp, Request, Resubscription, among

_STREAMING = re.compile(r"/(?:message:stream|tasks/[^/:]+:subscribe)$")
_V03_METHODS = frozenset({"message/stream", "tasks/resubscribe", "tasks/get"})


def resubscription(request: Request, sent: Sequence[str]) -> Resubscription | None:
    """The subscribe to the task the clients were being sent, while it has not ended."""
    task = task_after(_frames(sent))
    if task is None or among((task.get("status") or {}).get("state"), ENDS_A_STREAM):
        return None
    return _asking(request, task, ("SubscribeToTask", "tasks/resubscribe"), ":subscribe")


def lookup(request: Request, sent: Sequence[str]) -> Resubscription | None:
    """The task asked for (its answer a Task), when it will not be subscribed to."""
    task = task_after(_frames(sent))
    return None if task is None else _asking(request, task, ("GetTask", "tasks/get"), "")


def _asking(
    request: Request, task: dict[str, Any], methods: tuple[str, str], suffix: str
) -> Resubscription | None:
    """A request about the task on the stream's binding: JSON-RPC's method (v1.0's or,
    for a 0.3 stream, 0.3's) with the stream's own id, or REST's ``tasks/{id}SUFFIX``."""
    if not isinstance(task.get("id"), str):
        return None  # no event named the task yet
    task_id = task["id"]
    info = classify_request(request.method, request.path, request.body)
    path = request.path.partition("?")[0]
    if info.binding == Binding.JSONRPC:
        method = methods[1] if info.rpc_method in _V03_METHODS else methods[0]
        body = {"jsonrpc": "2.0", "id": info.rpc_id, "method": method, "params": {"id": task_id}}
        accept = "text/event-stream" if suffix else "application/json"
        headers = (("Content-Type", "application/json"), ("Accept", accept))
        return Resubscription("POST", path, json.dumps(body).encode(), headers)
    match = _STREAMING.search(path)
    if info.binding != Binding.REST or match is None:
        return None
    accept = "text/event-stream" if suffix else "application/json"
    target = f"{path[: match.start()]}/tasks/{quote(task_id, safe='')}{suffix}"
    return Resubscription("GET", target, None, (("Accept", accept),))


def catch_up(sent: Sequence[str], first: str) -> CatchUp:
    """The events that bring clients that were sent ``sent`` to the snapshot ``first``."""
    try:
        obj = load_json(first)
    except (ValueError, RecursionError):
        obj = None
    frame = stream_response(obj)
    snapshot = frame.get("task") if frame else None
    if snapshot is None and frame and isinstance(frame.get("status"), dict) and "id" in frame:
        snapshot = frame  # a Task itself: GetTask's answer
    if not isinstance(snapshot, dict) or _is_v03(obj):
        gap = "the subscribe's first event is not a v1.0 Task snapshot: it is sent on as it came"
        return CatchUp(gaps=(gap,), send_first=True)
    have = task_after(_frames(sent)) or {}
    ids = {"taskId": snapshot.get("id"), "contextId": snapshot.get("contextId")}
    updates: list[dict[str, Any]] = []
    gaps: list[str] = []
    held = {a.get("artifactId"): a for a in have.get("artifacts", []) if isinstance(a, dict)}
    for artifact in snapshot.get("artifacts") or []:
        if not isinstance(artifact, dict):
            continue
        name = artifact.get("artifactId")
        mine = held.pop(name, None)
        if mine is None:
            updates.append({"artifactUpdate": {**ids, "artifact": artifact}})
            continue
        rest = _parts_after(mine.get("parts") or [], artifact.get("parts") or [])
        if rest is None:  # the agent restated it otherwise (joined, with metadata): it replaces
            updates.append({"artifactUpdate": {**ids, "artifact": artifact}})
        elif rest:
            delta = {k: v for k, v in artifact.items() if k != "parts"} | {"parts": rest}
            updates.append({"artifactUpdate": {**ids, "artifact": delta, "append": True}})
    gaps.extend(f"artifact {name}: clients were sent it; the snapshot leaves it out" for name in held)
    status = snapshot.get("status")
    if isinstance(status, dict) and _moment_aside(status) != _moment_aside(have.get("status")):
        updates.append({"statusUpdate": {**ids, "status": status}})
    separators = (", ", ": ") if '", "' in first or '": ' in first else (",", ":")
    rpc_id = obj.get("id", NO_ID) if isinstance(obj, dict) and is_jsonrpc(obj) else NO_ID
    events = tuple(json.dumps(_enveloped(u, rpc_id), separators=separators) for u in updates)
    return CatchUp(events=events, gaps=tuple(gaps))


def _parts_after(mine: list[Any], theirs: list[Any]) -> list[Any] | None:
    """The parts the snapshot's artifact has past those clients were sent; None when it
    does not simply continue them. Deltas joined into fewer parts continue them when the
    parts are text alone."""
    if theirs[: len(mine)] == mine:
        return theirs[len(mine) :]
    have, full = _text(mine), _text(theirs)
    if have is None or full is None or not full.startswith(have):
        return None
    return [{"text": full[len(have) :]}] if len(full) > len(have) else []


def _text(parts: list[Any]) -> str | None:
    """The parts' text, when every one of them is text alone."""
    if not all(isinstance(p, dict) and set(p) == {"text"} and isinstance(p["text"], str) for p in parts):
        return None
    return "".join(p["text"] for p in parts)


def _moment_aside(status: Any) -> Any:
    """A status but for its timestamp (an agent may stamp every snapshot afresh)."""
    return {k: v for k, v in status.items() if k != "timestamp"} if isinstance(status, dict) else status


def _frames(sent: Sequence[str]) -> list[dict[str, Any]]:
    frames = []
    for data in sent:
        try:
            frame = stream_response(load_json(data))
        except (ValueError, RecursionError):
            continue
        if frame is not None:
            frames.append(frame)
    return frames


def _is_v03(obj: Any) -> bool:
    body = obj.get("result") if isinstance(obj, dict) and is_jsonrpc(obj) else obj
    return isinstance(body, dict) and "kind" in body


def _enveloped(update: dict[str, Any], rpc_id: object) -> dict[str, Any]:
    return update if rpc_id is NO_ID else {"jsonrpc": "2.0", "id": rpc_id, "result": update}
