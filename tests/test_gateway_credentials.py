"""Who may follow a held stream again (`tasktape record --resume`): a reconnect is answered
only with the credentials the stream was opened with, and only after an id its clients
were sent (the recorder's ids carry a key of their stream no other stream's clients know).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import RecordFactory, Serve
from sdk_agent import run_sdk_agent
from test_replay import events_of
from test_resume_gateway import EVENT, REST_BODY, counted, first_events, rest_of, ten_events

from tasktape.agent import create_agent_app
from tasktape.eventlog import LogWriter
from tasktape.proxy.recorder import RecordingProxy

ALICE = {"Authorization": "Bearer alice"}


async def first_of(url: str, headers: dict[str, str], n: int, path: str = "/message:stream") -> list[Any]:
    """``n`` events of a new stream, then the connection dropped."""
    got = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", json=REST_BODY, headers={"A2A-Version": "1.0", **headers}) as r,
    ):
        while len([e for e in events_of(got) if e.complete]) < n:
            got += await r.content.readany()
    return [e for e in events_of(got) if e.complete][:n]


async def again(
    url: str, headers: dict[str, str], last_id: str, path: str = "/message:stream"
) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        hs = {"A2A-Version": "1.0", "Last-Event-ID": last_id, **headers}
        async with session.post(f"{url}{path}", json=REST_BODY, headers=hs) as r:
            return r.status, await r.read()


@contextlib.asynccontextmanager
async def gateway(db: Path, agent: str, hold: float = 30.0) -> AsyncIterator[str]:
    """A resuming recorder on ``db`` for the span of the block: stopped as Ctrl-C stops it."""
    writer = LogWriter(db)
    server = TestServer(RecordingProxy(agent, writer, hold=hold).app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
        await writer.aclose()


async def test_a_reconnect_with_other_credentials_is_refused(record: RecordFactory) -> None:
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0)
    events = await first_of(rec.url, ALICE, 3)  # the agent's own ids
    for other in ({"Authorization": "Bearer mallory"}, {}, {**ALICE, "Cookie": "session=1"}):
        status, body = await again(rec.url, other, events[-1].id)
        message = json.loads(body)["error"]["message"]
        assert status == 403 and "other credentials than the one that opened the stream" in message
    status, rest = await again(rec.url, {"authorization": "Bearer alice"}, events[-1].id)  # any case
    assert status == 200 and "TASK_STATE_COMPLETED" in rest.decode()
    assert seen == ["POST /message:stream"]  # none of them reached the agent
    await rec.proxy.wait_idle()
    with await rec.log() as log:
        rows = list(log.db.query("SELECT outcome, last_event_id, error FROM resumes WHERE side = 'client'"))
    assert [r["outcome"] for r in rows] == ["refused"] * 3 + ["resumed"]
    assert all(r["last_event_id"] == events[-1].id for r in rows)


async def test_with_resume_unknown_forward_other_credentials_go_to_the_agent(record: RecordFactory) -> None:
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0, resume_unknown="forward")
    events = await first_of(rec.url, ALICE, 2)
    status, _ = await again(rec.url, {"Authorization": "Bearer mallory"}, events[-1].id)
    assert status == 200 and seen == ["POST /message:stream"] * 2  # the agent answers it as it sees fit


async def test_the_headers_compared_are_those_given(record: RecordFactory) -> None:
    app = web.Application()
    app.router.add_post("/{name}", ten_events)
    rec = await record(app, hold=30.0, credential_headers=["X-Tenant-Token"])
    events = await first_of(rec.url, {"X-Tenant-Token": "t1", "Authorization": "a"}, 4, "/a")
    status, _ = await again(rec.url, {"X-Tenant-Token": "t2", "Authorization": "a"}, events[1].id, "/a")
    assert status == 403
    status, rest = await again(
        rec.url, {"X-Tenant-Token": "t1"}, events[1].id, "/a"
    )  # Authorization not compared
    assert status == 200 and len([e for e in events_of(rest) if e.complete]) == 8


async def test_a_stream_let_go_is_answered_from_the_log_with_its_credentials_only(
    record: RecordFactory,
) -> None:
    app, seen = counted(web.Application())
    app.router.add_post("/{name}", ten_events)
    stream = len(EVENT * 10) + 10 * len(b"id: tg1-0123456789ab.10\n")
    rec = await record(app, hold=30.0, hold_bytes=stream * 3 // 2)
    got = {}
    for name in ("a", "b"):  # b's end lets a go
        got[name] = await first_of(rec.url, ALICE, 10, f"/{name}?ids=0")
    await rec.proxy.wait_idle()
    (await rec.log()).close()
    fifth = got["a"][4].id
    status, _ = await again(rec.url, {"Authorization": "Bearer mallory"}, fifth, "/a?ids=0")
    assert status == 403
    status, rest = await again(rec.url, ALICE, fifth, "/a?ids=0")
    assert status == 200 and rest == b"".join(e.raw for e in got["a"][5:])
    assert seen == ["POST /a", "POST /b"]


async def test_the_recorders_ids_of_one_stream_do_not_name_another(record: RecordFactory) -> None:
    app, seen = counted(web.Application())
    app.router.add_post("/{name}", ten_events)
    rec = await record(app, hold=30.0)
    a = await first_of(rec.url, {}, 10, "/a?ids=0")
    b = await first_of(rec.url, {}, 10, "/a?ids=0")
    key_a, key_b = (re.fullmatch(r"tg(\d+)-([0-9a-f]{12})\.1", s[0].id).groups() for s in (a, b))  # type: ignore[union-attr]
    assert key_a[1] != key_b[1]
    # b's key with a's exchange: a guess at a's ids from b's, not one of a's
    status, body = await again(rec.url, {}, f"tg{key_a[0]}-{key_b[1]}.5", "/a?ids=0")
    assert status == 400 and "names no event of the stream held here" in json.loads(body)["error"]["message"]
    status, rest = await again(rec.url, {}, a[4].id, "/a?ids=0")
    assert status == 200 and rest == b"".join(e.raw for e in a[5:])
    assert seen == ["POST /a", "POST /a"]


@web.middleware
async def alice_only(request: web.Request, handler: Any) -> web.StreamResponse:
    """The agent's own check: only Alice is let in."""
    if request.headers.get("Authorization") != ALICE["Authorization"]:
        return web.json_response({"error": "unauthorized"}, status=401)
    return await handler(request)


