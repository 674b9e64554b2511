"""Bodies mitmproxy streams, and what the log keeps of them, with a real mitmdump: bodies it
switches to streaming mid-way (stream_large_bodies), stream callables of other addons
loaded before and after tasktape's, HTTP/2 requests' host, a flow mitmproxy kills, event
streams answered without the upstream or left buffered for modify_body, and option
changes refused at run time."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
from aiohttp import web
from loopback import in_thread
from ports import free_port
from test_mitm import MITMDUMP, last_id, mitmdump_args, running, wait_for_exchanges

from tasktape.eventlog import EventLog
from tasktape.mitm_command import addon_path
from tasktape.proxy.mitm_flows import BUFFERED_UNTIMED

LATE = "body was streamed by mitmproxy (stream_large_bodies) after it began buffering; not kept"

# An addon changing '"a"' to '"CHANGED"' in the bodies of the flows whose query says
# change={when}, by a stream callable set in its head hooks.
CHANGER = """
def change(data):
    return data.replace(b'"a"', b'"CHANGED"')

class Change_{when}:
    def requestheaders(self, flow):
        if flow.request.query.get("change") == {when!r}:
            flow.request.stream = change

    def responseheaders(self, flow):
        if flow.request.query.get("change") == {when!r}:
            flow.response.stream = change

addons = [Change_{when}()]
"""


def upstream() -> web.Application:
    """/echo answers a request's body; /bigchunked 10,000 bytes chunked, with no
    Content-Length; /events an event stream; /slow one whose two events are a second
    apart; /plain a small JSON body."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read(), content_type="application/json")

    async def bigchunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(10):
            await response.write(b"x" * 1000)
            await asyncio.sleep(0.005)
        await response.write_eof()
        return response

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(2):
            await response.write(b'data: {"a": 1}\n\n')
        await response.write_eof()
        return response

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n in range(2):
            await response.write(f'data: {{"n": {n}}}\n\n'.encode())
            await asyncio.sleep(1)
        await response.write_eof()
        return response

    async def plain(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_get("/bigchunked", bigchunked)
    app.router.add_get("/events", events)
    app.router.add_get("/slow", slow)
    app.router.add_get("/plain", plain)
    return app


@dataclass
class Mitm:
    url: str  # a reverse proxy to the upstream (HTTP/1, or HTTP/2 over TLS)
    port: int
    upstream: str
    db: Path


@pytest.fixture(scope="module")
def mitm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mitm]:
    """mitmdump with the changing addon loaded before tasktape's (change=before) and after
    it (change=after), streaming bodies past 2 KB."""
    tmp = tmp_path_factory.mktemp("streams")
    scripts = {}
    for when in ("before", "after"):
        scripts[when] = tmp / f"{when}.py"
        scripts[when].write_text(CHANGER.format(when=when))
    port, db = free_port(), tmp / "streams.db"
    with in_thread(upstream()) as url:
        args = [MITMDUMP, "-s", str(scripts["before"]), "-s", str(addon_path()), "-s", str(scripts["after"])]
        args += ["--set", f"tasktape_db={db}", "--set", "stream_large_bodies=2k"]
        args += mitmdump_args(tmp / "conf", f"reverse:{url}@{port}")
        with running(args, [port], tmp / "mitm.txt"):
            yield Mitm(f"http://127.0.0.1:{port}", port, url, db)


def exchanges_after(db: Path, before: int, count: int) -> list[dict[str, Any]]:
    """Every exchange above ``before``, once ``count`` have ended."""
    wait_for_exchanges(db, before, count)
    with EventLog(db) as log:
        return [x for x in log.exchanges() if x["id"] > before]


def chunked(*pieces: bytes) -> Iterator[bytes]:
    """A request body sent chunked, without Content-Length (a changed body may differ in size)."""
    yield from pieces


def ended_after(db: Path, before: int) -> list[tuple[str, str | None]]:
    """The method and outcome (None while open) of every exchange above ``before``."""
    with EventLog(db) as log:
        return [(x["method"], x["outcome"]) for x in log.exchanges() if x["id"] > before]


