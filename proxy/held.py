"""Held streams, for a resuming recorder: the upstream is read to its end whether or not
a client is there (recorded as it came), clients follow it event by event, and a client
that reconnects with ``Last-Event-ID`` follows it again after that event, without the
request reaching the agent (where it would start a second task).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from tasktape.eventlog.jsonrpc_ids import NO_ID, jsonrpc_id_edits, rpc_id, same_id
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide
from tasktape.eventlog.spans import events_in

from .failure import describe
from .live import LiveStream
from .rejoin import Rejoin

if TYPE_CHECKING:
    from .recorder import Exchange, RecordingProxy

UPSTREAM_DROPPED = "upstream_disconnected"


async def relay_held(
    exchange: Exchange, upstream: aiohttp.ClientResponse, headers: Any
) -> web.StreamResponse:
    """The first client's answer: the held stream as it comes; its upstream read apart."""
    proxy, request = exchange.proxy, exchange.request
    assert proxy.live is not None
    headers.popall("Content-Length", None)  # ids added where there were none change the length
    line = f"{request.method} {request.rel_url.raw_path}"
    stream = proxy.live.open(exchange.id, line, rpc_id(exchange.request_body()), list(headers.items()))
    proxy.hold_stream(_pump(exchange, upstream, stream))
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    await _follow(request, response, stream, -1)
    return response


async def follow_again(
    proxy: RecordingProxy,
    request: web.Request,
    body: bytes | None,
    stream: LiveStream,
    position: int,
    t0: int,
    started_ns: int,
) -> web.StreamResponse:
    """A reconnect: the events after ``position``, then the live tail; recorded as an
    exchange of its own (what this client was sent), never forwarded."""
    writer = proxy.writer
    exchange_id = writer.begin_exchange(
        proxy.capture_id,  # type: ignore[arg-type]
        method=request.method,
        path=request.rel_url.raw_path,
        query=request.rel_url.raw_query_string or None,
        request_headers=list(request.headers.items()),
        request_body=body,
        request_body_truncated=False,
        started_ns=started_ns,
    )

    def offset() -> int:
        return time.perf_counter_ns() - t0

    writer.response_head(exchange_id, status=200, headers=stream.headers, is_sse=True, ttfb_ns=offset())
    proxy.resumed(
        Resume(
            stream.exchange_id,
            ResumeSide.CLIENT,
            ResumeOutcome.RESUMED,
            last_event_id=request.headers.get("Last-Event-ID"),
            events_from_log=sum(e.id is not None for e in stream.events[position + 1 :]),
            new_exchange_id=exchange_id,
        )
    )
    mine = rpc_id(body)
    theirs = stream.request_rpc_id
    rewrite = mine is not NO_ID and theirs is not NO_ID and not same_id(mine, theirs)
    response = web.StreamResponse(status=200, headers=stream.headers)
    outcome, error = "complete", None
    try:
        await response.prepare(request)
        async for events in stream.follow(position):
            data = b"".join(_answering(e.raw, theirs, mine) if rewrite else e.raw for e in events)
            writer.chunk(exchange_id, offset(), data)
            await response.write(data)
        if stream.outcome == "complete":
            await response.write_eof()
        else:
            outcome, error = UPSTREAM_DROPPED, f"the held stream ended {stream.outcome}"
            request.protocol.force_close()
    except (ConnectionError, asyncio.CancelledError):
        outcome, error = "client_disconnected", "the client went away again"
        raise
    finally:
        writer.end_exchange(exchange_id, duration_ns=offset(), outcome=outcome, error=error)
    return response


async def _follow(request: web.Request, response: web.StreamResponse, stream: LiveStream, after: int) -> None:
    """Send the stream after ``after`` to this client until it ends or the client leaves."""
    try:
        await response.prepare(request)
        async for events in stream.follow(after):
            await response.write(events[0].raw if len(events) == 1 else b"".join(e.raw for e in events))
        if stream.outcome == "complete":
            await response.write_eof()
        else:
            request.protocol.force_close()  # as abruptly as the upstream ended
    except ConnectionError:
        pass  # the client left; the stream goes on without it


