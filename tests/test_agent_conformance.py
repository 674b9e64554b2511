"""The demo agent holds to the A2A v1.0 specification where a client can tell: SendMessage's
returnImmediately, ListTasks, historyLength, the A2A-Version service parameter, required
message fields, the optional capabilities it does not offer, and the errors of both bindings
(JSON-RPC codes; REST statuses with a google.rpc ErrorInfo naming the A2A error)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from a2a.helpers import new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from conftest import Serve
from sdk_client import Binding, sdk_client, to_dict

from tasktape.agent import create_agent_app

BINDINGS: list[Binding] = ["rest", "jsonrpc"]
V1 = {"A2A-Version": "1.0"}
# The spec's mapping (section 5.4): JSON-RPC code, HTTP status.
ERRORS = {
    "INVALID_PARAMS": (-32602, 400),
    "UNSUPPORTED_OPERATION": (-32004, 400),
    "PUSH_NOTIFICATION_NOT_SUPPORTED": (-32003, 400),
    "VERSION_NOT_SUPPORTED": (-32009, 400),
}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
Answer = tuple[int, dict[str, Any]]


@pytest.fixture
async def agent(serve: Serve) -> str:
    return await serve(create_agent_app(pace=0.05))


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}], **fields}


async def request(method: str, url: str, *, headers: dict[str, str] | None = None, **kw: Any) -> Answer:
    async with aiohttp.ClientSession() as session, session.request(method, url, headers=headers, **kw) as r:
        return r.status, await r.json(content_type=None)


def query(params: dict[str, Any]) -> dict[str, str]:
    """Request fields as query parameters (spec 11.5): booleans lowercase, numbers decimal."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}


async def call(
    agent: str, binding: Binding, method: str, params: dict[str, Any], headers: dict[str, str] | None = V1
) -> Answer:
    """One operation on either binding: the HTTP status, and the REST body or JSON-RPC response."""
    if binding == "jsonrpc":
        rpc = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return await request("POST", f"{agent}/jsonrpc", json=rpc, headers=headers)
    rest = dict(params)
    task_id = rest.pop("id", None)
    return await {
        "SendMessage": lambda: request("POST", f"{agent}/message:send", json=rest, headers=headers),
        "GetTask": lambda: request("GET", f"{agent}/tasks/{task_id}", params=query(rest), headers=headers),
        "ListTasks": lambda: request("GET", f"{agent}/tasks", params=query(rest), headers=headers),
        "CancelTask": lambda: request("POST", f"{agent}/tasks/{task_id}:cancel", headers=headers),
    }[method]()


def result(binding: Binding, answer: Answer) -> dict[str, Any]:
    status, body = answer
    assert status == 200 and "error" not in body, answer
    return body["result"] if binding == "jsonrpc" else body


def assert_error(binding: Binding, answer: Answer, reason: str) -> None:
    status, body = answer
    code, http = ERRORS[reason]
    if binding == "jsonrpc":
        assert status == 200 and body["error"]["code"] == code, answer
    else:
        error = body["error"]
        assert status == http == error["code"], answer
        (info,) = error["details"]
        assert info["@type"] == ERROR_INFO and info["reason"] == reason, answer


async def send(agent: str, binding: Binding, text: str, **fields: Any) -> dict[str, Any]:
    """SendMessage, waiting (the default) for the task to finish or pause."""
    answer = await call(agent, binding, "SendMessage", {"message": message(text, **fields)})
    return result(binding, answer)["task"]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_return_immediately_answers_at_once_and_the_task_runs_on(agent: str, binding: Binding) -> None:
    immediately = SendMessageConfiguration(return_immediately=True)
    async with sdk_client(agent, binding, streaming=False) as client:

        async def start(text: str) -> dict[str, Any]:
            request = SendMessageRequest(
                message=new_text_message(text, role=Role.ROLE_USER), configuration=immediately
            )
            (answer,) = [to_dict(r) async for r in client.send_message(request)]
            return answer["task"]

        # The slow answer would keep a waiting SendMessage for seconds: this one answers at once.
        slow = await asyncio.wait_for(start("cancel me"), 2)
        assert slow["status"]["state"] in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING")
        # A task nobody streams can be canceled while it runs ...
        canceled = to_dict(await client.cancel_task(CancelTaskRequest(id=slow["id"])))
        assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
        # ... or polled until it completes.
        task = await start("What does J45.909 mean?")
        assert task["status"]["state"] != "TASK_STATE_COMPLETED"
        for _ in range(200):
            task = to_dict(await client.get_task(GetTaskRequest(id=task["id"])))
            if task["status"]["state"] == "TASK_STATE_COMPLETED":
                break
            await asyncio.sleep(0.02)
        assert task["status"]["state"] == "TASK_STATE_COMPLETED" and len(task["artifacts"]) == 2


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_message_to_a_terminal_task_is_an_unsupported_operation(agent: str, binding: Binding) -> None:
    done = await send(agent, binding, "What does J45.909 mean?")
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    more = {"message": message("and one more thing", taskId=done["id"])}
    assert_error(binding, await call(agent, binding, "SendMessage", more), "UNSUPPORTED_OPERATION")


