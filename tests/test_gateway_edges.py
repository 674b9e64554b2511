"""Edges of the resume gateway (`tasktape record --resume`): what a refused reconnect is
told of a stream it could not follow, which requests with Last-Event-ID are reconnects at
all, clients waking a stream together after a restart, event ids a client cannot send back,
a hold running out as a client reconnects, and headers the client cannot be sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from loopback import answering, raw_upstream
from test_gateway_credentials import ALICE, first_of, gateway
from test_gateway_rejoin import breaking, gated, until_broken
from test_replay import events_of
from test_resume_gateway import REST_BODY, counted, first_events, rest_of

from tasktape.agent import create_agent_app
from tasktape.eventlog.resumes import Resume, ResumeSide
from tasktape.proxy.reconnects import line_of

MALLORY = {"Authorization": "Bearer mallory"}


async def unnumbered(request: web.Request) -> web.StreamResponse:
    """Ten events without ids (the recorder gives them its own), 0.1 s apart."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in range(10):
        await response.write(b"data: %d\n\n" % n)
        await asyncio.sleep(0.1)
    return response


async def refusal(url: str, headers: dict[str, str], last_id: str, path: str = "/s") -> tuple[int, str]:
    """A reconnect's status, and its refusal's message (empty when it was answered)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", data=b"{}", headers={"Last-Event-ID": last_id, **headers}) as r,
    ):
        body = await r.read()
    return r.status, json.loads(body)["error"]["message"] if r.status >= 400 else ""


async def first_ids(url: str, headers: dict[str, str], n: int, path: str = "/s") -> list[str]:
    """The ids of ``n`` events of a new stream; then the connection is dropped."""
    got = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", data=b"{}", headers=headers) as r,
    ):
        while len([e for e in events_of(got) if e.complete]) < n:
            got += await r.content.readany()
    return [e.id for e in events_of(got) if e.complete][:n]


async def test_a_refusal_tells_no_ids_of_a_stream_the_client_could_not_follow(record: RecordFactory) -> None:
    """The recorder's ids carry their stream's key: a 400 naming them to anyone who sends
    the same request with a made-up id would let anyone follow someone else's stream."""
    app = web.Application()
    app.router.add_post("/s", unnumbered)
    rec = await record(app, hold=30.0)
    ids = await first_ids(rec.url, ALICE, 2)
    for headers in ({}, MALLORY):  # no credentials, or others
        status, message = await refusal(rec.url, headers, "garbage")
        assert status == 400 and "names no event of the stream held here" in message
        assert "tg" not in message and "events" not in message
    # The client that opened it, naming a made-up id: how many events, not their keyed ids.
    status, message = await refusal(rec.url, ALICE, "garbage")
    assert status == 400 and "tg" not in message and " events" in message
    # Naming one of its ids (its key right) that it does not hold: the ids it holds.
    beyond = ids[0].rsplit(".", 1)[0] + ".99"
    status, message = await refusal(rec.url, ALICE, beyond)
    assert status == 400 and repr(ids[0]) in message
    # A stream opened without credentials: nobody is told its ids either.
    open_ids = await first_ids(rec.url, {}, 2, "/s?open")
    status, message = await refusal(rec.url, {}, "garbage")
    assert status == 400 and open_ids[0].rsplit(".", 1)[0] not in message and "tg" not in message


async def test_a_refusal_after_the_stream_was_let_go_tells_no_ids(record: RecordFactory) -> None:
    """The same once the hold let it go: the refusal says so, without its ids."""
    app = web.Application()
    app.router.add_post("/s", unnumbered)
    rec = await record(app, hold=0.2)
    await first_ids(rec.url, ALICE, 2)
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    await asyncio.sleep(0.5)
    for headers in ({}, ALICE):
        status, message = await refusal(rec.url, headers, "garbage")
        assert status == 400 and "was let go" in message and "tg" not in message


