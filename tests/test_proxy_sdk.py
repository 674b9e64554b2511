"""The official a2a-sdk as agent and as client, through the recording proxy, on both
bindings: the client sees what it sees without the proxy, and the log holds it all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import RecordFactory, Recording
from sdk_agent import SdkAgent, run_sdk_agent
from sdk_client import cancel_task, get_task, send_message, stream_message, subscribe

BINDINGS = ["rest", "jsonrpc"]


@pytest.fixture(scope="module")
def agent() -> Iterator[SdkAgent]:
    with run_sdk_agent() as running:
        yield running


def shape(events: list[dict[str, Any]]) -> list[tuple]:
    """What a client sees of a stream, minus the ids and timestamps that change per run."""
    out = []
    for event in events:
        kind, body = next(iter(event.items()))
        status = body.get("status", {})
        artifact = body.get("artifact", {})
        out.append(
            (
                kind,
                status.get("state"),
                [p.get("text") for p in artifact.get("parts", [])],
                body.get("append", False),
                body.get("lastChunk", False),
            )
        )
    return out


def task_id_of(events: list[dict[str, Any]]) -> str:
    return events[0]["task"]["id"]


async def exchanges(rec: Recording) -> list[dict[str, Any]]:
    with await rec.log() as log:
        return [{**x, "events": log.events(x["id"])} for x in log.exchanges()]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_streaming_through_the_proxy(agent: SdkAgent, record: RecordFactory, binding: str) -> None:
    direct = await stream_message(agent.url, "hello", binding)
    rec = await record(agent.url)
    proxied = await stream_message(rec.url, "hello", binding)
    assert shape(proxied) == shape(direct)
    assert shape(proxied)[-1][1] == "TASK_STATE_COMPLETED"
    recorded = await exchanges(rec)
    # The card came through the proxy and so did the call: nothing bypassed it.
    assert recorded[0]["path"] == "/.well-known/agent-card.json"
    (stream,) = [x for x in recorded if x["is_sse"]]
    assert (stream["binding"], stream["rpc_method"], stream["outcome"]) == (
        binding,
        "SendStreamingMessage",
        "complete",
    )
    assert stream["task_id"] == task_id_of(proxied)
    events = stream["events"]
    assert [e["kind"] for e in events] == ["task", "statusUpdate"] + ["artifactUpdate"] * 5 + ["statusUpdate"]
    assert {e["task_id"] for e in events} == {task_id_of(proxied)}
    assert [e["state"] for e in events if e["state"]] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    deltas = [e for e in events if e["kind"] == "artifactUpdate"]
    assert [(e["append"], e["last_chunk"]) for e in deltas] == [(0, 0), (1, 0), (1, 0), (1, 0), (0, 1)]
    assert deltas[-1]["text"] == "Echo: hello -- done."
    assert ["A2A-Version", "1.0"] in json.loads(stream["request_headers"])


@pytest.mark.parametrize("binding", BINDINGS)
async def test_send_get_cancel_and_subscribe(agent: SdkAgent, record: RecordFactory, binding: str) -> None:
    rec = await record(agent.url)
    sent = await send_message(rec.url, "quick", binding)
    task_id = sent["task"]["id"]
    assert sent["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    fetched = await get_task(rec.url, task_id, binding)
    assert fetched["status"]["state"] == "TASK_STATE_COMPLETED"

    # A slow task: subscribe to it while it runs, then cancel it.
    first: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    streaming = asyncio.create_task(
        stream_message(
            rec.url,
            "slow one",
            binding,
            on_event=lambda e: (
                first.done()
                or first.set_result(
                    next(iter(e.values()))["id"] if "task" in e else next(iter(e.values()))["taskId"]
                )
            ),
        )
    )
    slow_id = await asyncio.wait_for(first, 10)
    subscribed = asyncio.create_task(subscribe(rec.url, slow_id, binding))
    await asyncio.sleep(0.3)
    canceled = await cancel_task(rec.url, slow_id, binding)
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    stream_events = await asyncio.wait_for(streaming, 10)
    sub_events = await asyncio.wait_for(subscribed, 10)
    assert shape(stream_events)[-1][1] == "TASK_STATE_CANCELED"
    assert "task" in sub_events[0] and shape(sub_events)[-1][1] == "TASK_STATE_CANCELED"

    recorded = await exchanges(rec)
    by_method = {}
    for x in recorded:
        by_method.setdefault(x["rpc_method"], []).append(x)
    assert {"SendMessage", "GetTask", "SendStreamingMessage", "SubscribeToTask", "CancelTask"} <= set(
        by_method
    )
    assert all(x["binding"] == binding for m, xs in by_method.items() if m for x in xs)
    assert by_method["GetTask"][0]["task_id"] == task_id
    assert by_method["CancelTask"][0]["task_id"] == slow_id
    (sub,) = by_method["SubscribeToTask"]
    assert sub["task_id"] == slow_id and sub["is_sse"] == 1
    assert sub["events"][0]["kind"] == "task" and sub["events"][-1]["state"] == "TASK_STATE_CANCELED"
    (send,) = by_method["SendMessage"]
    assert send["is_sse"] == 0 and task_id in send["response_body"]
    assert send["task_id"] == task_id  # named by the (non-streamed) answer
    assert all(x["outcome"] == "complete" for x in recorded)
