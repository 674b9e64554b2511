"""Compressed bodies: the upstream gets exactly the bytes the client sent (gzip, deflate,
br; read whole or streamed), through tasktape record and through replay's record-missing
and passthrough modes; the log keeps them decoded and says so; and what decodes to more
than the bound (a compression bomb) costs the log no more than the bound."""

from __future__ import annotations

import gzip
import hashlib
import json
import signal
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import brotli
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from loopback import running, stop
from multidict import CIMultiDict

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.content_coding import Inflate, decode_body
from tasktape.eventlog.recorded import Recorded
from tasktape.replay import ReplayMode, ReplayServer, load

MESSAGE = {
    "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}
}
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}


def big_message(size: int) -> bytes:
    """A request past the size read whole (64 KiB): it streams through."""
    return json.dumps({**MESSAGE, "metadata": {"padding": "x" * size}}).encode()


def witness() -> web.Application:
    """An agent that answers with what reached it: the SHA-256 and length of the body as
    sent, and whether it decodes (under the Content-Encoding it came with) to JSON."""

    async def echo(request: web.Request) -> web.Response:
        raw = await request.read()
        decoded, why = decode_body(raw, request.headers.get("Content-Encoding"))
        try:
            parsed = why is None and isinstance(json.loads(decoded), dict)
        except ValueError:
            parsed = False
        return web.json_response(
            {"sha256": hashlib.sha256(raw).hexdigest(), "length": len(raw), "json": parsed},
            status=200 if parsed else 500,
        )

    app = web.Application(handler_args={"auto_decompress": False})
    app.router.add_post("/message:send", echo)
    return app


async def post(url: str, body: bytes, encoding: str, *, chunked: bool = False) -> dict[str, object]:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 7000):
            yield body[start : start + 7000]

    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(f"{url}/message:send", data=pieces() if chunked else body, headers=headers) as r,
    ):
        answer = await r.json()
        answer["status"] = r.status
        return answer


def sent_as(body: bytes) -> dict[str, object]:
    return {"sha256": hashlib.sha256(body).hexdigest(), "length": len(body), "json": True, "status": 200}


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
@pytest.mark.parametrize("shape", ["small", "large", "chunked"])
async def test_the_recorder_forwards_compressed_bodies_as_sent(
    record: RecordFactory, encoding: str, shape: str
) -> None:
    plain = json.dumps(MESSAGE).encode() if shape == "small" else big_message(300_000)
    body = ENCODERS[encoding](plain)
    rec = await record(witness())
    assert await post(rec.upstream, body, encoding, chunked=shape == "chunked") == sent_as(body)  # direct
    assert await post(rec.url, body, encoding, chunked=shape == "chunked") == sent_as(body)
    with await rec.log() as log:
        (x,) = log.exchanges()
    # The log keeps the body decoded, and says from what.
    assert x["request_body"].encode() == plain
    assert x["request_body_encoding"] == encoding
    assert x["rpc_method"] == "SendMessage" and x["error"] is None


async def test_a_body_that_does_not_decode_is_forwarded_and_kept_as_sent(record: RecordFactory) -> None:
    rec = await record(witness())
    body = b"\x1f\x8b this is not gzip"
    answer = await post(rec.url, body, "gzip")
    assert (answer["sha256"], answer["status"]) == (hashlib.sha256(body).hexdigest(), 500)  # the agent's 500
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert x["request_body"] == body and x["request_body_encoding"] is None
    assert "request body: content decoding failed" in x["error"] and "stored as sent" in x["error"]


async def test_a_coding_sent_in_two_lines_is_both_codings(record: RecordFactory) -> None:
    """Two lines of Content-Encoding: gzip say gzip, gzip (RFC 9110 section 5.3): the log
    decoded the first alone and stored the bytes still gzip'd as a body decoded from gzip."""
    twice = gzip.compress(gzip.compress(json.dumps(MESSAGE).encode()))
    lines = CIMultiDict([("Content-Encoding", "gzip"), ("Content-Encoding", "gzip")])

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=twice, headers=lines, content_type="application/json")

    app = web.Application()
    app.router.add_post("/message:send", answer)
    rec = await record(app)
    async with rec.session.post(f"{rec.url}/message:send", data=twice, headers=lines) as r:
        assert await r.read() == twice
    await rec.proxy.wait_idle()
    with await rec.log() as log:
        (x,) = log.exchanges()
        body = log.body(x["id"])
    assert (x["request_body"], x["request_body_encoding"]) == (twice, None)  # stored as they came
    assert (body, x["body_encoding"]) == (twice, None)
    assert "request body: cannot decode Content-Encoding gzip, gzip: it is stored as sent" in x["error"]
    assert "cannot decode Content-Encoding gzip, gzip: the body is stored as received" in x["error"]


