"""MCP over Streamable HTTP, with the official mcp SDK as server and as client, in both
generations (mcp 1.x: sessions, the GET stream, resumption; mcp 2.x: the stateless
2026-07-28 revision): a session recorded through the proxy replays with the server
stopped, with the same results, the same progress notifications at the recorded pace,
and resumption served."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import RecordFactory, Serve
from mcp_peers import run_mcp_client, run_mcp_server

from tasktape.eventlog import EventLog
from tasktape.eventlog.checker import check_log, report_log
from tasktape.eventlog.spans import events_in
from tasktape.replay import ReplayServer, load

COUNT = ("--count", "3", "--delay", "0.15")
# mcp 2.x, beside the environment's 1.x: the README's test command installs it there.
MCP2 = Path(__file__).resolve().parent.parent / ".test-deps" / "mcp2"


@dataclass(frozen=True)
class Generation:
    sdk: str
    pythonpath: str | None
    server_args: tuple[str, ...] = ()


GENERATIONS = {
    "mcp1": Generation("1", None),
    "mcp1-resumed": Generation(
        "1", None, ("--event-store", "--retry-ms", "100", "--close-stream-after", "1")
    ),
    "mcp2-stateless": Generation("2", str(MCP2)),
}


def generation(name: str) -> Generation:
    chosen = GENERATIONS[name]
    if chosen.pythonpath is not None and not (MCP2 / "mcp").is_dir():
        why = f"mcp 2.x is not in {MCP2}: the README's test command installs it there"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return chosen


def calls(report: dict[str, Any]) -> dict[str, Any]:
    """What a client run got, minus its own timings."""
    out = {}
    for name, call in report["calls"].items():
        out[name] = {
            "result": call["result"],
            "progress": [(p["progress"], p["total"], p["message"]) for p in call.get("progress", [])],
        }
    return {"tools": report["tools"], "calls": out, "protocol": report["protocol_version"]}


async def client(url: str, peers: Generation) -> dict[str, Any]:
    return await asyncio.to_thread(run_mcp_client, url, *COUNT, sdk=peers.sdk, pythonpath=peers.pythonpath)


async def recorded_session(record: RecordFactory, peers: Generation) -> tuple[dict[str, Any], Path]:
    with run_mcp_server(*peers.server_args, sdk=peers.sdk, pythonpath=peers.pythonpath) as server:
        base = server.url.removesuffix("/mcp")
        direct = await client(server.url, peers)
        rec = await record(base)
        through = await client(f"{rec.url}/mcp", peers)
        assert calls(through) == calls(direct)
        (await rec.log()).close()  # every exchange committed
    return through, rec.db


@pytest.mark.parametrize("name", GENERATIONS)
async def test_the_sdk_session_replays_with_the_server_stopped(
    record: RecordFactory, serve: Serve, name: str
) -> None:
    peers = generation(name)
    through, db = await recorded_session(record, peers)
    assert through["mcp_version"].startswith(f"{peers.sdk}.")
    assert through["protocol_version"] == ("2026-07-28" if peers.sdk == "2" else "2025-11-25")
    with EventLog(db) as log:
        xs = log.exchanges()
        assert {x["protocol"] for x in xs} == {"mcp"} and {x["binding"] for x in xs} == {None}
        sessions = {x["session_id"] for x in xs}
        assert sessions == ({None} if peers.sdk == "2" else {through["session_id"]})
        assert check_log(log) == []
        # The GET resuming a closed stream, closed by mcp 1.x once its answer came, lost nothing.
        assert report_log(log).cut_short == []
        if "--close-stream-after" in peers.server_args:
            # The tool call's POST stream was closed for resumption, answered on the resumed GET.
            (resumed,) = [x for x in xs if "last-event-id" in x["request_headers"].lower()]
            assert resumed["method"] == "GET" and log.events(resumed["id"])[-1]["kind"] == "response"
    replay = ReplayServer(load([db]), speed=1.0)
    url = await serve(replay.app)
    replayed = await client(f"{url}/mcp", peers)
    assert calls(replayed) == calls(through)
    assert (replay.stats.missed, replay.stats.refused, replay.unused()) == ([], [], [])
    # At the recorded pace: the slow tool takes as long again.
    took, was = replayed["calls"]["slow_count"]["seconds"], through["calls"]["slow_count"]["seconds"]
    assert took >= 0.8 * was


@pytest.mark.parametrize("name", ["mcp1", "mcp2-stateless"])
async def test_a_tool_call_reads_back_with_its_progress_and_result(record: RecordFactory, name: str) -> None:
    _, db = await recorded_session(record, generation(name))
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
    _, db = await recorded_session(record, generation("mcp1"))
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


@pytest.mark.parametrize("name", ["mcp1", "mcp1-resumed"])
async def test_a_session_through_the_resume_gateway_is_unchanged(record: RecordFactory, name: str) -> None:
    # The server's own resumption (it closes a tool call's stream, the client resumes it
    # with a GET) still reaches the server: a stream it closed unfinished is not the
    # gateway's to answer for.
    peers = generation(name)
    with run_mcp_server(*peers.server_args, sdk=peers.sdk, pythonpath=peers.pythonpath) as server:
        direct = await client(server.url, peers)
        rec = await record(server.url.removesuffix("/mcp"), hold=30.0)
        through = await client(f"{rec.url}/mcp", peers)
    assert calls(through) == calls(direct)


@pytest.mark.parametrize("name", ["mcp1", "mcp2-stateless"])
async def test_a_miss_on_replay_is_no_ended_session(record: RecordFactory, serve: Serve, name: str) -> None:
    """A tool call nothing recorded matches: the SDK's client fails with the replay's error,
    not with "Session terminated" (what a 404 means to an MCP client)."""
    peers = generation(name)
    _, db = await recorded_session(record, peers)
    replay = ReplayServer(load([db]), speed=0)
    url = await serve(replay.app)
    with pytest.raises(RuntimeError) as failed:
        await asyncio.to_thread(
            run_mcp_client,
            f"{url}/mcp",
            *COUNT,
            "--a",
            "40",
            sdk=peers.sdk,
            pythonpath=peers.pythonpath,
            timeout=30,
        )
    said = str(failed.value)
    assert "Session terminated" not in said
    # mcp 2 shows the JSON-RPC error the miss is answered with; mcp 1 the HTTP status.
    assert ("no recorded exchange matches POST /mcp" if peers.sdk == "2" else "400 Bad Request") in said, said
    (miss,) = replay.stats.missed
    assert miss.request == "POST /mcp"
