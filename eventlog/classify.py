"""What the log indexes about one SSE ``data`` payload.

This runs for every recorded event, so it reads the decoded JSON directly instead of
building the pydantic models; ``tests/test_classify.py`` holds the two to agreement.
It never raises: content that is not an A2A frame is classified ``other`` (with a
``parse_error`` when it is not even JSON, or no text at all).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import orjson
from msgspec import UNSET

from . import typed_frames
from .a2a_terms import STREAM_KINDS, V03_KINDS, Binding, is_jsonrpc, normalize_state


class Classification(NamedTuple):
    kind: str  # task, message, statusUpdate, artifactUpdate, error or other
    binding: str | None = None  # rest, jsonrpc, or None when not A2A
    task_id: str | None = None
    context_id: str | None = None
    state: str | None = None
    artifact_id: str | None = None
    artifact_type: str | None = None
    append: bool | None = None
    last_chunk: bool | None = None
    text: str | None = None
    usage: dict[str, Any] | None = None
    parse_error: str | None = None


def load_json(data: str | bytes) -> Any:
    """JSON as the standard library reads it, at orjson's speed."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # orjson refuses what the standard library reads (NaN, infinities, lone
        # surrogates): let json decide, and word the error.
        return json.loads(data)


def is_json(text: str) -> bool:
    """Whether ``text`` reads as JSON (as the standard library reads it)."""
    try:
        load_json(text)
    except (ValueError, RecursionError):
        return False
    return True


def json_or_none(data: str | bytes | None) -> Any:
    """``load_json``'s value, or None for what is empty or not JSON."""
    if not data:
        return None
    try:
        return load_json(data)
    except (ValueError, RecursionError):
        return None


def classify(data: str | bytes, *, bare_task: bool = False) -> Classification:
    """Classify one event's data (a REST frame, a JSON-RPC response, A2A 0.3, or anything).

    With ``bare_task``, an object that is a Task itself (``id`` and ``status``, as in the
    body of a GetTask or CancelTask response) is a ``task`` too. Data that is no text at
    all (an int, a dict parsed already) is ``other`` too, its ``parse_error`` saying so."""
    try:  # (costs nothing on the way through: what is no text is told apart only on failing)
        if not data:
            return _EMPTY
        if not bare_task:
            try:
                frame = typed_frames.decode(data)
            except (typed_frames.DecodeError, UnicodeEncodeError, RecursionError):
                # Not an exact frame (or not JSON; or text holding a lone surrogate, which
                # msgspec will not encode; or JSON nested deeper than it reads): the general
                # path says what it is.
                pass
            else:
                typed = _typed(frame)
                if typed is not None:
                    return typed
        return classify_json(data, bare_task=bare_task)
    except Exception:
        if isinstance(data, str | bytes | bytearray | memoryview):
            raise  # text: a fault of this reading, not of the data
        return Classification("other", parse_error=f"not JSON text (str or bytes) but {type(data).__name__}")


def classify_json(data: str | bytes, *, bare_task: bool = False) -> Classification:
    """``classify``'s general path: any JSON, read through its dicts."""
    if not data:
        return _EMPTY
    try:
        obj = load_json(data)
    except (ValueError, RecursionError) as exc:
        return Classification("other", parse_error=f"not JSON: {exc}"[:500])
    if not isinstance(obj, dict):
        return Classification("other", parse_error=f"not a JSON object but {type(obj).__name__}")
    binding = _REST
    if is_jsonrpc(obj):
        binding = _JSONRPC
        if obj.get("result") is None and "error" in obj:
            return _error(obj["error"], binding)
        obj = obj.get("result")
        if not isinstance(obj, dict):
            return Classification("other", binding, parse_error="JSON-RPC result is not an object")
    if len(obj) == 1:
        # An exact v1.0 frame, by far the commonest: its one key is its kind.
        (kind,) = obj
        extract = _EXTRACT.get(kind)
        if extract is not None:
            body = obj[kind]
            if type(body) is dict:
                return extract(body, binding)
            return Classification("other", binding, parse_error=f"{kind} is not an object")
    kind = None
    for name in STREAM_KINDS:
        if name in obj:
            if kind is not None:
                present = ", ".join(k for k in STREAM_KINDS if k in obj)
                return Classification(
                    "other", binding, parse_error=f"more than one of {present} in one frame"
                )
            kind = name
    v03_kind = obj.get("kind")
    if kind is not None:
        body = obj[kind]
    elif isinstance(v03_kind, str) and v03_kind in V03_KINDS:
        kind = V03_KINDS[v03_kind]
        body = obj
    elif "error" in obj:
        return _error(obj["error"], binding)
    elif bare_task and "id" in obj and isinstance(obj.get("status"), dict):
        kind, body = "task", obj
    else:
        return Classification("other", None if binding == _REST else binding)
    if not isinstance(body, dict):
        return Classification("other", binding, parse_error=f"{kind} is not an object")
    return _EXTRACT[kind](body, binding)


_EMPTY = Classification("other")
# Bindings as module names: an enum member looked up on its class costs about a thousand
# instructions on Python 3.11 (its metaclass __getattr__), and classifying runs per event.
_REST, _JSONRPC = Binding.REST, Binding.JSONRPC


def str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(parts: Any) -> str | None:
    if type(parts) is not list:  # JSON as loaded here: a list is exactly a list
        return None
    if len(parts) == 1:  # a token delta: one text part
        text = parts[0].get("text") if type(parts[0]) is dict else None
        return text if type(text) is str else None
    texts = [t for p in parts if isinstance(p, dict) and isinstance(t := p.get("text"), str)]
    return "".join(texts) if texts else None


