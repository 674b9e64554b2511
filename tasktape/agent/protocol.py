"""What the demo agent checks of a request, and how it names what is wrong: the A2A v1.0
error types with their JSON-RPC codes and HTTP statuses, the protocol version it speaks,
and the fields a request must carry."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Mapping
from enum import Enum, StrEnum
from typing import Any

from tasktape.errors import A2AError

VERSION_HEADER = "A2A-Version"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
ERROR_DOMAIN = "a2a-protocol.org"
# 1.x: minor versions only add to 1.0, as the official SDK's server also accepts.
_SPOKEN_VERSION = re.compile(r"1(\.\d+){0,2}")
# How deep a request body may nest arrays and objects: protobuf's JSON reader, which the
# official SDK's server reads requests with, allows as much. Deeper ones crashed the reader,
# or a later walk of the task holding them (the REST rendering of its every listing).
MAX_DEPTH = 100


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


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _is_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_base64(value: Any) -> bool:
    """Protobuf JSON's bytes, read as the official SDK reads them: base64, standard or
    URL-safe, padding optional, characters outside the alphabet (line breaks) skipped."""
    if not isinstance(value, str):
        return False
    encoded = value.encode()
    try:
        base64.urlsafe_b64decode(encoded + b"=" * (4 - len(encoded) % 4))
    except (ValueError, binascii.Error):
        return False
    return True


class Shape(Enum):
    """What a message field holds in protobuf JSON: its check, and how an error names it."""

    STRING = (_is_string, "a string")
    BYTES = (_is_base64, "base64-encoded bytes")
    OBJECT = (_is_object, "an object")
    STRINGS = (_is_strings, "a list of strings")

    def __init__(self, check: Callable[[Any], bool], words: str) -> None:
        self.check, self.words = check, words


# A part holds exactly one of these; ``data`` is any JSON value.
_PART_CONTENT = ("text", "raw", "url", "data")
_PART_FIELDS = {
    "text": Shape.STRING,
    "raw": Shape.BYTES,
    "url": Shape.STRING,
    "filename": Shape.STRING,
    "mediaType": Shape.STRING,
    "metadata": Shape.OBJECT,
}
_MESSAGE_FIELDS = {
    "taskId": Shape.STRING,
    "contextId": Shape.STRING,
    "metadata": Shape.OBJECT,
    "extensions": Shape.STRINGS,
    "referenceTaskIds": Shape.STRINGS,
}


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is no JSON value", name, 0)  # (as the reader's own refusals)


def _finite(literal: str) -> float:
    """A JSON number with a fraction or an exponent, as a double: one beyond a double's range
    (1e400), which Python reads as infinity, is refused as NaN and Infinity are."""
    value = float(literal)
    if not math.isfinite(value):
        shown = literal if len(literal) <= 24 else literal[:20] + "..."
        raise ErrorKind.PARSE_ERROR.error(f"the body holds a number beyond a double's range: {shown}")
    return value


def _nests_within(value: Any, levels: int) -> bool:
    """Whether ``value`` nests no more than ``levels`` arrays and objects deep (walked with
    a stack of its own: a recursive walk is what fails on deep ones)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        inner = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if inner is None:
            continue
        if depth > levels:
            return False
        pending.extend((child, depth + 1) for child in inner)
    return True


def read_json(text: str) -> Any:
    """A request body as JSON has it. Python's reader also takes NaN and Infinity (refused,
    as any body that is not JSON: a ``ValueError``), and reads 1e400 as infinity: an answer
    echoing them (a JSON-RPC id, a message's metadata) would be no JSON. Such a number, or a
    body nested deeper than ``MAX_DEPTH``, is a parse error saying so (``A2AError``)."""
    too_deep = f"the body nests arrays and objects deeper than {MAX_DEPTH} levels"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:  # (nested past what the reader itself takes)
        raise ErrorKind.PARSE_ERROR.error(too_deep) from None
    if not _nests_within(value, MAX_DEPTH):
        raise ErrorKind.PARSE_ERROR.error(too_deep)
    return value


def dump_json(value: Any, **style: Any) -> str:
    """``value`` as JSON every client reads: a NaN or an infinity fails here (``ValueError``)
    rather than go out as ``NaN`` or ``Infinity``, which are no JSON."""
    return json.dumps(value, allow_nan=False, **style)


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
    for index, part in enumerate(parts):
        _check_part(part, f"message.parts[{index}]")
    if message.get("role") not in list(Role):
        raise ErrorKind.INVALID_PARAMS.error(f"message.role: one of {', '.join(Role)} is required")
    _check_fields(message, _MESSAGE_FIELDS, "message")
    # A missing messageId is tolerated (the project's own examples send none); a wrong one is not.
    if message.get("messageId") is not None and not (
        isinstance(message["messageId"], str) and message["messageId"]
    ):
        raise ErrorKind.INVALID_PARAMS.error("message.messageId: a non-empty string")
    return message


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a checked message: its text parts, joined."""
    return "".join(part.get("text") or "" for part in message["parts"])


def _check_part(part: Any, where: str) -> None:
    """A part holds one content, and each field it sets is of its type (so a text part's
    text is a string: the agent reads it)."""
    if not (isinstance(part, dict) and sum(_sets(part, name) for name in _PART_CONTENT) == 1):
        raise ErrorKind.INVALID_PARAMS.error(f"{where}: a part holds one of {', '.join(_PART_CONTENT)}")
    _check_fields(part, _PART_FIELDS, where)


def _check_fields(frame: dict[str, Any], fields: Mapping[str, Shape], where: str) -> None:
    for name, shape in fields.items():
        if _sets(frame, name) and not shape.check(frame[name]):
            raise ErrorKind.INVALID_PARAMS.error(f"{where}.{name}: {shape.words}")


def _sets(frame: dict[str, Any], name: str) -> bool:
    """Whether ``name`` is set: protobuf JSON reads null as unset, except in a part's
    ``data`` (a google.protobuf.Value, where null is a value)."""
    return name in frame and (frame[name] is not None or name == "data")


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
