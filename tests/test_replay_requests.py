"""The replay server as clients use it: long rewritten streams on time, clients that
leave, resumes of the stream each client was served, preflights, HEAD, encoded paths,
what a miss says, the control API's answers, and fault specs given twice."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import RecordFactory, Serve
from yarl import URL

from tasktape.agent import create_agent_app
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.replay import ReplayServer, load
from tasktape.replay.streams import apply_edits

MS = 1_000_000


def rpc_request(rpc_id: Any) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": rpc_id,
            "method": "SendStreamingMessage",
            "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "long"}]}},
        }
    ).encode()


def sse(events: list[tuple[str, str]]) -> list[tuple[int, bytes]]:
    """Chunks of one event each, ``(id, data)``, 1 ms apart."""
    return [(n * MS, f"id: {eid}\ndata: {data}\n\n".encode()) for n, (eid, data) in enumerate(events, 1)]


def rpc_stream(n: int, rpc_id: Any = 1) -> Recorded:
    """A JSON-RPC SendStreamingMessage answered by ``n`` events, each carrying ``rpc_id``."""
    chunks = [
        (
            i * 1000,
            f'id: {i}\ndata: {{"jsonrpc":"2.0","id":{json.dumps(rpc_id)},"result":{{"n":{i}}}}}\n\n'.encode(),
        )
        for i in range(n)
    ]
    return Recorded(
        method="POST",
        path="/jsonrpc",
        request_body=rpc_request(rpc_id),
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=chunks,
        duration_ns=n * 1000 + MS,
        outcome="complete",
    )


def events_stream(prefix: str, resumed_from: str | None = None) -> Recorded:
    """A GET stream of five events, ids 1 to 5, data ``prefix``1 to ``prefix``5."""
    return Recorded(
        method="GET",
        path="/events",
        request_headers=[("Last-Event-ID", resumed_from)] if resumed_from else [],
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=sse([(str(i), f"{prefix}{i}") for i in range(1, 6)]),
        duration_ns=10 * MS,
        outcome="complete",
    )


def served_from(tmp_path: Path, recordings: list[Recorded], **options: Any) -> ReplayServer:
    """A replay server of ``recordings``, as a cassette holds them."""
    write_cassette(tmp_path / "c.jsonl", recordings)
    return ReplayServer(load([tmp_path / "c.jsonl"]), speed=options.pop("speed", 0), **options)


def data_of(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]


async def first_byte_after(url: str, body: bytes) -> float:
    """The CPU seconds this process (client and server) spends from sending ``body`` to the
    first byte of its answer (read to its end): the work done before it, which other
    processes on a busy machine do not stretch as they stretch the wall clock."""
    async with aiohttp.ClientSession() as session:
        start = time.process_time()
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
            await r.content.readany()
            took = time.process_time() - start
            await r.read()
            return took


# -- long streams with a rewritten JSON-RPC id ----------------------------------------------


def test_edits_on_a_long_stream_take_linear_time() -> None:
    """An edit in each of 20,000 chunks (a JSON-RPC id in every event): one pass, not one
    per chunk boundary over every edit."""
    chunks = [(i, b"id: 1 data") for i in range(20_000)]
    edits = [(i * 10 + 4, 1, b"22") for i in range(20_000)]
    start = time.process_time()  # (CPU: a busy machine does not stretch it)
    edited = apply_edits(chunks, edits)
    assert time.process_time() - start < 1.0
    assert edited[0] == (0, b"id: 22 data") and edited[-1] == (19_999, b"id: 22 data")


async def test_a_long_stream_with_another_id_starts_on_time(tmp_path: Path, serve: Serve) -> None:
    """10,000 events answered with the client's JSON-RPC id start about as soon as with the
    recorded id, and hold up no other request meanwhile."""
    server = served_from(
        tmp_path,
        [
            rpc_stream(10_000),
            Recorded(method="GET", path="/ping", status=200, chunks=[(0, b"pong")], outcome="complete"),
        ],
        speed=1,
        allow_repeats=True,
    )
    url = await serve(server.app)
    recorded_id = await first_byte_after(f"{url}/jsonrpc", rpc_request(1))
    rewritten = asyncio.create_task(first_byte_after(f"{url}/jsonrpc", rpc_request(2)))
    await asyncio.sleep(0)
    async with aiohttp.ClientSession() as session:
        start = time.process_time()
        async with session.get(f"{url}/ping") as r:
            assert await r.read() == b"pong"
        unrelated = time.process_time() - start
    assert await rewritten < recorded_id + 1.0
    assert unrelated < 1.0


# -- a client that leaves ---------------------------------------------------------------------


async def test_a_client_leaving_mid_stream_is_client_left_not_an_error(
    tmp_path: Path, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that leaves mid-stream (here: done sending, so aiohttp closes under the
    stream) is a client-left in the report, and no error in the log."""
    stream = events_stream("a")
    stream.chunks = [(0, b"id: 0\ndata: first\n\n")] + [(i * 50 * MS, b"data: x\n\n") for i in range(1, 10)]
    server = served_from(tmp_path, [stream], speed=1)
    url = await serve(server.app)
    host, port = url.removeprefix("http://").split(":")
    caplog.set_level(logging.INFO)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /events HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    await writer.drain()
    # A client done sending (half-closed): aiohttp closes the connection under the stream.
    writer.write_eof()
    await reader.read()
    writer.close()
    await writer.wait_closed()
    for _ in range(30):  # until the server has noticed
        if server.served[0].reasons:
            break
        await asyncio.sleep(0.02)
    (stream_report,) = server.report()["streams"]
    assert any(r.startswith("client-left") for r in stream_report["reasons"])
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_client_leaving_after_the_last_byte_got_it_whole(tmp_path: Path, serve: Serve) -> None:
    """A client that leaves once it has every byte, before the recorded end of the body (an
    OpenAI client reads [DONE] and closes), got the answer as recorded: no client-left."""
    stream = events_stream("a")
    stream.chunks = [(i * 10 * MS, data) for i, (_, data) in enumerate(stream.chunks)]
    stream.duration_ns = 400 * MS  # the body ended well after its last event
    server = served_from(tmp_path, [stream], speed=1)
    url = await serve(server.app)
    whole = sum(len(data) for _, data in stream.chunks)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/events") as response:
        assert await response.content.readexactly(whole) == b"".join(d for _, d in stream.chunks)
    for _ in range(50):  # until the server has noticed
        if server.served[0].finished or server.served[0].reasons:
            break
        await asyncio.sleep(0.02)
    (report,) = server.report()["streams"]
    assert (report["identical"], report["finished"], report["reasons"]) == (True, True, [])