async def test_a_stream_taken_up_after_a_restart_is_followed_by_whom_the_agent_lets_in(
    tmp_path: Path, serve: Serve
) -> None:
    app, seen = counted(create_agent_app(pace=0.3))
    app.middlewares.append(alice_only)
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    async with gateway(db, agent) as url:
        events = await first_of(url, ALICE, 3)  # (its stream is cut short, for the next run to take up)
    async with gateway(db, agent) as url:
        # The log has no credentials: the agent is asked for the task with the client's.
        status, body = await again(url, {"Authorization": "Bearer mallory"}, events[-1].id)
        assert status == 403 and b"TASK_STATE" not in body  # nothing of the stream
        async with aiohttp.ClientSession() as session:
            hs = {"A2A-Version": "1.0", "Last-Event-ID": events[-1].id, **ALICE}
            async with session.post(f"{url}/message:stream", json=REST_BODY, headers=hs) as woken:
                assert woken.status == 200
                await woken.content.readany()
                status, _ = await again(url, {"Authorization": "Bearer mallory"}, events[-1].id)
                assert status == 403
                status, rest = await again(url, ALICE, events[-1].id)
                assert status == 200 and "TASK_STATE_COMPLETED" in rest.decode()
    assert seen.count("POST /message:stream") == 1  # one task


@web.middleware
async def token_only(request: web.Request, handler: Any) -> web.StreamResponse:
    """The agent's own check, of a token in the query: only ``?token=SECRET`` is let in."""
    if request.query.get("token") != "SECRET":
        return web.json_response({"error": "unauthorized"}, status=401)
    return await handler(request)


async def test_a_token_in_the_query_read_back_from_the_log_is_a_credential(
    tmp_path: Path, serve: Serve
) -> None:
    """The log keeps a query's credentials redacted (``?token=[REDACTED]``): after a
    restart, a reconnect with any token repeats the stream's request line, and the
    stream's request counts as one that carried credentials. An agent that cannot be asked
    (no protocol) leaves every such reconnect refused, as the agent refused it before."""
    app, seen = counted(web.Application(middlewares=[token_only]))
    app.router.add_post("/{name}", ten_events)
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    async with gateway(db, agent) as url:
        events = await first_of(url, {}, 10, "/a?token=SECRET")
        status, _ = await again(url, {}, events[4].id, "/a?token=WRONG")
        assert status == 401  # another request line: the agent's to answer
    async with gateway(db, agent) as url:
        for token in ("WRONG", "SECRET"):
            status, body = await again(url, {}, events[4].id, f"/a?token={token}")
            assert status == 403, body
            assert "the agent did not let this client see the task" in json.loads(body)["error"]["message"]
    assert seen == ["POST /a", "POST /a"]  # nothing of the stream went out again