def test_a_body_streamed_once_past_the_limit_says_it_was_not_kept(mitm: Mitm) -> None:
    """A body of unknown size (chunked) is buffered until it outgrows stream_large_bodies,
    then streamed with no hook in between: the log cannot have it, and says so; a
    request body counts as cut."""
    before = last_id(mitm.db)
    with httpx.Client() as client:
        sent = client.post(f"{mitm.url}/echo", content=chunked(b"y" * 2500, b"z" * 2500))
        got = client.get(f"{mitm.url}/bigchunked")
    assert sent.content == b"y" * 2500 + b"z" * 2500 and got.content == b"x" * 10_000
    upload, download = exchanges_after(mitm.db, before, 2)
    assert (upload["request_body_truncated"], upload["outcome"]) == (1, "complete")
    assert f"the request {LATE}" in upload["error"]
    assert upload["response_body"] == "y" * 2500 + "z" * 2500  # its Content-Length said: streamed, teed
    assert (download["response_body"], download["outcome"]) == (None, "complete")
    assert download["error"] == f"the response {LATE}"


def test_an_earlier_addons_stream_is_recorded_as_it_passes_on(mitm: Mitm) -> None:
    """Loaded after an addon that changes bodies as they stream, the log holds what the
    peers got: the changed bodies."""
    before = last_id(mitm.db)
    with httpx.Client() as client:
        posted = client.post(f"{mitm.url}/echo?change=before", content=chunked(b'{"a": 1}'))
        streamed = client.get(f"{mitm.url}/events?change=before")
    assert posted.content == b'{"CHANGED": 1}'  # what the upstream got
    assert streamed.content == b'data: {"CHANGED": 1}\n\n' * 2
    upload, stream = exchanges_after(mitm.db, before, 2)
    assert (upload["request_body"], upload["request_body_truncated"], upload["error"]) == (
        '{"CHANGED": 1}',
        0,
        None,
    )
    with EventLog(mitm.db) as log:
        assert [c["data"] for c in log.chunks(stream["id"])] == [b'data: {"CHANGED": 1}\n\n'] * 2
        assert [json.loads(e["data"]) for e in log.events(stream["id"])] == [{"CHANGED": 1}] * 2
    assert stream["error"] is None


def test_a_later_addons_stream_says_the_body_was_not_recorded(mitm: Mitm) -> None:
    """An addon loaded after tasktape's that replaces its tee (or streams a body it did not
    tee) leaves the body out of the log: the exchange says so, not silently empty."""
    before = last_id(mitm.db)
    with httpx.Client() as client:
        posted = client.post(f"{mitm.url}/echo?change=after", content=chunked(b'{"a": 1}'))
        streamed = client.get(f"{mitm.url}/events?change=after")
    assert posted.content == b'{"CHANGED": 1}'
    assert streamed.content == b'data: {"CHANGED": 1}\n\n' * 2
    upload, stream = exchanges_after(mitm.db, before, 2)
    assert upload["request_body_truncated"] == 1
    assert "a later addon replaced flow.request.stream" in upload["error"]
    assert "a later addon replaced flow.response.stream" in upload["error"]
    with EventLog(mitm.db) as log:
        assert log.chunks(stream["id"]) == []
    assert (stream["outcome"], stream["is_sse"]) == ("complete", 1)
    assert "a later addon replaced flow.response.stream" in stream["error"]


def h2_get(port: int, path: str) -> int:
    """GET ``path`` over HTTP/2 (TLS, ALPN h2, mitmproxy's certificate unchecked): the status."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    tls.set_alpn_protocols(["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", "GET"), (":scheme", "https"), (":authority", f"127.0.0.1:{port}"), (":path", path)]
    conn.send_headers(1, headers, end_stream=True)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, tls.wrap_socket(raw) as sock:
        assert sock.selected_alpn_protocol() == "h2"
        sock.sendall(conn.data_to_send())
        while True:
            data = sock.recv(65536)
            assert data, "mitmproxy closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    return int(dict(event.headers)[b":status"])
            sock.sendall(conn.data_to_send())


def test_an_http2_request_has_its_authority_as_host(mitm: Mitm) -> None:
    """An HTTP/2 request has no Host header, only :authority: the log keeps it as the Host
    an HTTP/1 client would have sent (mitmproxy's reverse proxy names the upstream in
    both), so the request's host is known to whoever reads the log."""
    before = last_id(mitm.db)
    with httpx.Client() as http1:
        assert http1.get(f"{mitm.url}/plain").status_code == 200
    assert h2_get(mitm.port, "/plain") == 200
    one, two = exchanges_after(mitm.db, before, 2)
    upstream_host = mitm.upstream.removeprefix("http://")
    assert json.loads(one["request_headers"])[0] == ["Host", upstream_host]
    assert json.loads(two["request_headers"])[:1] == [["Host", upstream_host]]


