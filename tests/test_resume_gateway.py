"""The resume gateway (``tasktape record --resume``), as far as it goes: held streams with
an id on every event, clients that drop and reconnect with Last-Event-ID followed again
from the held stream (the agent sees one request), JSON-RPC reconnects answered with their
own id, the upstream read to its end with nobody following, and the hold (in seconds and in
bytes) letting it go."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import socket
import time
import weakref
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from sdk_agent import SdkAgent, run_sdk_agent
from test_replay import events_of

from tasktape.agent import create_agent_app
from tasktape.eventlog.checker import report_log
from tasktape.proxy import live as live_module
from tasktape.proxy import recorder as recorder_module
from tasktape.proxy.live import recorders_exchange
from tasktape.replay import ReplayServer, load

QUESTION = "What does J45.909 mean?"
REST_BODY = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": QUESTION}]}}
HEADERS = {"A2A-Version": "1.0"}


@pytest.fixture(scope="module")
def sdk_agent() -> Any:
    with run_sdk_agent() as running:
        yield running


def counted(app: web.Application) -> tuple[web.Application, list[str]]:
    """The app, and the requests that reach it."""
    seen: list[str] = []

    async def count(request: web.Request, response: web.StreamResponse) -> None:
        seen.append(f"{request.method} {request.path}")

    app.on_response_prepare.append(count)
    return app, seen


async def first_events(url: str, body: Any, n: int, path: str = "/message:stream") -> tuple[bytes, list[Any]]:
    """Read ``n`` events of a stream, then drop the connection."""
    got = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", json=body, headers=HEADERS) as r,
    ):
        while len([e for e in events_of(got) if e.complete]) < n:
            got += await r.content.readany()
    events = [e for e in events_of(got) if e.complete][:n]
    return b"".join(e.raw for e in events), events


async def rest_of(url: str, body: Any, last_id: str, path: str = "/message:stream") -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", json=body, headers={**HEADERS, "Last-Event-ID": last_id}) as r,
    ):
        return r.status, await r.read()


async def upstream_stream(rec: Any) -> bytes:
    """What the upstream sent, as the log holds it."""
    with await rec.log() as log:
        (first, *_) = [x for x in log.exchanges() if x["is_sse"]]
        return log.body(first["id"])


async def test_a_client_that_drops_follows_the_stream_again(record: RecordFactory) -> None:
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0)
    before, events = await first_events(rec.url, REST_BODY, 5)
    status, after = await rest_of(rec.url, REST_BODY, events[-1].id)
    assert status == 200
    # Every event once, in order, its bytes as the agent sent them (it sends ids itself).
    await rec.proxy.wait_idle()
    assert before + after == await upstream_stream(rec)
    assert seen.count("POST /message:stream") == 1  # the agent started one task
    assert "TASK_STATE_COMPLETED" in after.decode().rstrip().splitlines()[-1]


async def test_a_last_event_id_parameter_is_no_part_of_the_request_repeated(record: RecordFactory) -> None:
    """An EventSource polyfill carries the id in the query too (``?lastEventId=``): the
    reconnect is still the request that opened the stream, as its protocol reads it, and
    never reaches the agent (where it would start a second task)."""
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0)
    before, events = await first_events(rec.url, REST_BODY, 3)
    path = f"/message:stream?lastEventId={events[-1].id}"
    status, after = await rest_of(rec.url, REST_BODY, events[-1].id, path)
    assert status == 200
    await rec.proxy.wait_idle()
    assert before + after == await upstream_stream(rec)  # the events after it, once each
    assert seen == ["POST /message:stream"]


async def test_events_without_ids_get_the_gateway_s(record: RecordFactory, sdk_agent: SdkAgent) -> None:
    rec = await record(sdk_agent.url, hold=30.0)
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "slow hello"}]}}
    before, events = await first_events(rec.url, body, 3)
    assert all(e.id and e.id.startswith("tg") for e in events)
    status, after = await rest_of(rec.url, body, events[-1].id)
    assert status == 200
    await rec.proxy.wait_idle()
    upstream = events_of(await upstream_stream(rec))
    sent = [e for e in events_of(before + after) if e.complete]
    # Only an id line was added to each event: the data, line ends and all, are the agent's.
    assert [e.data for e in sent] == [e.data for e in upstream if e.complete]
    assert [e.raw.replace(f"id: {e.id}\r\n".encode(), b"") for e in sent] == [
        e.raw for e in upstream if e.complete
    ]


async def test_a_jsonrpc_reconnect_gets_its_own_id(record: RecordFactory) -> None:
    rec = await record(create_agent_app(pace=0.3), hold=30.0)
    ask = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": REST_BODY}
    _, events = await first_events(rec.url, ask, 4, "/jsonrpc")
    again = {**ask, "id": "again-7"}
    status, after = await rest_of(rec.url, again, events[-1].id, "/jsonrpc")
    assert status == 200
    assert {json.loads(e.data)["id"] for e in events_of(after) if e.complete} == {"again-7"}


async def test_nobody_following_the_upstream_is_read_to_its_end(record: RecordFactory) -> None:
    rec = await record(create_agent_app(pace=0.1), hold=30.0)
    await first_events(rec.url, REST_BODY, 2)
    await asyncio.wait_for(rec.proxy.wait_idle(), 30)
    with await rec.log() as log:
        (stream,) = [x for x in log.exchanges() if x["is_sse"]]
        assert stream["outcome"] == "complete" and stream["finish"] == "TASK_STATE_COMPLETED"


async def test_the_hold_lets_an_unfollowed_upstream_go(record: RecordFactory) -> None:
    rec = await record(create_agent_app(pace=1.0), hold=0.2)
    await first_events(rec.url, REST_BODY, 2)
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    with await rec.log() as log:
        (stream,) = [x for x in log.exchanges() if x["is_sse"]]
        assert stream["outcome"] == "client_disconnected" and "--hold" in stream["error"]


async def test_an_id_the_gateway_does_not_hold_is_refused(record: RecordFactory) -> None:
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0)
    _, events = await first_events(rec.url, REST_BODY, 2)
    status, body = await rest_of(rec.url, REST_BODY, "evt.never")
    message = json.loads(body)["error"]["message"]
    assert status == 400 and "'evt.never' names no event of the stream held here" in message
    # Opened without credentials, anyone who names one of its ids follows it: none is told.
    assert repr(events[0].id) not in message and "evt.0" not in message
    assert seen.count("POST /message:stream") == 1  # never a silent restart


async def test_an_ended_stream_is_held_for_the_hold_then_let_go(record: RecordFactory) -> None:
    rec = await record(create_agent_app(pace=0.05), hold=0.3)
    _, events = await first_events(rec.url, REST_BODY, 2)
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    status, rest = await rest_of(rec.url, REST_BODY, events[-1].id)  # after its end, within the hold
    assert status == 200 and "TASK_STATE_COMPLETED" in rest.decode()
    await asyncio.sleep(0.5)
    assert rec.proxy.live is not None and len(rec.proxy.live) == 0


async def test_a_reconnect_after_the_last_event_of_an_ended_stream_is_told_it_ended(
    record: RecordFactory,
) -> None:
    app, seen = counted(create_agent_app(pace=0.02))
    rec = await record(app, hold=30.0)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rec.url}/message:stream", json=REST_BODY, headers=HEADERS) as r,
    ):
        whole = await r.read()
    last = [e for e in events_of(whole) if e.complete][-1]
    # A 204, by which an EventSource stops reconnecting (an empty 200 has it come back).
    status, body = await rest_of(rec.url, REST_BODY, last.id)
    assert (status, body) == (204, b"")
    assert seen == ["POST /message:stream"]
    await rec.proxy.wait_idle()
    with await rec.log() as log:
        (ended,) = log.db["resumes"].rows
        assert (ended["outcome"], ended["last_event_id"], ended["events_from_log"]) == ("ended", last.id, 0)
        assert log.exchange(ended["new_exchange_id"])["status"] == 204


EVENT = b'data: {"pad": "%s"}\n\n' % (b"x" * 80)


BIG = 200_000  # bytes of data an event: a few fill any socket's buffers


async def big_events(request: web.Request) -> web.StreamResponse:
    """Forty big events, 20 ms apart (0.8 s), with ids."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in range(40):
        await response.write(b"id: e%d\ndata: %s\n\n" % (n, b"x" * BIG))
        await asyncio.sleep(0.02)
    return response