async def test_a_request_that_continues_no_stream_goes_to_the_agent(record: RecordFactory) -> None:
    """Last-Event-ID on a cancel, a read of the task, a subscribe of another task, or a
    stream request of the other binding: none continues the stream held, each is the
    agent's to answer (a cancel answered with the stream would never reach the agent)."""
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0)
    ask = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": REST_BODY}
    _, events = await first_events(rec.url, ask, 3, "/jsonrpc")
    task = json.loads(events[0].data)["result"]["task"]["id"]
    last = {"A2A-Version": "1.0", "Last-Event-ID": events[-1].id}
    async with aiohttp.ClientSession() as session:
        cancel = {"jsonrpc": "2.0", "id": 2, "method": "CancelTask", "params": {"id": task}}
        async with session.post(f"{rec.url}/jsonrpc", json=cancel, headers=last) as r:
            assert r.content_type == "application/json"
            assert (await r.json())["result"]["status"]["state"] == "TASK_STATE_CANCELED"
        async with session.get(f"{rec.url}/tasks/{task}", headers=last) as r:
            assert r.content_type == "application/json" and (await r.json())["id"] == task
        async with session.get(f"{rec.url}/tasks/nonexistent:subscribe", headers=last) as r:
            assert r.status == 404
        # The REST binding's stream request, after the JSON-RPC stream's id: a stream of its own.
        async with session.post(f"{rec.url}/message:stream", json=REST_BODY, headers=last) as r:
            rest = [e for e in events_of(await r.read()) if e.complete]
        assert r.status == 200 and "jsonrpc" not in rest[0].data
    assert seen.count("POST /jsonrpc") == 2 and seen.count("POST /message:stream") == 1
    assert seen.count("GET /tasks/nonexistent:subscribe") == 1 and f"GET /tasks/{task}" in seen


async def test_a_subscribe_of_the_streams_task_is_a_reconnect(record: RecordFactory) -> None:
    """A subscribe of the task a stream carries, on its binding, continues it: answered
    from what is held, never reaching the agent."""
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0)
    events = await first_of(rec.url, {}, 3)
    task = json.loads(events[0].data)["task"]["id"]
    headers = {"A2A-Version": "1.0", "Last-Event-ID": events[-1].id}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{rec.url}/tasks/{task}:subscribe", headers=headers) as r,
    ):
        rest = [e for e in events_of(await r.read()) if e.complete]
    assert r.status == 200 and "TASK_STATE_COMPLETED" in rest[-1].data
    assert not any(s.endswith(":subscribe") for s in seen)


@web.middleware
async def alice_slowly(request: web.Request, handler: Any) -> web.StreamResponse:
    """Only Alice is let in; anyone else is told so after 0.3 s."""
    if request.headers.get("Authorization") != ALICE["Authorization"]:
        await asyncio.sleep(0.3)
        return web.json_response({"error": "unauthorized"}, status=401)
    return await handler(request)


async def test_a_client_waiting_on_anothers_wake_that_failed_is_asked_for_itself(
    tmp_path: Path, serve: Serve
) -> None:
    """After a restart, Mallory's reconnect asks the agent first; Alice, reconnecting
    meanwhile, waits for that, and is let in on her own credentials when Mallory is not."""
    app, seen = counted(create_agent_app(pace=0.3))
    app.middlewares.append(alice_slowly)
    agent = await serve(app)
    db = tmp_path / "gateway.db"
    async with gateway(db, agent) as url:
        events = await first_of(url, ALICE, 3)
    async with gateway(db, agent) as url:

        async def alice_later() -> tuple[int, bytes]:
            await asyncio.sleep(0.05)
            return await again_on(url, ALICE, events[-1].id)

        mallory, alice = await asyncio.gather(again_on(url, MALLORY, events[-1].id), alice_later())
    assert mallory[0] == 403
    assert alice[0] == 200 and "TASK_STATE_COMPLETED" in alice[1].decode()
    assert seen.count("POST /message:stream") == 1