def _usage(metadata: Any) -> dict[str, Any] | None:
    if type(metadata) is not dict:
        return None
    usage = metadata.get("$usage")
    return usage if isinstance(usage, dict) else None


# The extractors below run once per recorded event: they build the tuple positionally
# (keyword construction of a NamedTuple costs several times more) and test types inline.
_new = tuple.__new__


def _with_status(kind: str, id_field: str, body: dict[str, Any], binding: str) -> Classification:
    """A task snapshot (id in ``id``) or a status update (id in ``taskId``)."""
    status = body.get("status")
    if not isinstance(status, dict):
        status = {}
    state = status.get("state")
    message = status.get("message")
    task_id = body.get(id_field)
    context_id = body.get("contextId")
    return _new(
        Classification,
        (
            kind,
            binding,
            task_id if isinstance(task_id, str) else None,
            context_id if isinstance(context_id, str) else None,
            normalize_state(state) if isinstance(state, str) else None,
            None,
            None,
            None,
            None,
            _text(message.get("parts")) if isinstance(message, dict) else None,
            None if (usage := body.get("metadata")) is None else _usage(usage),
            None,
        ),
    )


def _message(m: dict[str, Any], binding: str) -> Classification:
    return Classification(
        "message",
        binding,
        task_id=str_or_none(m.get("taskId")),
        context_id=str_or_none(m.get("contextId")),
        text=_text(m.get("parts")),
        usage=_usage(m.get("metadata")),
    )


def _artifact_update(a: dict[str, Any], binding: str) -> Classification:
    artifact = a.get("artifact")
    if not isinstance(artifact, dict):
        artifact = {}
    task_id = a.get("taskId")
    context_id = a.get("contextId")
    artifact_id = artifact.get("artifactId")
    metadata = artifact.get("metadata")
    artifact_type = metadata.get("type") if isinstance(metadata, dict) else None
    return _new(
        Classification,
        (
            "artifactUpdate",
            binding,
            task_id if isinstance(task_id, str) else None,
            context_id if isinstance(context_id, str) else None,
            None,
            artifact_id if isinstance(artifact_id, str) else None,
            artifact_type if isinstance(artifact_type, str) else None,
            a.get("append") is True,
            a.get("lastChunk") is True,
            _text(artifact.get("parts")),
            None if (usage := a.get("metadata")) is None else _usage(usage),
            None,
        ),
    )


def _error(error: Any, binding: str) -> Classification:
    err = _dict(error)
    message = str_or_none(err.get("message"))
    code = err.get("code")
    text = f"{code}: {message}" if code is not None and message else message
    return Classification("error", binding, text=text)


def _typed(frame: typed_frames.Frame) -> Classification | None:
    """An exact frame's classification, as the general path gives it; None: another shape."""
    binding, body = _REST, frame
    if frame.jsonrpc is not UNSET or frame.id is not UNSET or frame.result is not UNSET:
        if frame.result is UNSET or (frame.jsonrpc is UNSET and frame.id is UNSET):
            return None
        binding, body = _JSONRPC, frame.result
    task, message, status_update, artifact_update = (
        body.task,
        body.message,
        body.statusUpdate,
        body.artifactUpdate,
    )
    if artifact_update is not UNSET:
        if task is not UNSET or message is not UNSET or status_update is not UNSET:
            return None
        a = artifact_update
        artifact = a.artifact
        if artifact is None:
            artifact_id = artifact_type = text = None
        else:
            artifact_id, metadata, text = artifact.artifactId, artifact.metadata, _parts_text(artifact.parts)
            artifact_type = metadata.get("type") if type(metadata) is dict else None
        task_id, context_id = a.taskId, a.contextId
        return _new(
            Classification,
            (
                "artifactUpdate",
                binding,
                task_id if type(task_id) is str else None,
                context_id if type(context_id) is str else None,
                None,
                artifact_id if type(artifact_id) is str else None,
                artifact_type if type(artifact_type) is str else None,
                a.append is True,
                a.lastChunk is True,
                text,
                None if a.metadata is None else _usage(a.metadata),
                None,
            ),
        )
    if message is not UNSET:
        if task is not UNSET or status_update is not UNSET:
            return None
        return Classification(
            "message",
            binding,
            task_id=str_or_none(message.taskId),
            context_id=str_or_none(message.contextId),
            text=_parts_text(message.parts),
            usage=_usage(message.metadata),
        )
    if task is not UNSET:
        if status_update is not UNSET:
            return None
        return _typed_status("task", task, task.id, binding)
    if status_update is not UNSET:
        return _typed_status("statusUpdate", status_update, status_update.taskId, binding)
    return None


def _typed_status(kind: str, body: Any, task_id: Any, binding: str) -> Classification:
    status = body.status
    state = message = None
    if status is not None:
        state, message = status.state, status.message
    context_id = body.contextId
    return _new(
        Classification,
        (
            kind,
            binding,
            task_id if type(task_id) is str else None,
            context_id if type(context_id) is str else None,
            normalize_state(state) if type(state) is str else None,
            None,
            None,
            None,
            None,
            None if message is None else _parts_text(message.parts),
            None if body.metadata is None else _usage(body.metadata),
            None,
        ),
    )


def _parts_text(parts: list[Any] | None) -> str | None:
    """``_text`` of parts msgspec decoded."""
    if not parts:
        return None
    if len(parts) == 1:
        text = parts[0].text
        return text if type(text) is str else None
    texts = [t for p in parts if type(t := p.text) is str]
    return "".join(texts) if texts else None


_EXTRACT: dict[str, Callable[[dict[str, Any], str], Classification]] = {
    "task": partial(_with_status, "task", "id"),
    "message": _message,
    "statusUpdate": partial(_with_status, "statusUpdate", "taskId"),
    "artifactUpdate": _artifact_update,
}