def test_a_request_without_a_body_has_none_in_the_log(mitm: Mitm) -> None:
    """No body at all (no Content-Length, not chunked) is NULL, as tasktape record stores
    it (and a cassette made of the log has no empty body); an empty chunked one is empty."""
    before = last_id(mitm.db)
    with httpx.Client() as client:
        assert client.get(f"{mitm.url}/plain").status_code == 200
        assert client.post(f"{mitm.url}/echo", content=chunked()).status_code == 200
    bodiless, empty = exchanges_after(mitm.db, before, 2)
    assert (bodiless["request_body"], empty["request_body"]) == (None, "")


def test_a_flow_mitmproxy_kills_is_one_exchange(mitm: Mitm) -> None:
    """mitmproxy kills a cleartext HTTP/2 (prior knowledge) request on an HTTP/1 listener,
    and calls its request and error hooks with the flow no longer live: still the flow
    followed from its request headers, one exchange, killed, not a second one beside it
    left open."""
    before = last_id(mitm.db)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", "/plain")])
    with socket.create_connection(("127.0.0.1", mitm.port), timeout=10) as sock:
        sock.sendall(conn.data_to_send())
        while sock.recv(65536):  # until mitmproxy closes the connection
            pass
    with httpx.Client() as client:
        assert client.get(f"{mitm.url}/plain").status_code == 200
    deadline = time.monotonic() + 10
    while ("GET", "complete") not in (rows := ended_after(mitm.db, before)):
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
    assert rows == [("PRI", "killed"), ("GET", "complete")]


# -- responses mitmproxy does not fetch, and bodies it modifies -------------------------------

# An addon answering /answered itself, in its request hook, with an event stream.
ANSWERER = """
from mitmproxy import http

class Answer:
    def request(self, flow):
        if flow.request.path == "/answered":
            body = b'data: {"answered": 1}\\n\\ndata: {"answered": 2}\\n\\n'
            flow.response = http.Response.make(200, body, {"Content-Type": "text/event-stream"})

addons = [Answer()]
"""


def chunks_and_events(db: Path, exchange: dict[str, Any]) -> tuple[bytes, list[Any]]:
    with EventLog(db) as log:
        data = b"".join(c["data"] for c in log.chunks(exchange["id"]))
        return data, [json.loads(e["data"]) for e in log.events(exchange["id"])]


