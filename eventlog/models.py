"""Pydantic models of the A2A v1.0 stream frames (lenient: unknown fields are kept,
optional fields may be missing), plus the A2A 0.3 shapes still seen in the wild."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from tasktape.errors import FrameError


class TaskState(StrEnum):
    SUBMITTED = "TASK_STATE_SUBMITTED"
    WORKING = "TASK_STATE_WORKING"
    COMPLETED = "TASK_STATE_COMPLETED"
    FAILED = "TASK_STATE_FAILED"
    CANCELED = "TASK_STATE_CANCELED"
    INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
    REJECTED = "TASK_STATE_REJECTED"
    AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
    UNSPECIFIED = "TASK_STATE_UNSPECIFIED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def interrupted(self) -> bool:
        return self in INTERRUPTED_STATES


TERMINAL_STATES = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED})
INTERRUPTED_STATES = frozenset({TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED})

# A2A 0.3 spells states in lowercase kebab case ("input-required").
V03_STATES = {s.value.removeprefix("TASK_STATE_").lower().replace("_", "-"): s.value for s in TaskState}
V03_STATES["unknown"] = TaskState.UNSPECIFIED.value


def normalize_state(value: str) -> str:
    """``"working"`` (A2A 0.3) -> ``"TASK_STATE_WORKING"``; v1.0 names and unknown values pass."""
    return V03_STATES.get(value, value)


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="allow", populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True
    )


class Part(_Model):
    text: str | None = None
    raw: str | None = None
    url: str | None = None
    data: Any = None
    filename: str | None = None
    media_type: str | None = None
    metadata: dict[str, Any] | None = None
    kind: str | None = None  # A2A 0.3: "text", "file" or "data"


class Message(_Model):
    message_id: str | None = None
    context_id: str | None = None
    task_id: str | None = None
    role: str | None = None
    parts: list[Part] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None
    extensions: list[str] | None = None
    reference_task_ids: list[str] | None = None
    kind: str | None = None

    @property
    def text(self) -> str | None:
        return _join_text(self.parts)


class Artifact(_Model):
    artifact_id: str | None = None
    name: str | None = None
    description: str | None = None
    parts: list[Part] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None
    extensions: list[str] | None = None

    @property
    def type(self) -> str | None:
        """``metadata.type``, e.g. ``"intermediate-thinking"``."""
        value = (self.metadata or {}).get("type")
        return value if isinstance(value, str) else None

    @property
    def text(self) -> str | None:
        return _join_text(self.parts)


class TaskStatus(_Model):
    state: TaskState | str | None = None
    message: Message | None = None
    timestamp: str | None = None

    @field_validator("state", mode="before")
    @classmethod
    def _normalize(cls, value: Any) -> Any:
        return normalize_state(value) if isinstance(value, str) else value


class Usage(_Model):
    """Token and credit accounting found under ``metadata["$usage"]``."""

    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    total_tokens: int | None = None
    credits: float | None = None


class _WithUsage(_Model):
    metadata: dict[str, Any] | None = None

    @property
    def usage(self) -> Usage | None:
        value = (self.metadata or {}).get("$usage")
        return Usage.model_validate(value) if isinstance(value, dict) else None


class Task(_WithUsage):
    id: str | None = None
    context_id: str | None = None
    status: TaskStatus | None = None
    artifacts: list[Artifact] | None = None
    history: list[Message] | None = None
    kind: str | None = None


class TaskStatusUpdateEvent(_WithUsage):
    task_id: str | None = None
    context_id: str | None = None
    status: TaskStatus | None = None
    final: bool | None = None  # A2A 0.3 only
    kind: str | None = None


class TaskArtifactUpdateEvent(_WithUsage):
    task_id: str | None = None
    context_id: str | None = None
    artifact: Artifact | None = None
    append: bool | None = None
    last_chunk: bool | None = None
    kind: str | None = None


STREAM_KINDS = ("task", "message", "statusUpdate", "artifactUpdate")
# A2A 0.3 tags each result with "kind" instead of wrapping it in a named field.
V03_KINDS = {
    "task": "task",
    "message": "message",
    "status-update": "statusUpdate",
    "artifact-update": "artifactUpdate",
}


class StreamResponse(_Model):
    """Exactly one of ``task``, ``message``, ``status_update``, ``artifact_update``."""

    task: Task | None = None
    message: Message | None = None
    status_update: TaskStatusUpdateEvent | None = None
    artifact_update: TaskArtifactUpdateEvent | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StreamResponse:
        present = [k for k in STREAM_KINDS if getattr(self, _field_name(k)) is not None]
        if len(present) != 1:
            raise ValueError(
                f"a StreamResponse holds exactly one of {', '.join(STREAM_KINDS)}; got {present or 'none'}"
            )
        return self

    @property
    def kind(self) -> str:
        return next(k for k in STREAM_KINDS if getattr(self, _field_name(k)) is not None)

    @property
    def payload(self) -> Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent:
        return getattr(self, _field_name(self.kind))


class JsonRpcError(_Model):
    code: int | None = None
    message: str | None = None
    data: Any = None


class JsonRpcResponse(_Model):
    jsonrpc: str | None = None
    id: int | str | None = None
    result: StreamResponse | None = None
    error: JsonRpcError | None = None

    @field_validator("result", mode="before")
    @classmethod
    def _unwrap_v03(cls, value: Any) -> Any:
        return from_v03(value) if isinstance(value, dict) else value


def _field_name(kind: str) -> str:
    return {"statusUpdate": "status_update", "artifactUpdate": "artifact_update"}.get(kind, kind)


def _join_text(parts: list[Part]) -> str | None:
    texts = [p.text for p in parts if p.text is not None]
    return "".join(texts) if texts else None


def from_v03(obj: dict[str, Any]) -> dict[str, Any]:
    """Wrap an A2A 0.3 result (``{"kind": "status-update", ...}``) as a v1.0 StreamResponse."""
    kind = obj.get("kind")
    if isinstance(kind, str) and kind in V03_KINDS and not any(k in obj for k in STREAM_KINDS):
        return {V03_KINDS[kind]: obj}
    return obj


def parse_stream_response(data: str | bytes | dict[str, Any]) -> StreamResponse | JsonRpcResponse:
    """Parse one SSE ``data`` payload: a REST StreamResponse, or a JSON-RPC response
    wrapping one (``result``) or carrying an ``error``; A2A 0.3 shapes are accepted.

    Raises :class:`FrameError` (a ``ValueError``) naming what is wrong."""
    try:
        obj = json.loads(data) if isinstance(data, str | bytes) else data
    except ValueError as exc:
        raise FrameError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"not a JSON object: {type(obj).__name__}")
    try:
        if is_jsonrpc(obj):
            return JsonRpcResponse.model_validate(obj)
        return StreamResponse.model_validate(from_v03(obj))
    except ValueError as exc:
        raise FrameError(str(exc)) from None


def is_jsonrpc(obj: dict[str, Any]) -> bool:
    return "jsonrpc" in obj or ("id" in obj and ("result" in obj or "error" in obj))
