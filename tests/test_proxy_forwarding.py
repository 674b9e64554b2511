"""The recording proxy forwards like a reverse proxy should: methods, paths, queries,
bodies and headers untouched; hop-by-hop headers handled; redirects passed back;
errors and disconnects mirrored; not an open proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct

import aiohttp
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from loopback import RawAnswer, answering, answering_anything, raw_upstream
from multidict import CIMultiDict
from ports import free_port
from yarl import URL

from tasktape.proxy import recorder as recorder_module


def echo_app() -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(
            {
                "method": request.method,
                "path": request.raw_path,
                "headers": [[k, v] for k, v in request.headers.items()],
                "body": body.decode("latin-1"),
            },
            headers={"X-Upstream": "yes", "Keep-Alive": "timeout=5", "Connection": "keep-alive, X-Drop"},
        )

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("GET", "/prefix/redirect", redirect)
    app.router.add_route("*", "/{tail:.*}", echo)
    return app


async def test_methods_paths_queries_and_bodies_pass_untouched(record: RecordFactory) -> None:
    rec = await record(echo_app())
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        url = URL(f"{rec.url}/a/b%20c/tasks/t1:cancel?x=1&y=%2F", encoded=True)
        async with rec.session.request(method, url) as r:
            seen = await r.json()
        assert (seen["method"], seen["path"]) == (method, "/a/b%20c/tasks/t1:cancel?x=1&y=%2F")
    body = bytes(range(256)) * 1000
    async with rec.session.post(f"{rec.url}/upload", data=body) as r:
        assert (await r.json())["body"].encode("latin-1") == body
    log = await rec.log()
    exchanges = log.exchanges()
    assert [x["method"] for x in exchanges[:6]] == ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    assert exchanges[0]["path"] == "/a/b%20c/tasks/t1:cancel" and exchanges[0]["query"] == "x=1&y=%2F"
    assert exchanges[1]["rpc_method"] == "CancelTask" and exchanges[1]["task_id"] == "t1"
    assert exchanges[-1]["request_body"] == body and exchanges[-1]["request_body_truncated"] == 0
    log.close()


async def test_a_path_prefix_on_the_upstream_is_kept(record: RecordFactory) -> None:
    rec = await record(echo_app())
    rec2 = await record(rec.upstream + "/prefix")
    async with rec2.session.get(f"{rec2.url}/tasks/t1?q=1") as r:
        assert (await r.json())["path"] == "/prefix/tasks/t1?q=1"
    async with rec2.session.get(f"{rec2.url}/redirect", allow_redirects=False) as r:
        assert (r.status, r.headers["Location"]) == (302, "/elsewhere")  # passed back, not followed


async def test_headers_end_to_end_hop_by_hop_and_forwarding(record: RecordFactory) -> None:
    rec = await record(echo_app())
    headers = {
        "A2A-Version": "1.0",
        "Accept": "text/event-stream",
        "X-Custom": "kept",
        "X-Hop": "dropped because Connection names it",
        "Connection": "X-Hop",
        "TE": "trailers",
        "Proxy-Authorization": "Basic eA==",
        "X-Forwarded-For": "10.0.0.9",
        "Host": "evil.example",
    }
    async with rec.session.get(f"{rec.url}/h", headers=headers) as r:
        seen = dict((await r.json())["headers"])
        response_headers = r.headers
    assert (
        seen["A2A-Version"] == "1.0" and seen["Accept"] == "text/event-stream" and seen["X-Custom"] == "kept"
    )
    assert not {"X-Hop", "TE", "Proxy-Authorization"} & set(seen)
    assert seen["Host"] == rec.upstream.removeprefix("http://")  # the Host header never picks the target
    assert seen["X-Forwarded-For"] == "10.0.0.9, 127.0.0.1"
    assert (seen["X-Forwarded-Proto"], seen["X-Forwarded-Host"]) == ("http", "evil.example")
    assert "User-Agent" not in seen or seen["User-Agent"].startswith("Python")  # ours, not added by the proxy
    assert response_headers["X-Upstream"] == "yes"
    assert "X-Drop" not in response_headers and "Keep-Alive" not in response_headers


async def test_unreachable_upstream_gives_a_502_naming_the_reason(record: RecordFactory) -> None:
    port = free_port()  # nothing listens there
    rec = await record(f"http://127.0.0.1:{port}")
    async with rec.session.post(f"{rec.url}/message:stream", json={"message": {}}) as r:
        assert r.status == 502
        error = (await r.json())["error"]
    assert f"127.0.0.1:{port}" in error["message"] and "ClientConnectorError" in error["message"]
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert (x["status"], x["outcome"]) == (502, "upstream_error") and "failed before answering" in x["error"]
    assert json.loads(x["response_body"])["error"]["code"] == 502


async def test_not_an_open_proxy(record: RecordFactory) -> None:
    contacted: list[str] = []
    rec = await record(answering_anything(contacted))
    host, port = rec.url.removeprefix("http://").split(":")
    for request_line, said in (
        (b"GET http://example.com/x HTTP/1.1", b"absolute-form request targets are not accepted"),
        (b"CONNECT example.com:443 HTTP/1.1", b"CONNECT is not accepted"),
        (b"OPTIONS * HTTP/1.1", b"an asterisk-form request target (OPTIONS *) is not accepted"),
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request_line + b"\r\nHost: example.com\r\nConnection: close\r\n\r\n")
        response = await reader.read()
        writer.close()
        assert response.split(b"\r\n")[0] in (b"HTTP/1.1 400 Bad Request", b"HTTP/1.1 405 Method Not Allowed")
        assert said in response, response
    assert contacted == []
    with await rec.log() as log:
        assert [x["outcome"] for x in log.exchanges()] == ["refused"] * 3


async def test_a_websocket_upgrade_is_refused_saying_why(record: RecordFactory) -> None:
    """Its Upgrade is hop-by-hop: forwarded without it, the client got the agent's plain
    answer (a 400 from an aiohttp agent), or a 101 that switched nothing and broke the
    connection. Refused, and logged; an h2c upgrade is ignored, as HTTP lets a server."""
    contacted = []

    async def ws(request: web.Request) -> web.StreamResponse:
        contacted.append(request.headers.get("Upgrade"))
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        return socket

    app = web.Application()
    app.router.add_get("/ws", ws)
    rec = await record(app)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await rec.session.ws_connect(f"{rec.url}/ws")
    assert refused.value.status == 501
    async with rec.session.get(
        f"{rec.url}/ws", headers={"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c"}
    ) as r:
        assert r.status == 400  # the agent's own answer to a plain GET of its WebSocket route
    assert contacted == [None]
    with await rec.log() as log:
        (refusal, plain) = log.exchanges()
    assert refusal["outcome"] == "refused" and refusal["status"] == 501
    assert "a WebSocket upgrade: tasktape record carries HTTP exchanges" in refusal["error"]
    assert plain["outcome"] == "complete"


async def test_a_switch_the_client_never_asked_for_is_a_502(record: RecordFactory) -> None:
    """Passed on, a 101 to a plain request left the client's connection taken as switched
    (curl read the agent's raw bytes as the body; httpx waited for ever)."""

    async def switching(request: web.Request) -> web.StreamResponse:
        switched = web.StreamResponse(status=101, headers={"Upgrade": "websocket", "Connection": "Upgrade"})
        await switched.prepare(request)
        await switched.write(b"raw bytes of another protocol")
        return switched

    app = web.Application()
    app.router.add_get("/x", switching)
    rec = await record(app)
    async with rec.session.get(f"{rec.url}/x") as r:
        assert r.status == 502
        said = (await r.json())["error"]["message"]
    assert "answered 101 Switching Protocols to a request that asked for no protocol switch" in said
    with await rec.log() as log:
        (exchange,) = log.exchanges()
    assert (exchange["status"], exchange["outcome"]) == (502, "upstream_error")


async def test_client_disconnect_cancels_the_upstream_at_once(record: RecordFactory) -> None:
    cancelled = asyncio.Event()
    first_sent = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        first_sent.set()
        try:
            await asyncio.sleep(60)  # idle: the proxy must notice the client leaving anyway
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return response

    app = web.Application()
    app.router.add_post("/message:stream", endless)
    rec = await record(app)
    async with aiohttp.ClientSession() as client:
        response = await client.post(f"{rec.url}/message:stream", json={})
        assert await response.content.readuntil(b"\n\n") == b'data: {"n": 1}\n\n'
        response.close()  # the client goes away mid-stream
    await asyncio.wait_for(cancelled.wait(), 5)
    await asyncio.sleep(0.1)
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "client_disconnected" and log.body(x["id"]) == b'data: {"n": 1}\n\n'


async def test_upstream_dropping_mid_stream_is_mirrored(record: RecordFactory) -> None:
    async def dropping(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        await response.write(b'data: {"n": 2}\n\ndata: {"cut')
        await asyncio.sleep(0.05)
        request.transport.close()  # gone, without the terminating chunk
        return response

    app = web.Application()
    app.router.add_post("/message:stream", dropping)
    rec = await record(app)
    received = b""
    async with rec.session.post(f"{rec.url}/message:stream", json={}) as response:
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in response.content.iter_any():
                received += data
    assert received == b'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: {"cut'
    await asyncio.sleep(0.1)
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "upstream_disconnected" and "dropped mid-response" in x["error"]
        assert log.body(x["id"]) == received
        events = log.events(x["id"])
        assert [e["complete"] for e in events] == [1, 1, 0] and events[-1]["data"] == '{"cut'


async def test_an_upstream_reset_is_logged_in_whole_words(record: RecordFactory) -> None:
    """aiohttp quotes the reset in its error's message; the log cut it mid-token
    ("ConnectionResetError(104,")."""
    forwarded = asyncio.Event()

    async def resetting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(b"9\r\ndata: a\n\n\r\n")
        await writer.drain()
        await forwarded.wait()
        # A linger of 0: the socket's close resets the connection.
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        writer.transport.abort()

    async with raw_upstream(resetting) as upstream:
        rec = await record(upstream)
        async with rec.session.get(f"{rec.url}/s") as r:
            assert await r.content.readuntil(b"\n\n") == b"data: a\n\n"
            forwarded.set()
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        await rec.proxy.wait_idle()
        with await rec.log() as log:
            (x,) = log.exchanges()
    assert x["outcome"] == "upstream_disconnected"
    assert x["error"] == (
        "the upstream dropped mid-response: ClientPayloadError: Response payload is not completed. "
        "ConnectionResetError: Connection reset by peer; from TransferEncodingError: Not enough data to "
        "satisfy transfer length header."
    )


async def test_small_request_bodies_respect_the_cap(record: RecordFactory) -> None:
    rec = await record(echo_app(), max_body=1000)
    body = b"x" * 5000
    async with rec.session.post(f"{rec.url}/echo", data=body) as r:
        assert (await r.json())["body"].encode() == body  # forwarded whole
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["request_body"] == "x" * 1000 and x["request_body_truncated"] == 1


async def test_a_streamed_body_is_recorded_even_when_the_upstream_fails(record: RecordFactory) -> None:
    port = free_port()
    rec = await record(f"http://127.0.0.1:{port}")

    async def body():
        yield b'{"message": '
        yield b'{"parts": []}}'

    async with rec.session.post(f"{rec.url}/message:send", data=body()) as r:
        assert r.status == 502
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "upstream_error" and x["request_body"] == '{"message": {"parts": []}}'


async def test_a_body_the_upstream_did_not_read_to_its_end_is_logged_truncated(record: RecordFactory) -> None:
    async def too_big(request: web.Request) -> web.Response:
        return web.json_response({"error": "too big"}, status=413)  # without reading the body

    app = web.Application()
    app.router.add_post("/upload", too_big)
    rec = await record(app)

    async def body():
        for _ in range(80):
            yield b"x" * 65536  # 5 MiB, more than the upstream's connection takes unread

    async with rec.session.post(f"{rec.url}/upload", data=body()) as r:
        assert r.status == 413
    await rec.proxy.wait_idle()
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert x["status"] == 413 and 0 < len(x["request_body"]) < 80 * 65536
    assert x["request_body_truncated"] == 1  # a part of the body, said so


async def test_redirects_to_the_upstream_stay_on_the_proxy(record: RecordFactory) -> None:
    where: list[str] = []

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently(f"{where[0]}/v2/card", headers={"X-Seen": "1"})

    async def elsewhere(request: web.Request) -> web.Response:
        raise web.HTTPFound("https://auth.example/login")

    app = web.Application()
    app.router.add_get("/card", moved)
    app.router.add_get("/login", elsewhere)
    rec = await record(app)
    where.append(rec.upstream)
    async with rec.session.get(f"{rec.url}/card", allow_redirects=False) as r:
        assert r.headers["Location"] == f"{rec.url}/v2/card"
    async with rec.session.get(f"{rec.url}/login", allow_redirects=False) as r:
        assert r.headers["Location"] == "https://auth.example/login"


async def test_a_redirect_under_the_upstreams_own_path_stays_on_the_proxy(
    record: RecordFactory, serve: Serve
) -> None:
    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def there(request: web.Request) -> web.Response:
        return web.Response(text=request.path_qs)

    app = web.Application()
    app.router.add_get("/api/moved", moved)
    app.router.add_get("/api/next", there)
    rec = await record(f"{await serve(app)}/api")  # the agent's /api, at the proxy's /
    for to, local in (("/api/next?a=1", "/next?a=1"), ("/api", "/"), ("/elsewhere", "/elsewhere")):
        async with rec.session.get(f"{rec.url}/moved", params={"to": to}, allow_redirects=False) as r:
            assert r.headers["Location"] == local
    async with rec.session.get(f"{rec.url}/moved", params={"to": "/api/next?a=1"}) as r:
        assert await r.text() == "/api/next?a=1"  # followed through the proxy, to the agent's
        assert str(r.url) == f"{rec.url}/next?a=1"


@pytest.mark.parametrize("resume", [False, True], ids=["record", "record --resume"])
@pytest.mark.parametrize(
    ("path", "sent"),
    [
        ("/plain", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
        ("/stream", b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: x\n\n"),
        ("/.well-known/agent-card.json", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
    ],
)
async def test_the_client_gets_the_upstreams_headers_and_a_date(
    record: RecordFactory, path: str, sent: bytes, resume: bool
) -> None:
    """aiohttp names itself in a Server header and types an untyped body; the recorder
    passes on neither. It adds a Date where the upstream sent none, as a proxy must."""

    async with raw_upstream(answering(sent)) as upstream:
        rec = await record(upstream, hold=30.0 if resume else None)
        async with rec.session.get(f"{rec.url}{path}") as r:
            await r.read()
            names = {name.lower() for name in r.headers}
    sent_names = {
        line.split(b":")[0].decode().lower() for line in sent.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
    }
    hop = {"content-length", "transfer-encoding", "connection"}  # (framed anew for this connection)
    assert names - hop == (sent_names - hop) | {"date"}


async def test_header_bytes_that_are_not_utf8_are_kept_as_latin1(record: RecordFactory) -> None:
    rec = await record(echo_app())
    host, port = rec.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /x HTTP/1.1\r\nHost: a\r\nX-Note: caf\xe9\r\nConnection: close\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 200")
    writer.close()
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert ["X-Note", "café"] in json.loads(x["request_headers"])


async def test_header_names_pass_and_are_logged_as_spelt(record: RecordFactory) -> None:
    """aiohttp's parser spells the names it knows its own way: ETag reached the client as
    Etag, USER-AGENT the agent as User-Agent, and the log kept them so."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(
            b'HTTP/1.1 302 Found\r\nETag: "x"\r\ncontent-type: application/json\r\nx-request-id: 1\r\n'
        )
        writer.write(b"location: /next\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    sent = [(b"USER-AGENT", b"me"), (b"content-type", b"text/plain"), (b"x-request-id", b"2")]
    request = b"".join(b"%s: %s\r\n" % line for line in sent)
    async with raw_upstream(answer) as upstream:
        rec = await record(upstream)
        host, port = rec.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /x HTTP/1.1\r\nHost: a\r\n" + request + b"Connection: close\r\n\r\n")
        head = (await asyncio.wait_for(reader.read(), 10)).partition(b"\r\n\r\n")[0]
        writer.close()
        await rec.proxy.wait_idle()
        with await rec.log() as log:
            (x,) = log.exchanges()
    assert request in heads[0]
    assert (
        b'\r\nETag: "x"\r\ncontent-type: application/json\r\nx-request-id: 1\r\nlocation: /next\r\n' in head
    )
    assert [[k.decode(), v.decode()] for k, v in sent] == json.loads(x["request_headers"])[1:4]
    assert [name for name, _ in json.loads(x["response_headers"])] == [
        *("ETag", "content-type", "x-request-id", "location", "Content-Length")
    ]


async def test_every_x_forwarded_for_line_is_passed_on(record: RecordFactory) -> None:
    """A client may send the trail in several lines (RFC 9110 5.3): all of them reach the
    upstream, joined, with the client's address after them; none is dropped."""
    rec = await record(echo_app())
    sent = CIMultiDict([("X-Forwarded-For", "10.0.0.1"), ("X-Forwarded-For", "10.0.0.2")])
    async with rec.session.get(f"{rec.url}/h", headers=sent) as r:
        seen = (await r.json())["headers"]
    assert [v for k, v in seen if k == "X-Forwarded-For"] == ["10.0.0.1, 10.0.0.2, 127.0.0.1"]


async def _sent_without_host(url: str, path: str) -> bytes:
    """What the proxy at ``url`` answers an HTTP/1.0 request for ``path``, which has no Host."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    return answer


async def test_without_a_host_header_the_proxys_own_address_is_named(record: RecordFactory) -> None:
    """An HTTP/1.0 client sends no Host: the card's URL, a redirect's Location and the
    X-Forwarded-Host name the proxy's socket, its port included (not port 80)."""
    where: list[str] = []

    async def card(request: web.Request) -> web.Response:
        return web.json_response({"name": "a", "url": f"{where[0]}/"})

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"{where[0]}/next")

    async def forwarded(request: web.Request) -> web.Response:
        return web.Response(text=request.headers["X-Forwarded-Host"])

    app = web.Application()
    app.router.add_get("/.well-known/agent-card.json", card)
    app.router.add_get("/moved", moved)
    app.router.add_get("/host", forwarded)
    rec = await record(app)
    where.append(rec.upstream)
    authority = rec.url.removeprefix("http://")
    card_answer = await _sent_without_host(rec.url, "/.well-known/agent-card.json")
    assert json.loads(card_answer.partition(b"\r\n\r\n")[2])["url"] == f"{rec.url}/"
    assert f"Location: {rec.url}/next\r\n".encode() in await _sent_without_host(rec.url, "/moved")
    assert (await _sent_without_host(rec.url, "/host")).endswith(authority.encode())


def keeping_alive(sent: bytes, idle: float, connections: list[int]) -> RawAnswer:
    """A raw answer to every request of a connection: ``sent``; the connection closed once
    idle for ``idle`` seconds (as Node's and uvicorn's servers close theirs). Each request
    notes its connection's number in ``connections``."""
    opened = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened[0] += 1
        number = opened[0]
        with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            while True:
                await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), idle)
                connections.append(number)
                writer.write(sent)
                await writer.drain()
        writer.close()

    return answer


async def test_an_idle_upstream_connection_is_not_kept_past_the_agents_idle_timeout(
    record: RecordFactory,
) -> None:
    """aiohttp kept idle upstream connections 15 s, and took one up again just as the agent
    (closing its own after 5 s) closed it: a POST got a 502. They are kept UPSTREAM_IDLE,
    less than common agent servers keep theirs; within it, one is used again."""
    connections: list[int] = []
    idle = recorder_module.UPSTREAM_IDLE + 0.5
    sent = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_upstream(keeping_alive(sent, idle, connections)) as upstream:
        rec = await record(upstream)
        for pause in (0, 0.1, recorder_module.UPSTREAM_IDLE + 0.2):
            await asyncio.sleep(pause)
            async with rec.session.post(f"{rec.url}/x", data=b"{}") as r:
                assert (r.status, await r.read()) == (200, b"ok")
    assert connections == [1, 1, 2]


def closing_when_asked_again(sent: bytes, connections: list[int], then: bytes = b"") -> RawAnswer:
    """A raw answer that answers a connection's first request with ``sent`` and a second
    with ``then`` (none: nothing, as a server that closed the connection idle just as the
    second request went out on it; some: the head of an answer begun), then closes it.
    Each request notes its connection's number in ``connections``."""
    opened = [0]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened[0] += 1
        number = opened[0]
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            for answered in (sent, then):
                await reader.readuntil(b"\r\n\r\n")
                connections.append(number)
                writer.write(answered)
                await writer.drain()
        writer.close()

    return answer


@pytest.mark.parametrize("then", [b"", b"HTTP/1.1 200 OK\r\nContent-Le"], ids=["unanswered", "answer-begun"])
async def test_a_post_a_pooled_connection_closed_on_is_never_sent_twice(
    record: RecordFactory, then: bytes
) -> None:
    """An agent that closes a kept-alive connection after reading a POST on it, answering
    nothing or part of an answer, may have acted on it (a worker killed mid-request): the
    client gets a 502, and the agent never gets the POST again."""
    connections: list[int] = []
    sent = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_upstream(closing_when_asked_again(sent, connections, then)) as upstream:
        rec = await record(upstream)
        async with rec.session.post(f"{rec.url}/x", data=b"{}") as r:
            assert (r.status, await r.read()) == (200, b"ok")
        async with rec.session.post(f"{rec.url}/x", data=b"{}") as r:
            assert r.status == 502
    assert connections == [1, 1]


async def test_bytes_past_the_end_of_a_response_are_named_in_the_502(record: RecordFactory) -> None:
    """An agent that sends more than its Content-Length leaves bytes aiohttp reads as the
    next response on the connection, and fails: the 502 says so, rather than blaming a
    status line the agent never sent."""
    sent = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok and more"
    async with raw_upstream(keeping_alive(sent, 5.0, [])) as upstream:
        rec = await record(upstream)
        async with rec.session.get(f"{rec.url}/x") as r:
            assert r.status == 502
            said = (await r.json())["error"]["message"]
    assert "sent bytes where no HTTP response starts: past the end of a response" in said
    assert "more than its Content-Length, or a body where none goes: to a HEAD, a 204 or a 304" in said
