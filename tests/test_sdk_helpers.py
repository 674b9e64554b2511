"""The a2a-sdk test helpers work end to end: sdk_agent.py served, sdk_client.py talking to it directly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sdk_agent import ARTIFACT_NAME, SdkAgent, echo_chunks, run_sdk_agent
from sdk_client import cancel_task, get_task, send_message, stream_message, subscribe

BINDINGS = ["rest", "jsonrpc"]


@pytest.fixture(scope="module")
def agent() -> Iterator[SdkAgent]:
    with run_sdk_agent() as running:
        yield running
    assert running.process.poll() is not None


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [next(iter(event)) for event in events]


def state(event: dict[str, Any]) -> str:
    body = event.get("task") or event.get("statusUpdate") or {}
    return body["status"]["state"]


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def test_card_lists_both_interfaces(agent: SdkAgent) -> None:
    card = httpx.get(agent.url + "/.well-known/agent-card.json").json()
    bindings = {(i["protocolBinding"], i["url"], i["protocolVersion"]) for i in card["supportedInterfaces"]}
    assert bindings == {("HTTP+JSON", agent.url, "1.0"), ("JSONRPC", agent.url, "1.0")}
    assert card["capabilities"]["streaming"] is True


def test_public_url_goes_into_the_card() -> None:
    with run_sdk_agent(public_url="http://proxy.invalid:9/") as running:
        card = httpx.get(running.url + "/.well-known/agent-card.json").json()
    assert {i["url"] for i in card["supportedInterfaces"]} == {"http://proxy.invalid:9"}


@pytest.mark.parametrize("binding", BINDINGS)
async def test_stream_message(agent: SdkAgent, binding: str) -> None:
    events = await stream_message(agent.url, "hello", binding)

    assert kinds(events) == ["task", "statusUpdate", *["artifactUpdate"] * 5, "statusUpdate"]
    task = events[0]["task"]
    assert state(events[0]) == "TASK_STATE_SUBMITTED"
    assert task["history"][0]["parts"] == [{"text": "hello"}]
    assert task["history"][0]["role"] == "ROLE_USER"
    assert state(events[1]) == "TASK_STATE_WORKING"
    assert state(events[-1]) == "TASK_STATE_COMPLETED"
    assert {e[next(iter(e))]["taskId"] for e in events[1:]} == {task["id"]}

    updates = [e["artifactUpdate"] for e in events[2:7]]
    assert [u["artifact"]["parts"][0]["text"] for u in updates] == [
        *echo_chunks("hello"),
        "Echo: hello -- done.",
    ]
    assert [u.get("append", False) for u in updates] == [False, True, True, True, False]
    assert [u.get("lastChunk", False) for u in updates] == [False] * 4 + [True]
    assert {u["artifact"]["name"] for u in updates} == {ARTIFACT_NAME}
    assert len({u["artifact"]["artifactId"] for u in updates}) == 1


@pytest.mark.parametrize("binding", BINDINGS)
async def test_send_message_then_get_task(agent: SdkAgent, binding: str) -> None:
    response = await send_message(agent.url, "hi there", binding)

    assert list(response) == ["task"]
    task = response["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    [artifact] = task["artifacts"]
    assert artifact["name"] == ARTIFACT_NAME
    assert artifact["parts"] == [{"text": "Echo: hi there -- done."}]

    fetched = await get_task(agent.url, task["id"], binding)
    assert fetched["id"] == task["id"]
    assert fetched["status"]["state"] == "TASK_STATE_COMPLETED"
    assert fetched["artifacts"] == task["artifacts"]
    assert fetched["history"][0]["parts"] == [{"text": "hi there"}]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_input_required(agent: SdkAgent, binding: str) -> None:
    events = await stream_message(agent.url, "need input please", binding)
    assert kinds(events) == ["task", "statusUpdate", "statusUpdate"]
    assert [state(e) for e in events] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_INPUT_REQUIRED",
    ]

    response = await send_message(agent.url, "more input", binding)
    assert response["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert "artifacts" not in response["task"]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_cancel_running_slow_task(agent: SdkAgent, binding: str) -> None:
    seen: list[dict[str, Any]] = []
    streaming = asyncio.create_task(stream_message(agent.url, "slow one", binding, on_event=seen.append))
    try:
        await wait_for(lambda: len(seen) >= 2)  # the task, then WORKING
        task_id = seen[0]["task"]["id"]

        cancelled = await cancel_task(agent.url, task_id, binding)
        assert cancelled["id"] == task_id
        assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"

        async with asyncio.timeout(5):
            events = await streaming
    finally:
        streaming.cancel()

    # The stream ends with the CANCELED update and never reaches COMPLETED.
    assert state(events[-1]) == "TASK_STATE_CANCELED"
    assert "TASK_STATE_COMPLETED" not in {state(e) for e in events if "artifactUpdate" not in e}
    assert len(events) < 8

    fetched = await get_task(agent.url, task_id, binding)
    assert fetched["status"]["state"] == "TASK_STATE_CANCELED"


@pytest.mark.parametrize("binding", BINDINGS)
async def test_subscribe_to_running_slow_task(agent: SdkAgent, binding: str) -> None:
    seen: list[dict[str, Any]] = []
    streaming = asyncio.create_task(stream_message(agent.url, "slow echo", binding, on_event=seen.append))
    try:
        await wait_for(lambda: len(seen) >= 2)
        task_id = seen[0]["task"]["id"]

        resubscribed = await subscribe(agent.url, task_id, binding)
        async with asyncio.timeout(5):
            original = await streaming
    finally:
        streaming.cancel()

    # A snapshot of the task first, then exactly the tail of the original stream.
    assert kinds(resubscribed)[0] == "task"
    snapshot = resubscribed[0]["task"]
    assert snapshot["id"] == task_id
    assert snapshot["status"]["state"] == "TASK_STATE_WORKING"
    tail = resubscribed[1:]
    assert tail
    assert tail == original[len(original) - len(tail) :]
    assert state(tail[-1]) == "TASK_STATE_COMPLETED"
    assert tail[-2]["artifactUpdate"]["artifact"]["parts"] == [{"text": "Echo: slow echo -- done."}]