async def test_a_first_client_that_stops_reading_holds_up_no_one(record: RecordFactory) -> None:
    """The first client's handler reads the upstream: one that stops reading (its socket
    buffers full) held the stream up for every other client, and the log, for as long as
    it stayed. A pump takes the reading over; it follows at its own pace."""
    app = web.Application()
    app.router.add_post("/big", big_events)
    rec = await record(app, hold=30.0)
    host, port = rec.url.removeprefix("http://").split(":")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect((host, int(port)))
    try:
        stalled.sendall(b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        head = b""
        while b"id: e0" not in head:  # its first event came; then it reads nothing more
            head += await asyncio.to_thread(stalled.recv, 4096)
        started = time.monotonic()
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{rec.url}/big", data=b"{}", headers={"Last-Event-ID": "e0"}) as r,
        ):
            rest = [e for e in events_of(await asyncio.wait_for(r.read(), 20)) if e.complete]
        assert [e.id for e in rest] == [f"e{n}" for n in range(1, 40)]
        assert time.monotonic() - started < 10  # the stream's pace (0.8 s), not the stalled client's
    finally:
        stalled.close()
    with await rec.log() as log:  # (once the stalled client is gone: its exchange was in flight)
        (first, *_) = log.exchanges()
        assert len(log.events(first["id"])) == 40 and first["outcome"] == "complete"