async def again_on(url: str, headers: dict[str, str], last_id: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        hs = {"A2A-Version": "1.0", "Last-Event-ID": last_id, **headers}
        async with session.post(f"{url}/message:stream", json=REST_BODY, headers=hs) as r:
            return r.status, await r.read()


async def test_the_auth_scheme_is_compared_as_http_does(record: RecordFactory) -> None:
    """``bearer`` and ``Bearer`` are one scheme (RFC 9110 section 11.1)."""
    app = web.Application()
    app.router.add_post("/s", unnumbered)
    rec = await record(app, hold=30.0)
    ids = await first_ids(rec.url, {"Authorization": "Bearer tokA"}, 2)
    status, _ = await refusal(rec.url, {"Authorization": "bearer tokA"}, ids[-1])
    assert status == 200
    status, _ = await refusal(rec.url, {"Authorization": "Bearer toka"}, ids[-1])
    assert status == 403  # (the token itself is compared as it is)


@pytest.fixture
async def control_character_upstream() -> AsyncIterator[str]:
    """An upstream whose answer carries a header value with a control character (which
    aiohttp's own server would not send)."""

    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Ctl: a\x01b\r\nX-Ok: yes\r\n"
    async with raw_upstream(answering(head + b"Content-Length: 2\r\nConnection: close\r\n\r\nok")) as url:
        yield url


@pytest.mark.parametrize("hold", [None, 30.0], ids=["record", "resume"])
async def test_a_header_the_client_cannot_be_sent_is_left_out(
    record: RecordFactory, control_character_upstream: str, hold: float | None
) -> None:
    """The answer goes out without it (not a 500), and the log says which was left out."""
    rec = await record(control_character_upstream, hold=hold)
    async with aiohttp.ClientSession() as session, session.get(f"{rec.url}/x") as r:
        assert (r.status, await r.read(), "X-Ctl" in r.headers, r.headers["X-Ok"]) == (
            200,
            b"ok",
            False,
            "yes",
        )
    with await rec.log() as log:
        (exchange,) = log.exchanges()
    assert exchange["outcome"] == "complete" and "X-Ctl" in exchange["error"]


ODD_IDS = (b"id: good1", b"id: ", b"id:", b"id: e 2 ", b"id:  lead", b"id: tab\t", b"id: good2")


async def odd_ids(request: web.Request) -> web.StreamResponse:
    """Events whose ids a client cannot send back (empty, spaces around them) among good
    ones; in one chunk with ``?bulk=1``, else one event a chunk."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    events = [b"%s\ndata: %d\n\n" % (line, n) for n, line in enumerate(ODD_IDS)]
    for chunk in [b"".join(events)] if request.query.get("bulk") else events:
        await response.write(chunk)
        await asyncio.sleep(0.02)
    return response


@pytest.mark.parametrize("bulk", ["0", "1"], ids=["paced", "bulk"])
async def test_an_id_a_client_cannot_send_back_is_the_recorders(record: RecordFactory, bulk: str) -> None:
    """An empty id resets a client's last id (it would reconnect without one: a new task);
    spaces around one are stripped from the header it comes back in. Those events get the
    recorder's ids, the only bytes added to them, and a reconnect after each is answered."""
    app = web.Application()
    app.router.add_post("/s", odd_ids)
    rec = await record(app, hold=30.0)
    async with aiohttp.ClientSession() as session, session.post(f"{rec.url}/s?bulk={bulk}", data=b"{}") as r:
        sent = [e for e in events_of(await r.read()) if e.complete]
    ids = [e.id for e in sent]
    assert ids[0] == "good1" and ids[-1] == "good2" and all(i.startswith("tg") for i in ids[1:-1])
    assert [e.raw for e in sent][1].startswith(b"id: \ndata: 1\nid: tg")  # the agent's line kept
    for event_id in ids[:-1]:
        assert (await refusal(rec.url, {}, event_id, f"/s?bulk={bulk}"))[0] == 200, event_id


async def test_a_redirect_to_the_upstreams_base_with_a_query_stays_on_the_proxy(
    record: RecordFactory, serve: Serve
) -> None:
    """``Location: http://agent/api?x=1`` is the agent's root (``/api``) with a query, as
    ``/api?x=1`` and ``http://agent/api/next`` are its paths: the client stays on the record."""
    base = ""

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound(base + request.query["to"])

    app = web.Application()
    app.router.add_get("/api/moved", moved)
    base = f"{await serve(app)}/api"
    rec = await record(base)
    for to, local in (("?x=1", f"{rec.url}/?x=1"), ("/next", f"{rec.url}/next"), ("#top", f"{rec.url}/#top")):
        async with rec.session.get(f"{rec.url}/moved", params={"to": to}, allow_redirects=False) as r:
            assert r.headers["Location"] == local


async def test_a_reconnect_as_the_hold_runs_out_is_served(record: RecordFactory) -> None:
    """With ``--hold 0`` each stream is let go as its client drops: a reconnect at once
    comes while the agent's connection is being closed, and is served the rest (the task
    followed again), never an empty stream cut off."""
    rec = await record(create_agent_app(pace=0.02), hold=0.0)

    async def drop_and_come_back(delay: float) -> tuple[int, str]:
        _, events = await first_events(rec.url, REST_BODY, 3)
        await asyncio.sleep(delay)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{rec.url}/message:stream",
                json=REST_BODY,
                headers={"A2A-Version": "1.0", "Last-Event-ID": events[-1].id},
            ) as r,
        ):
            rest = [e for e in events_of(await r.read()) if e.complete]
        return r.status, rest[-1].data if rest else ""

    got = await asyncio.gather(*(drop_and_come_back(n / 2000) for n in range(24)))
    assert all(status == 200 and "TASK_STATE_COMPLETED" in last for status, last in got), got