@pytest.mark.parametrize("binding", BINDINGS)
async def test_list_tasks_filters_and_pages_newest_first(agent: str, binding: Binding) -> None:
    ours = [await send(agent, binding, f"question {n}", contextId="ctx.ours") for n in range(3)]
    waiting = await send(agent, binding, "I need input")
    assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"

    async def listed(**params: Any) -> dict[str, Any]:
        return result(binding, await call(agent, binding, "ListTasks", params))

    everything = await listed()
    assert (everything["totalSize"], everything["pageSize"], everything["nextPageToken"]) == (4, 50, "")
    assert [t["id"] for t in everything["tasks"]] == [waiting["id"]] + [t["id"] for t in reversed(ours)]
    stamps = [t["status"]["timestamp"] for t in everything["tasks"]]
    assert stamps == sorted(stamps, reverse=True)  # by last update, newest first
    assert all("artifacts" not in t and t["history"] for t in everything["tasks"])  # artifacts: on request

    assert {t["id"] for t in (await listed(contextId="ctx.ours"))["tasks"]} == {t["id"] for t in ours}
    only = await listed(status="TASK_STATE_INPUT_REQUIRED")
    assert [t["id"] for t in only["tasks"]] == [waiting["id"]] and only["totalSize"] == 1

    first = await listed(pageSize=3)
    assert len(first["tasks"]) == 3 and first["nextPageToken"] and first["totalSize"] == 4
    rest = await listed(pageSize=3, pageToken=first["nextPageToken"])
    assert rest["nextPageToken"] == "" and [t["id"] for t in first["tasks"] + rest["tasks"]] == [
        t["id"] for t in everything["tasks"]
    ]

    slim = await listed(contextId="ctx.ours", historyLength=0, includeArtifacts=True)
    assert all("history" not in t and len(t["artifacts"]) == 2 for t in slim["tasks"])

    for bad in (
        {"pageSize": 0},
        {"pageSize": 101},
        {"historyLength": -1},
        {"status": "TASK_STATE_RUNNING"},
        {"pageToken": "not a token"},
    ):
        assert_error(binding, await call(agent, binding, "ListTasks", bad), "INVALID_PARAMS")

    # The official client reads the answer as a ListTasksResponse.
    async with sdk_client(agent, binding, streaming=False) as client:
        answer = await client.list_tasks(
            ListTasksRequest(context_id="ctx.ours", page_size=2, status=TaskState.TASK_STATE_COMPLETED)
        )
    assert (len(answer.tasks), answer.total_size, answer.page_size) == (2, 3, 2) and answer.next_page_token


