"""Subscriptions nothing recorded answers, true to the recording and to A2A v1.0: the task
runs in replay time, a subscriber gets its snapshot at that moment and then what follows
(the recorded bytes), with nothing twice and nothing missing; the official a2a-sdk
client's resubscribe after a dropped stream, on both bindings."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import RecordFactory, Serve
from sdk_agent import SdkAgent, run_sdk_agent
from sdk_client import stream_message, subscribe
from test_replay import events_of, message, recorded_demo, stream_exchange, timed_post

from tasktape.agent import create_agent_app
from tasktape.eventlog.task_snapshot import stream_response, task_after
from tasktape.replay import ReplayServer, load

QUESTION = "What does J45.909 mean?"
BINDINGS = ["rest", "jsonrpc"]


@pytest.fixture(scope="module")
def sdk_agent() -> Iterator[SdkAgent]:
    with run_sdk_agent() as running:
        yield running


def frames(body: bytes) -> list[dict[str, Any]]:
    return [stream_response(json.loads(e.data)) for e in events_of(body)]


async def arm(url: str, spec: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/_tasktape/faults", json={"fault": spec}) as r,
    ):
        assert r.status == 200, await r.text()
        return await r.json()


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("agent_kind", ["demo", "sdk"])
async def test_the_sdk_client_resubscribes_after_a_dropped_stream(
    record: RecordFactory, serve: Serve, sdk_agent: SdkAgent, agent_kind: str, binding: str
) -> None:
    # The demo agent writes SSE ids and compact JSON; the SDK's agent neither, with CRLFs.
    upstream = await serve(create_agent_app(pace=0.5)) if agent_kind == "demo" else sdk_agent.url
    text = QUESTION if agent_kind == "demo" else "slow hello"
    rec = await record(upstream)
    live = await stream_message(rec.url, text, binding)
    (await rec.log()).close()
    server = ReplayServer(load([rec.db]), speed=1.0)
    url = await serve(server.app)
    await arm(url, "drop-after=3;times=1")  # once: the subscribe is a stream too
    before: list[dict[str, Any]] = []
    with pytest.raises(Exception, match=r"incomplete chunked read|peer closed|Connection"):
        await stream_message(url, text, binding, on_event=before.append)
    assert before == live[:3]
    after = await subscribe(url, live[0]["task"]["id"], binding)
    snapshot, rest = after[0], after[1:]
    seen = len(live) - len(rest)
    # The task ran on while nobody listened: the snapshot holds what happened by then,
    # as the agent would hold it, and the rest follows: nothing twice, nothing missing.
    assert 3 <= seen < len(live), (seen, len(live))
    assert rest == live[seen:]
    assert snapshot == {"task": task_after(live[:seen])}
    assert snapshot["task"]["status"]["state"] != "TASK_STATE_COMPLETED"
    (report,) = [s for s in server.report()["streams"] if "subscribe" in " ".join(s["reasons"])]
    assert report["finished"] and not report["identical"]


async def test_after_the_snapshot_the_recorded_bytes(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "rest"), pace=0.5)
    recorded = stream_exchange(db, result.task_id).body
    events = events_of(recorded)
    url = await serve(ReplayServer(load([db]), speed=1.0).app)
    async with aiohttp.ClientSession() as session:
        dropped = b""
        async with session.post(
            f"{url}/message:stream", json=message(QUESTION), headers={"X-Tasktape-Fault": "drop-after=5"}
        ) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for data in r.content.iter_any():
                    dropped += data
        assert len(events_of(dropped)) == 5
        async with session.get(f"{url}/tasks/{result.task_id}:subscribe") as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            body = await r.read()
    got = events_of(body)
    snapshot = got[0]
    seen = next(n for n, e in enumerate(events, 1) if e.id == snapshot.id)
    # The snapshot carries the id of the last event it holds: a resume from it goes on after.
    assert seen >= 5 and json.loads(snapshot.data) == {"task": task_after(frames(recorded)[:seen])}
    tail = recorded[sum(len(e.raw) for e in events[:seen]) :]
    assert body[len(snapshot.raw) :] == tail  # byte for byte


async def test_a_finished_task_gets_its_final_snapshot(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "rest"), pace=0.05)
    recorded = stream_exchange(db, result.task_id).body
    url = await serve(ReplayServer(load([db]), speed=0).app)
    await timed_post(f"{url}/message:stream", message(QUESTION))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/tasks/{result.task_id}:subscribe") as r:
            (only,) = events_of(await r.read())
        assert json.loads(only.data) == {"task": task_after(frames(recorded))}
        assert json.loads(only.data)["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        # On JSON-RPC: the same Task, in the envelope, with the subscriber's id.
        rpc = {"jsonrpc": "2.0", "id": "sub-9", "method": "SubscribeToTask", "params": {"id": result.task_id}}
        async with session.post(f"{url}/jsonrpc", json=rpc) as r:
            (framed,) = [json.loads(e.data) for e in events_of(await r.read())]
        assert framed == {"jsonrpc": "2.0", "id": "sub-9", "result": {"task": task_after(frames(recorded))}}


async def test_a_task_nothing_started_starts_when_subscribed(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "rest"), pace=0.05)
    recorded = stream_exchange(db, result.task_id).body
    events = events_of(recorded)
    url = await serve(ReplayServer(load([db]), speed=0).app)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/tasks/{result.task_id}:subscribe") as r:
            body = await r.read()
        # Its first state (the recorded Task event), then its whole run: the recording itself.
        assert body == recorded
        async with session.post(
            f"{url}/tasks/{result.task_id}:subscribe", headers={"Last-Event-ID": events[4].id}
        ) as r:
            assert [e.id for e in events_of(await r.read())] == [e.id for e in events[5:]]
        async with session.get(
            f"{url}/tasks/{result.task_id}:subscribe", headers={"Last-Event-ID": "nope"}
        ) as r:
            assert r.status == 400 and "names no recorded event" in await r.text()


async def test_a_rest_recording_subscribed_on_jsonrpc(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "rest"), pace=0.05)
    recorded = frames(stream_exchange(db, result.task_id).body)
    url = await serve(ReplayServer(load([db]), speed=0).app)
    rpc = {"jsonrpc": "2.0", "id": 4, "method": "SubscribeToTask", "params": {"id": result.task_id}}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/jsonrpc", json=rpc) as r:
        framed = [json.loads(e.data) for e in events_of(await r.read())]
    assert [f["result"] for f in framed] == recorded and {f["id"] for f in framed} == {4}


async def test_reset_forgets_where_tasks_are(record: RecordFactory, serve: Serve, tmp_path: Path) -> None:
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "rest"), pace=0.05)
    recorded = stream_exchange(db, result.task_id).body
    server = ReplayServer(load([db]), speed=0)
    url = await serve(server.app)
    await timed_post(f"{url}/message:stream", message(QUESTION))
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/_tasktape/reset", json={}) as r:
            assert r.status == 200
        async with session.get(f"{url}/tasks/{result.task_id}:subscribe") as r:
            assert await r.read() == recorded  # started afresh by the subscribe
    await asyncio.sleep(0)