async def _pump(exchange: Exchange, upstream: aiohttp.ClientResponse, stream: LiveStream) -> None:
    """Read the upstream to its end, recording it, whoever follows; rejoin it when it
    breaks; let it go once no client has followed it for the hold."""
    await pump(stream, Rejoin.of(exchange, stream), exchange, upstream)


async def pump(
    stream: LiveStream,
    rejoin: Rejoin,
    recording: Exchange | None = None,
    response: aiohttp.ClientResponse | None = None,
) -> None:
    """Hold ``stream``: read its upstream ``response`` (recorded by ``recording``), and
    each one it is rejoined by, to the end. Without a response (a stream revived from the
    log), it begins with a rejoin."""
    proxy = rejoin.proxy
    rejoined = recording is None
    try:
        while True:
            if recording is not None and response is not None:
                broke = await _read(recording, response, stream, rejoin, rejoined)
                if broke is None:
                    return
                response.close()
            else:
                broke = "tasktape record restarted while it held the stream"
            again = await rejoin.again(broke)
            if again is None:
                stream.end(UPSTREAM_DROPPED)
                return
            (recording, response), rejoined = again, True
    except asyncio.CancelledError:
        if recording is not None:
            recording.end("proxy_stopped", "tasktape record stopped while it held the stream")
        stream.end("proxy_stopped")
        raise
    finally:
        if response is not None:
            response.close()
        # Clients that come back soon after the end are still answered; then it is let go.
        if proxy.live is not None:
            asyncio.get_running_loop().call_later(proxy.hold or 0.0, proxy.live.forget, stream.exchange_id)


async def _read(
    recording: Exchange, upstream: aiohttp.ClientResponse, stream: LiveStream, rejoin: Rejoin, rejoined: bool
) -> str | None:
    """Read one upstream response (``rejoined``: a subscribe's) to its end into the stream:
    None once the stream has ended, or why the upstream broke (the exchange recording it
    has ended)."""
    hold = recording.proxy.hold or 0.0
    read = upstream.content.readany
    while True:
        try:
            data = await _read_while_followed(read, stream, hold)
        except TimeoutError:
            reason = f"no client followed the stream for {hold:g} s (--hold): the upstream was let go"
            recording.end("client_disconnected", reason)
            stream.end("client_disconnected")
            return None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError) as exc:
            why = f"the upstream dropped mid-response: {describe(exc)}"
            recording.end(UPSTREAM_DROPPED, why)
            return why
        if not data:
            if not rejoined:
                recording.upstream_ended = True
                stream.end("complete", closed=rejoin.closed())
                recording.end("complete")
                return None
            # A subscribe's stream that ends before its task did broke off too.
            recording.end("complete")
            return "the subscribe's stream ended before its task did"
        recording.writer.chunk(recording.id, recording.offset(), data)
        events = stream.feed(data)
        if rejoined and (rejoin.ended or any(rejoin.closes(e) for e in events)):
            recording.end("complete")
            stream.end("complete", closed=True)
            return None


async def _read_while_followed(read: Any, stream: LiveStream, hold: float) -> bytes:
    """The upstream's next bytes; TimeoutError once nobody has followed for ``hold`` seconds."""
    reading = asyncio.ensure_future(read())
    alone_since: float | None = None
    loop = asyncio.get_running_loop()
    try:
        while True:
            if stream.followers:
                alone_since = None
            elif alone_since is None:
                alone_since = loop.time()
            left = None if alone_since is None else alone_since + hold - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError
            changed = asyncio.ensure_future(stream.changed())
            done, _ = await asyncio.wait(
                {reading, changed}, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            changed.cancel()
            if reading in done:
                return reading.result()
    finally:
        if not reading.done():
            reading.cancel()


def _answering(raw: bytes, theirs: object, mine: object) -> bytes:
    """The event's bytes answering the reconnecting request's JSON-RPC id."""
    chunks = [(0, raw)]
    edits = jsonrpc_id_edits(chunks, events_in(chunks), theirs, mine)
    out = raw
    for at, removed, inserted in sorted(edits, reverse=True):
        out = out[:at] + inserted + out[at + removed :]
    return out
