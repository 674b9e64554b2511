"""A2A's fixed vocabulary, for code that reads frames without the pydantic models: the
task states (v1.0 names, and A2A 0.3's spellings of them), the kinds of stream frame (and
of the log's events), the two bindings, and what tells a JSON-RPC envelope. Loading it
loads no pydantic: the recorder and the log writer start without it."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


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
ENDS_A_STREAM = TERMINAL_STATES | INTERRUPTED_STATES  # a state a task's stream ends in


def short_state(state: str | None) -> str:
    """``TASK_STATE_COMPLETED`` -> ``COMPLETED``, as people read it."""
    return (state or "").removeprefix("TASK_STATE_")


# A2A 0.3 spells states in lowercase kebab case ("input-required").
V03_STATES = {s.value.removeprefix("TASK_STATE_").lower().replace("_", "-"): s.value for s in TaskState}
V03_STATES["unknown"] = TaskState.UNSPECIFIED.value


def normalize_state(value: str) -> str:
    """``"working"`` (A2A 0.3) -> ``"TASK_STATE_WORKING"``; v1.0 names and unknown values pass."""
    return V03_STATES.get(value, value)


class A2AKind(StrEnum):
    """The kinds of the log's A2A events: a stream frame's, or an error's, or other."""

    TASK = "task"
    MESSAGE = "message"
    STATUS_UPDATE = "statusUpdate"
    ARTIFACT_UPDATE = "artifactUpdate"
    ERROR = "error"
    OTHER = "other"


# The four kinds of stream frame (a StreamResponse holds one), as plain strings.
STREAM_KINDS = tuple(
    k.value for k in (A2AKind.TASK, A2AKind.MESSAGE, A2AKind.STATUS_UPDATE, A2AKind.ARTIFACT_UPDATE)
)


# Where agent cards are served: the well-known paths (v1.0 and 0.3), the REST extended
# card; and the JSON-RPC methods whose result is a card (v1.0 and 0.3).
CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json", "/extendedAgentCard")
CARD_METHODS = ("GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard")

# The operations that answer nothing (google.protobuf.Empty; JSON-RPC ``"result": null``,
# as the official SDK sends it), v1.0's and 0.3's.
EMPTY_ANSWER_METHODS = frozenset({"DeleteTaskPushNotificationConfig", "tasks/pushNotificationConfig/delete"})


class Binding(StrEnum):
    """The two ways A2A is carried: ``RequestInfo.binding`` and ``Classification.binding``."""

    REST = "rest"
    JSONRPC = "jsonrpc"


# A2A 0.3 tags each result with "kind" instead of wrapping it in a named field.
V03_KINDS = {
    "task": "task",
    "message": "message",
    "status-update": "statusUpdate",
    "artifact-update": "artifactUpdate",
}


def from_v03(obj: dict[str, Any]) -> dict[str, Any]:
    """Wrap an A2A 0.3 result (``{"kind": "status-update", ...}``) as a v1.0 StreamResponse."""
    kind = obj.get("kind")
    if isinstance(kind, str) and kind in V03_KINDS and not any(k in obj for k in STREAM_KINDS):
        return {V03_KINDS[kind]: obj}
    return obj


def is_jsonrpc(obj: dict[str, Any]) -> bool:
    return "jsonrpc" in obj or ("id" in obj and ("result" in obj or "error" in obj))
