"""The resume gateway survives its own SIGKILL: restarted on the same log, it answers a
client's Last-Event-ID from the log and carries the stream on through a subscribe to the
agent, which sees one task."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import Serve
from loopback import running, stop
from test_gateway_credentials import ALICE, again, alice_only, first_of, gateway
from test_gateway_rejoin import frames, read_all, text_of
from test_replay import events_of
from test_resume_gateway import EVENT, HEADERS, REST_BODY, counted, ten_events

from tasktape.agent import create_agent_app
from tasktape.eventlog import LogWriter
from tasktape.proxy.recorder import RecordingProxy


# Paced so that the agent's task is still running when the gateway is back (REST: the
# rest comes live), or has ended by then (JSON-RPC: the rest is made up from its snapshot).
@pytest.mark.parametrize(("path", "pace"), [("/message:stream", 3.0), ("/jsonrpc", 1.0)])
async def test_a_killed_gateway_restarted_carries_the_stream_on(
    tmp_path: Path, serve: Serve, path: str, pace: float
) -> None:
    body = (
        REST_BODY
        if path == "/message:stream"
        else {"jsonrpc": "2.0", "id": 9, "method": "SendStreamingMessage", "params": REST_BODY}
    )
    plain = await serve(create_agent_app(pace=0.02))
    whole = text_of(await read_all(plain, body, path))
    app, seen = counted(create_agent_app(pace=pace))
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    args = ("record", "--upstream", agent, "--db", str(db), "--resume", "--listen", "127.0.0.1:0")
    kept = await killed_mid_stream(args, path, body)
    last = [e for e in events_of(kept) if e.complete][-1].id
    async with running(*args) as second:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{second.url}{path}", json=body, headers={**HEADERS, "Last-Event-ID": last}) as r,
        ):
            assert r.status == 200, await r.text()
            rest = await r.read()
        assert await stop(second) == 0
    assert text_of(kept + rest) == whole  # nothing lost, nothing twice
    assert "TASK_STATE_COMPLETED" in str(frames(rest)[-1])
    ids = [e.id for e in events_of(kept + rest) if e.complete]
    assert len(ids) == len(set(ids))
    assert seen.count(f"POST {path}") == 1 + (path == "/jsonrpc")  # the task, then (JSON-RPC) its subscribe
    assert len([s for s in seen if s.endswith(":subscribe")]) == (path != "/jsonrpc")
    printed = "".join(second.printed)
    assert f"a client reconnected after {last}" in printed
    assert "tasktape record restarted while it held the stream: rejoined by exchange" in printed
    with sqlite3.connect(db) as conn:
        sides = conn.execute("SELECT side, outcome FROM resumes ORDER BY id").fetchall()
    assert sides == [("client", "resumed"), ("upstream", "rejoined")]


async def killed_mid_stream(args: tuple[str, ...], path: str, body: object) -> bytes:
    """The whole events a client got of a stream through ``tasktape record ARGS``, which
    is SIGKILLed once the client has five."""
    got = b""
    async with (
        running(*args) as first,
        aiohttp.ClientSession() as session,
        session.post(f"{first.url}{path}", json=body, headers=HEADERS) as r,
    ):
        while len([e for e in events_of(got) if e.complete]) < 5:
            got += await r.content.readany()
        await asyncio.sleep(0.3)  # the log holds what was forwarded up to 0.1 s before a kill
        os.kill(first.proc.pid, signal.SIGKILL)
        await first.proc.wait()
        with pytest.raises(aiohttp.ClientError):  # its stream broke with the gateway
            while await r.content.readany():
                pass  # events the client never took in: it resumes after the fifth
    return b"".join(e.raw for e in events_of(got) if e.complete)


async def test_a_stream_taken_up_after_a_restart_and_let_go_by_hold_bytes_is_woken(
    tmp_path: Path, serve: Serve
) -> None:
    """Asleep after the restart, the stream is let go at once (past --hold-bytes): a client
    that comes back has it read back from the log and woken, as one --hold let go is,
    never told it ended (its task still running)."""
    plain = await serve(create_agent_app(pace=0.02))
    whole = text_of(await read_all(plain, REST_BODY))
    app, seen = counted(create_agent_app(pace=3.0))
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    args = ("record", "--upstream", agent, "--db", str(db), "--resume", "--listen", "127.0.0.1:0")
    kept = await killed_mid_stream(args, "/message:stream", REST_BODY)
    last = [e for e in events_of(kept) if e.complete][-1].id
    async with running(*args, "--hold-bytes", "1") as second:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{second.url}/message:stream", json=REST_BODY, headers={**HEADERS, "Last-Event-ID": last}
            ) as r,
        ):
            assert r.status == 200, await r.text()
            rest = await r.read()
        assert await stop(second) == 0
    assert text_of(kept + rest) == whole  # nothing lost, nothing twice
    assert "TASK_STATE_COMPLETED" in str(frames(rest)[-1])
    assert seen.count("POST /message:stream") == 1
    printed = "".join(second.printed)
    assert "tasktape record restarted while it held the stream: rejoined by exchange" in printed
    with sqlite3.connect(db) as conn:
        sides = conn.execute("SELECT side, outcome FROM resumes ORDER BY id").fetchall()
    assert sides == [("client", "resumed"), ("upstream", "rejoined")]


# A stream that ended before the gateway stopped is still held after it restarts (for the
# rest of its --hold): a reconnect to it is answered from the log, never sent on to the
# agent as a new request (it would start the task again).
@pytest.mark.parametrize("ids", [False, True], ids=["recorders-ids", "agents-ids"])
async def test_a_stream_that_ended_before_a_restart_is_answered_from_the_log(
    tmp_path: Path, serve: Serve, ids: bool
) -> None:
    app, seen = counted(web.Application())
    app.router.add_post("/{name}", ten_events)
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    async with gateway(db, agent) as url:
        events = await first_of(url, {}, 4, f"/a?ids={int(ids)}")
        await asyncio.sleep(0.2)  # the stream ends upstream, held
    async with gateway(db, agent) as url:
        status, rest = await again(url, {}, events[-1].id, f"/a?ids={int(ids)}")
        assert status == 200, rest
        assert len([e for e in events_of(rest) if e.complete]) == 6
        status, body = await again(url, {}, "no-such-id", f"/a?ids={int(ids)}")
        assert status == 400 and "was let go" in json.loads(body)["error"]["message"]
    assert seen == ["POST /a"]  # one stream: neither reconnect reached the agent
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT outcome, events_from_log FROM resumes ORDER BY id").fetchall()
    assert rows == [("resumed", 6), ("refused", None)]


async def test_a_stream_that_ended_before_a_restart_is_followed_by_whom_the_agent_lets_in(
    tmp_path: Path, serve: Serve
) -> None:
    app, seen = counted(create_agent_app(pace=0.01))
    app.middlewares.append(alice_only)
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    async with gateway(db, agent) as url:
        events = await first_of(url, ALICE, 3)
        await asyncio.sleep(0.5)  # the task completes, held
    async with gateway(db, agent) as url:
        # The log keeps no credentials: the agent is asked for the task with the client's.
        status, body = await again(url, {"Authorization": "Bearer mallory"}, events[-1].id)
        assert status == 403 and b"TASK_STATE" not in body, body
        assert "the agent did not let this client see the task" in json.loads(body)["error"]["message"]
        status, rest = await again(url, ALICE, events[-1].id)
        assert status == 200 and "TASK_STATE_COMPLETED" in rest.decode()
    assert seen.count("POST /message:stream") == 1  # one task


async def slow_events(request: web.Request) -> web.StreamResponse:
    """An event every 50 ms, for a minute: of no protocol the recorder knows how to rejoin."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(1200):
        await response.write(EVENT)
        await asyncio.sleep(0.05)
    return response