PIECES = ["Alpha", " beta", " gamma", " delta", " epsilon", " zeta"]


async def a2a_without_ids(request: web.Request) -> web.StreamResponse:
    """An A2A agent that gives its events no ids (as the a2a-sdk's server): a task, its
    answer in six deltas 0.05 s apart, then COMPLETED; on REST and JSON-RPC alike."""
    body = await request.json()
    rpc_id = body.get("id")

    def event(obj: dict[str, Any]) -> bytes:
        framed = obj if rpc_id is None else {"jsonrpc": "2.0", "id": rpc_id, "result": obj}
        return b"data: " + json.dumps(framed).encode() + b"\n\n"

    def state(name: str) -> dict[str, Any]:
        return {"statusUpdate": {"taskId": "t1", "contextId": "c1", "status": {"state": name}}}

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(
        event({"task": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_SUBMITTED"}}})
    )
    await response.write(event(state("TASK_STATE_WORKING")))
    for n, piece in enumerate(PIECES):
        await asyncio.sleep(0.05)
        art = {"artifactId": "a1", "parts": [{"text": piece}]}
        update = {"taskId": "t1", "contextId": "c1", "artifact": art, "append": n > 0}
        await response.write(event({"artifactUpdate": {**update, "lastChunk": n == len(PIECES) - 1}}))
    await response.write(event(state("TASK_STATE_COMPLETED")))
    return response


def assembled(raw: bytes) -> str:
    """The answer as a client builds it from a stream: deltas appended to the text so far."""
    text = ""
    for e in events_of(raw):
        frame = json.loads(e.data) if e.complete and e.data else {}
        update = frame.get("result", frame).get("artifactUpdate")
        if update:
            piece = "".join(p["text"] for p in update["artifact"]["parts"])
            text = text + piece if update.get("append") else piece
    return text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/message:stream", REST_BODY),
        ("/", {"jsonrpc": "2.0", "id": 5, "method": "SendStreamingMessage", "params": REST_BODY}),
    ],
)
@pytest.mark.parametrize("wait", [0.0, 0.6], ids=["live", "ended"])
async def test_a_reconnects_slice_is_not_read_again_by_the_task_views(
    record: RecordFactory, path: str, body: dict[str, Any], wait: float
) -> None:
    """The agent gives no ids, so the log holds its events without any and the reconnect's
    under the gateway's: the task's answer is the client's, not the slice's text twice."""
    app = web.Application()
    app.router.add_post(path, a2a_without_ids)
    rec = await record(app, hold=30.0)
    first, events = await first_events(rec.url, body, 3, path)
    await asyncio.sleep(wait)  # (0.6 s: the stream has ended when the client comes back)
    status, rest = await rest_of(rec.url, body, events[-1].id, path)
    assert status == 200
    assert assembled(first + rest) == "".join(PIECES)
    with await rec.log() as log:
        (outcome,) = [r["outcome"] for r in log.db.query("SELECT outcome FROM resumes")]
        (summary,) = log.db.query("SELECT answer, final_state FROM task_summary")
        (artifact,) = log.db.query("SELECT text, events FROM task_artifacts")
    assert outcome == "resumed"
    assert summary == {"answer": "".join(PIECES), "final_state": "TASK_STATE_COMPLETED"}
    assert artifact == {"text": "".join(PIECES), "events": len(PIECES)}