@pytest.mark.parametrize("mode", [ReplayMode.RECORD_MISSING, ReplayMode.PASSTHROUGH])
@pytest.mark.parametrize("encoding", ["gzip", "br"])
async def test_replay_modes_that_forward_send_the_bodies_as_sent(
    tmp_path: Path, serve: Serve, mode: ReplayMode, encoding: str
) -> None:
    agent = await serve(witness())
    db = tmp_path / "grows.db"
    body = ENCODERS[encoding](big_message(200_000))
    with LogWriter(db) as writer:
        server = ReplayServer([], speed=0, mode=mode, upstream=agent, writer=writer, log_path=db)
        url = await serve(server.app)
        assert await post(url, body, encoding, chunked=True) == sent_as(body)
    if mode is ReplayMode.RECORD_MISSING:
        with EventLog(db) as log:
            (x,) = log.exchanges()
        assert x["request_body_encoding"] == encoding


async def test_a_compressed_request_replays_against_its_recording(
    record: RecordFactory, serve: Serve
) -> None:
    """Replay matches request bodies as the log keeps them: decoded."""
    rec = await record(witness())
    body = gzip.compress(json.dumps(MESSAGE).encode())
    recorded = await post(rec.url, body, "gzip")
    await rec.log()
    url = await serve(ReplayServer(load([rec.db]), speed=0).app)
    again = json.dumps({**MESSAGE, "message": {**MESSAGE["message"], "messageId": "m-2"}}).encode()
    assert await post(url, zlib.compress(again), "deflate") == recorded


async def test_a_replay_reads_a_coding_in_two_lines_as_both(serve: Serve, tmp_path: Path) -> None:
    """The replay decoded a body under two Content-Encoding lines once and matched the
    still-gzipped bytes (a 404 miss); it says it cannot decode gzip, gzip, as for one line."""
    write_cassette(tmp_path / "c.jsonl", [Recorded(method="POST", path="/ask", request_body=b'{"q": 1}')])
    url = await serve(ReplayServer(load([tmp_path / "c.jsonl"]), speed=0).app)
    twice = gzip.compress(gzip.compress(b'{"q": 1}'))
    said = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for lines in (["gzip", "gzip"], ["gzip, gzip"]):
            headers = CIMultiDict(("Content-Encoding", line) for line in lines)
            async with session.post(f"{url}/ask", data=twice, headers=headers) as r:
                said.append((r.status, (await r.json())["error"]["message"]))
    assert said[0] == said[1] and said[0][0] == 400
    assert "cannot decode Content-Encoding gzip, gzip" in said[0][1]


