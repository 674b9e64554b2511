"""The resume gateway rejoining an MCP stream that broke: the official mcp SDK server (1.x)
keeps its events in an event store, so the recorder follows a tool call's stream again with
a ``GET`` carrying ``Last-Event-ID``, as a client resumes; the SDK client, through the
recorder, gets every progress notification once and the result, and the call reaches the
server once. A server that gives its events no ids cannot be rejoined, and the log says so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from typing import Any

import aiohttp
from conftest import RecordFactory
from cutter import Cut, Cutter, Relayed
from mcp_peers import run_mcp_client, run_mcp_server
from test_replay import events_of

from tasktape.eventlog.protocols.base import Request, Resubscription
from tasktape.eventlog.protocols.mcp import MCP
from tasktape.inspector.session_page import load_session
from tasktape.proxy.stamper import Stamper

COUNT = ("--count", "6", "--delay", "0.1")
PROGRESS = b"notifications/progress"


def cut_the_tool_call(after_reports: int) -> Any:
    """A plan: the first ``slow_count`` call's stream reset halfway through the event after
    its ``after_reports``-th progress report (so half an event has passed)."""
    made = []

    def plan(request: Relayed, rng: random.Random) -> Cut | None:
        if made or request.method != "POST" or b'"slow_count"' not in request.data:
            return None
        made.append(request)
        return Cut(10, "rst", PROGRESS, after_reports + 1)

    return plan


def calls(report: dict[str, Any]) -> dict[str, Any]:
    return {
        name: (call["result"], [(p["progress"], p["total"], p["message"]) for p in call["progress"]])
        for name, call in report["calls"].items()
        if "progress" in call
    }


async def client(url: str) -> dict[str, Any]:
    return await asyncio.to_thread(run_mcp_client, url, *COUNT, sdk="1")


async def test_a_broken_tool_call_stream_is_rejoined_with_last_event_id(record: RecordFactory) -> None:
    with run_mcp_server("--event-store", sdk="1") as server:
        base = server.url.removesuffix("/mcp")
        direct = await client(server.url)
        async with Cutter(base, plan=cut_the_tool_call(2)) as cutter:
            rec = await record(cutter.url, hold=30.0, rejoin_for=10.0)
            through = await client(f"{rec.url}/mcp")
            assert len(cutter.cuts()) == 1
            rejoins = [r for r in cutter.requests if r.method == "GET" and b"Last-Event-ID" in r.data]
            calls_made = cutter.count("POST", b'"slow_count"')
        log = await rec.log()
    assert calls(through) == calls(direct)  # every report once, in order, and the result
    assert calls_made == 1  # the tool ran once
    assert len(rejoins) == 1
    with log:
        (resume,) = log.db.conn.execute(
            "SELECT r.side, r.outcome, r.last_event_id, x.method, x.request_headers"
            " FROM resumes r JOIN exchanges x ON x.id = r.new_exchange_id"
        ).fetchall()
        sent_ids = [
            r[0]
            for r in log.db.conn.execute(
                "SELECT e.event_id FROM events e JOIN resumes r ON e.exchange_id = r.exchange_id"
                " WHERE e.event_id IS NOT NULL AND e.complete ORDER BY e.seq"
            )
        ]
    side, outcome, last_event_id, method, headers = resume
    assert (side, outcome, method) == ("upstream", "rejoined", "GET")
    # Resumed from the last whole event the agent sent (not the one cut off), which the GET named.
    assert last_event_id == sent_ids[-1]
    assert (
        f'"Last-Event-ID", "{last_event_id}"' in headers or f'"last-event-id", "{last_event_id}"' in headers
    )


# A session opened as the SDK client opens it.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


async def opened(session: aiohttp.ClientSession, url: str, accept: dict[str, str]) -> dict[str, str]:
    """A session opened as the SDK client opens it (initialize, then initialized): the
    headers its requests carry, its id among them."""
    async with session.post(url, json=INITIALIZE, headers=accept) as answer:
        headers = {**accept, "Mcp-Session-Id": answer.headers["Mcp-Session-Id"]}
        await answer.read()
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with session.post(url, json=note, headers=headers) as noted:
        await noted.read()
    return headers


async def tool_call_stream(url: str) -> bytes:
    """A session opened and a ``slow_count`` call sent, as the SDK client does; what its
    stream brought before it ended or broke off."""
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    got = b""
    async with aiohttp.ClientSession() as session:
        headers = await opened(session, url, accept)
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {
                "name": "slow_count",
                "arguments": {"n": 6, "delay": 0.1},
                "_meta": {"progressToken": 2},
            },
        }
        with contextlib.suppress(aiohttp.ClientPayloadError):
            async with session.post(url, json=call, headers=headers) as answer:
                async for data in answer.content.iter_any():
                    got += data
    return got


async def test_a_stream_without_ids_is_not_rejoined_and_the_log_says_why(record: RecordFactory) -> None:
    with run_mcp_server(sdk="1") as server:
        base = server.url.removesuffix("/mcp")
        async with Cutter(base, plan=cut_the_tool_call(2)) as cutter:
            rec = await record(cutter.url, hold=30.0, rejoin_for=2.0)
            got = await asyncio.wait_for(tool_call_stream(f"{rec.url}/mcp"), 20)
            assert len(cutter.cuts()) == 1
            assert cutter.count("GET") == 0  # nothing to resume from
        log = await rec.log()
    # Broken off where the agent's was (its last bytes as they came), with no result.
    assert b"counted 2 of 6" in got and b"counted 3 of 6" not in got and b"counted to 6" not in got
    with log:
        (row,) = log.db.conn.execute("SELECT side, outcome, error FROM resumes").fetchall()
    assert row[:2] == ("upstream", "not_resumable")
    assert "the agent gave the last event sent no id" in row[2]


def test_the_plan_resumes_from_the_last_event_only_while_the_answer_has_not_come() -> None:
    mcp = MCP()
    call = Request("POST", "/mcp?x=1", [("Mcp-Session-Id", "s1")], b'{"jsonrpc":"2.0","id":2}')
    progress = '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}'
    answer = '{"jsonrpc":"2.0","id":2,"result":{"content":[]}}'
    plan = mcp.resubscription(call, [progress], "e7")
    assert plan == Resubscription(
        "GET", "/mcp?x=1", None, (("Accept", "text/event-stream"), ("Last-Event-ID", "e7"))
    )
    assert mcp.resubscription(call, [progress], None) is None  # nothing to resume from
    assert mcp.resubscription(call, [progress, answer], "e8") is None  # it had ended


def test_the_last_agent_id_is_that_of_the_last_event_or_none() -> None:
    stamper = Stamper("tg1.")
    stamper.feed(b"id: a\ndata: 1\n\n")
    assert stamper.last_own() == "a"
    stamper.feed(b"data: 2\n\n")  # an event without an id after it: resuming from "a" would repeat it
    assert stamper.last_own() is None


async def dropped_and_resumed(url: str) -> tuple[str, bytes]:
    """A session opened and a ``slow_count`` call sent; its stream dropped after three
    events and resumed with a ``GET`` after the last, as the SDK client resumes: the
    session's id, and the events both connections brought."""
    accept = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "slow_count", "arguments": {"n": 6, "delay": 0.1}, "_meta": {"progressToken": 2}},
    }
    async with aiohttp.ClientSession() as session:
        headers = await opened(session, url, accept)
        got = b""
        async with session.post(url, json=call, headers=headers) as answer:
            while len([e for e in events_of(got) if e.complete and e.id]) < 3:
                got += await answer.content.readany()
        first = b"".join(e.raw for e in [e for e in events_of(got) if e.complete][:3])
        last_id = [e.id for e in events_of(first)][-1]
        again = {**headers, "Accept": "text/event-stream", "Last-Event-ID": last_id}
        async with session.get(url, headers=again) as resumed:
            rest = await resumed.read()
    return headers["Mcp-Session-Id"], first + rest


async def test_the_session_page_reads_a_reconnects_slice_once(record: RecordFactory) -> None:
    """The server gives no ids (no event store): the log holds its events without any and
    the reconnect's under the gateway's, which the page does not read as new progress."""
    with run_mcp_server(sdk="1") as server:
        rec = await record(server.url.removesuffix("/mcp"), hold=30.0)
        session_id, got = await asyncio.wait_for(dropped_and_resumed(f"{rec.url}/mcp"), 20)
        log = await rec.log()
    sent = [json.loads(e.data) for e in events_of(got) if e.complete and e.data]
    progress = [m["params"]["progress"] for m in sent if m.get("method") == "notifications/progress"]
    assert progress == [1, 2, 3, 4, 5, 6]  # the client got each once
    with log:
        (resume,) = log.db.conn.execute("SELECT side, outcome FROM resumes").fetchall()
    assert resume == ("client", "resumed")
    page = load_session(log.path, session_id)
    assert page is not None
    (called,) = [x for x in page.exchanges if x.tool == "slow_count"]
    assert [p.progress for p in called.progress] == progress