async def test_a_stream_the_hold_let_go_is_said_to_be_taken_up_not_broken(record: RecordFactory) -> None:
    """A client coming back to a stream --hold let go wakes it (a subscribe): the line for
    that says so, not that the agent's stream broke, which it did not."""
    said: list[Resume] = []
    rec = await record(create_agent_app(pace=0.3), hold=0.2, on_resume=said.append)
    _, events = await first_events(rec.url, REST_BODY, 3)
    await asyncio.sleep(0.6)  # the hold runs out: the agent's stream is let go
    headers = {"A2A-Version": "1.0", "Last-Event-ID": events[-1].id}
    async with rec.session.post(f"{rec.url}/message:stream", json=REST_BODY, headers=headers) as r:
        rest = [e for e in events_of(await r.read()) if e.complete]
    assert r.status == 200 and "TASK_STATE_COMPLETED" in rest[-1].data
    upstream = [resume.describe() for resume in said if resume.side is ResumeSide.UPSTREAM]
    assert len(upstream) == 1 and "rejoined by exchange" in upstream[0], [r.describe() for r in said]
    assert "--hold let the agent's stream go with no client following (0.2 s)" in upstream[0]
    assert "broke" not in upstream[0]


async def by_topic(request: web.Request) -> web.StreamResponse:
    """The feed ``?topic=`` names: ten events e1 to e10, each naming its feed (every feed
    numbers its events alike); after the third, one every ``?pace=`` seconds."""
    topic, pace = request.query["topic"].encode(), float(request.query.get("pace", "0"))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in range(1, 11):
        await response.write(b"id: e%d\ndata: %s\n\n" % (n, topic))
        if n >= 3:
            await asyncio.sleep(pace)
    return response


async def feed_again(url: str, query: str, last_id: str) -> tuple[int, list[str]]:
    """A reconnect to the feed of ``query``: its status, and the data of what it is sent."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/s?{query}", headers={"Last-Event-ID": last_id}) as r,
    ):
        return r.status, [e.data for e in events_of(await r.read()) if e.complete]


async def test_a_reconnect_follows_the_stream_its_query_opened(record: RecordFactory) -> None:
    """One endpoint serves a feed per query, their ids alike: a reconnect to ``?topic=alpha``
    follows alpha's stream, never beta's opened after it; a feed no stream carried, named
    with an id nothing holds, is the agent's to answer (a new stream, not a 400)."""
    app, seen = counted(web.Application())
    app.router.add_get("/s", by_topic)
    rec = await record(app, hold=30.0)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{rec.url}/s?topic=alpha&pace=0.2") as r:
            got = b""
            while len([e for e in events_of(got) if e.complete]) < 3:
                got += await r.content.readany()
        async with session.get(f"{rec.url}/s?topic=beta&pace=0.2") as beta:
            await beta.content.readany()
            status, rest = await feed_again(rec.url, "topic=alpha&pace=0.2", "e1")
    assert (status, rest) == (200, ["alpha"] * 9)
    # An EventSource polyfill carries the id in the URL too (?lastEventId=): the same line.
    status, rest = await feed_again(rec.url, "topic=alpha&pace=0.2&lastEventId=e8", "e8")
    assert (status, rest) == (200, ["alpha"] * 2)
    assert await feed_again(rec.url, "topic=gamma", "never-sent") == (200, ["gamma"] * 10)
    assert sorted(seen) == ["GET /s"] * 3  # alpha, beta, and gamma's own