@pytest.mark.parametrize("binding", BINDINGS)
async def test_history_length_returns_the_most_recent_messages(agent: str, binding: Binding) -> None:
    asked = await send(agent, binding, "I need input")
    resume = {"message": message("record 42", taskId=asked["id"]), "configuration": {"historyLength": 1}}
    resumed = result(binding, await call(agent, binding, "SendMessage", resume))["task"]
    assert resumed["status"]["state"] == "TASK_STATE_COMPLETED"
    assert [m["parts"][0]["text"] for m in resumed["history"]] == ["record 42"]

    async def history(**params: Any) -> list[str] | None:
        task = result(binding, await call(agent, binding, "GetTask", {"id": asked["id"], **params}))
        return [m["parts"][0]["text"] for m in task["history"]] if "history" in task else None

    everything = await history()
    assert everything is not None and len(everything) == 3 and everything[-1] == "record 42"
    assert await history(historyLength=0) is None  # no history: the field is left out
    assert await history(historyLength=2) == everything[-2:]
    assert await history(historyLength=10) == everything
    negative = {"id": asked["id"], "historyLength": -1}
    assert_error(binding, await call(agent, binding, "GetTask", negative), "INVALID_PARAMS")


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a2a_version_is_checked(agent: str, binding: Binding) -> None:
    task = await send(agent, binding, "What does J45.909 mean?")
    for version in ("9.9", "0.3", "2.0"):
        answer = await call(agent, binding, "GetTask", {"id": task["id"]}, {"A2A-Version": version})
        assert_error(binding, answer, "VERSION_NOT_SUPPORTED")
    assert_error(
        binding,
        await call(agent, binding, "SendMessage", {"message": message("hi")}, {"A2A-Version": "9.9"}),
        "VERSION_NOT_SUPPORTED",
    )
    # 1.0, a later 1.x, and no version at all (as many clients send) are served.
    for headers in ({"A2A-Version": "1.0"}, {"A2A-Version": "1.1"}, {}):
        served = await call(agent, binding, "GetTask", {"id": task["id"]}, headers)
        assert result(binding, served)["id"] == task["id"]


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    "bad",
    [
        {"messageId": "m1", "role": "ROLE_USER", "parts": []},
        {"messageId": "m1", "role": "ROLE_USER"},
        {"messageId": "m1", "parts": [{"text": "no role"}]},
        {"messageId": "m1", "role": "ROLE_UNSPECIFIED", "parts": [{"text": "hi"}]},
        {"messageId": "", "role": "ROLE_USER", "parts": [{"text": "empty id"}]},
        {"messageId": "m1", "role": "ROLE_USER", "parts": [{}]},
    ],
    ids=["empty parts", "no parts", "no role", "unspecified role", "empty messageId", "empty part"],
)
async def test_a_message_without_its_required_fields_is_invalid(
    agent: str, binding: Binding, bad: dict[str, Any]
) -> None:
    assert_error(binding, await call(agent, binding, "SendMessage", {"message": bad}), "INVALID_PARAMS")
    assert result(binding, await call(agent, binding, "ListTasks", {}))["totalSize"] == 0  # no task made


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/tasks/task.x/pushNotificationConfigs"),
        ("GET", "/tasks/task.x/pushNotificationConfigs"),
        ("GET", "/tasks/task.x/pushNotificationConfigs/cfg.1"),
        ("DELETE", "/tasks/task.x/pushNotificationConfigs/cfg.1"),
    ],
)
async def test_rest_push_notification_configs_are_not_supported(agent: str, method: str, path: str) -> None:
    body = {"url": "https://example.com/hook"} if method == "POST" else None
    answer = await request(method, f"{agent}{path}", json=body, headers=V1)
    assert_error("rest", answer, "PUSH_NOTIFICATION_NOT_SUPPORTED")


@pytest.mark.parametrize(
    "method",
    [
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
    ],
)
async def test_jsonrpc_push_notification_configs_are_not_supported(agent: str, method: str) -> None:
    answer = await call(agent, "jsonrpc", method, {"taskId": "task.x", "id": "cfg.1"})
    assert_error("jsonrpc", answer, "PUSH_NOTIFICATION_NOT_SUPPORTED")


async def test_the_extended_agent_card_is_an_unsupported_operation(agent: str) -> None:
    card = (await request("GET", f"{agent}/.well-known/agent-card.json"))[1]
    assert not card["capabilities"].get("extendedAgentCard")
    answer = await request("GET", f"{agent}/extendedAgentCard", headers=V1)
    assert_error("rest", answer, "UNSUPPORTED_OPERATION")
    answer = await call(agent, "jsonrpc", "GetExtendedAgentCard", {})
    assert_error("jsonrpc", answer, "UNSUPPORTED_OPERATION")


@pytest.mark.parametrize("rpc_id", [{"an": "object"}, [1], True])
async def test_a_jsonrpc_id_that_is_no_string_or_number_is_an_invalid_request(
    agent: str, rpc_id: Any
) -> None:
    rpc = {"jsonrpc": "2.0", "id": rpc_id, "method": "GetTask", "params": {"id": "task.x"}}
    status, answer = await request("POST", f"{agent}/jsonrpc", json=rpc, headers=V1)
    assert status == 200 and answer["error"]["code"] == -32600 and answer["id"] is None


@pytest.mark.parametrize("rpc_id", ["x", 7, None])
async def test_string_number_and_null_ids_are_answered_with_the_same_id(agent: str, rpc_id: Any) -> None:
    rpc = {"jsonrpc": "2.0", "id": rpc_id, "method": "GetTask", "params": {"id": "task.x"}}
    status, answer = await request("POST", f"{agent}/jsonrpc", json=rpc, headers=V1)
    assert status == 200 and answer["error"]["code"] == -32001 and answer["id"] == rpc_id