# -- resuming the stream this client was served -----------------------------------------------


async def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers or {}) as r:
        return r.status, await r.read()


async def post(url: str | URL, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers={"Content-Type": "application/json", **(headers or {})}) as r,
    ):
        return r.status, await r.read()


async def test_a_resume_continues_the_recording_it_was_served(tmp_path: Path, serve: Serve) -> None:
    """Two identical recordings: the client cut after event 3 of the first gets the rest of
    the first, not of the second."""
    server = served_from(tmp_path, [events_stream("a"), events_stream("b")])
    url = await serve(server.app)
    with contextlib.suppress(aiohttp.ClientPayloadError):
        await get(f"{url}/events", {"X-Tasktape-Fault": "drop-after=3"})
    status, body = await get(f"{url}/events", {"Last-Event-ID": "3"})
    assert status == 200 and data_of(body) == ["a4", "a5"]
    # The second recording is still the next fresh request's.
    status, body = await get(f"{url}/events")
    assert status == 200 and data_of(body) == ["b1", "b2", "b3", "b4", "b5"]


async def test_a_resumed_jsonrpc_stream_carries_the_id_of_the_request_that_resumed(
    tmp_path: Path, serve: Serve
) -> None:
    """Two clients served the same recording (--allow-repeats): each one's resume carries its
    own JSON-RPC id, not the id of whoever was served last."""
    server = served_from(tmp_path, [rpc_stream(10)], allow_repeats=True)
    url = await serve(server.app)
    for client in ("A", "B"):
        status, body = await post(f"{url}/jsonrpc", rpc_request(client))
        assert status == 200 and {json.loads(d)["id"] for d in data_of(body)} == {client}
    status, body = await post(f"{url}/jsonrpc", rpc_request("A"), {"Last-Event-ID": "7"})
    assert status == 200
    assert [(json.loads(d)["id"], json.loads(d)["result"]["n"]) for d in data_of(body)] == [
        ("A", 8),
        ("A", 9),
    ]


async def test_an_unknown_last_event_id_after_the_stream_was_served_is_a_400(
    tmp_path: Path, serve: Serve
) -> None:
    """Served or not yet, a Last-Event-ID the stream does not hold is a 400 naming its ids,
    never a miss."""
    server = served_from(tmp_path, [events_stream("a")])
    url = await serve(server.app)
    for served in (False, True):
        if served:
            assert (await get(f"{url}/events"))[0] == 200
        status, body = await get(f"{url}/events", {"Last-Event-ID": "99"})
        assert status == 400
        assert "names no event" in body.decode() and "from '1' to '5'" in body.decode()
    assert server.stats.missed == []