async def ten_events(request: web.Request) -> web.StreamResponse:
    """Ten events, as fast as they go: with ``?ids=1`` each has an id (a0 to a9 on /a)."""
    ids, name = request.query.get("ids") == "1", request.match_info["name"].encode()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"".join((b"id: %s%d\n" % (name, n) if ids else b"") + EVENT for n in range(10)))
    return response


async def two_streams(record: RecordFactory, ids: bool) -> tuple[Any, list[str], dict[str, list[Any]], int]:
    """Streams a and b, each of ten events, through a recorder holding one that ended, not two."""
    app, seen = counted(web.Application())
    app.router.add_post("/{name}", ten_events)
    stream = len(EVENT * 10) + 10 * len(b"id: tg1-0123456789ab.10\n")  # one stream as clients get it, at most
    rec = await record(app, hold=30.0, hold_bytes=stream * 3 // 2)
    got = {}
    async with aiohttp.ClientSession() as session:
        for name in ("a", "b"):
            async with session.post(f"{rec.url}/{name}?ids={int(ids)}", data=b"{}") as r:
                got[name] = [e for e in events_of(await r.read()) if e.complete]
    return rec, seen, got, stream * 3 // 2


async def test_ended_streams_past_hold_bytes_are_let_go_the_earliest_first(record: RecordFactory) -> None:
    rec, seen, _, hold_bytes = await two_streams(record, ids=True)
    # a was let go when b ended: an id it never had is refused, saying so (one it had is
    # answered from the log, below).
    status, body = await rest_of(rec.url, {}, "a11", "/a?ids=1")
    message = json.loads(body)["error"]["message"]
    assert status == 400 and "was let go as streams held after it filled --hold-bytes" in message
    assert f"({hold_bytes:,} bytes)" in message
    assert seen == ["POST /a", "POST /b"]  # the reconnect did not reach the agent
    assert rec.proxy.live is not None and rec.proxy.live.newest("POST /b?ids=1") is not None  # b still held
    assert len(rec.proxy.live) == 1


async def test_a_stream_let_go_is_answered_from_the_log_after_one_of_the_recorders_ids(
    record: RecordFactory,
) -> None:
    rec, seen, got, _ = await two_streams(record, ids=False)
    fifth = got["a"][4].id
    assert re.fullmatch(r"tg1-[0-9a-f]{12}\.5", fifth)
    assert rec.proxy.live is not None and len(rec.proxy.live) == 1
    (await rec.log()).close()  # a's end is in the log
    status, body = await rest_of(rec.url, {}, fifth, "/a?ids=0")
    assert status == 200 and body == b"".join(e.raw for e in got["a"][5:])  # the same bytes, the same ids
    status, body = await rest_of(rec.url, {}, fifth.replace(".5", ".11"), "/a?ids=0")  # one it never had
    assert status == 400
    assert seen == ["POST /a", "POST /b"]
    with await rec.log() as log:
        resumed = [r for r in log.db["resumes"].rows if r["outcome"] == "resumed"]
        assert [(r["exchange_id"], r["last_event_id"], r["events_from_log"]) for r in resumed] == [
            (1, fifth, 5)
        ]


async def let_go_after_three(record: RecordFactory) -> tuple[Any, list[str], bytes, list[Any]]:
    """A recorder, the requests its agent saw, and the first three events of a stream its
    client left, which then ended and was let go (its end in the log)."""
    app, seen = counted(create_agent_app(pace=0.02))
    rec = await record(app, hold=0.1)
    before, events = await first_events(rec.url, REST_BODY, 3)
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    await asyncio.sleep(0.3)  # ended, then let go
    assert rec.proxy.live is not None and len(rec.proxy.live) == 0
    (await rec.log()).close()
    return rec, seen, before, events


async def test_a_stream_let_go_is_answered_from_the_log_after_one_of_the_agents_ids(
    record: RecordFactory,
) -> None:
    rec, seen, before, events = await let_go_after_three(record)
    status, after = await rest_of(rec.url, REST_BODY, events[-1].id)  # the log says which stream has it
    assert status == 200
    assert before + after == await upstream_stream(rec)  # the rest, as the agent sent it
    status, body = await rest_of(rec.url, REST_BODY, "evt.never")  # one no stream let go had
    assert status == 400 and "was let go" in json.loads(body)["error"]["message"]
    assert seen == ["POST /message:stream"]
    with await rec.log() as log:
        resumed = [r for r in log.db["resumes"].rows if r["outcome"] == "resumed"]
        assert [(r["exchange_id"], r["last_event_id"]) for r in resumed] == [(1, events[-1].id)]
        assert resumed[0]["events_from_log"] == len(events_of(after))


async def test_a_subscribe_after_the_agents_id_to_a_task_let_go_is_answered_from_the_log(
    record: RecordFactory,
) -> None:
    rec, seen, before, events = await let_go_after_three(record)
    task_id = json.loads(events[0].data)["task"]["id"]
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{rec.url}/tasks/{task_id}:subscribe", headers={**HEADERS, "Last-Event-ID": events[-1].id}
        ) as r,
    ):
        status, after = r.status, await r.read()
    assert status == 200
    assert before + after == await upstream_stream(rec)  # the rest, as the agent sent it
    assert seen == ["POST /message:stream"]  # the agent was not asked (its task had ended)