def strict_json(text: str) -> Any:
    """JSON as a client other than Python's reads it: NaN and Infinity are none."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in the answer: {text}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/jsonrpc", '{"jsonrpc": "2.0", "id": NaN, "method": "GetTask", "params": {"id": "task.x"}}'),
        ("/jsonrpc", '{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": MESSAGE}}'),
        ("/message:send", '{"message": MESSAGE}'),
    ],
)
async def test_nan_and_infinity_are_no_json(agent: str, path: str, body: str) -> None:
    # Python's reader takes them; echoed into the answer (the id, the message's metadata
    # in the task's history) they would make it no JSON for the client.
    text = json.dumps(message("hi", metadata={"x": 1.5})).replace("1.5", "Infinity")
    headers = {**V1, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(agent + path, data=body.replace("MESSAGE", text), headers=headers) as r,
    ):
        status, answer = r.status, strict_json(await r.text())
    if path == "/jsonrpc":
        assert status == 200 and answer["error"]["code"] == -32700 and answer["id"] is None
    else:
        assert status == 400 and answer["error"]["message"] == "the body is not JSON"


def parse_error(path: str, answer: Answer) -> str:
    """The parse error's message, once checked it is one, as the binding answers it."""
    status, body = answer
    if path == "/jsonrpc":
        assert status == 200 and body["error"]["code"] == -32700 and body["id"] is None, answer
        return str(body["error"]["message"])
    assert status == 400 and body["error"]["details"][0]["reason"] == "PARSE_ERROR", answer
    return str(body["error"]["message"])


async def strictly(method: str, url: str, text: str | None = None) -> Answer:
    """``text`` sent as it is; the answer read as a client other than Python's reads JSON."""
    headers = {**V1, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, data=text, headers=headers) as r,
    ):
        return r.status, strict_json(await r.text())


@pytest.mark.parametrize(
    ("path", "body", "number"),
    [
        ("/jsonrpc", '{"jsonrpc": "2.0", "id": 1e400, "method": "GetTask", "params": {"id": "t"}}', "1e400"),
        ("/jsonrpc", '{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": MESSAGE}', "-1e999"),
        ("/message:send", "MESSAGE", "-1e999"),
        ("/message:stream", "MESSAGE", "-1e999"),
    ],
)
async def test_a_number_beyond_a_double_is_a_parse_error(
    agent: str, path: str, body: str, number: str
) -> None:
    """Python reads 1e400 as infinity: the id was answered as ``Infinity``, and -1e999 in a
    message's metadata made every ListTasks after it answer ``-Infinity``: no JSON."""
    asking = json.dumps({"message": message("hi", metadata={"n": 1.5})}).replace("1.5", "-1e999")
    said = parse_error(path, await strictly("POST", agent + path, body.replace("MESSAGE", asking)))
    assert said.endswith(f"the body holds a number beyond a double's range: {number}")
    status, listed = await strictly("GET", f"{agent}/tasks")
    assert status == 200 and listed["tasks"] == []


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("path", ["/jsonrpc", "/message:send", "/message:stream"])
@pytest.mark.parametrize("depth", [101, 1_000, 100_000])
async def test_a_body_nested_too_deep_is_a_parse_error(agent: str, path: str, depth: int) -> None:
    """From about 1,000 levels Python's reader fails (RecursionError): the agent answered 500."""
    said = parse_error(path, await strictly("POST", agent + path, nested(depth)))
    assert said.endswith("the body nests arrays and objects deeper than 100 levels")


@pytest.mark.parametrize("binding", BINDINGS)
async def test_data_nested_deep_is_refused_and_the_tasks_stay_listed(agent: str, binding: Binding) -> None:
    """A part's data 400 levels deep was taken: then every REST view of its task (a copy,
    made recursively) failed, GET /tasks with it, 500 for every client after."""

    def asking(levels: int) -> dict[str, Any]:
        # Levels above the part's data: the body (and JSON-RPC's params), message, parts, the part.
        above = 5 if binding == "jsonrpc" else 4
        data = json.loads(nested(levels - above))
        return {"message": message("auth needed", parts=[{"text": "auth needed"}, {"data": data}])}

    taken = result(binding, await call(agent, binding, "SendMessage", asking(100)))
    parse_error(
        "/jsonrpc" if binding == "jsonrpc" else "/message:send",
        await call(agent, binding, "SendMessage", asking(400)),
    )
    listed = result(binding, await call(agent, binding, "ListTasks", {}))
    assert [task["id"] for task in listed["tasks"]] == [taken["task"]["id"]]