async def test_a_resume_from_the_event_a_recording_broke_off_in_is_a_miss(
    tmp_path: Path, record: RecordFactory, serve: Serve
) -> None:
    """The demo agent's stream dropped mid-event, recorded through the recorder: a client
    that kept that event's id (its id line came, its data did not) and resumed with it got a
    200 with nothing in it, then a broken transfer, every time. No rest was recorded: the
    resume is a miss that says so."""
    rec = await record(await serve(create_agent_app(pace=0.01)))
    question = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "please drop"}]}}
    headers = {"A2A-Version": "1.0"}
    received = b""
    async with rec.session.post(f"{rec.url}/message:stream", json=question, headers=headers) as r:
        with pytest.raises(aiohttp.ClientPayloadError):
            async for data in r.content.iter_any():
                received += data
    (await rec.log()).close()
    cut_id = received.rsplit(b"id: ", 1)[1].split(b"\n", 1)[0].decode()
    assert not received.endswith(b"\n\n")  # the id line of an event whose data was cut
    url = await serve(ReplayServer(load([rec.db]), speed=0).app)
    resume = {**headers, "Last-Event-ID": cut_id}
    status, body = await post(f"{url}/message:stream", json.dumps(question).encode(), resume)
    (closest, *_) = json.loads(body)["error"]["closest"]
    assert status == 404
    assert closest["differs"] == [
        f"its recording breaks off in event {cut_id} (upstream_disconnected): what came after was not "
        "recorded"
    ]


async def test_only_whole_events_are_resumed_after(tmp_path: Path, serve: Serve) -> None:
    """A stream that ended with half an event: its id names no event a client saw (none was
    dispatched), so resuming from it is a 400 naming the ids there are, not an empty rest."""
    stream = events_stream("a")
    stream.chunks.append((6 * MS, b'id: 6\ndata: {"ha'))
    url = await serve(served_from(tmp_path, [stream]).app)
    status, body = await get(f"{url}/events", {"Last-Event-ID": "6"})
    assert status == 400 and "'6' names no event" in body.decode() and "from '1' to '5'" in body.decode()


# -- compressed request bodies ----------------------------------------------------------------


async def test_a_compressed_body_is_decoded_within_the_bound_or_refused_saying_why(
    tmp_path: Path, serve: Serve
) -> None:
    """A body decoded whole before matching, without the bound the docs give (16 MiB then a
    413), and one that does not decode from its Content-Encoding was matched as its
    compressed bytes, the miss never saying why: a 413 and a 400 that say so, counted as
    refused. One that decodes is matched as ever."""
    server = served_from(tmp_path, [ok("POST", "/x")])
    url = await serve(server.app)
    gzipped = {"Content-Encoding": "gzip"}
    bomb = gzip.compress(bytes(17 * 1024 * 1024))  # some 17 KB, 17 MiB decoded
    status, body = await post(f"{url}/x", bomb, gzipped)
    assert status == 413
    assert json.loads(body)["error"]["message"].startswith(
        "the request body is over 16,777,216 bytes decoded from its Content-Encoding gzip: "
    )
    status, body = await post(f"{url}/x", b"not gzip", gzipped)
    assert status == 400
    assert "cannot be decoded from its Content-Encoding gzip" in json.loads(body)["error"]["message"]
    assert await post(f"{url}/x", gzip.compress(b'{"message": {"messageId": "m"}}'), gzipped) == (200, b"ok")
    assert server.stats.refused == [
        "POST /x (a body over 16,777,216 bytes decoded from its Content-Encoding gzip)",
        "POST /x (Content-Encoding gzip: content decoding failed (Error -3 while decompressing data: "
        "incorrect header check))",
    ]
    assert server.stats.missed == []


# -- preflights, HEAD, encoded paths ----------------------------------------------------------


def preflight() -> Recorded:
    return Recorded(
        method="OPTIONS",
        path="/message:stream",
        request_headers=[("Origin", "http://localhost:5173"), ("Access-Control-Request-Method", "POST")],
        status=204,
        response_headers=[
            ("Access-Control-Allow-Origin", "http://localhost:5173"),
            ("Access-Control-Allow-Methods", "POST"),
        ],
        outcome="complete",
    )