async def test_only_streams_held_here_are_answered_from_the_log(
    record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live_module, "KEPT_GONE", 0)  # a, let go, is not remembered
    rec, seen, got, _ = await two_streams(record, ids=False)
    (await rec.log()).close()  # the log has a, whole
    status, _ = await rest_of(rec.url, {}, got["a"][4].id, "/a?ids=0")
    assert status == 200 and seen == ["POST /a", "POST /b", "POST /a"]  # a new request, as without --resume


async def test_an_agents_id_on_a_stream_of_no_known_protocol_that_ended_is_answered_here(
    record: RecordFactory,
) -> None:
    """Its agent may not read Last-Event-ID: sent to it, the reconnect got the stream again
    from its start, every event twice."""
    app, seen = counted(web.Application())
    app.router.add_post("/{name}", ten_events)
    rec = await record(app, hold=30.0)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{rec.url}/a?ids=1", data=b"{}") as r:
            whole = [e for e in events_of(await r.read()) if e.complete]
        await asyncio.wait_for(rec.proxy.wait_idle(), 10)
        for last, rest in (("a6", whole[7:]), ("a9", [])):
            async with session.post(f"{rec.url}/a?ids=1", data=b"{}", headers={"Last-Event-ID": last}) as r:
                got = [e for e in events_of(await r.read()) if e.complete]
                assert r.status == (200 if rest else 204) and [e.raw for e in got] == [e.raw for e in rest]
    assert seen == ["POST /a"]


