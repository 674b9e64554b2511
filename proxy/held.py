"""Held streams, for a resuming recorder: the upstream is read to its end whether or not
a client is there (recorded as it came), clients follow it event by event, and a client
that reconnects with ``Last-Event-ID`` follows it again after that event, without the
request reaching the agent (where it would start a second task).

While its first client is there, that client's handler reads the upstream itself, as
``tasktape record`` does without ``--resume``; a pump task takes the reading over once it
leaves, once it stops reading what it is sent (the others, and the log, would wait for
it), or once the upstream breaks (and is rejoined).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from tasktape.eventlog import SSEDecoder
from tasktape.eventlog.jsonrpc_ids import NO_ID, IdRewriter, rpc_id, same_id
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide

from .failure import dropped
from .headers import Relayed
from .live import LiveStream
from .reconnects import line_of
from .rejoin import Rejoin

if TYPE_CHECKING:
    from .recorder import Exchange, RecordingProxy

BROKEN = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError)
# A reconnect's first bytes go out in one write before the rest of what is held is even
# joined (its client is answered at once, however much it missed); the rest in writes of
# at most PIECE bytes (each at least one upstream chunk's).
FIRST, PIECE = 16 * 1024, 1024 * 1024
# How often the first client's writes are looked at: one that waits from one look to the
# next (the client reads nothing) hands the upstream's reading over to a pump.
TICK = 0.25
# The headers of the first response that are its own, not the stream's: a reconnect's
# answer leaves them out (another client is not handed the first one's cookie, nor a Date
# of the past: aiohttp gives it one of now).
FIRST_RESPONSES_OWN = frozenset(
    {
        "age",  # how long the first response was cached
        "authentication-info",  # the first request's authentication (a nonce for its next)
        "date",
        "server-timing",  # how long the agent took to answer the first request
        "set-cookie",
        "set-cookie2",
    }
)


class FirstClient:
    """The first client of a held stream, whose handler reads the upstream, watched by a
    timer (not per write, which costs each event): once a write to it has waited a whole
    tick, ``take_over`` is called and ``handed_over`` set; the handler then follows the
    stream as the other clients do, at its own pace."""

    def __init__(self, take_over: Callable[[], None]) -> None:
        self.in_write = False
        self.writes = 0
        self.handed_over = False
        self._seen = -1  # the write in progress at the last look
        self._take_over = take_over
        self._timer = asyncio.get_running_loop().call_later(TICK, self._look)

    def _look(self) -> None:
        if self.in_write and self.writes == self._seen:
            self.handed_over = True
            self._timer = None
            self._take_over()
            return
        self._seen = self.writes if self.in_write else -1
        self._timer = asyncio.get_running_loop().call_later(TICK, self._look)

    def done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Hold:
    """The --hold of one held stream: armed when its last client leaves, disarmed when
    one comes; when it runs out, the upstream's pending read fails with TimeoutError."""

    def __init__(self, stream: LiveStream, seconds: float) -> None:
        self.seconds = seconds
        self.content: aiohttp.StreamReader | None = None
        self.ran_out = False
        self._timer: asyncio.TimerHandle | None = None
        self._stream = stream
        stream.on_followed = self._followed

    def reading(self, content: aiohttp.StreamReader) -> None:
        """The upstream now read (the first response, or a rejoin's)."""
        self.content = content
        if not self._stream.followers:
            self._arm()

    def _followed(self, followed: bool) -> None:
        if followed:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        else:
            self._arm()

    def _arm(self) -> None:
        if self._timer is None and self._stream.outcome is None:
            self._timer = asyncio.get_running_loop().call_later(self.seconds, self._let_go)

    def _let_go(self) -> None:
        self._timer = None
        if self.content is not None and not self._stream.followers and self._stream.outcome is None:
            self.ran_out = self._stream.letting_go = True
            self.content.set_exception(TimeoutError(f"nobody followed the stream for {self.seconds:g} s"))


