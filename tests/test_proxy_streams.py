"""Streams through the proxy: never buffered, byte-exact for the client, complete in the
log, whatever the upstream sends (tiny chunks, CR line ends, huge events, binary, gzip,
slow streams, many at once)."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import os
import random
import zlib
from enum import Enum

import openai
import pytest
from a2a_frames import completed_run, sse
from aiohttp import web
from conftest import RecordFactory, Recording

from tasktape.eventlog.checker import report_log


def streaming_app(
    pieces: list[bytes],
    *,
    delay: float = 0.0,
    content_type: str = "text/event-stream",
    headers: dict[str, str] | None = None,
) -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type, **(headers or {})})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            if delay:
                await asyncio.sleep(delay)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


async def fetch(rec: Recording) -> bytes:
    async with rec.session.post(f"{rec.url}/message:stream", json={"message": {}}) as response:
        return await response.read()


async def check_recorded(rec: Recording, received: bytes, n_events: int | None = None) -> None:
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "complete"
        assert log.body(x["id"]) == received
        if n_events is not None:
            assert len([e for e in log.events(x["id"]) if e["complete"]]) == n_events


async def test_each_chunk_reaches_the_client_before_the_next_is_produced(record: RecordFactory) -> None:
    frames = sse(completed_run(), ids="e")
    delivered = [asyncio.Event() for _ in frames]

    async def lockstep(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame, seen in zip(frames, delivered, strict=True):
            await response.write(frame)
            await asyncio.wait_for(seen.wait(), 5)  # deadlocks if the proxy holds the chunk back
        return response

    app = web.Application()
    app.router.add_post("/message:stream", lockstep)
    rec = await record(app)
    received = b""
    async with rec.session.post(f"{rec.url}/message:stream", json={}) as response:
        for frame, seen in zip(frames, delivered, strict=True):
            received += await response.content.readexactly(len(frame))
            seen.set()
        received += await response.read()  # to the end, so the exchange completes
    assert received == b"".join(frames)
    await check_recorded(rec, received, len(frames))


async def test_byte_by_byte_and_cr_line_ends(record: RecordFactory) -> None:
    stream = b"".join(sse(completed_run()[:3], ids="e")).replace(b"\n", b"\r")
    # Paced, so that the bytes really arrive one by one.
    rec = await record(streaming_app([bytes([b]) for b in stream], delay=0.0005))
    received = await fetch(rec)
    assert received == stream
    await check_recorded(rec, received, 3)
    with await rec.log() as log:
        events = log.events(1)
        assert [e["kind"] for e in events] == ["task", "statusUpdate", "artifactUpdate"]
        assert len(log.chunks(1)) > len(stream) / 4


async def test_a_16_mib_event(record: RecordFactory) -> None:
    text = "x" * (16 * 1024 * 1024)
    stream = b'data: {"message": {"parts": [{"text": "' + text.encode() + b'"}]}}\n\n'
    rec = await record(streaming_app([stream[i : i + 65536] for i in range(0, len(stream), 65536)]))
    received = await fetch(rec)
    assert received == stream
    with await rec.log() as log:
        (event,) = log.events(1)
        assert event["kind"] == "message" and len(event["text"]) == len(text)
        assert log.body(1) == stream


async def test_binary_garbage(record: RecordFactory) -> None:
    garbage = random.Random(3).randbytes(300_000)
    for content_type in ("text/event-stream", "application/octet-stream"):
        rec = await record(
            streaming_app(
                [garbage[i : i + 4096] for i in range(0, len(garbage), 4096)], content_type=content_type
            )
        )
        received = await fetch(rec)
        assert received == garbage
        await check_recorded(rec, garbage)


async def test_gzip_is_forwarded_untouched_and_recorded_decoded(record: RecordFactory) -> None:
    stream = b"".join(sse(completed_run(), ids="e"))
    packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    pieces = [
        packer.compress(frame) + packer.flush(zlib.Z_SYNC_FLUSH) for frame in sse(completed_run(), ids="e")
    ]
    pieces.append(packer.flush())
    rec = await record(streaming_app(pieces, headers={"Content-Encoding": "gzip"}))
    async with rec.session.post(f"{rec.url}/message:stream", json={}) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        received = await response.read()  # the session does not decompress
    assert received == b"".join(pieces) and gzip.decompress(received) == stream
    with await rec.log() as log:
        x = log.exchange(1)
        assert x["body_encoding"] == "gzip" and log.body(1) == stream
        assert [e["kind"] for e in log.events(1)][-1] == "statusUpdate"


async def test_slow_stream_offsets_follow_the_upstream(record: RecordFactory) -> None:
    frames = sse(completed_run()[:4], ids="e")
    rec = await record(streaming_app(frames, delay=0.1))
    assert await fetch(rec) == b"".join(frames)
    with await rec.log() as log:
        offsets = [e["offset_ns"] / 1e6 for e in log.events(1)]
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    # Each offset is the upstream's moment plus the proxy's latency, which a loaded machine
    # varies by some milliseconds: gaps keep the upstream's 100 ms give or take that.
    assert all(60 <= gap <= 400 for gap in gaps) and offsets[-1] - offsets[0] >= 290, gaps


async def test_200_concurrent_streams(record: RecordFactory) -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        n = int(request.query["n"])
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in sse(completed_run(f"task.{n}", f"ctx.{n}") * 5, ids=f"{n}-"):
            await response.write(frame)
            await asyncio.sleep(random.random() / 100)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    rec = await record(app)

    async def one(n: int) -> tuple[int, bytes]:
        async with rec.session.post(f"{rec.url}/message:stream?n={n}", json={}) as response:
            return n, await response.read()

    results = dict(await asyncio.gather(*(one(n) for n in range(200))))
    for n, body in results.items():
        assert body == b"".join(sse(completed_run(f"task.{n}", f"ctx.{n}") * 5, ids=f"{n}-"))
    with await rec.log() as log:
        exchanges = log.exchanges()
        assert len(exchanges) == 200
        for x in exchanges:
            n = int(x["query"].removeprefix("n="))
            assert x["outcome"] == "complete" and x["task_id"] == f"task.{n}"
            assert log.body(x["id"]) == results[n]
            assert [e["event_id"] for e in log.events(x["id"])] == [f"{n}-{i}" for i in range(1, 51)]


async def test_non_streamed_bodies_are_recorded_with_a_cap(record: RecordFactory) -> None:
    big = os.urandom(1000)
    rec = await record(
        streaming_app([big[:600], big[600:]], content_type="application/octet-stream"), max_body=700
    )
    assert await fetch(rec) == big  # the client gets everything
    with await rec.log() as log:
        x = log.exchange(1)
        assert x["response_body_truncated"] == 1 and x["response_body"] == big[:700]


async def test_a_client_that_leaves_with_the_last_event_leaves_a_complete_exchange(
    record: RecordFactory,
) -> None:
    """The agent's body ends 20 ms after its last event; the client hangs up the moment it
    has that event. The upstream ended cleanly and the client got every event: complete,
    and the log holds exactly what the client was sent. A client that leaves while more is
    still to come is client_disconnected, as before."""
    frames = sse(completed_run(), ids="e")
    rec = await record(streaming_app([*frames[:-1], frames[-1]], delay=0.02))
    host, port = rec.url.removeprefix("http://").split(":")

    async def leave_after(marker: bytes) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /message:stream HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Content-Type: application/json\r\n\r\n{}"
        )
        seen = b""
        while marker not in seen:
            seen += await asyncio.wait_for(reader.read(65536), 10)
        writer.transport.abort()  # at once, without reading the end of the response

    for _ in range(5):
        await leave_after(frames[-1])
    await leave_after(frames[2])
    with await rec.log() as log:
        exchanges = log.exchanges()
        assert [(x["outcome"], x["error"]) for x in exchanges[:5]] == [("complete", None)] * 5
        for x in exchanges[:5]:
            assert b"".join(c["data"] for c in log.chunks(x["id"])) == b"".join(frames)
        assert exchanges[5]["outcome"] == "client_disconnected"


class AfterDone(Enum):
    """What an OpenAI-like upstream does once it has sent ``data: [DONE]``."""

    ENDS = "ends"  # its body ends 300 ms later (bookkeeping after its last yield)
    NEVER_ENDS = "never_ends"  # its body never ends


def chat_chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
    return f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n".encode()


CHAT = [
    chat_chunk({"role": "assistant", "content": ""}),
    chat_chunk({"content": "Done"}),
    chat_chunk({}, "stop"),
    b"data: [DONE]\n\n",
]


def chat_then(after: AfterDone, let_go: asyncio.Event) -> web.Application:
    """Chat Completions streaming ``CHAT``, then doing ``after``; ``let_go`` is set when
    its connection is closed under it before its body ended."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in CHAT:
            await response.write(frame)
        try:
            await (asyncio.Event().wait() if after is AfterDone.NEVER_ENDS else asyncio.sleep(0.3))
        except asyncio.CancelledError:  # the recorder closed the connection
            let_go.set()
            raise
        await response.write_eof()
        return response

    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def chat_streamed(url: str) -> str:
    """The answer the OpenAI SDK reads from a chat stream; it closes the response on [DONE]."""
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream])


@pytest.mark.parametrize("after", list(AfterDone))
async def test_a_client_that_leaves_on_done_leaves_a_complete_exchange(
    record: RecordFactory, after: AfterDone
) -> None:
    """The OpenAI SDK closes its connection on [DONE], before the upstream ends its body
    (300 ms later, or never). The client was sent all the stream owed it: complete, the log
    holding exactly what the client was sent, and check notes nothing cut short. The
    upstream is let go as for any client that leaves, its body ended or not."""
    let_go = asyncio.Event()
    rec = await record(chat_then(after, let_go))
    assert await chat_streamed(rec.url) == "Done"
    if after is AfterDone.NEVER_ENDS:
        await asyncio.wait_for(let_go.wait(), 10)
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert (x["outcome"], x["error"]) == ("complete", None)
        assert log.body(x["id"]) == b"".join(CHAT)
        report = report_log(log)
        assert (report.findings, report.cut_short) == ([], [])
