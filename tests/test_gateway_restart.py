"""The resume gateway survives its own SIGKILL: restarted on the same log, it answers a
client's Last-Event-ID from the log and carries the stream on through a subscribe to the
agent, which sees one task."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from conftest import Serve
from loopback import running, stop
from test_gateway_rejoin import frames, read_all, text_of
from test_replay import events_of
from test_resume_gateway import HEADERS, REST_BODY, counted

from tasktape.agent import create_agent_app


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
    kept = b"".join(e.raw for e in events_of(got) if e.complete)
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
    assert f"a client reconnected after {last}" in printed and "rejoined by exchange" in printed
    with sqlite3.connect(db) as conn:
        sides = conn.execute("SELECT side, outcome FROM resumes ORDER BY id").fetchall()
    assert sides == [("client", "resumed"), ("upstream", "rejoined")]