def test_the_recorders_ids_name_their_stream() -> None:
    key = "0123456789ab"
    named = {f"tg1-{key}.5": 1, f"tg12-{key}.30": 12}
    others = ["tg1.5", "tg1", "tg.5", f"tg-{key}.5", f"tgx-{key}.5", f"tg\u0661-{key}.5", "a4"]
    for event_id in [*named, *others, f"tg1-{key}.5.6", f"tg1-{key}0.5", f"tg1-{key[1:]}.5", f"tg1-{key}.x"]:
        assert recorders_exchange(event_id) == named.get(event_id), event_id


async def test_a_stream_let_go_is_freed_at_once(record: RecordFactory) -> None:
    app = web.Application()
    app.router.add_post("/{name}", ten_events)
    rec = await record(app, hold=0.2)
    gc.disable()  # what the stream held goes when it is let go, not at the next collection
    try:
        async with aiohttp.ClientSession() as session, session.post(f"{rec.url}/a", data=b"{}") as r:
            assert len([e for e in events_of(await r.read()) if e.complete]) == 10
        assert rec.proxy.live is not None
        held = weakref.ref(rec.proxy.live.newest("POST /a"))  # type: ignore[arg-type]
        assert held() is not None
        await asyncio.sleep(0.5)
        assert rec.proxy.live.newest("POST /a") is None and held() is None
    finally:
        gc.enable()


async def test_a_keep_alive_goes_out_at_once(record: RecordFactory) -> None:
    async def agent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": keep-alive\n\n")
        await asyncio.sleep(1.0)
        await response.write(b"data: hello\n\n")
        return response

    app = web.Application()
    app.router.add_post("/stream", agent)
    rec = await record(app, hold=30.0)
    async with rec.session.post(f"{rec.url}/stream") as r:
        first = await asyncio.wait_for(r.content.readany(), 0.5)  # not held back with the next event
        assert first == b": keep-alive\n\n"
        assert re.fullmatch(rb"data: hello\nid: tg1-[0-9a-f]{12}\.1\n\n", await r.read())


@pytest.mark.parametrize("after", ["first", "last"])
async def test_a_reconnect_after_the_hold_let_the_agent_go_mid_task_takes_the_task_up_again(
    record: RecordFactory, after: str
) -> None:
    """The hold runs out while the agent still streams: its upstream is let go. A client
    that reconnects then was told the stream had ended (cut after what the log held, or a
    204 after its last event) while the task ran on. It is subscribed to anew instead,
    and the client gets the rest of the task, its events once each."""
    app, seen = counted(create_agent_app(pace=1.0))
    rec = await record(app, hold=0.3)
    _, events = await first_events(rec.url, REST_BODY, 3)
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)  # let go though the agent still streams
    with await rec.log() as log:
        (stream,) = [x for x in log.exchanges() if x["is_sse"]]
        assert stream["outcome"] == "client_disconnected" and "--hold" in stream["error"]
        held = [e["event_id"] for e in log.events(stream["id"])]
    last = events[0].id if after == "first" else held[-1]
    status, rest = await rest_of(rec.url, REST_BODY, last)
    assert status == 200
    got = [e for e in events_of(rest) if e.complete]
    assert "TASK_STATE_COMPLETED" in got[-1].data
    ids = [e.id for e in got]
    assert (
        len(ids) == len(set(ids)) and ids[: len(held) - held.index(last) - 1] == held[held.index(last) + 1 :]
    )
    assert seen.count("POST /message:stream") == 1  # never a silent restart
    assert any(s.endswith(":subscribe") for s in seen)
    with await rec.log() as log:
        outcomes = [r["outcome"] for r in log.db.query("SELECT outcome FROM resumes ORDER BY id")]
    assert "rejoined" in outcomes or "gap" in outcomes


def in_pieces(data: bytes) -> Any:
    """A body sent chunked (no Content-Length), in 10 kB pieces."""

    async def pieces() -> Any:
        for i in range(0, len(data), 10_000):
            yield data[i : i + 10_000]

    return pieces()


async def post(url: str, data: bytes, last_id: str, chunked: bool) -> tuple[int, bytes]:
    headers = {**HEADERS, "Last-Event-ID": last_id, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=in_pieces(data) if chunked else data, headers=headers) as r,
    ):
        return r.status, await r.read()


