"""Subscriptions nothing recorded answers, true to the recording and to A2A v1.0: the task
runs in replay time, a subscriber gets its snapshot at that moment and then what follows
(the recorded bytes), with nothing twice and nothing missing; the official a2a-sdk
client's resubscribe after a dropped stream, on both bindings."""

from __future__ import annotations

import asyncio
import json
import time
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
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.task_snapshot import stream_response, task_after
from tasktape.replay import ReplayServer, load

QUESTION = "What does J45.909 mean?"
BINDINGS = ["rest", "jsonrpc"]
MS = 1_000_000


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
    # The SDK's agent paces its events 0.2 s apart: replayed slower, the subscribe comes
    # before the task's end even when a loaded machine is slow to send it.
    server = ReplayServer(load([rec.db]), speed=1.0 if agent_kind == "demo" else 0.25)
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


TASK = "task.7"
CTX = "ctx.7"


def frame(kind: str, **body: Any) -> dict[str, Any]:
    if kind == "task":
        return {"task": {"id": TASK, "contextId": CTX, **body}}
    return {kind: {"taskId": TASK, "contextId": CTX, **body}}


def status(state: str) -> dict[str, Any]:
    return frame("statusUpdate", status={"state": f"TASK_STATE_{state}"})


def delta(text: str, append: bool) -> dict[str, Any]:
    return frame("artifactUpdate", artifact={"artifactId": "art.1", "parts": [{"text": text}]}, append=append)


def stream(
    frames_and_ids: list[tuple[dict[str, Any], str]],
    *,
    every_ms: int = 20,
    last_event_id: str | None = None,
    started_at: str | None = None,
    text: str = "hi",
) -> Recorded:
    """A REST message:stream recording of these events, ``every_ms`` apart."""
    chunks = [
        (
            (n + 1) * every_ms * MS,
            f"id: {event_id}\ndata: {json.dumps(f, separators=(',', ':'))}\n\n".encode(),
        )
        for n, (f, event_id) in enumerate(frames_and_ids)
    ]
    headers = [("Content-Type", "application/json")]
    if last_event_id is not None:
        headers.append(("Last-Event-ID", last_event_id))
    return Recorded(
        method="POST",
        path="/message:stream",
        request_headers=headers,
        request_body=json.dumps({"message": {"role": "ROLE_USER", "parts": [{"text": text}]}}).encode(),
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=chunks,
        duration_ns=chunks[-1][0] + MS,
        outcome="complete",
        started_at=started_at,
    )


async def subscribed(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/tasks/{TASK}:subscribe", headers=headers) as r,
    ):
        return r.status, await r.read()


async def test_a_task_runs_on_into_its_recorded_resumption(serve: Serve) -> None:
    first = stream(
        [(frame("task", status={"state": "TASK_STATE_WORKING"}), "e1"), (delta("Hel", False), "e2")],
        started_at="2026-12-01T10:00:00.000000+00:00",
    )
    resumed = stream(
        [(delta("lo", True), "e3"), (status("COMPLETED"), "e4")],
        last_event_id="e2",
        started_at="2026-12-01T10:00:00.150000+00:00",
    )
    url = await serve(ReplayServer([first, resumed], speed=1.0).app)
    started = time.monotonic()
    code, body = await subscribed(url)
    # Nothing started it: its whole run, the resumed stream's events after the first's.
    assert code == 200 and body == first.body + resumed.body
    assert time.monotonic() - started >= 0.15 + 0.04 - 0.01
    # Served, and subscribed to once it is over: the final snapshot, resumption included.
    fresh = ReplayServer([first, resumed], speed=1.0)
    url = await serve(fresh.app)
    await timed_post(f"{url}/message:stream", {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}})
    await asyncio.sleep(0.25)
    _, body = await subscribed(url)
    (only,) = events_of(body)
    assert only.id == "e4" and json.loads(only.data)["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert json.loads(only.data)["task"]["artifacts"][0]["parts"] == [{"text": "Hel"}, {"text": "lo"}]


async def test_a_second_turn_with_the_same_ids_is_not_dropped(serve: Serve) -> None:
    turn1 = stream(
        [(frame("task", status={"state": "TASK_STATE_WORKING"}), "1"), (status("INPUT_REQUIRED"), "2")]
    )
    turn2 = stream([(status("WORKING"), "1"), (status("COMPLETED"), "2")], text="more")
    url = await serve(ReplayServer([turn1, turn2], speed=0).app)
    for text in ("hi", "more"):
        await timed_post(
            f"{url}/message:stream", {"message": {"role": "ROLE_USER", "parts": [{"text": text}]}}
        )
    _, body = await subscribed(url)
    (only,) = events_of(body)
    assert json.loads(only.data)["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_refused_subscribe_starts_nothing(serve: Serve) -> None:
    run = stream([(frame("task", status={"state": "TASK_STATE_WORKING"}), "e1"), (status("COMPLETED"), "e2")])
    server = ReplayServer([run], speed=0)
    url = await serve(server.app)
    code, _ = await subscribed(url, {"Last-Event-ID": "nope"})
    assert code == 400 and server.stats.refused
    assert (await subscribed(url))[1] == run.body  # still its whole run


async def test_a_subscription_opens_with_a_task_even_if_the_recording_does_not(serve: Serve) -> None:
    run = stream([(status("WORKING"), "e1"), (delta("Hi", False), "e2"), (status("COMPLETED"), "e3")])
    url = await serve(ReplayServer([run], speed=0).app)
    _, body = await subscribed(url)
    got = events_of(body)
    assert json.loads(got[0].data) == {
        "task": {"id": TASK, "contextId": CTX, "status": {"state": "TASK_STATE_WORKING"}}
    }
    assert got[0].id == "e1" and [e.raw for e in got[1:]] == [e.raw for e in events_of(run.body)[1:]]


async def test_serving_a_stream_again_starts_its_task_again(serve: Serve) -> None:
    run = stream(
        [(frame("task", status={"state": "TASK_STATE_WORKING"}), "e1"), (status("COMPLETED"), "e2")],
        every_ms=150,
    )
    url = await serve(ReplayServer([run], speed=1.0, allow_repeats=True).app)
    question = {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    await timed_post(f"{url}/message:stream", question)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/message:stream", json=question, headers={"X-Tasktape-Fault": "drop-after=1"}
        ) as r,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    _, body = await subscribed(url)
    got = events_of(body)
    assert json.loads(got[0].data)["task"]["status"]["state"] == "TASK_STATE_WORKING"  # the second run's
    assert got[-1].raw == events_of(run.body)[-1].raw


async def test_jsonrpc_ids_of_another_type_are_the_subscriber_s(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "jsonrpc"), pace=0.05)
    url = await serve(ReplayServer(load([db]), speed=0).app)
    ask = {"jsonrpc": "2.0", "id": True, "method": "SendStreamingMessage", "params": message(QUESTION)}
    body, _, _ = await timed_post(f"{url}/jsonrpc", ask)
    assert {json.dumps(json.loads(e.data)["id"]) for e in events_of(body)} == {"true"}
    rpc = {"jsonrpc": "2.0", "id": 1.0, "method": "SubscribeToTask", "params": {"id": result.task_id}}
    body, _, _ = await timed_post(f"{url}/jsonrpc", rpc)
    assert {json.dumps(json.loads(e.data)["id"]) for e in events_of(body)} == {"1.0"}
