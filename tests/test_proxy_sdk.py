"""The official a2a-sdk as agent and as client, through the recording proxy, on both
bindings: the client sees what it sees without the proxy, and the log holds it all."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    GetExtendedAgentCardRequest,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from aiohttp import web
from conftest import RecordFactory, Recording, Serve
from google.protobuf.json_format import MessageToDict
from sdk_agent import CARD_PATH, SdkAgent, run_sdk_agent
from sdk_client import cancel_task, get_task, sdk_client, send_message, stream_message, subscribe

from tasktape.agent import create_agent_app
from tasktape.eventlog.checker import check_log
from tasktape.replay import ReplayServer, load

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


def extended_card_agent() -> web.Application:
    """An agent whose card offers an extended card, both listing the agent's own address,
    written as the SDK's server writes them (its types, to JSON)."""

    def card(request: web.Request, name: str) -> dict[str, Any]:
        base = f"http://{request.host}"
        interfaces = [
            AgentInterface(url=base, protocol_binding=b.value, protocol_version=PROTOCOL_VERSION_CURRENT)
            for b in (TransportProtocol.HTTP_JSON, TransportProtocol.JSONRPC)
        ]
        capabilities = AgentCapabilities(extended_agent_card=True)
        return MessageToDict(AgentCard(name=name, supported_interfaces=interfaces, capabilities=capabilities))

    async def public(request: web.Request) -> web.Response:
        return web.json_response(card(request, "public"))

    async def jsonrpc(request: web.Request) -> web.Response:
        rpc = await request.json()
        assert rpc["method"] == "GetExtendedAgentCard"
        return web.json_response({"jsonrpc": "2.0", "id": rpc["id"], "result": card(request, "extended")})

    app = web.Application()
    app.router.add_get(CARD_PATH, public)
    app.router.add_post("/", jsonrpc)
    return app


async def test_a_replayed_extended_card_on_jsonrpc_points_at_the_replay(
    record: RecordFactory, serve: Serve
) -> None:
    # The card sits under the JSON-RPC answer's ``result``: replayed as recorded, it would
    # send the client's next call to the recorded agent, past the replay.
    rec = await record(extended_card_agent())
    async with sdk_client(rec.url, "jsonrpc") as client:
        live = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    assert {i.url for i in live.supported_interfaces} == {rec.url}
    (await rec.log()).close()
    url = await serve(ReplayServer(load([rec.db])).app)
    async with sdk_client(url, "jsonrpc") as client:
        replayed = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
    assert replayed.name == "extended"
    assert [i.url for i in replayed.supported_interfaces] == [url, url]


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("agent_kind", ["sdk", "demo"])
async def test_a_subscribe_to_a_running_task_checks_clean(
    agent: SdkAgent, record: RecordFactory, serve: Serve, agent_kind: str, binding: str
) -> None:
    # The subscribe is sent again what the first stream carries; the SDK's agent gives its
    # events no SSE ids (the demo agent does): either way each counts once.
    upstream = agent.url if agent_kind == "sdk" else await serve(create_agent_app(pace=0.2))
    rec = await record(upstream)
    first: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def note(event: dict[str, Any]) -> None:
        if not first.done():
            first.set_result(next(iter(event.values())).get("id"))

    streaming = asyncio.create_task(stream_message(rec.url, "slow hello", binding, on_event=note))
    subscribed = await subscribe(rec.url, await asyncio.wait_for(first, 10), binding)
    streamed = await asyncio.wait_for(streaming, 10)
    assert shape(subscribed)[-1][1] == shape(streamed)[-1][1] == "TASK_STATE_COMPLETED"
    assert any("artifactUpdate" in e for e in subscribed)  # it ran on while subscribed
    with await rec.log() as log:
        assert check_log(log) == []
