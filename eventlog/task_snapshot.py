"""A2A: the Task an agent holds after some of its stream's events, built as the official
SDK's task manager builds it (what a subscriber is sent first)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from .a2a_terms import from_v03, is_jsonrpc

SUBMITTED = "TASK_STATE_SUBMITTED"


def stream_response(frame: Any) -> dict[str, Any] | None:
    """The StreamResponse of one event's JSON (a JSON-RPC result unwrapped, 0.3 read as 1.0)."""
    if not isinstance(frame, dict):
        return None
    if is_jsonrpc(frame):
        frame = frame.get("result")
        if not isinstance(frame, dict):
            return None
    return from_v03(frame)


def task_after(frames: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """The Task after these StreamResponses, or None when none of them made one: a Task
    replaces what came before; a status update moves the last status message into the
    history, merges its metadata and takes the status; an artifact update adds the
    artifact, replaces the one of its id, or (``append``) adds its parts to it."""
    task: dict[str, Any] | None = None
    for frame in frames:
        if isinstance(frame.get("task"), dict):
            task = copy.deepcopy(frame["task"])
            continue
        update = frame.get("statusUpdate") or frame.get("artifactUpdate")
        if not isinstance(update, dict):
            continue
        if task is None:
            task = {
                "id": update.get("taskId"),
                "contextId": update.get("contextId"),
                "status": {"state": SUBMITTED},
            }
        if "statusUpdate" in frame:
            _status(task, update)
        else:
            _artifact(task, update)
    return task


def _status(task: dict[str, Any], update: dict[str, Any]) -> None:
    message = (task.get("status") or {}).get("message")
    if message:
        task.setdefault("history", []).append(message)
    if isinstance(update.get("metadata"), dict):
        task["metadata"] = {**task.get("metadata", {}), **update["metadata"]}
    if isinstance(update.get("status"), dict):
        task["status"] = copy.deepcopy(update["status"])


def _artifact(task: dict[str, Any], update: dict[str, Any]) -> None:
    artifact = update.get("artifact")
    if not isinstance(artifact, dict):
        return
    artifacts = task.setdefault("artifacts", [])
    same = next((a for a in artifacts if a.get("artifactId") == artifact.get("artifactId")), None)
    if not update.get("append") or same is None:
        # An append to an artifact never created is the agent's mistake: it stands as new.
        if same is None:
            artifacts.append(copy.deepcopy(artifact))
        else:
            artifacts[artifacts.index(same)] = copy.deepcopy(artifact)
        return
    same.setdefault("parts", []).extend(copy.deepcopy(artifact.get("parts", [])))
    if isinstance(artifact.get("metadata"), dict):
        same["metadata"] = {**same.get("metadata", {}), **artifact["metadata"]}