async def test_a_reconnect_to_a_stream_let_go_follows_the_one_its_query_opened(record: RecordFactory) -> None:
    """The same once the streams were let go and are answered from the log, whose query has
    its credentials redacted (``token=[REDACTED]``): the reconnect's token repeats it."""
    app, seen = counted(web.Application())
    app.router.add_get("/s", by_topic)
    rec = await record(app, hold=30.0, hold_bytes=0)
    async with aiohttp.ClientSession() as session:
        for query in ("topic=alpha&token=s3cret", "topic=beta&token=s3cret"):
            async with session.get(f"{rec.url}/s?{query}") as r:
                await r.read()
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    assert rec.proxy.live is not None and len(rec.proxy.live) == 0
    (await rec.log()).close()  # their ends are in the log
    assert await feed_again(rec.url, "topic=alpha&token=s3cret", "e7") == (200, ["alpha"] * 3)
    assert await feed_again(rec.url, "topic=gamma", "never-sent") == (200, ["gamma"] * 10)
    assert seen == ["GET /s"] * 3


@pytest.mark.parametrize("made_up", ["exchange", "event"])
async def test_an_id_with_a_number_too_long_to_read_names_no_event(
    record: RecordFactory, made_up: str
) -> None:
    """An id of the recorder's form whose exchange or event number runs to thousands of
    digits (past what Python reads) is refused as naming nothing, not a 500."""
    app = web.Application()
    app.router.add_post("/s", unnumbered)
    rec = await record(app, hold=30.0)
    (first,) = await first_ids(rec.url, {}, 1)
    digits = "9" * 5000
    last_id = f"tg{digits}-abcdefabcdef.1" if made_up == "exchange" else f"{first.rsplit('.', 1)[0]}.{digits}"
    status, message = await refusal(rec.url, {}, last_id)
    assert status == 400 and "names no event of the stream held here" in message
    with await rec.log() as log:
        (refused,) = log.db["resumes"].rows_where("outcome = 'refused'")
    assert refused["last_event_id"] == last_id


async def with_a_cookie(request: web.Request) -> web.StreamResponse:
    """Ten events e1 to e10, 20 ms apart, answered with a session cookie, a Date of its
    own and its timing (this response's alone), and a header of the stream's."""
    headers = {
        "Content-Type": "text/event-stream",
        "Set-Cookie": "session=first-clients; Path=/",
        "Date": "Mon, 01 Jan 2024 00:00:00 GMT",
        "Server-Timing": "agent;dur=12",
        "X-Feed": "news",
    }
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    for n in range(1, 11):
        await response.write(b"id: e%d\ndata: %d\n\n" % (n, n))
        await asyncio.sleep(0.02)
    return response


