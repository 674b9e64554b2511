"""What the demo agent checks of a request, and how it names what is wrong: the A2A v1.0
error types with their JSON-RPC codes and HTTP statuses, the protocol version it speaks,
and the fields a request must carry."""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import Enum, StrEnum
from typing import Any

from tasktape.errors import A2AError

VERSION_HEADER = "A2A-Version"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "a2a-protocol.org"
# 1.x: minor versions only add to 1.0, as the official SDK's server also accepts.
_SPOKEN_VERSION = re.compile(r"1(\.\d+){0,2}")


class ErrorKind(Enum):
    """An error answer: (JSON-RPC code, HTTP status, google.rpc status); the name is the
    ErrorInfo reason a REST error carries."""

    PARSE_ERROR = (-32700, 400, "INVALID_ARGUMENT")
    INVALID_REQUEST = (-32600, 400, "INVALID_ARGUMENT")
    METHOD_NOT_FOUND = (-32601, 404, "NOT_FOUND")
    INVALID_PARAMS = (-32602, 400, "INVALID_ARGUMENT")
    TASK_NOT_FOUND = (-32001, 404, "NOT_FOUND")
    # 409 Conflict, not the spec's 400: the hosted API answers a cancel of a terminal task so.
    TASK_NOT_CANCELABLE = (-32002, 409, "FAILED_PRECONDITION")
    PUSH_NOTIFICATION_NOT_SUPPORTED = (-32003, 400, "FAILED_PRECONDITION")
    UNSUPPORTED_OPERATION = (-32004, 400, "FAILED_PRECONDITION")
    VERSION_NOT_SUPPORTED = (-32009, 400, "FAILED_PRECONDITION")

    def __init__(self, rpc: int, http: int, status: str) -> None:
        self.rpc, self.http, self.status = rpc, http, status

    def error(self, message: str) -> A2AError:
        return A2AError(self.http, self.rpc, message)

    @classmethod
    def of(cls, error: A2AError) -> ErrorKind:
        return next(kind for kind in cls if kind.rpc == error.rpc)


class Method(StrEnum):
    """The JSON-RPC binding's methods."""

    SEND_MESSAGE = "SendMessage"
    SEND_STREAMING_MESSAGE = "SendStreamingMessage"
    GET_TASK = "GetTask"
    LIST_TASKS = "ListTasks"
    CANCEL_TASK = "CancelTask"
    SUBSCRIBE_TO_TASK = "SubscribeToTask"
    CREATE_PUSH_CONFIG = "CreateTaskPushNotificationConfig"
    GET_PUSH_CONFIG = "GetTaskPushNotificationConfig"
    LIST_PUSH_CONFIGS = "ListTaskPushNotificationConfigs"
    DELETE_PUSH_CONFIG = "DeleteTaskPushNotificationConfig"
    GET_EXTENDED_AGENT_CARD = "GetExtendedAgentCard"


class Role(StrEnum):
    USER = "ROLE_USER"
    AGENT = "ROLE_AGENT"


# A part holds exactly one of these.
_PART_CONTENT = ("text", "raw", "url", "data")


def check_version(version: str | None) -> None:
    """An ``A2A-Version`` the agent does not speak is refused; none at all is served (as
    1.0: many clients and examples send none)."""
    if version and not _SPOKEN_VERSION.fullmatch(version.strip()):
        raise ErrorKind.VERSION_NOT_SUPPORTED.error(
            f"A2A version {version} is not supported: this agent speaks 1.0 (any 1.x)"
        )


def check_message(message: Any) -> dict[str, Any]:
    """The message of a SendMessage request, with the fields the spec requires."""
    if not isinstance(message, dict):
        raise ErrorKind.INVALID_PARAMS.error("the request needs a message")
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        raise ErrorKind.INVALID_PARAMS.error("message.parts: at least one part is required")
    if not all(isinstance(p, dict) and sum(k in p for k in _PART_CONTENT) == 1 for p in parts):
        raise ErrorKind.INVALID_PARAMS.error(
            f"message.parts: each part holds one of {', '.join(_PART_CONTENT)}"
        )
    if message.get("role") not in list(Role):
        raise ErrorKind.INVALID_PARAMS.error(f"message.role: one of {', '.join(Role)} is required")
    for name in ("taskId", "contextId"):
        if name in message and not isinstance(message[name], str):
            raise ErrorKind.INVALID_PARAMS.error(f"message.{name}: a string")
    # A missing messageId is tolerated (the project's own examples send none); a wrong one is not.
    if "messageId" in message and not (isinstance(message["messageId"], str) and message["messageId"]):
        raise ErrorKind.INVALID_PARAMS.error("message.messageId: a non-empty string")
    return message


def named_task_id(params: Any) -> str:
    """The ``id`` a task request names."""
    value = params.get("id") if isinstance(params, dict) else None
    if not isinstance(value, str) or not value:
        raise ErrorKind.INVALID_PARAMS.error("id: the task's id is required")
    return value


def integer(params: Mapping[str, Any], name: str, *, low: int, high: int | None = None) -> int | None:
    """An optional int32 field: a JSON number, or its decimal string (a query parameter, or
    protobuf JSON's other spelling)."""
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ErrorKind.INVALID_PARAMS.error(f"{name}: an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high} inclusive" if high is not None else f"at least {low}"
        raise ErrorKind.INVALID_PARAMS.error(f"{name}: must be {bounds}, got {value}")
    return value


def boolean(params: Mapping[str, Any], name: str) -> bool:
    """An optional bool field, false by default: JSON true/false, or "true"/"false" in a query."""
    value = params.get(name, False)
    if isinstance(value, str) and value in ("true", "false"):
        return value == "true"
    if not isinstance(value, bool):
        raise ErrorKind.INVALID_PARAMS.error(f"{name}: true or false, got {value!r}")
    return value


def history_length(params: Mapping[str, Any]) -> int | None:
    """``historyLength``: unset, no limit; 0, no history; n, the n most recent messages."""
    return integer(params, "historyLength", low=0)