def bomb_app(decoded: int) -> tuple[web.Application, bytes]:
    """An SSE stream whose gzip body (a few KiB a chunk) decodes to ``decoded`` bytes."""
    event = b"data: " + b"0" * 1018 + b"\n\n"
    plain = event * (decoded // len(event))
    wire = gzip.compress(plain, compresslevel=9)

    async def stream(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        for start in range(0, len(wire), 4096):
            await response.write(wire[start : start + 4096])
        return response

    app = web.Application()
    app.router.add_get("/bomb", stream)
    return app, wire


async def test_a_compression_bomb_costs_the_log_no_more_than_the_bound(record: RecordFactory) -> None:
    """40 MiB decoded from ~40 KiB on the wire, with a bound of 4 MiB: the client gets the
    wire bytes unchanged; the log keeps 4 MiB decoded at most, then the wire bytes as they
    came, and says so on the exchange."""
    app, wire = bomb_app(40 * 1024 * 1024)
    bound = 4 * 1024 * 1024
    rec = await record(app, max_decoded=bound)
    async with rec.session.get(f"{rec.url}/bomb") as r:
        assert await r.read() == wire
    with await rec.log() as log:
        (x,) = log.exchanges()
        stored = log.db.execute("SELECT sum(length(data)) FROM chunks").fetchone()[0]
        events = log.db.execute("SELECT count(*) FROM events").fetchone()[0]
    assert stored <= bound + len(wire)
    assert 0 < events <= bound // 1024
    assert x["outcome"] == "complete"
    assert "decodes to more than 4,194,304 bytes" in x["error"] and "the rest of the body" in x["error"]


async def test_the_recorder_names_its_bound_and_the_log_names_none(serve: Serve, tmp_path: Path) -> None:
    """Past the bound, ``tasktape record`` says so on stderr naming the option that raises
    it; the log says it naming none, as what else writes logs (mitmproxy's addon, whose
    option is another) has no ``--max-decoded``."""
    app, wire = bomb_app(1024 * 1024)
    agent, db = await serve(app), tmp_path / "bomb.db"
    args = (
        "record",
        "--upstream",
        agent,
        "--db",
        str(db),
        "--listen",
        "127.0.0.1:0",
        "--max-decoded",
        "100000",
    )
    async with running(*args) as run:
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.get(f"{run.url}/bomb") as r,
        ):
            assert await r.read() == wire
        assert await stop(run, signal.SIGINT) == 0
    said = "Content-Encoding gzip: the body decodes to more than 100,000 bytes"
    warning = f"tasktape record: WARNING: exchange 1 (GET /bomb): {said} (--max-decoded); see exchanges.error"
    assert warning in run.printed[-1].splitlines(), run.printed
    with EventLog(db) as log:
        (x,) = log.exchanges()
    assert x["error"] == f"{said}: the rest of the body is stored as received"


def test_inflate_never_holds_more_than_its_limit() -> None:
    wire = gzip.compress(b"\0" * (50 * 1024 * 1024))
    inflate = Inflate.for_encoding("gzip", limit=1000)
    assert inflate is not None
    out = inflate.feed(wire)
    assert len(out) == 1000 and inflate.exceeded and inflate.feed(wire) == b"" and inflate.flush() == b""
    # (no option named: the bound is each caller's own, which names it where it says so)
    why = "Content-Encoding gzip: the body decodes to more than 1,000 bytes"
    assert decode_body(wire, "gzip", 1000) == (wire, why)
    assert decode_body(gzip.compress(b"ok") * 2, "gzip") == (b"okok", None)  # two members
    assert decode_body(b"x", "zstd") == (b"x", "cannot decode Content-Encoding zstd")


def test_a_brotli_bomb_is_decoded_in_bounded_pieces() -> None:
    """brotli decodes what it is given at once: 5 KiB of br were 1 GiB in one call (the
    recorder's tree grew to 1.7 GB). It is given fewer bytes as they decode to more."""
    plain = (b"data: " + b"A" * 94 + b"\n\n") * (1 << 23)  # 800 MiB
    wire = brotli.compress(plain, quality=5)
    assert len(wire) < 10_000
    inflate = Inflate.for_encoding("br", limit=64 * 1024 * 1024)
    assert inflate is not None
    sizes = [len(piece) for piece in inflate.pieces(wire)]
    # A few compressed bytes decode to a meta-block (16 MiB) at most; the limit stops it.
    assert max(sizes) <= 40 * 1024 * 1024 and max(sizes[1:]) <= 16 * 1024 * 1024
    assert sum(sizes) == 64 * 1024 * 1024 and inflate.exceeded
    # An ordinary body decodes whole, fed in any chunks.
    events = b"".join(b'data: {"n": %d}\n\n' % i for i in range(100_000))
    squeezed = brotli.compress(events)
    whole = Inflate.for_encoding("br")
    assert whole is not None
    assert b"".join(whole.feed(squeezed[i : i + 5000]) for i in range(0, len(squeezed), 5000)) == events


def test_raw_deflate_coming_a_byte_at_a_time_is_decoded() -> None:
    """A deflate body sent without the zlib wrapper, its first byte alone: that byte was
    lost and the rest failed "incorrect header check"."""
    plain = b"data: " + b"x" * 5000 + b"\n\n"
    squeeze = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = squeeze.compress(plain) + squeeze.flush()
    for first in (1, 2, 3):
        inflate = Inflate.for_encoding("deflate")
        assert inflate is not None
        assert inflate.feed(raw[:first]) + inflate.feed(raw[first:]) + inflate.flush() == plain
    wrapped = zlib.compress(plain)
    inflate = Inflate.for_encoding("deflate")
    assert inflate is not None
    assert b"".join(inflate.feed(wrapped[i : i + 1]) for i in range(len(wrapped))) + inflate.flush() == plain


async def test_a_request_bomb_is_forwarded_and_not_decoded(record: RecordFactory) -> None:
    body = gzip.compress(b" " * (80 * 1024 * 1024) + json.dumps(MESSAGE).encode())
    rec = await record(witness(), max_decoded=1024 * 1024)
    answer = await post(rec.url, body, "gzip")
    assert answer["sha256"] == hashlib.sha256(body).hexdigest()
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert x["request_body"] == body and x["request_body_encoding"] is None
    assert "decodes to more than 1,048,576 bytes" in x["error"]


def test_a_chunk_that_decodes_to_megabytes_is_stored_whole_in_pieces(tmp_path: Path) -> None:
    """One wire chunk decoding to 12 MiB: decoded 1 MiB at a time, events split across
    pieces are whole, and every one is in the log, in order."""
    events = [f"id: {i}\ndata: {json.dumps({'n': i, 'pad': 'x' * 990})}\n\n".encode() for i in range(12_000)]
    plain = b"".join(events)
    inflate = Inflate.for_encoding("gzip")
    assert inflate is not None
    assert max(len(p) for p in inflate.pieces(gzip.compress(plain))) <= 1024 * 1024
    db = tmp_path / "big.db"
    with LogWriter(db) as w:
        x = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
        head = [("Content-Type", "text/event-stream"), ("Content-Encoding", "gzip")]
        w.response_head(x, status=200, headers=head, is_sse=True, ttfb_ns=1, content_encoding="gzip")
        w.chunk(x, 1, gzip.compress(plain))
        w.end_exchange(x, duration_ns=2, outcome="complete")
    with EventLog(db) as log:
        assert b"".join(c["data"] for c in log.chunks(x)) == plain
        ids = [row[0] for row in log.db.execute("SELECT event_id FROM events ORDER BY seq")]
        assert ids == [str(i) for i in range(12_000)]
        assert log.exchange(x)["error"] is None