@pytest.mark.parametrize("chunked", [False, True], ids=["with a length", "chunked"])
async def test_a_reconnect_with_a_big_body_is_answered_from_the_stream(
    record: RecordFactory, chunked: bool
) -> None:
    # 2 MB: past what aiohttp reads whole by default (1 MiB), and past what the log keeps.
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0, max_body=50_000)
    ask = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": REST_BODY}
    _, events = await first_events(rec.url, ask, 3, "/jsonrpc")
    again = json.dumps({**ask, "id": "again-7", "pad": "x" * 2_000_000}).encode()
    status, after = await post(f"{rec.url}/jsonrpc", again, events[-1].id, chunked)
    assert status == 200
    assert {json.loads(e.data)["id"] for e in events_of(after) if e.complete} == {"again-7"}
    assert seen.count("POST /jsonrpc") == 1
    await rec.proxy.wait_idle()
    with await rec.log() as log:
        reconnect = next(x for x in log.exchanges() if x["id"] != 1 and x["is_sse"])
        assert reconnect["request_body"] == again[:50_000].decode() and reconnect["request_body_truncated"]


@pytest.mark.parametrize("chunked", [False, True], ids=["with a length", "chunked"])
async def test_a_reconnect_body_past_the_bound_is_refused_or_streams_on(
    record: RecordFactory, monkeypatch: pytest.MonkeyPatch, chunked: bool
) -> None:
    monkeypatch.setattr(recorder_module, "RECONNECT_READ", 100_000)
    got: list[bytes] = []

    async def echo(request: web.Request) -> web.Response:
        got.append(await request.read())
        return web.Response(text="ok")

    app, seen = counted(create_agent_app(pace=0.3))
    app.router.add_post("/echo", echo)
    rec = await record(app, hold=30.0)
    ask = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": REST_BODY}
    _, events = await first_events(rec.url, ask, 3, "/jsonrpc")
    big = json.dumps({**ask, "id": 2, "pad": "x" * 150_000}).encode()
    # Naming an event held: not answered (it cannot be read whole), and not sent on.
    status, body = await post(f"{rec.url}/jsonrpc", big, events[-1].id, chunked)
    assert status == 413 and "over 100,000 bytes" in json.loads(body)["error"]["message"]
    assert seen.count("POST /jsonrpc") == 1
    # Naming none, to a path no stream is held for: it goes on to the agent whole.
    status, _ = await post(f"{rec.url}/echo", big, "evt.elsewhere", chunked)
    assert status == 200 and got == [big]
    with await rec.log() as log:
        (refused,) = log.db["resumes"].rows_where("outcome = 'refused'")
        assert refused["last_event_id"] == events[-1].id


async def numbered(request: web.Request) -> web.StreamResponse:
    """Ten events numbered 1 to 10 on every stream (as agents number theirs), each naming
    its stream (what a reconnect gets tells which stream answered it); after the third,
    one every 0.2 s."""
    name = request.match_info["name"].encode()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in range(1, 11):
        await response.write(b"id: %d\ndata: %s\n\n" % (n, name))
        if n >= 3:
            await asyncio.sleep(0.2)
    return response


async def test_an_agents_id_in_several_streams_resumes_the_one_this_request_opened(
    record: RecordFactory,
) -> None:
    """Agents number each stream's events alike: a reconnect after id 3 resumes the stream
    its own request (and credentials) opened, not the newest holding an id 3."""
    app, seen = counted(web.Application())
    app.router.add_post("/counter/{name}", numbered)
    rec = await record(app, hold=30.0)
    opened = (("a", "tokA"), ("b", "tokB"), ("c", "tokA"))

    async def drop_after_3(name: str, token: str) -> None:
        headers = {**HEADERS, "Authorization": f"Bearer {token}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{rec.url}/counter/{name}", data=b"{}", headers=headers) as r,
        ):
            got = b""
            while len([e for e in events_of(got) if e.complete]) < 3:
                got += await r.content.readany()

    async def rest_after_3(name: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}", "Last-Event-ID": "3"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{rec.url}/counter/{name}", data=b"{}", headers=headers) as r,
        ):
            rest = [e for e in events_of(await r.read()) if e.complete]
        assert (r.status, [e.id for e in rest]) == (200, [str(n) for n in range(4, 11)]), name
        assert {e.data for e in rest} == {name}

    await asyncio.gather(*(drop_after_3(name, token) for name, token in opened))
    await asyncio.gather(*(rest_after_3(name, token) for name, token in opened))
    assert sorted(seen) == ["POST /counter/a", "POST /counter/b", "POST /counter/c"]