def ok(method: str, path: str, body: bytes = b"ok") -> Recorded:
    return Recorded(
        method=method,
        path=path,
        request_body=b'{"message": {"messageId": "m"}}' if method == "POST" else None,
        status=200,
        response_headers=[("Content-Type", "text/plain"), ("Content-Length", str(len(body)))],
        chunks=[(0, body)],
        outcome="complete",
    )


async def test_a_preflight_is_answered_however_often_it_comes(tmp_path: Path, serve: Serve) -> None:
    """A browser sends a preflight before each POST its cache has none for: one recorded
    preflight answers them all, as a card does."""
    server = served_from(
        tmp_path, [preflight(), ok("POST", "/message:stream"), ok("POST", "/message:stream")]
    )
    url = await serve(server.app)
    statuses = []
    async with aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.options(
                f"{url}/message:stream",
                headers={"Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST"},
            ) as r:
                statuses.append(r.status)
                assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"
            async with session.post(f"{url}/message:stream", data=b'{"message": {"messageId": "x"}}') as r:
                statuses.append(r.status)
    assert statuses == [204, 200, 204, 200]


async def test_head_is_answered_from_the_get_without_using_it_up(tmp_path: Path, serve: Serve) -> None:
    """HEAD of a recorded GET: its status and headers, no body; the GET still gets its answer."""
    server = served_from(tmp_path, [ok("GET", "/report", b"the report")])
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        async with session.head(f"{url}/report") as r:
            assert r.status == 200 and r.headers["Content-Length"] == "10" and await r.read() == b""
            assert r.headers["Content-Type"].startswith("text/plain")
        async with session.get(f"{url}/report") as r:
            assert r.status == 200 and await r.read() == b"the report"


async def test_head_misses_once_the_get_is_used_up(tmp_path: Path, serve: Serve) -> None:
    """A HEAD answers as the next GET would: once the recorded GET was served, it misses as
    that GET does (unless repeats are allowed); a card answers however often it is asked."""
    card = ok("GET", "/.well-known/agent-card.json", b'{"name": "agent"}')
    server = served_from(tmp_path, [ok("GET", "/report", b"the report"), card])
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        for path in ("/report", "/.well-known/agent-card.json"):
            async with session.get(f"{url}{path}") as r:
                assert r.status == 200
        async with session.head(f"{url}/report") as r:
            assert r.status == 404
        async with session.head(f"{url}/.well-known/agent-card.json") as r:
            assert r.status == 200
    (missed,) = server.stats.missed
    assert missed.request == "HEAD /report"
    assert missed.closest[0]["differs"][0].startswith("already served 1 time(s)")
    repeats = served_from(tmp_path, [ok("GET", "/report", b"the report")], allow_repeats=True)
    url = await serve(repeats.app)
    assert (await get(f"{url}/report"))[0] == 200
    async with aiohttp.ClientSession() as session, session.head(f"{url}/report") as r:
        assert r.status == 200 and r.headers["Content-Length"] == "10"


async def test_percent_encoded_paths_match_the_recorded_path(tmp_path: Path, serve: Serve) -> None:
    """``/message%3Astream`` and ``/%6Dessage:stream`` name ``/message:stream``, as the
    agent's server reads them."""
    server = served_from(tmp_path, [ok("POST", "/message:stream", b"1"), ok("POST", "/message:stream", b"2")])
    url = await serve(server.app)
    got = []
    for path in ("/message%3Astream", "/%6Dessage:stream"):
        status, body = await post(URL(f"{url}{path}", encoded=True), b'{"message": {"messageId": "x"}}')
        got.append((status, body))
    assert got == [(200, b"1"), (200, b"2")]


# -- what a miss says ---------------------------------------------------------------------------


async def test_a_miss_says_a_resume_recording_needs_its_last_event_id(tmp_path: Path, serve: Serve) -> None:
    """A recording of a resume is not for a fresh request: the miss says which it is for,
    not that it was used up."""
    server = served_from(tmp_path, [events_stream("a"), events_stream("r", resumed_from="3")])
    url = await serve(server.app)
    assert (await get(f"{url}/events"))[0] == 200
    status, body = await get(f"{url}/events")
    assert status == 404
    differs = {c["recorded"]: c["differs"] for c in json.loads(body)["error"]["closest"]}
    assert differs["c.jsonl:9"] == [
        "recorded as a resume after event 3: only a request with Last-Event-ID 3 gets it"
    ]