def test_event_streams_answered_without_the_upstream_are_recorded(tmp_path: Path) -> None:
    """A response set in the request hook (by an addon, or by server replay of a flow file)
    is sent whole, its stream callable never called: the log holds the bytes the client got
    and their events, not an exchange without a body."""
    saved, answerer, db = tmp_path / "saved.mitm", tmp_path / "answer.py", tmp_path / "answered.db"
    answerer.write_text(ANSWERER)
    with in_thread(upstream()) as url:
        port = free_port()
        plain = [MITMDUMP, "-w", str(saved), *mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")]
        with running(plain, [port], tmp_path / "plain.txt"), httpx.Client() as client:
            upstreams = client.get(f"http://127.0.0.1:{port}/events").content
        port = free_port()
        args = [MITMDUMP, "-S", str(saved), "-s", str(addon_path()), "-s", str(answerer)]
        args += ["--set", f"tasktape_db={db}", *mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")]
        with running(args, [port], tmp_path / "mitm.txt"), httpx.Client() as client:
            replayed = client.get(f"http://127.0.0.1:{port}/events")
            answered = client.get(f"http://127.0.0.1:{port}/answered")
            (x_replayed, x_answered) = wait_for_exchanges(db, 0, 2)
    assert replayed.content == upstreams == b'data: {"a": 1}\n\n' * 2
    assert answered.content == b'data: {"answered": 1}\n\ndata: {"answered": 2}\n\n'
    for x, got in ((x_replayed, replayed), (x_answered, answered)):
        assert (x["status"], x["is_sse"], x["outcome"], x["error"]) == (200, 1, "complete", None)
        assert chunks_and_events(db, x) == (
            got.content,
            [json.loads(line[6:]) for line in got.iter_lines() if line],
        )


def test_modify_body_and_streamed_event_streams(tmp_path: Path) -> None:
    """mitmproxy modifies no body it streams: with modify_body set, the addon says that
    event streams pass unmodified, and tasktape_stream_events=false leaves them buffered,
    modified for the client, recorded whole and said to be untimed. (mitmproxy runs its
    modify_body after script addons: the log has the body as the upstream sent it.)"""
    modify = ["--modify-body", '/~s/"a"/"CHANGED"']
    sent = b'data: {"a": 1}\n\n' * 2
    with in_thread(upstream()) as url:
        got, logs = {}, {}
        for streamed in (True, False):
            port, logs[streamed] = free_port(), tmp_path / f"{streamed}.db"
            args = [MITMDUMP, "-s", str(addon_path()), "--set", f"tasktape_db={logs[streamed]}", *modify]
            args += ["--set", f"tasktape_stream_events={str(streamed).lower()}"]
            args += mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")
            with running(args, [port], tmp_path / f"{streamed}.txt"), httpx.Client() as client:
                got[streamed] = client.get(f"http://127.0.0.1:{port}/events").content
                (x,) = wait_for_exchanges(logs[streamed], 0, 1)
            said = (tmp_path / f"{streamed}.txt").read_text()
            assert ("event streams (text/event-stream) are streamed through" in said) is streamed, said
            assert chunks_and_events(logs[streamed], x) == (sent, [{"a": 1}] * 2)
    assert got == {True: sent, False: b'data: {"CHANGED": 1}\n\n' * 2}
    assert (x["is_sse"], x["outcome"], x["error"]) == (1, "complete", BUFFERED_UNTIMED)


# -- options changed at run time ------------------------------------------------------------

# An addon setting the options its /switch request's query names, as another addon or
# mitmweb's option editor may: it answers what mitmproxy said.
SWITCHER = """
from mitmproxy import ctx, exceptions, http

class Switch:
    def request(self, flow):
        if flow.request.path.startswith("/switch"):
            try:
                ctx.options.set(*(f"{k}={v}" for k, v in flow.request.query.items()))
                said = "accepted"
            except exceptions.OptionsError as exc:
                said = str(exc)
            flow.response = http.Response.make(200, said)

addons = [Switch()]
"""


def test_an_option_change_refused_at_run_time_leaves_the_log_open(tmp_path: Path) -> None:
    """mitmproxy rolls a refused change back by configuring the addon again with the values
    in use: the log stays open, the stream in flight is recorded whole, in one capture. A
    change that is taken reopens it."""
    switcher, db, port = tmp_path / "switch.py", tmp_path / "switched.db", free_port()
    switcher.write_text(SWITCHER)
    with in_thread(upstream()) as url:
        args = [MITMDUMP, "-s", str(addon_path()), "-s", str(switcher), "--set", f"tasktape_db={db}"]
        args += mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")
        with running(args, [port], tmp_path / "mitm.txt"), httpx.Client(timeout=10) as client:
            proxy = f"http://127.0.0.1:{port}"
            with client.stream("GET", f"{proxy}/slow") as streamed:
                lines = streamed.iter_lines()
                assert next(lines) == 'data: {"n": 0}'
                said = [
                    client.get(f"{proxy}/switch", params={name: value}).text
                    for name, value in [
                        ("tasktape_max_body", "-5"),
                        ("tasktape_db", tmp_path / "no" / "x.db"),
                    ]
                ]
                rest = list(lines)
            assert rest == ["", 'data: {"n": 1}', ""]
            stream, *_ = wait_for_exchanges(db, 0, 3)
            assert client.get(f"{proxy}/switch", params={"tasktape_max_body": "5"}).text == "accepted"
            assert client.get(f"{proxy}/plain").status_code == 200
            (plain,) = [x for x in wait_for_exchanges(db, 0, 5) if x["path"] == "/plain"]
            with EventLog(db) as log:
                captures = log.captures()
    assert "tasktape_max_body: must be 0 or more, not -5" in said[0]
    assert said[1].startswith("tasktape_db: ") and "does not exist" in said[1]
    assert (stream["path"], stream["outcome"], stream["error"]) == ("/slow", "complete", None)
    assert chunks_and_events(db, stream)[1] == [{"n": 0}, {"n": 1}]
    # The one begun at start-up, and the one the change taken began.
    assert [c["id"] for c in captures] == [1, plain["capture_id"]] == [1, 2]
