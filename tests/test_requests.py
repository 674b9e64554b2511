"""Request classification: binding, A2A operation, task and context, on both bindings."""

from __future__ import annotations

import json

import pytest

from tasktape.eventlog.requests import RequestInfo, classify_request


def rpc(method: str, params: dict, rpc_id: object = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}).encode()


MESSAGE = {
    "message": {"messageId": "m1", "role": "ROLE_USER", "taskId": "t1", "contextId": "c1", "parts": []}
}


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        (
            "POST",
            "/message:stream",
            json.dumps(MESSAGE).encode(),
            RequestInfo("rest", "SendStreamingMessage", "t1", "c1"),
        ),
        ("POST", "/v1/acme/message:send", b'{"message": {"parts": []}}', RequestInfo("rest", "SendMessage")),
        ("GET", "/tasks/task.42", None, RequestInfo("rest", "GetTask", "task.42")),
        ("POST", "/tasks/task.42:cancel", None, RequestInfo("rest", "CancelTask", "task.42")),
        ("GET", "/tenant/tasks/task.42:subscribe", None, RequestInfo("rest", "SubscribeToTask", "task.42")),
        ("POST", "/tasks/task.42:subscribe", b"", RequestInfo("rest", "SubscribeToTask", "task.42")),
        ("GET", "/tasks", None, RequestInfo("rest", "ListTasks")),
        (
            "GET",
            "/tasks/t9/pushNotificationConfigs/p1",
            None,
            RequestInfo("rest", "GetTaskPushNotificationConfig", "t9"),
        ),
        ("GET", "/extendedAgentCard", None, RequestInfo("rest", "GetExtendedAgentCard")),
        ("GET", "/.well-known/agent-card.json", None, RequestInfo()),
        ("DELETE", "/message:stream", None, RequestInfo()),
        (
            "POST",
            "/",
            rpc("SendStreamingMessage", MESSAGE, "r-7"),
            RequestInfo("jsonrpc", "SendStreamingMessage", "t1", "c1", "r-7"),
        ),
        ("POST", "/", rpc("GetTask", {"id": "task.9"}), RequestInfo("jsonrpc", "GetTask", "task.9", None, 1)),
        (
            "POST",
            "/rpc",
            rpc("SubscribeToTask", {"id": "task.9"}, 3),
            RequestInfo("jsonrpc", "SubscribeToTask", "task.9", None, 3),
        ),
        (
            "POST",
            "/",
            rpc("tasks/resubscribe", {"id": "t"}),
            RequestInfo("jsonrpc", "tasks/resubscribe", "t", None, 1),
        ),
        ("POST", "/", b'{"jsonrpc": "2.0", "method": 5}', RequestInfo()),
        ("POST", "/", b"\xff\xfe not json", RequestInfo()),
        ("POST", "/", b"[" * 100_000, RequestInfo()),
    ],
)
def test_classify_request(method: str, path: str, body: bytes | None, expected: RequestInfo) -> None:
    assert classify_request(method, path, body) == expected


# A push config call names its task and its config: v1.0 takes them from the SDK's own
# request types (``taskId`` and ``id``), 0.3 named the task ``id``; the REST list of a
# task's configs is its own operation, as v1.0 routes it.
@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        (
            "POST",
            "/",
            rpc("CreateTaskPushNotificationConfig", {"taskId": "t1", "id": "cfg1", "url": "http://hook"}),
            RequestInfo("jsonrpc", "CreateTaskPushNotificationConfig", "t1", None, 1),
        ),
        (
            "POST",
            "/",
            rpc("GetTaskPushNotificationConfig", {"id": "cfg1", "taskId": "t1"}),
            RequestInfo("jsonrpc", "GetTaskPushNotificationConfig", "t1", None, 1),
        ),
        (
            "POST",
            "/",
            rpc("DeleteTaskPushNotificationConfig", {"id": "cfg1", "taskId": "t1"}),
            RequestInfo("jsonrpc", "DeleteTaskPushNotificationConfig", "t1", None, 1),
        ),
        (
            "POST",
            "/",
            rpc("ListTaskPushNotificationConfigs", {"taskId": "t1"}),
            RequestInfo("jsonrpc", "ListTaskPushNotificationConfigs", "t1", None, 1),
        ),
        (
            "POST",
            "/",
            rpc("tasks/pushNotificationConfig/get", {"id": "t1", "pushNotificationConfigId": "cfg1"}),
            RequestInfo("jsonrpc", "tasks/pushNotificationConfig/get", "t1", None, 1),
        ),
        (
            "POST",
            "/",
            rpc("tasks/pushNotificationConfig/set", {"taskId": "t1", "pushNotificationConfig": {"id": "c"}}),
            RequestInfo("jsonrpc", "tasks/pushNotificationConfig/set", "t1", None, 1),
        ),
        (
            "GET",
            "/tasks/t1/pushNotificationConfigs",
            None,
            RequestInfo("rest", "ListTaskPushNotificationConfigs", "t1"),
        ),
        (
            "POST",
            "/tenant/tasks/t1/pushNotificationConfigs",
            b'{"url": "http://hook"}',
            RequestInfo("rest", "CreateTaskPushNotificationConfig", "t1"),
        ),
        (
            "DELETE",
            "/tasks/t1/pushNotificationConfigs/cfg1",
            None,
            RequestInfo("rest", "DeleteTaskPushNotificationConfig", "t1"),
        ),
        ("DELETE", "/tasks/t1/pushNotificationConfigs", None, RequestInfo()),
    ],
)
def test_push_config_calls_name_their_task(
    method: str, path: str, body: bytes | None, expected: RequestInfo
) -> None:
    assert classify_request(method, path, body) == expected
