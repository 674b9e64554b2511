"""The demo agent, driven by the official a2a-sdk client on both bindings: every scenario
reaches its documented end, streams look like the hosted API's, and so through the proxy."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import socket
import struct
import subprocess
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import RecordFactory, Serve
from loopback import running, stop
from sdk_client import cancel_task, get_task, send_message, stream_message, subscribe

from tasktape.agent import create_agent_app
from tasktape.agent.app import STORE
from tasktape.agent.protocol import ERROR_DOMAIN, ERROR_INFO
from tasktape.agent.scenarios import Scenario, choose
from tasktape.agent.tasks import TaskStore
from tasktape.errors import UsageError
from tasktape.eventlog import SSEDecoder, classify

BINDINGS = ["rest", "jsonrpc"]
MESSAGE = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}
UUID7 = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


@pytest.fixture
async def agent(serve: Serve) -> str:
    return await serve(create_agent_app(pace=0.05))


def body(event: dict[str, Any]) -> dict[str, Any]:
    return next(iter(event.values()))


def state(event: dict[str, Any]) -> str | None:
    return body(event).get("status", {}).get("state")


def states(events: list[dict[str, Any]]) -> list[str]:
    return [s for e in events if (s := state(e))]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_completed_run_looks_like_the_hosted_api(agent: str, binding: str) -> None:
    events = await stream_message(agent, "What does J45.909 mean?", binding)
    assert next(iter(events[0])) == "task" and states(events) == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    task = events[0]["task"]
    assert re.fullmatch(rf"task\.{UUID7}", task["id"]) and re.fullmatch(rf"ctx\.{UUID7}", task["contextId"])
    artifacts = [body(e) for e in events if "artifactUpdate" in e]
    thinking = [
        a for a in artifacts if a["artifact"].get("metadata", {}).get("type") == "intermediate-thinking"
    ]
    answer = [a for a in artifacts if a not in thinking]
    for stream in (thinking, answer):
        assert [a.get("append", False) for a in stream[:-1]] == [False] + [True] * (len(stream) - 2)
        assert stream[-1].get("lastChunk") and not stream[-1].get("append", False)
        assert re.fullmatch(rf"art\.{UUID7}", stream[0]["artifact"]["artifactId"])
        deltas = "".join(a["artifact"]["parts"][0]["text"] for a in stream[:-1])
        assert stream[-1]["artifact"]["parts"][0]["text"] == deltas
    closing = answer[-1]["artifact"]["parts"]
    (citation,) = closing[0]["metadata"]["citations"]
    assert closing[1]["metadata"]["dataPartId"] == citation["data_part_id"]
    assert closing[0]["text"][int(citation["offset"]) :].startswith("[1]")  # protobuf: a float
    final = body(events[-1])
    assert "message" not in final["status"]  # v1.0: a COMPLETED status carries no answer
    usage = final["metadata"]["$usage"]
    assert set(usage) == {
        "model",
        "inputTokens",
        "outputTokens",
        "cachedInputTokens",
        "cacheCreationInputTokens",
        "totalTokens",
        "credits",
    }
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    fetched = await get_task(agent, task["id"], binding)
    assert fetched["status"]["state"] == "TASK_STATE_COMPLETED" and len(fetched["artifacts"]) == 2


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize(
    ("text", "rest_state", "rpc_state"),
    [
        ("input please", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_INPUT_REQUIRED"),
        ("auth needed", "TASK_STATE_FAILED", "TASK_STATE_AUTH_REQUIRED"),
        ("this will fail", "TASK_STATE_FAILED", "TASK_STATE_FAILED"),
        ("reject me", "TASK_STATE_FAILED", "TASK_STATE_REJECTED"),
        ("a long answer", "TASK_STATE_COMPLETED", "TASK_STATE_COMPLETED"),
    ],
)
async def test_every_scenario_reaches_its_documented_end(
    agent: str, binding: str, text: str, rest_state: str, rpc_state: str
) -> None:
    events = await stream_message(agent, text, binding)
    expected = rest_state if binding == "rest" else rpc_state
    assert states(events)[-1] == expected
    if expected != "TASK_STATE_COMPLETED":
        message = body(events[-1])["status"]["message"]["parts"][0]["text"]
        assert message and (binding != "rest" or rest_state == rpc_state or message.startswith("Failed: "))
    if "long" in text:
        assert sum("artifactUpdate" in e for e in events) > 400
    if rpc_state == "TASK_STATE_REJECTED":  # rejected before any work
        assert states(events) == ["TASK_STATE_SUBMITTED", expected]
    sent = await send_message(agent, text, binding)
    assert sent["task"]["status"]["state"] == expected


@pytest.mark.parametrize("binding", BINDINGS)
async def test_input_required_resumes_with_more_input(agent: str, binding: str) -> None:
    first = await stream_message(agent, "I need input", binding)
    task_id = first[0]["task"]["id"]
    assert states(first)[-1] == "TASK_STATE_INPUT_REQUIRED"
    second = await stream_message(agent, "record 42", binding, task_id=task_id)
    assert states(second) == ["TASK_STATE_INPUT_REQUIRED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
    assert {body(e).get("taskId", body(e).get("id")) for e in second} == {task_id}


@pytest.mark.parametrize("binding", BINDINGS)
async def test_cancel_mid_stream_and_409_after(agent: str, binding: str) -> None:
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def first(event: dict[str, Any]) -> None:
        if not seen.done() and "artifactUpdate" in event:
            seen.set_result(body(event)["taskId"])

    streaming = asyncio.create_task(stream_message(agent, "cancel me", binding, on_event=first))
    task_id = await asyncio.wait_for(seen, 10)
    assert (await cancel_task(agent, task_id, binding))["status"]["state"] == "TASK_STATE_CANCELED"
    events = await asyncio.wait_for(streaming, 10)
    assert states(events)[-1] == "TASK_STATE_CANCELED"
    with pytest.raises(Exception, match=r"(?i)cancel"):
        await cancel_task(agent, task_id, binding)
    async with aiohttp.ClientSession() as session, session.post(f"{agent}/tasks/{task_id}:cancel") as r:
        assert r.status == 409 and "terminal" in (await r.json())["error"]["message"]


async def test_the_slow_answer_waits_for_its_cancel_at_any_pace() -> None:
    # At --pace 0 every other answer is instant; this one must still be there to cancel.
    server = TestServer(create_agent_app(pace=0), host="127.0.0.1")
    await server.start_server()
    agent = str(server.make_url("")).rstrip("/")
    try:
        for _ in range(5):
            seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            def first(event: dict[str, Any], seen: asyncio.Future[str] = seen) -> None:
                if not seen.done() and "artifactUpdate" in event:
                    seen.set_result(body(event)["taskId"])

            streaming = asyncio.create_task(stream_message(agent, "cancel me", "rest", on_event=first))
            task_id = await asyncio.wait_for(seen, 10)
            assert (await cancel_task(agent, task_id, "rest"))["status"]["state"] == "TASK_STATE_CANCELED"
            assert states(await asyncio.wait_for(streaming, 10))[-1] == "TASK_STATE_CANCELED"
    finally:
        await server.close()


@pytest.mark.parametrize("binding", BINDINGS)
async def test_subscribe_running_and_finished(agent: str, binding: str) -> None:
    seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def first(event: dict[str, Any]) -> None:
        if not seen.done():
            seen.set_result(body(event)["id"])

    original = asyncio.create_task(stream_message(agent, "a long one", binding, on_event=first))
    task_id = await asyncio.wait_for(seen, 10)
    await asyncio.sleep(0.1)
    live = await subscribe(agent, task_id, binding)
    full = await original
    assert "task" in live[0] and states(live)[-1] == "TASK_STATE_COMPLETED"
    # After the snapshot, the subscriber sees exactly the tail of the original stream.
    assert live[1:] == full[len(full) - len(live) + 1 :]
    finished = await subscribe(agent, task_id, binding)
    assert len(finished) == 1 and finished[0]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_drop_cuts_the_stream_and_the_task_still_completes(agent: str) -> None:
    received = b""
    async with aiohttp.ClientSession() as session:
        message = {"message": {"role": "ROLE_USER", "parts": [{"text": "drop the line"}]}}
        async with session.post(f"{agent}/message:stream", json=message) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in r.content.iter_any():
                    received += data
    dec = SSEDecoder()
    events = dec.feed(received) + dec.close()
    assert len([e for e in events if e.complete]) == 8 and all(e.id for e in events if e.complete)
    task_id = classify(events[0].data).task_id
    for _ in range(100):
        task = await get_task(agent, task_id or "", "rest")
        if task["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        await asyncio.sleep(0.05)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_errors(agent: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{agent}/tasks/task.nope") as r:
            assert r.status == 404
        async with session.post(f"{agent}/message:send", data=b"{") as r:
            assert r.status == 400
        rpc = {"jsonrpc": "2.0", "id": "x", "method": "Nope", "params": {}}
        async with session.post(f"{agent}/jsonrpc", json=rpc) as r:
            assert (await r.json())["error"]["code"] == -32601
        rpc["method"] = "GetTask"
        rpc["params"] = {"id": "task.nope"}
        async with session.post(f"{agent}/jsonrpc", json=rpc) as r:
            reply = await r.json()
            assert reply["id"] == "x" and reply["error"]["code"] == -32001


# A message with a field of the wrong type, and the error naming it: what the official
# SDK's server refuses when it reads the message as protobuf JSON.
MALFORMED: list[tuple[dict[str, Any], str]] = [
    ({"parts": [{"text": "hi"}, {"text": 5}]}, "message.parts[1].text: a string"),
    ({"parts": [{"text": None}]}, "message.parts[0]: a part holds one of text, raw, url, data"),
    ({"parts": [{"raw": "a"}]}, "message.parts[0].raw: base64-encoded bytes"),
    ({"parts": [{"raw": 5}]}, "message.parts[0].raw: base64-encoded bytes"),
    ({"parts": [{"url": ["https://example.com/a.pdf"]}]}, "message.parts[0].url: a string"),
    ({"parts": [{"data": {}, "mediaType": 5}]}, "message.parts[0].mediaType: a string"),
    ({"parts": [{"url": "https://example.com/a", "filename": 5}]}, "message.parts[0].filename: a string"),
    ({"parts": [{"text": "hi", "metadata": "cited"}]}, "message.parts[0].metadata: an object"),
    ({"metadata": [1]}, "message.metadata: an object"),
    ({"extensions": [1]}, "message.extensions: a list of strings"),
]


@pytest.mark.parametrize(("fields", "error"), MALFORMED, ids=[error for _, error in MALFORMED])
async def test_a_malformed_message_is_invalid_params_and_starts_no_task(
    agent: str, fields: dict[str, Any], error: str
) -> None:
    """Every send method answers it 400 / -32602, as other malformed fields, never 500; and
    no task is left SUBMITTED behind it."""
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}], **fields}
    headers = {"A2A-Version": "1.0"}
    async with aiohttp.ClientSession(headers=headers) as session:
        for path in ("/message:send", "/message:stream"):
            async with session.post(agent + path, json={"message": message}) as r:
                assert r.status == 400, await r.text()
                refused = (await r.json())["error"]
                assert refused["message"] == error and refused["details"][0]["reason"] == "INVALID_PARAMS"
        for method in ("SendMessage", "SendStreamingMessage"):
            rpc = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": message}}
            async with session.post(f"{agent}/jsonrpc", json=rpc) as r:
                assert r.status == 200 and await r.json() == {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "error": {"code": -32602, "message": error},
                }
        async with session.get(f"{agent}/tasks") as r:
            assert (await r.json())["tasks"] == []


@pytest.mark.parametrize(
    "part",
    [
        {"raw": "aGVsbG8="},
        {"raw": "aGVsbG8", "mediaType": "text/plain", "filename": "hello.txt"},  # padding optional
        {"url": "https://example.com/a.pdf", "mediaType": "application/pdf"},
        {"data": None},  # a JSON null is data too
        {"text": "hi", "url": None, "metadata": None},  # protobuf JSON: null is unset
    ],
)
async def test_file_and_data_parts_are_answered(agent: str, part: dict[str, Any]) -> None:
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [part]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{agent}/message:send", json={"message": message}) as r,
    ):
        assert r.status == 200 and (await r.json())["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.mark.parametrize("pace", [math.nan, math.inf, -1.0])
def test_a_pace_that_never_ends_a_delay_is_refused(pace: float) -> None:
    """A NaN or infinite pace would make every task sleep forever."""
    with pytest.raises(UsageError, match=r"the pace is 0 \(as fast as possible\) or a finite number"):
        create_agent_app(pace=pace)
    done = subprocess.run(
        [sys.executable, "-m", "tasktape", "agent", "--listen", "127.0.0.1:0", "--pace", str(pace)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    refused = "the pace is 0 (as fast as possible) or a finite number above it"
    assert done.returncode == 2 and f"Invalid value for '--pace': {refused}, not {pace}" in done.stderr


async def test_listening_beyond_loopback_warns_of_what_is_exposed() -> None:
    """The agent records nothing, but shows every task it was sent to anyone who asks."""
    async with running("agent", "--listen", "0.0.0.0:0", "--pace", "0") as run:
        assert await stop(run) == 0
    stderr = run.printed[-1]
    assert (
        "WARNING: tasktape agent is listening on 0.0.0.0, beyond this machine's loopback: anyone who "
        "can reach it can use it, and read every task sent to it, messages included (GET /tasks lists "
        "them all); it records nothing."
    ) in stderr
    assert "recorded" not in stderr


def test_choose() -> None:
    assert choose("What is J45.909?") is Scenario.COMPLETED
    assert choose("Please CANCEL this") is Scenario.CANCELED
    assert choose("it failed") is Scenario.FAILED
    assert choose("needs input, then drop") is Scenario.INPUT_REQUIRED  # the first in table order


@pytest.mark.parametrize("binding", BINDINGS)
async def test_through_the_recording_proxy(agent: str, record: RecordFactory, binding: str) -> None:
    rec = await record(agent)
    events = await stream_message(rec.url, "What does J45.909 mean?", binding)
    rejected = await stream_message(rec.url, "reject me", binding)
    with await rec.log() as log:
        summaries = {r["task_id"]: r for r in log.db.query("SELECT * FROM task_summary")}
    done = summaries[events[0]["task"]["id"]]
    assert done["final_state"] == "TASK_STATE_COMPLETED" and done["events"] == len(events)
    assert done["answer"].startswith("About What does J45.909 mean: ") and done["thinking"].startswith(
        "Looking up"
    )
    assert done["credits"] > 0 and done["model"] == "tasktape-demo-1"
    assert summaries[rejected[0]["task"]["id"]]["final_state"] == states(rejected)[-1]


async def send(session: aiohttp.ClientSession, url: str, text: str, context_id: str) -> dict[str, Any]:
    message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": text}], "contextId": context_id}
    async with session.post(f"{url}/message:send", json={"message": message}) as r:
        task: dict[str, Any] = (await r.json())["task"]
        return task


async def test_closing_while_tasks_end_and_are_forgotten_stops_every_run() -> None:
    """A task that ends while close() stops another is forgotten: close() walked the tasks
    as they changed ("dictionary changed size during iteration" at Ctrl-C)."""
    store = TaskStore(1.0, kept_ended=0)

    async def slow(run: Any, text: str) -> None:
        await asyncio.sleep(10)

    async def quick(run: Any, text: str) -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        run.set_status("TASK_STATE_COMPLETED")

    for work in (slow, quick):
        store.new(None).start({"role": "ROLE_USER", "parts": [{"text": "x"}]}, work)
    await asyncio.sleep(0)
    await store.close()
    assert len(store.tasks) == 1  # the slow one, stopped; the quick one ended and was forgotten


async def test_ended_tasks_past_the_bound_are_forgotten_the_earliest_first(serve: Serve) -> None:
    """Kept for good, they grew the agent without bound (47 kB a task in a soak)."""
    app = create_agent_app(pace=0, kept_ended=2)
    agent = await serve(app)
    async with aiohttp.ClientSession(headers={"A2A-Version": "1.0"}) as session:
        waiting = await send(session, agent, "I need input", "ctx.a")  # interrupted: kept
        ended = [await send(session, agent, "What is J45?", c) for c in ("ctx.a", "ctx.b", "ctx.a", "ctx.c")]
        assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        got = {}
        for task in [waiting, *ended]:
            async with session.get(f"{agent}/tasks/{task['id']}") as r:
                got[task["id"]] = (r.status, (await r.json()).get("error", {}).get("details"))
        not_found = (404, [{"@type": ERROR_INFO, "reason": "TASK_NOT_FOUND", "domain": ERROR_DOMAIN}])
        assert [got[t["id"]] for t in ended[:2]] == [not_found] * 2
        assert [got[t["id"]][0] for t in [waiting, *ended[2:]]] == [200] * 3
        async with session.get(f"{agent}/tasks") as r:
            assert (await r.json())["totalSize"] == 3
    contexts = app[STORE].contexts
    assert contexts == {"ctx.a": [waiting["id"], ended[2]["id"]], "ctx.c": [ended[3]["id"]]}  # ctx.b gone


async def reset_after_asking(url: str, body: dict[str, Any]) -> None:
    """POST a message:stream, then reset the connection (RST) before reading anything."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    _, writer = await asyncio.open_connection(host, int(port))
    head = f"POST /message:stream HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_a_client_that_leaves_its_stream_ends_it_quietly(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """Its stream's next write found the connection gone, which logged a traceback
    ("Error handling request") for every such client; the task runs on, as without it."""
    handled = asyncio.Event()

    @web.middleware
    async def watched(request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        finally:
            handled.set()

    app = create_agent_app(pace=0.05)
    app.middlewares.append(watched)
    agent = await serve(app)
    await reset_after_asking(agent, {"message": MESSAGE})
    await asyncio.wait_for(handled.wait(), 10)
    (run,) = app[STORE].tasks.values()
    await asyncio.wait_for(run.settled(), 10)
    assert run.state == "TASK_STATE_COMPLETED"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def answer_on(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    """Read one HTTP answer (status, JSON body) off a connection."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    length = int(re.search(r"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
    return int(head.split()[1]), json.loads(await reader.readexactly(length))


