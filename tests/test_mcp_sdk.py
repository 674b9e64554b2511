"""MCP over Streamable HTTP, with the official mcp SDK as server and as client: a session
recorded through the proxy replays with the server stopped, with the same results, the
same progress notifications at the recorded pace, and resumption served."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import RecordFactory, Serve
from mcp_peers import run_mcp_client, run_mcp_server

from tasktape.eventlog import EventLog
from tasktape.eventlog.checker import check_log
from tasktape.eventlog.spans import events_in
from tasktape.replay import ReplayServer, load

COUNT = ("--count", "3", "--delay", "0.15")


def calls(report: dict[str, Any]) -> dict[str, Any]:
    """What a client run got, minus its own timings."""
    out = {}
    for name, call in report["calls"].items():
        out[name] = {
            "result": call["result"],
            "progress": [(p["progress"], p["total"], p["message"]) for p in call.get("progress", [])],
        }
    return {"tools": report["tools"], "calls": out, "protocol": report["protocol_version"]}


async def client(url: str, *args: str) -> dict[str, Any]:
    return await asyncio.to_thread(run_mcp_client, url, *COUNT, *args)


async def recorded_session(record: RecordFactory, *server_args: str) -> tuple[dict[str, Any], Path]:
    with run_mcp_server(*server_args) as server:
        base = server.url.removesuffix("/mcp")
        direct = await client(server.url)
        rec = await record(base)
        through = await client(f"{rec.url}/mcp")
        assert calls(through) == calls(direct)
        await rec.log()
    return through, rec.db


@pytest.mark.parametrize(
    "server_args", [(), ("--event-store", "--retry-ms", "100", "--close-stream-after", "1")]
)
async def test_the_sdk_session_replays_with_the_server_stopped(
    record: RecordFactory, serve: Serve, server_args: tuple[str, ...]
) -> None:
    through, db = await recorded_session(record, *server_args)
    with EventLog(db) as log:
        xs = log.exchanges()
        assert {x["protocol"] for x in xs} == {"mcp"} and {x["binding"] for x in xs} == {None}
        assert len({x["session_id"] for x in xs}) == 1 and xs[0]["session_id"]
        assert check_log(log) == []
    replay = ReplayServer(load([db]), speed=1.0)
    url = await serve(replay.app)
    replayed = await client(f"{url}/mcp")
    assert calls(replayed) == calls(through)
    assert (replay.stats.missed, replay.stats.refused, replay.unused()) == ([], [], [])
    # At the recorded pace: the slow tool takes as long again.
    took, was = replayed["calls"]["slow_count"]["seconds"], through["calls"]["slow_count"]["seconds"]
    assert took >= 0.8 * was


async def test_a_tool_call_reads_back_with_its_progress_and_result(record: RecordFactory) -> None:
    _, db = await recorded_session(record)
    with EventLog(db) as log:
        (call,) = [x for x in log.exchanges() if b"slow_count" in (x["request_body"] or "").encode()]
        assert call["rpc_method"] == "tools/call"
        events = [e for e in log.events(call["id"]) if e["kind"] != "priming"]
        assert [e["kind"] for e in events] == ["notification"] * 3 + ["response"]
        assert [e["text"] for e in events] == [
            "counted 1 of 3",
            "counted 2 of 3",
            "counted 3 of 3",
            "counted to 3",
        ]
        (summary,) = log.stream_summary(call["id"])
        assert (summary["finish"], summary["answer"]) == ("result", "counted to 3")
        last = json.loads(events[-1]["data"])
        assert last["id"] == json.loads(call["request_body"])["id"]


async def test_answers_carry_the_id_of_the_request_being_answered(
    record: RecordFactory, serve: Serve
) -> None:
    _, db = await recorded_session(record)
    with EventLog(db) as log:
        (call,) = [x for x in log.exchanges() if b"slow_count" in (x["request_body"] or "").encode()]
        headers = dict(json.loads(call["request_headers"]))
    body = json.loads(call["request_body"])
    # Another client numbers its requests otherwise, and takes its progress token from the id.
    body["id"], body["params"]["_meta"]["progressToken"] = 42, 42
    url = await serve(ReplayServer(load([db]), speed=0).app)
    send = {k: v for k, v in headers.items() if k.lower() in ("accept", "content-type", "mcp-session-id")}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/mcp", json=body, headers=send) as resp,
    ):
        assert resp.status == 200
        frames = [json.loads(e.data) for e in events_in([(0, await resp.read())]) if e.data]
    assert [f.get("id") for f in frames] == [None, None, None, 42]