async def test_an_id_the_log_lacks_is_refused_naming_its_ids_after_a_restart(tmp_path: Path) -> None:
    """A stream opened without credentials, taken up from the log after a restart: a
    client that got an event the log lacks (a kill) and reconnects after it is told the
    ids the log holds, as before the restart, and can resume after the last of them."""
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "slow one two three"}]}}
    db = tmp_path / "gateway.db"
    with run_sdk_agent() as agent:
        async with gateway(db, agent.url) as url:
            _, events = await first_events(url, body, 2)  # (its stream is cut short, for the next run)
        prefix = events[0].id.rpartition(".")[0]  # the recorder's ids: its key right
        async with gateway(db, agent.url) as url:
            status, answer = await rest_of(url, body, f"{prefix}.99")
            message = json.loads(answer)["error"]["message"]
            assert status == 400 and "names no event of the stream held here" in message
            key = re.escape(prefix)
            held = re.search(rf"it holds (\d+) events \('{key}\.1' to '({key}\.\d+)'\)", message)
            assert held is not None, message
            status, rest = await rest_of(url, body, held[2])
    assert status == 200 and "TASK_STATE_COMPLETED" in rest.decode()


@web.middleware
async def alice_only_forbidden(request: web.Request, handler: Any) -> web.StreamResponse:
    """The agent's own check, answering a 403 to anyone but Alice."""
    if request.headers.get("Authorization") != ALICE["Authorization"]:
        return web.json_response({"error": "forbidden"}, status=403)
    return await handler(request)


async def nothing_held(proxy: RecordingProxy) -> bool:
    """Whether the proxy comes to hold no stream (polled; False after 10 s)."""
    assert proxy.live is not None
    for _ in range(200):
        if not len(proxy.live):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_stream_a_refused_client_woke_is_let_go_after_the_hold(record: RecordFactory) -> None:
    """--hold lets the agent's stream go before its task ended; a client the agent
    refuses reconnects: the stream, read back from the log to be woken, is asleep again,
    and is let go after the hold as any stream nobody follows (it was held for good)."""
    app = create_agent_app(pace=1.0)
    app.middlewares.append(alice_only_forbidden)
    rec = await record(app, hold=0.3)
    events = await first_of(rec.url, ALICE, 3)
    assert await nothing_held(rec.proxy)  # let go though the agent still streams
    for _ in range(3):
        status, body = await again(rec.url, {"Authorization": "Bearer mallory"}, events[-1].id)
        message = json.loads(body)["error"]["message"]
        assert status == 403 and "the agent did not let this client see the task" in message
        assert "--hold let the agent's stream go" in message and "earlier run" not in message
    assert await nothing_held(rec.proxy)


async def test_a_client_that_leaves_while_the_agent_is_asked_leaves_the_stream_to_the_next(
    record: RecordFactory,
) -> None:
    """A client reconnects to a stream --hold let go, and leaves while the agent is asked
    whether it may follow: the stream is asleep again, for the next client to wake (it was
    neither asleep nor followed, held for good, and the next client got nothing)."""
    asked = asyncio.Event()

    @web.middleware
    async def slow_to_answer(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "GET" and request.path.startswith("/tasks/") and not asked.is_set():
            asked.set()
            await asyncio.sleep(1.0)  # (the client leaves meanwhile)
        return await handler(request)

    app = create_agent_app(pace=0.3)
    app.middlewares.extend([alice_only_forbidden, slow_to_answer])
    rec = await record(app, hold=0.3)
    events = await first_of(rec.url, ALICE, 3)
    assert await nothing_held(rec.proxy)  # let go though the agent still streams
    leaving = asyncio.create_task(again(rec.url, ALICE, events[-1].id))
    await asyncio.wait_for(asked.wait(), 10)
    leaving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await leaving
    status, rest = await asyncio.wait_for(again(rec.url, ALICE, events[-1].id), 20)
    assert status == 200 and "TASK_STATE_COMPLETED" in rest.decode()


async def test_a_query_token_of_a_stream_taken_up_asleep_is_asked_about(tmp_path: Path, serve: Serve) -> None:
    """A JSON-RPC stream opened with ``?token=SECRET`` and still running at a restart is
    taken up asleep: waking it for a reconnect with ``?token=WRONG`` counted header
    credentials only, so the reconnect got the private events. The agent is asked now,
    without the query (it never sees the client's), and refuses: a 403."""
    app, seen = counted(create_agent_app(pace=0.3))
    app.middlewares.append(token_only)
    agent = await serve(app)
    ask = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": REST_BODY}
    db = tmp_path / "gateway.db"
    headers = {"A2A-Version": "1.0"}
    async with gateway(db, agent) as url:
        got = b""
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/jsonrpc?token=SECRET", json=ask, headers=headers) as r,
        ):
            while len([e for e in events_of(got) if e.complete]) < 3:
                got += await r.content.readany()
        last = [e for e in events_of(got) if e.complete][2].id
    async with gateway(db, agent) as url, aiohttp.ClientSession() as session:
        hs = {**headers, "Last-Event-ID": last}
        async with session.post(f"{url}/jsonrpc?token=WRONG", json=ask, headers=hs) as r:
            status, body = r.status, await r.read()
    assert status == 403 and b"TASK_STATE" not in body
    assert seen[0] == "POST /jsonrpc"