def http_request(method: str, path: str, body: dict[str, Any] | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nA2A-Version: 1.0\r\n"
    head += "Content-Type: application/json\r\n"
    return f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data


async def at_once(url: str, task_id: str, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """POST each body to /message:send on a connection of its own, all written before any
    is answered, so that the agent reads them in one turn of its loop. (Each connection is
    first answered a GetTask: the agent holds it open, ready, when they are written.)"""
    host, port = url.removeprefix("http://").split(":")
    connections = [await asyncio.open_connection(host, int(port)) for _ in bodies]
    try:
        for reader, writer in connections:
            writer.write(http_request("GET", f"/tasks/{task_id}"))
            assert (await answer_on(reader))[0] == 200
        for (_, writer), body in zip(connections, bodies, strict=True):
            writer.write(http_request("POST", "/message:send", body))
        return [await answer_on(reader) for reader, _ in connections]
    finally:
        for _, writer in connections:
            writer.close()
            await writer.wait_closed()


def resume(task_id: str, text: str, **configuration: Any) -> dict[str, Any]:
    message = {"messageId": text, "role": "ROLE_USER", "taskId": task_id, "parts": [{"text": text}]}
    return {"message": message, "configuration": configuration}


def refused_as_running(answer: tuple[int, dict[str, Any]], task_id: str) -> bool:
    """The answer to input for a task that runs already: -32004 (400), as after its WORKING."""
    status, body = answer
    error = body.get("error", {})
    return (
        status == 400
        and error.get("details", [{}])[0].get("reason") == "UNSUPPORTED_OPERATION"
        and error.get("message")
        == f"task {task_id} is TASK_STATE_WORKING: only an interrupted task takes more input"
    )


@pytest.mark.parametrize("asking", ["input please", "auth needed"])
async def test_two_resumes_at_once_start_one_run(serve: Serve, asking: str) -> None:
    """Both started a run (the task stopped being interrupted only at the run's first step):
    both answered COMPLETED, the task's history held both, its artifacts doubled."""
    agent = await serve(create_agent_app(pace=0))
    task_id = (await send_message(agent, asking))["task"]["id"]
    answers = await at_once(agent, task_id, [resume(task_id, "Record 1"), resume(task_id, "Record 2")])
    done = [body["task"] for status, body in answers if status == 200]
    assert len(done) == 1 and done[0]["status"]["state"] == "TASK_STATE_COMPLETED", answers
    assert sum(refused_as_running(answer, task_id) for answer in answers) == 1, answers
    task = await get_task(agent, task_id)
    users = [m["parts"][0]["text"] for m in task["history"] if m["role"] == "ROLE_USER"]
    assert users == [asking, done[0]["history"][-1]["parts"][0]["text"]]
    assert [a["name"] for a in task["artifacts"]] == ["thinking", "thinking", "answer"]


async def test_a_task_resumed_twice_at_once_and_canceled_stays_canceled(serve: Serve) -> None:
    """With returnImmediately both resumes ran; a cancel stopped one, answered CANCELED, and
    the other completed the task after it: a terminal state changed."""
    agent = await serve(create_agent_app(pace=0.05))
    task_id = (await send_message(agent, "input please"))["task"]["id"]
    bodies = [resume(task_id, f"Record {n}", returnImmediately=True) for n in (1, 2)]
    answers = await at_once(agent, task_id, bodies)
    assert sorted(status for status, _ in answers) == [200, 400], answers
    assert sum(refused_as_running(answer, task_id) for answer in answers) == 1, answers
    assert (await cancel_task(agent, task_id))["status"]["state"] == "TASK_STATE_CANCELED"
    task = await get_task(agent, task_id)
    assert task["status"]["state"] == "TASK_STATE_CANCELED"
    assert sum(m["role"] == "ROLE_USER" for m in task["history"]) == 2  # the question, one resume


async def test_a_host_name_not_allowed_is_misdirected() -> None:
    """On loopback it answered any Host (GET /tasks under a page's own name listed every
    task: DNS rebinding), unlike record, replay and inspect, which answer 421."""
    args = ("agent", "--listen", "127.0.0.1:0", "--pace", "0", "--allow-host", "team.example")
    async with running(*args) as run:
        task_id = (await send_message(run.url, "What is J45?"))["task"]["id"]  # the official client
        port = run.url.rsplit(":", 1)[1]
        answers = {}
        async with aiohttp.ClientSession() as session:
            for name in ("rebound.example", "team.example", "localhost", "127.0.0.1"):
                headers = {"Host": f"{name}:{port}", "A2A-Version": "1.0"}
                async with session.get(f"{run.url}/tasks", headers=headers) as r:
                    answers[name] = (r.status, await r.text())
        assert await stop(run) == 0
    status, refused = answers.pop("rebound.example")
    assert status == 421 and "--allow-host rebound.example" in refused and task_id not in refused
    assert all(status == 200 and task_id in text for status, text in answers.values()), answers
