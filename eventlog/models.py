"""Pydantic models of the A2A v1.0 stream frames (lenient: unknown fields are kept,
optional fields may be missing), plus the A2A 0.3 shapes still seen in the wild."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from tasktape.errors import FrameError

from .a2a_terms import STREAM_KINDS, TaskState, from_v03, is_jsonrpc, normalize_state


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


def parse_stream_response(data: str | bytes | dict[str, Any]) -> StreamResponse | JsonRpcResponse:
    """Parse one SSE ``data`` payload: a REST StreamResponse, or a JSON-RPC response
    wrapping one (``result``) or carrying an ``error``; A2A 0.3 shapes are accepted.

    Raises :class:`FrameError` (a ``ValueError``) naming what is wrong."""
    try:
        obj = json.loads(data) if isinstance(data, str | bytes) else data
    except (ValueError, RecursionError) as exc:  # (nested past what the parser follows)
        raise FrameError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError(f"not a JSON object: {type(obj).__name__}")
    try:
        if is_jsonrpc(obj):
            return JsonRpcResponse.model_validate(obj)
        return StreamResponse.model_validate(from_v03(obj))
    except ValueError as exc:
        raise FrameError(str(exc)) from None