async def relay_held(
    exchange: Exchange, upstream: aiohttp.ClientResponse, headers: Any
) -> web.StreamResponse:
    """The first client's answer: the held stream as it comes, its handler reading the
    upstream while it is there."""
    proxy, request = exchange.proxy, exchange.request
    assert proxy.live is not None
    headers.popall("Content-Length", None)  # ids added where there were none change the length
    credentials = proxy.credentials.of(request.headers)
    stream = proxy.live.open(
        exchange.id,
        line_of(request.method, request.rel_url.raw_path_qs),
        exchange.request_body(),
        list(headers.items()),
        credentials,
        list(request.headers.items()),
    )
    rejoin = Rejoin.of(exchange, stream)
    hold = Hold(stream, proxy.hold or 0.0)
    response = Relayed(status=upstream.status, reason=upstream.reason, headers=headers)
    read, write, chunk, offset, feed = (
        upstream.content.readany,
        response.write,
        exchange.writer.chunk,
        exchange.offset,
        stream.feed,
    )
    reading = attached = True
    stream.attach()
    first = FirstClient(lambda: proxy.hold_stream(pump(stream, rejoin, hold, exchange, upstream)))
    try:
        await response.prepare(request)
        while True:
            try:
                data = await read()
            except BROKEN as exc:
                sent = stream.size  # this client was sent all the stream holds, so far
                reading = False
                upstream.close()
                why = _broke(exchange, stream, rejoin, exc)
                if why is not None:
                    proxy.hold_stream(pump(stream, rejoin, hold, broke=why))
                else:
                    _forget_later(proxy, stream)
                break
            if not data:
                sent = stream.size
                reading = False
                _ended(exchange, stream, rejoin)
                _forget_later(proxy, stream)
                break
            chunk(exchange.id, offset(), data)
            new = feed(data)
            if new:
                sent = stream.size
                first.in_write = True
                await write(new)
                first.in_write = False
                first.writes += 1
                if first.handed_over:  # a pump reads on: this client follows from here
                    reading = False
                    break
        stream.detach()
        attached = False
        await _follow(request, response, stream, sent)  # the rest: the tail, or a rejoin's
    except ConnectionError:
        pass  # the client left; the stream goes on without it
    finally:
        first.done()
        if attached:
            stream.detach()
        if reading and not first.handed_over:
            # The client left (or the recorder stops) while this handler read: a pump reads on.
            proxy.hold_stream(pump(stream, rejoin, hold, exchange, upstream))
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
    exchange_id = proxy.begin_exchange(request, body, started_ns)

    def offset() -> int:
        return time.perf_counter_ns() - t0

    resumed = Resume(
        stream.exchange_id,
        ResumeSide.CLIENT,
        ResumeOutcome.RESUMED,
        last_event_id=request.headers.get("Last-Event-ID"),
        events_from_log=stream.events_after(position),
        new_exchange_id=exchange_id,
        live=stream.outcome is None,
    )
    if stream.outcome is not None and position >= stream.size and _whole(stream):
        # Nothing more will come. A 204 says so: an EventSource given an empty 200 would
        # come back for ever. (One cut off ends as it was, below: the client is not told its
        # task's answer ended.)
        writer.response_head(exchange_id, status=204, headers=None, is_sse=False, ttfb_ns=offset())
        writer.end_exchange(exchange_id, duration_ns=offset(), outcome=Outcome.COMPLETE)
        proxy.resumed(replace(resumed, outcome=ResumeOutcome.ENDED))
        return web.Response(status=204)
    headers = reconnect_headers(stream.headers)
    writer.response_head(exchange_id, status=200, headers=headers, is_sse=True, ttfb_ns=offset())
    mine, theirs = rpc_id(body), stream.request_rpc_id
    answering = (
        None if mine is NO_ID or theirs is NO_ID or same_id(mine, theirs) else IdRewriter(theirs, mine)
    )
    response = Relayed(status=200, headers=headers)
    outcome, error, noted = Outcome.COMPLETE, None, False
    try:
        await response.prepare(request)
        at = position
        async for segments in stream.follow(position):
            for piece in _pieces(segments, PIECE if noted else FIRST):
                data = piece if answering is None else b"".join(map(answering, stream.events_in(piece, at)))
                at += len(piece)
                await response.write(data)
                writer.chunk(exchange_id, offset(), data)
                if not noted:  # after the first write: the client is not kept waiting for the log
                    noted = True
                    proxy.resumed(resumed)
        if stream.outcome == Outcome.COMPLETE:
            await response.write_eof()
        else:
            outcome, error = Outcome.UPSTREAM_DISCONNECTED, f"the held stream ended {stream.outcome}"
            request.protocol.force_close()
    except (ConnectionError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and proxy.stopping:
            outcome = Outcome.PROXY_STOPPED
            error = "tasktape record stopped while this client followed the stream"
        else:
            outcome, error = Outcome.CLIENT_DISCONNECTED, "the client went away again"
        if isinstance(exc, asyncio.CancelledError):
            raise
    finally:
        if not noted:  # nothing was held past its id, and nothing came
            proxy.resumed(resumed)
        writer.end_exchange(exchange_id, duration_ns=offset(), outcome=outcome, error=error)
    return response


def _whole(stream: LiveStream) -> bool:
    """Whether a stream that ended gave its clients everything: it ended whole, or with
    the event its protocol closes a stream with."""
    return stream.outcome == Outcome.COMPLETE or stream.closed


def reconnect_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The stream's response headers as a reconnect is answered with them: without those
    that were the first response's own."""
    return [(name, value) for name, value in headers if name.lower() not in FIRST_RESPONSES_OWN]


def _pieces(segments: list[bytes], first: int) -> Iterator[bytes]:
    """The segments joined into writes: the first of at most ``first`` bytes, the rest of
    at most PIECE (a segment longer goes alone)."""
    group: list[bytes] = []
    size, limit = 0, first
    for segment in segments:
        if group and size + len(segment) > limit:
            yield group[0] if len(group) == 1 else b"".join(group)
            group, size, limit = [], 0, PIECE
        group.append(segment)
        size += len(segment)
    if group:
        yield group[0] if len(group) == 1 else b"".join(group)


async def _follow(
    request: web.Request, response: web.StreamResponse, stream: LiveStream, position: int
) -> None:
    """Send the stream from ``position`` on to this client until it ends or the client leaves."""
    try:
        await response.prepare(request)
        if stream.outcome is None or position < stream.size:  # (else it was all sent, and it ended)
            async for segments in stream.follow(position):
                await response.write(segments[0] if len(segments) == 1 else b"".join(segments))
        if stream.outcome == Outcome.COMPLETE:
            await response.write_eof()
        else:
            request.protocol.force_close()  # as abruptly as the upstream ended
    except ConnectionError:
        pass  # the client left; the stream goes on without it


async def pump(
    stream: LiveStream,
    rejoin: Rejoin,
    hold: Hold,
    recording: Exchange | None = None,
    response: aiohttp.ClientResponse | None = None,
    *,
    broke: str | None = None,
) -> None:
    """Hold ``stream``: read its upstream ``response`` (recorded by ``recording``), and
    each one it is rejoined by, to the end. Without a response (its upstream ``broke``, or
    a stream revived from the log), it begins with a rejoin."""
    proxy = rejoin.proxy
    rejoined = recording is None
    try:
        while True:
            if recording is not None and response is not None:
                broke = await _read(recording, response, stream, rejoin, hold, rejoined)
                if broke is None:
                    return
                response.close()
            assert broke is not None  # (why: given to a stream that begins with a rejoin, else read)
            again = await rejoin.again(broke)
            if again is None:
                stream.end(Outcome.UPSTREAM_DISCONNECTED)
                return
            (recording, response), rejoined = again, True
    except asyncio.CancelledError:
        if recording is not None:
            recording.end(Outcome.PROXY_STOPPED, "tasktape record stopped while it held the stream")
        stream.end(Outcome.PROXY_STOPPED)
        raise
    finally:
        if response is not None:
            response.close()
        _forget_later(proxy, stream)


def _ended(recording: Exchange, stream: LiveStream, rejoin: Rejoin) -> None:
    """The agent's first response for the stream ended whole: so does the stream."""
    recording.upstream_ended = True
    stream.end(Outcome.COMPLETE, closed=rejoin.closed_later())
    recording.end(Outcome.COMPLETE)


def _broke(recording: Exchange, stream: LiveStream, rejoin: Rejoin, exc: BaseException) -> str | None:
    """The upstream broke: why (the stream is to be rejoined), or None when it broke after
    its closing event, and the stream ends cleanly for its clients."""
    why = dropped(exc)
    if rejoin.closed():
        recording.end(Outcome.UPSTREAM_DISCONNECTED, f"{why}, after the event that closes the stream")
        stream.end(Outcome.COMPLETE, closed=True)
        return None
    recording.end(Outcome.UPSTREAM_DISCONNECTED, why)
    return why


def _forget_later(proxy: RecordingProxy, stream: LiveStream) -> None:
    """Clients that come back soon after the end are still answered; then it is let go."""
    if proxy.live is not None:
        proxy.live.ended(stream)


async def _read(
    recording: Exchange,
    upstream: aiohttp.ClientResponse,
    stream: LiveStream,
    rejoin: Rejoin,
    hold: Hold,
    rejoined: bool,
) -> str | None:
    """Read one upstream response (``rejoined``: a subscribe's) to its end into the stream:
    None once the stream has ended, or why the upstream broke (the exchange recording it
    has ended)."""
    read, chunk, offset = upstream.content.readany, recording.writer.chunk, recording.offset
    decoder = SSEDecoder() if rejoined else None  # a subscribe's events, for the one that closes it
    hold.reading(upstream.content)
    while True:
        try:
            data = await read()
        except TimeoutError as exc:
            if not hold.ran_out:
                why = dropped(exc)
                recording.end(Outcome.UPSTREAM_DISCONNECTED, why)
                return why
            reason = f"no client followed the stream for {hold.seconds:g} s (--hold): the upstream was let go"
            recording.end(Outcome.CLIENT_DISCONNECTED, reason)
            stream.end(Outcome.CLIENT_DISCONNECTED)
            return None
        except BROKEN as exc:
            return _broke(recording, stream, rejoin, exc)
        if not data:
            if not rejoined:
                _ended(recording, stream, rejoin)
                return None
            # A subscribe's stream that ends before its task did broke off too.
            recording.end(Outcome.COMPLETE)
            return "the subscribe's stream ended before its task did"
        chunk(recording.id, offset(), data)
        stream.feed(data)
        if decoder is not None and (rejoin.ended or any(rejoin.closes(e) for e in decoder.feed(data))):
            recording.end(Outcome.COMPLETE)
            stream.end(Outcome.COMPLETE, closed=True)
            return None