async def test_only_a_get_or_a_post_is_a_reconnect(record: RecordFactory) -> None:
    """A HEAD, OPTIONS or DELETE naming an event held goes to the agent as it is (a HEAD
    answered with the stream's bytes would break the connection's next response); so does
    a request whose Last-Event-ID is empty, which names no event."""
    app, seen = counted(web.Application())
    app.router.add_post("/counter/{name}", numbered)

    async def other(request: web.Request) -> web.Response:
        return web.Response(text="the agent")

    app.router.add_route("*", "/other", other)
    rec = await record(app, hold=30.0)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{rec.url}/counter/a", data=b"{}") as r:
            (held_id, *_) = [e.id for e in events_of(await r.read())]
        for method in ("HEAD", "OPTIONS", "DELETE"):
            async with session.request(method, f"{rec.url}/other", headers={"Last-Event-ID": held_id}) as r:
                assert (r.status, await r.read()) == (200, b"" if method == "HEAD" else b"the agent")
        async with session.post(f"{rec.url}/counter/a", data=b"{}", headers={"Last-Event-ID": ""}) as r:
            assert len(events_of(await r.read())) == 10  # a stream of its own
    assert seen.count("POST /counter/a") == 2
    assert [s for s in seen if s.endswith("/other")] == ["HEAD /other", "OPTIONS /other", "DELETE /other"]


async def reconnected_once(record: RecordFactory) -> Any:
    """A gateway's recording of a stream a client left after five events and reconnected
    to (a reconnect the gateway answered from the stream it held)."""
    rec = await record(create_agent_app(pace=0.3), hold=30.0)
    _, events = await first_events(rec.url, REST_BODY, 5)
    assert (await rest_of(rec.url, REST_BODY, events[-1].id))[0] == 200
    await rec.proxy.wait_idle()
    return rec


async def test_a_gateway_log_checks_clean_and_replays_streams_whole(
    record: RecordFactory, serve: Serve
) -> None:
    """A reconnect's exchange is a slice of the stream it resumed: the checker leaves it
    to that stream's own exchange (which holds every event), and a replayed request
    without Last-Event-ID gets a stream from its start, never a slice."""
    rec = await reconnected_once(record)
    with await rec.log() as log:
        report = report_log(log)
        whole = log.body(min(x["id"] for x in log.exchanges() if x["is_sse"]))
    assert (report.findings, report.reconnects, report.streams) == ([], 1, 1)
    url = await serve(ReplayServer(load([rec.db]), speed=0).app)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/message:stream", json=REST_BODY, headers=HEADERS) as r:
            assert await r.read() == whole
        async with session.post(f"{url}/message:stream", json=REST_BODY, headers=HEADERS) as r:
            assert r.status == 404  # the one recorded stream was served; the slice is no answer


async def test_callbacks_that_raise_never_break_traffic(
    record: RecordFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's on_resume that raises cut the reconnected client's stream (the log said it
    was complete); an on_refusal that raises kept the refusal out of the log. Each is
    reported on stderr once, and the traffic goes on."""

    def failing(_: object) -> None:
        raise KeyError("bookkeeping")

    rec = await record(create_agent_app(pace=0.3), hold=30.0, on_resume=failing, on_refusal=failing)
    before, events = await first_events(rec.url, REST_BODY, 3)
    status, after = await rest_of(rec.url, REST_BODY, events[-1].id)
    assert status == 200 and "TASK_STATE_COMPLETED" in after.decode().rstrip().splitlines()[-1]
    for _ in range(2):
        status, body = await rest_of(rec.url, REST_BODY, "evt.never")
        assert status == 400 and b"names no event of the stream held here" in body
    await rec.proxy.wait_idle()
    assert before + after == await upstream_stream(rec)
    with await rec.log() as log:
        assert [x["outcome"] for x in log.exchanges()][-2:] == ["refused", "refused"]
    said = capsys.readouterr().err
    for kind in ("on_resume", "on_refusal"):
        assert said.count(f"the recorder's {kind} callback raised (KeyError: 'bookkeeping')") == 1