async def test_after_a_kill_streams_that_ended_or_cannot_go_on_are_answered_from_the_log(
    tmp_path: Path, serve: Serve
) -> None:
    app, seen = counted(web.Application())
    app.router.add_post("/slow", slow_events)
    app.router.add_post("/{name}", ten_events)
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    args = ("record", "--upstream", agent, "--db", str(db), "--resume", "--listen", "127.0.0.1:0")
    async with running(*args) as first, aiohttp.ClientSession() as session:
        ended = await first_of(first.url, {}, 4, "/a")
        async with session.post(f"{first.url}/slow", data=b"{}") as r:
            got = b""
            while len([e for e in events_of(got) if e.complete]) < 3:
                got += await r.content.readany()
            await asyncio.sleep(0.3)  # the log holds what was forwarded up to 0.1 s before a kill
            os.kill(first.proc.pid, signal.SIGKILL)
            await first.proc.wait()
    cut = [e for e in events_of(got) if e.complete][2]
    async with running(*args) as second:
        status, rest = await again(second.url, {}, ended[-1].id, "/a")
        assert status == 200 and len([e for e in events_of(rest) if e.complete]) == 6
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{second.url}/slow", data=b"{}", headers={"Last-Event-ID": cut.id}) as r,
        ):
            assert r.status == 200
            after = b""
            with pytest.raises(aiohttp.ClientPayloadError):  # cut short, as the kill cut it
                while chunk := await r.content.readany():
                    after += chunk
        following = [e for e in events_of(after) if e.complete]
        assert following and all(e.data == EVENT[6:-2].decode() for e in following)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{second.url}/slow", data=b"{}", headers={"Last-Event-ID": following[-1].id}) as r,
        ):
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):  # nothing more, and cut short as it was
                await r.read()
        assert await stop(second) == 0
    assert seen == ["POST /a", "POST /slow"]  # no reconnect reached the agent
    printed = "".join(second.printed)
    assert f"after {ended[-1].id}: 6 events from the log, the rest of the stream, which had ended" in printed


async def held_after_restart(db: Path, agent: str, hold_bytes: int) -> int:
    """How many streams a resuming recorder restarted on ``db`` holds once started."""
    writer = LogWriter(db)
    proxy = RecordingProxy(agent, writer, hold=30.0, hold_bytes=hold_bytes)
    server = TestServer(proxy.app, host="127.0.0.1")
    await server.start_server()
    try:
        assert proxy.live is not None
        return len(proxy.live)
    finally:
        await server.close()
        await writer.aclose()


async def test_streams_taken_up_after_a_restart_are_held_within_hold_bytes(
    tmp_path: Path, serve: Serve
) -> None:
    """Asleep, nothing reads them: they count toward --hold-bytes as streams that ended do."""
    agent = await serve(create_agent_app(pace=1.0))
    db = tmp_path / "gateway.db"
    async with gateway(db, agent) as url:
        for _ in range(2):
            await first_of(url, ALICE, 3)  # (cut short, for the next runs to take up)
    assert await held_after_restart(db, agent, 64 * 1024 * 1024) == 2
    assert await held_after_restart(db, agent, 1) == 0  # each past the bound: let go at once