async def test_a_repeated_request_is_told_of_allow_repeats(tmp_path: Path, serve: Serve) -> None:
    """Asked more often than recorded: the miss names the option that answers repeats."""
    server = served_from(tmp_path, [ok("GET", "/report")])
    url = await serve(server.app)
    assert (await get(f"{url}/report"))[0] == 200
    status, body = await get(f"{url}/report")
    error = json.loads(body)["error"]
    assert status == 404
    assert "--allow-repeats (allow_repeats=True in the pytest marker)" in error["closest"][0]["differs"][0]
    assert "--allow-repeats" in error["hint"]


# -- the control API and fault specs ------------------------------------------------------------


async def test_the_control_api_says_allow_refuses_unknown_keys_and_reads_gzip(
    tmp_path: Path, serve: Serve
) -> None:
    """A 405 names the methods in Allow; a key it does not take is refused, by name; a
    gzipped body is read as the replay reads the bodies it matches."""
    server = served_from(tmp_path, [ok("GET", "/report")])
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        async with session.delete(f"{url}/_tasktape/faults") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET, POST"
        async with session.post(f"{url}/_tasktape/faults", json={"fault": "drop-after=1", "extra": 1}) as r:
            assert r.status == 400 and 'unknown key(s) "extra"' in (await r.json())["error"]["message"]
        gzipped = gzip.compress(b'{"fault": "drop-after=1"}')
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        async with session.post(f"{url}/_tasktape/faults", data=gzipped, headers=headers) as r:
            assert r.status == 200 and (await r.json())["armed"]["fault"] == "drop-after=1"
    assert [a.as_json()["fault"] for a in server.armed] == ["drop-after=1"]


@pytest.mark.parametrize("spec", ["drop-after=3;drop-after=4", "times=1;drop-after=2;times=5"])
async def test_a_fault_item_given_twice_is_refused(tmp_path: Path, serve: Serve, spec: str) -> None:
    """A spec naming an item twice would have its last value win, unsaid: refused, naming it."""
    server = served_from(tmp_path, [events_stream("a")])
    url = await serve(server.app)
    status, body = await post(f"{url}/_tasktape/faults", json.dumps({"fault": spec}).encode())
    name = spec.split("=", maxsplit=1)[0]
    assert status == 400 and f"{name} is given twice" in json.loads(body)["error"]["message"]


# -- HTTP/1.0 keep-alive clients ----------------------------------------------------------------


async def http10(url: str, request_line: str, body: bytes = b"") -> tuple[bytes, float]:
    """Send one HTTP/1.0 keep-alive request; what arrives until the server closes the
    connection or 5 s pass, and how long that took."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = f"{request_line} HTTP/1.0\r\nHost: {host}:{port}\r\nConnection: keep-alive\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    start = time.perf_counter()
    writer.write(head.encode() + b"\r\n" + body)
    received = b""
    try:
        async with asyncio.timeout(5):
            while data := await reader.read(65536):
                received += data
                if b"\r\n\r\n" in received and b"Content-Length" in received.partition(b"\r\n\r\n")[0]:
                    head_part, _, got = received.partition(b"\r\n\r\n")
                    length = int(head_part.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    if len(got) >= length:
                        break  # whole, by its length: the connection may stay open
    except TimeoutError:
        pass
    writer.close()
    return received, time.perf_counter() - start


async def test_http10_keep_alive_clients_get_a_length_or_a_close(tmp_path: Path, serve: Serve) -> None:
    """An answer whose recorded length an edit changed (its JSON-RPC id) goes out with its
    new length; a stream of unknown length to an HTTP/1.0 client ends with the connection:
    neither leaves the client waiting."""
    answer = b'{"jsonrpc":"2.0","id":1,"result":{"ok":true}}'
    rpc = Recorded(
        method="POST",
        path="/rpc",
        request_body=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        status=200,
        response_headers=[("Content-Type", "application/json"), ("Content-Length", str(len(answer)))],
        chunks=[(0, answer)],
        outcome="complete",
    )
    server = served_from(tmp_path, [rpc, events_stream("a")])
    url = await serve(server.app)
    received, took = await http10(url, "POST /rpc", b'{"jsonrpc":"2.0","id":"a-longer-id","method":"ping"}')
    head, _, body = received.partition(b"\r\n\r\n")
    assert body == b'{"jsonrpc":"2.0","id":"a-longer-id","result":{"ok":true}}'
    assert f"Content-Length: {len(body)}".encode() in head and took < 4
    received, took = await http10(url, "GET /events")
    assert data_of(received.partition(b"\r\n\r\n")[2]) == ["a1", "a2", "a3", "a4", "a5"] and took < 4
