"""The demo agent, driven by the official a2a-sdk client on both bindings: every scenario
reaches its documented end, streams look like the hosted API's, and so through the proxy."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from conftest import RecordFactory, Serve
from sdk_client import cancel_task, get_task, send_message, stream_message, subscribe

from tasktape.agent import create_agent_app
from tasktape.agent.scenarios import Scenario, choose
from tasktape.eventlog import SSEDecoder, classify

BINDINGS = ["rest", "jsonrpc"]
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
