"""What the log indexes about a request: binding, A2A operation, task and context ids.

REST requests are recognised by the path's tail (any prefix or tenant before it is
fine); JSON-RPC requests by their body. ``rpc_method`` holds the A2A operation for both
bindings (the JSON-RPC method name; for REST, the equivalent name).
"""

from __future__ import annotations

import re
from typing import Any

from .a2a_terms import Binding
from .classify import json_or_none, str_or_none
from .protocols.base import RequestInfo

_TASK = r"/tasks/(?P<task>[^/:]+)"
_REST_ROUTES = [
    (re.compile(r"(?:^|/)message:send$"), {"POST": "SendMessage"}),
    (re.compile(r"(?:^|/)message:stream$"), {"POST": "SendStreamingMessage"}),
    (re.compile(rf"{_TASK}:cancel$"), {"POST": "CancelTask"}),
    (re.compile(rf"{_TASK}:subscribe$"), {"GET": "SubscribeToTask", "POST": "SubscribeToTask"}),
    (
        re.compile(rf"{_TASK}/pushNotificationConfigs$"),
        {"POST": "CreateTaskPushNotificationConfig", "GET": "ListTaskPushNotificationConfigs"},
    ),
    (
        re.compile(rf"{_TASK}/pushNotificationConfigs/[^/]+$"),
        {"GET": "GetTaskPushNotificationConfig", "DELETE": "DeleteTaskPushNotificationConfig"},
    ),
    (re.compile(rf"{_TASK}$"), {"GET": "GetTask"}),
    (re.compile(r"(?:^|/)tasks$"), {"GET": "ListTasks"}),
    (re.compile(r"(?:^|/)extendedAgentCard$"), {"GET": "GetExtendedAgentCard"}),
]


# A subscription to a task's events: v1.0's name (both bindings), and 0.3's.
SUBSCRIBE_METHODS = frozenset({"SubscribeToTask", "tasks/resubscribe"})
# The operations that only read (a task, a list, a config, a card): asked again, they change nothing.
READ_METHODS = SUBSCRIBE_METHODS | {
    "GetTask",
    "ListTasks",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "ListTaskPushNotificationConfig",
    "GetExtendedAgentCard",
    "tasks/get",
    "tasks/pushNotificationConfig/get",
    "tasks/pushNotificationConfig/list",
    "agent/getAuthenticatedExtendedCard",
}
# The JSON-RPC methods of A2A v1.0, and of A2A 0.3.
A2A_METHODS = frozenset(
    {
        "SendMessage",
        "SendStreamingMessage",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "SubscribeToTask",
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "ListTaskPushNotificationConfig",
        "DeleteTaskPushNotificationConfig",
        "GetExtendedAgentCard",
        "message/send",
        "message/stream",
        "tasks/get",
        "tasks/cancel",
        "tasks/resubscribe",
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
        "agent/getAuthenticatedExtendedCard",
    }
)

# v1.0's push config calls name their task ``taskId``: their ``id`` is the config's (in
# 0.3, whose methods are named otherwise, ``id`` is the task).
_ID_IS_CONFIG = frozenset(
    {
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "ListTaskPushNotificationConfig",
        "DeleteTaskPushNotificationConfig",
    }
)


def _route(method: str, path: str) -> tuple[str, re.Match[str]] | None:
    """The A2A operation of a REST request, and its path's match, if its route is one."""
    for pattern, operations in _REST_ROUTES:
        if method in operations and (match := pattern.search(path)):
            return operations[method], match
    return None


def rest_operation(method: str, path: str) -> str | None:
    """The A2A operation of a REST request, if its route is one."""
    route = _route(method, path)
    return None if route is None else route[0]


def classify_request(method: str, path: str, body: bytes | str | None) -> RequestInfo:
    """Classify one request. Never raises: what is not A2A gives an empty RequestInfo."""
    return classify_parsed(method, path, json_or_none(body))


def classify_parsed(method: str, path: str, obj: Any) -> RequestInfo:
    """``classify_request`` of a body already parsed (``obj``: None if it is not JSON)."""
    if isinstance(obj, dict) and "jsonrpc" in obj and isinstance(obj.get("method"), str):
        params = obj.get("params") if isinstance(obj.get("params"), dict) else {}
        message = params.get("message") if isinstance(params.get("message"), dict) else {}
        task_id = None if obj["method"] in _ID_IS_CONFIG else str_or_none(params.get("id"))
        task_id = task_id or str_or_none(params.get("taskId")) or str_or_none(message.get("taskId"))
        context_id = str_or_none(message.get("contextId"))
        return RequestInfo(Binding.JSONRPC, obj["method"], task_id, context_id, obj.get("id"))
    route = _route(method, path)
    if route is None:
        return RequestInfo()
    operation, match = route
    message = obj.get("message") if isinstance(obj, dict) else None
    message = message if isinstance(message, dict) else {}
    task_id = match.groupdict().get("task") or str_or_none(message.get("taskId"))
    return RequestInfo(Binding.REST, operation, task_id, str_or_none(message.get("contextId")))