async def test_a_reconnect_is_not_sent_the_first_responses_own_headers(record: RecordFactory) -> None:
    """A reconnecting client is not handed the first client's cookie, nor its Date or
    timing; the stream's headers it is sent, and the log keeps what it was sent. The
    console counts what it was sent from the log as people do ("1 event")."""
    said: list[Resume] = []
    app = web.Application()
    app.router.add_get("/s", with_a_cookie)
    rec = await record(app, hold=30.0, on_resume=said.append)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{rec.url}/s") as r:
            assert r.headers["Set-Cookie"].startswith("session=first-clients")
            await r.read()
        async with session.get(f"{rec.url}/s", headers={"Last-Event-ID": "e9"}) as r:
            rest = [e.data for e in events_of(await r.read()) if e.complete]
            answered = r.headers
    assert rest == ["10"] and answered["X-Feed"] == "news" and answered["Content-Type"] == "text/event-stream"
    assert "Set-Cookie" not in answered and "Server-Timing" not in answered
    assert answered["Date"] != "Mon, 01 Jan 2024 00:00:00 GMT"
    with await rec.log() as log:
        (resumed,) = log.db["resumes"].rows
        logged = {
            name.lower()
            for name, _ in json.loads(log.exchange(resumed["new_exchange_id"])["response_headers"])
        }
    assert "x-feed" in logged and not logged & {"set-cookie", "date", "server-timing"}
    assert "e9: 1 event from the log, the rest of the stream" in said[0].describe()


@pytest.mark.parametrize(
    ("target", "line"),
    [
        ("/s?topic=a&lastEventId=e3", "GET /s?topic=a"),
        ("/s?lastEventId=e3&topic=a", "GET /s?topic=a"),
        ("/s?topic=a;lastEventId=e3", "GET /s?topic=a"),
        ("/s?lastEventId=e3", "GET /s"),
        ("/s?lastEventIdx=1", "GET /s?lastEventIdx=1"),
    ],
)
def test_the_id_a_polyfill_puts_in_the_query_is_no_part_of_the_line(target: str, line: str) -> None:
    """Wherever the parameter stands, and whichever separator is before it."""
    assert line_of("GET", target) == line


async def one_id_for_several(request: web.Request) -> web.StreamResponse:
    """Five events, the first three of one id (as an agent that names its run, not its events)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n, event_id in enumerate([b"run-1", b"run-1", b"run-1", b"b", b"c"]):
        await response.write(b"id: %s\ndata: %d\n\n" % (event_id, n))
    return response


async def test_a_reconnect_after_an_id_the_agent_gave_several_events_is_refused(
    record: RecordFactory,
) -> None:
    """Which of them the client got last cannot be told: answered after the first, it would
    be sent the others again. An id that names one event is answered as ever."""
    app = web.Application()
    app.router.add_post("/s", one_id_for_several)
    rec = await record(app, hold=30.0)
    async with aiohttp.ClientSession() as session, session.post(f"{rec.url}/s", data=b"{}") as r:
        sent = [e for e in events_of(await r.read()) if e.complete]
    assert [e.id for e in sent] == ["run-1", "run-1", "run-1", "b", "c"]  # as the agent gave them
    status, message = await refusal(rec.url, {}, "run-1")
    assert status == 409 and "the agent gave 3 events of the stream the id run-1" in message
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rec.url}/s", data=b"{}", headers={"Last-Event-ID": "b"}) as r,
    ):
        assert [e.data for e in events_of(await r.read()) if e.complete] == ["4"]
    with await rec.log() as log:
        outcomes = [row["outcome"] for row in log.db["resumes"].rows]
    assert outcomes == ["refused", "resumed"]


async def test_a_reconnect_after_the_last_event_of_a_stream_cut_off_is_cut_off(
    record: RecordFactory, serve: Serve
) -> None:
    """The agent's stream broke and could not be rejoined: a reconnect after its last event
    ends as the stream did (the head, then the connection closed), never a 204, which would
    tell an EventSource the answer ended and stop it for good."""
    agent = await serve(create_agent_app(pace=0.05))
    front, seen = breaking(agent, after=4)
    rec = await record(await serve(gated(front)), hold=30.0, rejoin_for=0.5)
    got = [e for e in events_of(await until_broken(rec.url, {})) if e.complete]
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{rec.url}/message:stream",
            json=REST_BODY,
            headers={"A2A-Version": "1.0", "Last-Event-ID": got[-1].id},
        ) as r,
    ):
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    with await rec.log() as log:
        rows = [(row["side"], row["outcome"]) for row in log.db["resumes"].rows]
    assert rows == [("upstream", "gave_up"), ("client", "resumed")]
    assert seen.count("POST /message:stream") == 1
