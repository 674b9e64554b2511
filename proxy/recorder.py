"""The recording reverse proxy: every request goes to one upstream, every response
streams back chunk by chunk, and everything is teed into the event log.

The hot path does as little as it can: each upstream chunk is written to the client
and handed to the log writer's queue with its offset; decoding, classification,
redaction and SQLite all happen on the writer's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import secrets
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import BadStatusLine
from multidict import CIMultiDict
from yarl import URL

from tasktape.errors import UsageError, WriterClosed
from tasktape.eventlog import LogProducer
from tasktape.eventlog.exchange_rows import MAX_BODY, ExchangeSummary
from tasktape.eventlog.http_fields import joined, unsendable
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.producer import NullWriter, check_bound
from tasktape.eventlog.protocols.base import Protocol, Request
from tasktape.eventlog.redact import DEFAULT_HEADERS, Redactor
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide, shown_id
from tasktape.eventlog.sse import SSEDecoder, is_event

from . import unread
from .card import is_card_request, rewrite_card
from .credentials import Credentials, same
from .failure import describe, dropped
from .headers import (
    HEADER_LIMITS,
    HEADER_TIMEOUT,
    Relayed,
    RelayedWhole,
    as_named,
    asks_websocket,
    end_to_end,
    for_upstream,
    head_timeout,
    left_out,
    other_transfer_coding,
    request_lines,
    standard_reason,
)
from .held import Hold, follow_again, pump, relay_held
from .hosts import host_guard
from .kept_body import KeptBody
from .live import HOLD_BYTES, KEPT_GONE, Gone, LiveStream, LiveStreams, keyed, recorders_exchange
from .reconnects import continues, line_of, same_line
from .rejoin import Rejoin, agent_resumes, asked_protocol, named_task
from .resume_options import UnknownResume
from .revive import (
    LOOKED_IN,
    UNFINISHED,
    asleep_in_log,
    capture_uid,
    ended_before,
    ended_in_log,
    holding,
    let_go_unfinished,
)

# The server hands request bodies over as the client sent them: aiohttp would otherwise
# decode a Content-Encoding, and the upstream would get decoded bytes under the client's
# Content-Encoding and Content-Length. An application that mounts handle() needs the same.
AS_SENT = {"auto_decompress": False}

# How long a recorder whose client left waits for the upstream's end before it closes the
# upstream connection: an agent's last chunk and the end of its body often come apart.
END_GRACE = 0.1  # seconds
# How many of a stream's last reads are kept (references, not copies) to tell, once its
# client left, whether they end with a closing event: decoded then, never as they pass.
TAIL_READS = 16

# Request bodies up to this size (with a Content-Length) are read whole before they
# are forwarded; larger or chunked ones are streamed through.
READ_WHOLE = 64 * 1024
# A reconnect's body (a request with Last-Event-ID, resuming) is read whole up to this
# size, chunked or not: what it repeats (a JSON-RPC request's method and id) is read from
# it. A bigger one is not answered from a stream held, nor sent to the agent again. (Any
# request holds as much in memory while it streams on: the first --max-body bytes, 16 MiB
# by default, kept for the log.)
RECONNECT_READ = MAX_BODY
# Why a stream taken up from the log after a restart is followed again (LiveStream.asleep_because).
RESTARTED = "tasktape record restarted while it held the stream"
RECONNECTS = frozenset({"GET", "POST"})  # the methods a reconnect to a held stream comes with
# How long an upstream connection may wait idle in the pool: less than the idle timeouts
# of common agent servers (gunicorn's 2 s; Node's and uvicorn's 5 s). aiohttp keeps one
# 15 s, and took it up again just as the upstream closed it: a POST then failed.
UPSTREAM_IDLE = 1.0  # seconds


class RecordingProxy:
    """An aiohttp application forwarding to ``upstream`` and recording into ``writer``."""

    def __init__(
        self,
        upstream: str,
        writer: LogProducer,
        *,
        capture_id: int | None = None,
        public_url: str | None = None,
        rewrite_cards: bool = True,
        max_request_body: int = MAX_BODY,
        connect_timeout: float = 10.0,
        on_exchange: Callable[[ExchangeSummary], None] | None = None,
        on_refusal: Callable[[Refusal], None] | None = None,
        allowed_hosts: frozenset[str] | None = None,
        header_timeout: float = HEADER_TIMEOUT,
        hold: float | None = None,
        hold_bytes: int = HOLD_BYTES,
        rejoin_for: float = 30.0,
        resume_unknown: UnknownResume | str = UnknownResume.REFUSE,
        on_resume: Callable[[Resume], None] | None = None,
        credential_headers: Iterable[str] = DEFAULT_HEADERS,
    ) -> None:
        url = upstream_url(upstream)
        _check_options(
            writer,
            public_url,
            max_request_body,
            connect_timeout,
            header_timeout,
            hold,
            hold_bytes,
            rejoin_for,
        )
        # A user and password in the URL are sent as Basic auth to the upstream alone (a
        # client's own Authorization header passes instead); never shown, never stored.
        auth = aiohttp.BasicAuth.from_url(url)
        self._authorization = auth.encode() if auth else None
        self.upstream = url.with_user(None)
        self.writer = writer
        self.capture_id = capture_id
        self.public_url = URL(public_url) if public_url else None
        self.rewrite_cards = rewrite_cards
        self.max_request_body = max_request_body
        self.connect_timeout = connect_timeout
        self.on_exchange = on_exchange
        self.on_refusal = on_refusal  # told of each request answered here, not forwarded
        # Resuming (``hold`` given): SSE streams are held, clients that reconnect follow them again.
        self.hold = hold
        self.live = LiveStreams(hold, hold_bytes) if hold is not None else None
        self.rejoin_for = rejoin_for  # how long a held stream whose agent broke is subscribed again
        self.resume_unknown = UnknownResume.parse(resume_unknown)
        self.on_resume = on_resume
        self._failed_callbacks: set[str] = set()  # the kinds of callback reported raising
        # What a reconnect must carry as the request that opened its stream did.
        self.credentials = Credentials(credential_headers)
        self._pumps: set[asyncio.Task[None]] = set()
        self._base = str(self.upstream).rstrip("/")
        # Named in the Via header of every request forwarded: one that comes back with it
        # went round a loop (an upstream that leads back here).
        self._via = f"1.1 tasktape-{secrets.token_hex(6)}"
        self._upstream_host = self.upstream.raw_authority
        self._session: aiohttp.ClientSession | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = False
        self.app = web.Application(
            middlewares=[
                self._refuse_forward_proxying,
                # None: any Host (listening beyond loopback, or mounted elsewhere)
                *([host_guard(allowed_hosts, "tasktape record", self._refuse)] if allowed_hosts else []),
            ],
            handler_args={
                **HEADER_LIMITS,
                **head_timeout(header_timeout),
                **unread.handler_args(self),
                **AS_SENT,
            },
        )
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_startup.append(lambda _app: self.start())
        self.app.on_shutdown.append(lambda _app: self._mark_stopping())
        self.app.on_cleanup.append(lambda _app: self.close())

    async def start(self) -> None:
        """Open the pooled upstream session (and the capture, unless one was given);
        resuming, take up the streams of earlier runs still running."""
        if self._session is not None:
            raise UsageError("the recording proxy is started already: start() it once, close() it once")
        self.stopping = False  # (served again after a stop)
        if self.capture_id is None:
            self.capture_id = self.writer.begin_capture(source="record", upstream=str(self.upstream))
        if self.live is not None:
            self.live.capture_uid = self.writer.capture_uids.get(self.capture_id) or await asyncio.to_thread(
                capture_uid, self.writer.path, self.capture_id
            )
        if self.live is not None and self.hold:
            taken_up: set[int] = set()
            for stream, original in asleep_in_log(self.writer.path, self.capture_id, self.hold):
                self.live.hold_asleep(stream, original)
                taken_up.add(stream.exchange_id)
            ended = ended_before(self.writer.path, self.capture_id, self.hold, KEPT_GONE)
            for exchange_id, line in reversed(ended):
                if exchange_id not in taken_up:
                    self.live.ended_before(exchange_id, line)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_IDLE),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
            **HEADER_LIMITS,
        )

    def unrecorded(self) -> LogProducer:
        """The log was closed under the recorder (its writer raised WriterClosed): what
        is forwarded from now on is not recorded, which is said once; traffic goes on."""
        if not isinstance(self.writer, NullWriter):
            print(
                f"tasktape: WARNING: the log {self.writer.path} was closed while the recorder "
                "forwarded: traffic goes on, no longer recorded",
                file=sys.stderr,
                flush=True,
            )
            self.writer = NullWriter(self.writer.path)  # (the log can still be read)
        return self.writer

    async def _mark_stopping(self) -> None:
        self.stopping = True  # exchanges cut short from now on were stopped, not abandoned

    async def close(self) -> None:
        for held in list(self._pumps):  # held streams end with the recorder
            held.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None  # (served again, its app starts it again)
        if self.capture_id is not None:
            with contextlib.suppress(WriterClosed):  # the log went first: nothing to note
                self.writer.end_capture(self.capture_id)

    @web.middleware
    async def _refuse_forward_proxying(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Only the configured upstream is ever contacted: CONNECT and absolute-form
        targets (what a client sends to a forward proxy) are refused, before routing."""
        request[unread.HANDLED] = True
        if request.method == "CONNECT":
            return self._refuse(request, 405, "CONNECT is not accepted: tasktape record is a reverse proxy")
        if not request.raw_path.startswith("/"):
            what = (
                "an asterisk-form request target (OPTIONS *) is"
                if request.raw_path == "*"
                else "absolute-form request targets are"
            )
            return self._refuse(
                request, 400, f"{what} not accepted: tasktape record is a reverse proxy of paths"
            )
        return await handler(request)

    async def wait_idle(self) -> None:
        """Return once no exchange is in flight (each one has been handed to the log)."""
        await self._idle.wait()

    async def handle(self, request: web.Request, body: bytes | None = None) -> web.StreamResponse:
        """Forward one request to the upstream and record it: the aiohttp handler, also
        usable from another application's handler (whose server must keep request bodies
        as sent: ``handler_args=AS_SENT``). ``body``: the request's body, when the caller
        has read it already."""
        if self._session is None:  # (its app starts it; mounted elsewhere, its owner must)
            raise UsageError("the recording proxy is not started: await its start() before it handles any")
        with self.in_flight():
            return await self._forward(request, body)

    @contextlib.contextmanager
    def in_flight(self) -> Iterator[None]:
        """While an exchange (or a held stream) is not yet all handed to the log."""
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def resumed(self, resume: Resume) -> None:
        """A side of a held stream reconnected: in the log, and told ``on_resume``."""
        with contextlib.suppress(WriterClosed):  # the log went first: nothing to note
            self.writer.resume(resume)
        if self.on_resume is not None:
            self.told("on_resume", self.on_resume, resume)

    def told(self, kind: str, callback: Callable[[Any], None], what: object) -> None:
        """Tell a callback of the user's: one that raises never breaks traffic, and is
        reported on stderr the first time it does (of each ``kind``)."""
        try:
            callback(what)
        except Exception as exc:  # the callback's bug, never the traffic's
            if kind not in self._failed_callbacks:
                self._failed_callbacks.add(kind)
                print(
                    f"tasktape: WARNING: the recorder's {kind} callback raised ({type(exc).__name__}: "
                    f"{exc}); traffic goes on, and later failures of it are not reported",
                    file=sys.stderr,
                    flush=True,
                )

    def hold_stream(self, pump: Awaitable[None]) -> asyncio.Task[None]:
        """Run ``pump`` (a held stream's reading of its upstream) on its own, to its end."""

        async def held() -> None:
            with self.in_flight():
                await pump

        task = asyncio.ensure_future(held())
        self._pumps.add(task)
        task.add_done_callback(self._pumps.discard)
        return task

    async def _forward(self, request: web.Request, read: bytes | None) -> web.StreamResponse:
        if self.writer.closed:  # (what follows, a held stream's reconnect too, takes self.writer)
            self.unrecorded()
        if any(self._via in v for v in request.headers.getall("Via", ())):
            return self._refuse(
                request,
                508,
                f"the request came back to this recorder: its upstream {self.upstream} leads here",
            )
        if (coding := other_transfer_coding(request.headers)) is not None:
            # The agent would be sent its bytes as a plain body (RFC 9112: a coding not
            # understood is a 501).
            return self._refuse(
                request,
                501,
                f"Transfer-Encoding {coding!r}: tasktape record passes "
                "request bodies chunked or of a length; send the coding as Content-Encoding",
            )
        if asks_websocket(request.headers):
            # Forwarded without its Upgrade (hop-by-hop), it would get the agent's plain answer,
            # a 400 as often as not, or a 101 that switches nothing.
            return self._refuse(
                request,
                501,
                "a WebSocket upgrade: tasktape record carries HTTP exchanges (event streams "
                "included), not upgraded connections; point this client at the agent itself",
            )
        t0 = time.perf_counter_ns()
        started_ns = time.time_ns()
        body: bytes | _TeedBody | None = read
        forwarded = None  # a reconnect --resume-unknown forward sends to the agent
        # An event stream is asked for with a GET or a POST; an empty id names no event
        # (an EventSource whose last event reset it sends none).
        if (
            self.live is not None
            and (last_id := request.headers.get("Last-Event-ID"))
            and request.method in RECONNECTS
        ):
            if body is None:
                body = await self._reconnect_body(request)
            answered = await self._resume(request, body, last_id, t0, started_ns)
            if isinstance(answered, web.StreamResponse):
                return answered
            forwarded = answered
        elif body is None:
            body = await self._request_body(request)
        exchange = self.begin_exchange(request, body if isinstance(body, bytes) else None, started_ns)
        if forwarded is not None:  # noted once the exchange that forwards it is
            self.resumed(replace(forwarded, new_exchange_id=exchange))
        return await Exchange(self, request, exchange, t0).run(body)

    async def _resume(
        self, request: web.Request, body: bytes | _TeedBody | None, last_id: str, t0: int, started_ns: int
    ) -> web.StreamResponse | Resume | None:
        """A request with ``Last-Event-ID``: answered from a stream held (or refused), or
        it goes to the agent: None, or the resume to note (--resume-unknown forward)."""
        live = self.live
        assert live is not None
        told = body if isinstance(body, bytes) else b""  # what the protocol reads the request by
        line = line_of(request.method, request.rel_url.raw_path_qs)
        credentials = self.credentials.of(request.headers)
        resuming = Request(request.method, request.rel_url.raw_path_qs, list(request.headers.items()), told)

        def continued(stream: LiveStream) -> bool:
            if isinstance(body, _TeedBody):  # not read whole: what it repeats is not known
                return same_line(stream.request_line, line)
            return continues(resuming, stream.opened(), stream)

        found = live.find(last_id, line, credentials, continued)
        found = found or await self._let_go(request, resuming, last_id, credentials)
        if found is not None and found[0].letting_go:  # its hold ran out just now: as if it had ended
            await found[0].until_ended()
        if found is not None and found[0].outcome in UNFINISHED:
            found = await self._reopen(found, last_id)
        # An agent's id on a stream the agent ended unfinished goes back to it only where
        # its protocol takes streams up again (else the request would start a new task).
        if found is not None and (found[0].answers(last_id) or not agent_resumes(request, told)):
            stream, position = found
            if isinstance(body, _TeedBody):
                why = (
                    f"the reconnect's body is over {RECONNECT_READ:,} bytes: a reconnect is read "
                    "whole to tell what it repeats, and is not sent to the agent again"
                )
                return self._not_answered(request, stream.exchange_id, last_id, why, 413)
            if stream.credentials is None and stream.outcome is None:  # taken up from the log after a restart
                await self._wake(stream, request, credentials)
            if stream.admits(credentials):
                if (given := stream.times_given(last_id)) > 1:
                    why = _ambiguous(last_id, given)
                    return self._not_answered(request, stream.exchange_id, last_id, why, 409)
                return await follow_again(self, request, body, stream, position, t0, started_ns)
            why = (
                "the request carries other credentials than the one that opened the stream"
                if stream.credentials is not None
                else f"{stream.asleep_because or RESTARTED}: the stream was read back from the log, which "
                "keeps no credentials, and the agent did not let this client see the task (or could not be "
                "asked)"
            )
            return self._not_answered(request, stream.exchange_id, last_id, why, 403)
        held = None if found else live.latest(continued)
        gone = None if found or held else live.gone(resuming)
        if held is not None or gone is not None:  # a reconnect, after an event no stream held has
            return self._unknown_resume(request, held or gone, last_id, credentials)  # type: ignore[arg-type]
        return None

    async def _reopen(self, found: tuple[LiveStream, int], last_id: str) -> tuple[LiveStream, int]:
        """A stream let go before it ended (--hold let its agent go, or a bound let it go
        asleep, as taken up from the log after a restart): its reconnecting client would be
        told it ended (a 204, or a cut). Rebuilt from the log asleep instead, where its task
        had not ended and its protocol can follow it again, so that the reconnect wakes it
        (a subscribe)."""
        await self.writer.aflush()  # (the hold may have run out a moment ago: its end is committed)
        reopened = await asyncio.to_thread(let_go_unfinished, self.writer.path, found[0].exchange_id)
        if reopened is None:
            return found
        stream, original = reopened
        position = stream.position(last_id)
        if position is None:
            return found
        assert self.live is not None
        if found[0].outcome == Outcome.CLIENT_DISCONNECTED:  # (else, asleep since a restart: RESTARTED)
            stream.asleep_because = (
                f"--hold let the agent's stream go with no client following ({self.hold or 0:g} s)"
                " before its task ended, and a client came back"
            )
        self.live.revive(stream, original)
        return stream, position

    async def _wake(self, stream: LiveStream, request: web.Request, credentials: bytes) -> None:
        """Wake a stream taken up from the log: it goes on through a subscribe to its agent,
        with this client's headers. The log keeps no credentials: when the request that
        opened it carried some, the agent is asked for the task with this client's headers
        first: a 401 or 403 leaves the stream asleep, a 2xx gives it this client's
        credentials (where asking cannot tell, the first answer to the subscribe does). A
        client that reconnects meanwhile waits for that, and where the agent did not let
        that one in, is asked for with its own headers."""
        live = self.live
        assert live is not None
        while (original := live.wake(stream)) is None:  # another client is waking it
            waking = live.waking.get(stream.exchange_id)
            if waking is None or await asyncio.shield(waking):
                return
        rejoin = Rejoin(self, stream, original, request)
        rejoin.taken_up = stream.asleep_because or RESTARTED
        admitted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        live.waking[stream.exchange_id] = admitted
        followed = False
        try:
            carried = self.credentials.carried_by(original)
            verdict = await rejoin.lets_follow() if carried else True
            if verdict is False:  # asleep again, for a client the agent lets in
                live.hold_asleep(stream, original)
                admitted.set_result(False)
                return
            if verdict is None:  # asking could not tell (an MCP stream): what carries it on does
                rejoin.admitted = admitted
            hold = Hold(stream, self.hold or 0.0)
            task = self.hold_stream(pump(stream, rejoin, hold, broke=rejoin.taken_up))
            followed = True
            if verdict:
                admitted.set_result(True)
            else:
                task.add_done_callback(lambda _: admitted.done() or admitted.set_result(False))
            if await asyncio.shield(admitted):
                stream.credentials = credentials if carried else b""  # (as the stream's request's)
        except BaseException:
            if not followed:  # the client left while the agent was asked: asleep again, for the next
                live.hold_asleep(stream, original)
            raise
        finally:
            if not admitted.done():  # (a client waiting for this one asks for itself)
                admitted.set_result(False)
            live.waking.pop(stream.exchange_id, None)

    async def _reconnect_body(self, request: web.Request) -> bytes | _TeedBody | None:
        """A reconnect's body, read whole (chunked or not) up to ``RECONNECT_READ`` bytes;
        a bigger one streams on from what was read, should it go to the agent."""
        if not request.body_exists:
            return None
        length = request.content_length
        if length is not None and length > RECONNECT_READ:
            return _TeedBody(request.content, self.max_request_body)
        read = bytearray()
        while chunk := await request.content.read(RECONNECT_READ + 1 - len(read)):
            read += chunk
            if len(read) > RECONNECT_READ:
                return _TeedBody(request.content, self.max_request_body, first=bytes(read))
        return bytes(read)

    async def _let_go(
        self, request: web.Request, resuming: Request, last_id: str, credentials: bytes
    ) -> tuple[LiveStream, int] | None:
        """A stream that ended and was let go, named by an id in it (one of the
        recorder's names its stream; for one of the agent's, the log is asked which):
        rebuilt from the log (off the event loop), and where that event ends in it."""
        live = self.live
        assert live is not None
        exchange_id = recorders_exchange(last_id)
        if exchange_id is None:
            alike = live.let_go_alike(line_of(request.method, request.rel_url.raw_path_qs), LOOKED_IN)
            task = named_task(request, resuming.body if isinstance(resuming.body, bytes) else b"")
            if alike or task != (None, None):
                path, let_go = self.writer.path, live.let_go_ids()
                await self.writer.aflush()  # (a stream let go a moment ago: its events committed)
                exchange_id = await asyncio.to_thread(holding, path, last_id, alike, task, let_go)
        held = None if exchange_id is None else live.let_go(exchange_id)
        if held is None:
            return None  # (no other stream of the log is answered: the agent was not asked)
        path = self.writer.path
        rebuilt = await asyncio.to_thread(ended_in_log, path, exchange_id, self.capture_id)  # type: ignore[arg-type]
        if rebuilt is None:
            return None
        stream, original = rebuilt
        position = stream.position(last_id)  # (its key too)
        if position is None or not continues(resuming, original, stream):
            return None
        stream.credentials = held.credentials
        if held.credentials is None:  # opened in an earlier run
            await self._vouch(stream, original, request, credentials)
        return stream, position

    async def _vouch(
        self, stream: LiveStream, original: Request, request: web.Request, credentials: bytes
    ) -> None:
        """A stream of an earlier run, followed again: the log keeps no credentials, so
        where the request that opened it carried some, the agent is asked for its task
        with this client's headers, and a 2xx lets this client follow it."""
        if not self.credentials.carried_by(original):
            stream.credentials = b""
        elif await Rejoin(self, stream, original, request).lets_follow():
            stream.credentials = credentials

    def _unknown_resume(
        self, request: web.Request, held: LiveStream | Gone, last_id: str, credentials: bytes
    ) -> web.Response | Resume:
        """A reconnect naming an event the stream held for it never had, or to a stream
        let go: refused (a 400 saying what this client may know of the stream: see
        ``_what_it_holds``), or, with --resume-unknown forward, the resume to note once it
        has gone upstream."""
        holds = _what_it_holds(held, last_id, self._admitted(held, credentials))
        why = f"Last-Event-ID {shown_id(last_id)!r} names no event of the stream held here{holds}"
        return self._not_answered(request, held.exchange_id, last_id, why, 400)

    def _admitted(self, held: LiveStream | Gone, credentials: bytes) -> Admitted:
        """How far a client with these credentials may follow the stream."""
        kept = self._kept(held)
        if kept is None or not same(kept, credentials):
            return Admitted.NO
        return Admitted.WITH_CREDENTIALS if kept else Admitted.ANYONE

    def _kept(self, held: LiveStream | Gone) -> bytes | None:
        """The digest of the credentials that opened the stream (b"": none), None where
        unknown. A stream read back from the log keeps none, but the log tells whether its
        request carried any: one that carried none is anyone's, as it was before."""
        assert self.live is not None
        if not isinstance(held, LiveStream):
            let_go = self.live.let_go(held.exchange_id)
            return let_go and let_go.credentials
        if held.credentials is None and not self.credentials.carried_by(held.opened()):
            return b""
        return held.credentials

    def _not_answered(
        self, request: web.Request, exchange_id: int, last_id: str, reason: str, status: int
    ) -> web.Response | Resume:
        """A reconnect the stream it names does not answer: refused (``status``, saying
        why), or, with --resume-unknown forward, the resume to note (saying why) once it
        has gone upstream, by the exchange that sends it."""
        resume = Resume(
            exchange_id, ResumeSide.CLIENT, ResumeOutcome.FORWARDED, last_event_id=last_id, error=reason
        )
        if self.resume_unknown is UnknownResume.FORWARD:
            return resume
        response, refusal = self._refusal(request, status, reason)
        self.resumed(replace(resume, outcome=ResumeOutcome.REFUSED, new_exchange_id=refusal))
        return response

    def _refuse(self, request: web.Request, status: int, reason: str) -> web.Response:
        return self._refusal(request, status, reason)[0]

    def _refusal(self, request: web.Request, status: int, reason: str) -> tuple[web.Response, int]:
        """The refusal's answer, and its exchange in the log."""
        response = error_response(status, reason)
        body: bytes = response.body  # type: ignore[assignment]
        headers = request_lines(request)
        path, query = logged_target(request.raw_path)
        return response, self._log_refusal(request.method, path, headers, status, body, reason, query)

    def log_unread(self, status: int, reason: str) -> None:
        """aiohttp answered a request it could not read (see ``unread``): neither its
        method nor its path is known, and its answer, which quotes it, is not kept."""
        self._log_refusal("UNKNOWN", "", None, status, None, f"the request could not be read: {reason}")

    def _log_refusal(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]] | None,
        status: int,
        body: bytes | None,
        reason: str,
        query: str | None = None,
    ) -> int:
        def log(writer: LogProducer) -> int:
            exchange = writer.begin_exchange(
                self.capture_id,  # type: ignore[arg-type]
                method=method,
                path=path,
                query=query,
                request_headers=headers,
            )
            writer.response_head(exchange, status=status, headers=None, is_sse=False, ttfb_ns=0)
            if body is not None:
                writer.chunk(exchange, 0, body)
            writer.end_exchange(exchange, duration_ns=0, outcome=Outcome.REFUSED, error=reason)
            return exchange

        try:
            exchange = log(self.writer)
        except WriterClosed:
            exchange = log(self.unrecorded())
        if self.on_refusal is not None:
            self.told("on_refusal", self.on_refusal, Refusal(method, path, status, reason))
        return exchange

    async def _request_body(self, request: web.Request) -> bytes | _TeedBody | None:
        """Small bodies (with a Content-Length) are read whole, so the log gets them with
        the request; bigger or chunked ones stream through while their first bytes are kept."""
        if not request.body_exists:
            return None
        length = request.content_length
        if length is not None and length <= READ_WHOLE:
            return await request.read()
        return _TeedBody(request.content, self.max_request_body)

    def begin_exchange(self, request: web.Request, body: bytes | None, started_ns: int) -> int:
        """The log's exchange of a request (its body when read whole: the first
        ``max_request_body`` bytes of it; one streamed through comes later)."""
        cut = body is not None and len(body) > self.max_request_body

        def begin(writer: LogProducer) -> int:
            return writer.begin_exchange(
                self.capture_id,  # type: ignore[arg-type]
                method=request.method,
                path=request.rel_url.raw_path,
                query=request.rel_url.raw_query_string or None,
                request_headers=request_lines(request),
                request_body=body[: self.max_request_body] if cut else body,
                request_body_truncated=cut,
                started_ns=started_ns,
            )

        try:
            return begin(self.writer)
        except WriterClosed:  # (closed while the request's body was read)
            return begin(self.unrecorded())

    def upstream_url(self, raw_path: str) -> URL:
        return URL(self._base + raw_path, encoded=True)

    def public_for(self, request: web.Request) -> URL:
        return self.public_url or URL.build(scheme=request.scheme, authority=authority(request))

    def local_location(self, location: str, request: web.Request) -> str:
        """A redirect to the upstream itself points at the proxy instead, so the client
        does not leave the recording by following it; one to a path under the upstream's
        own path (``--upstream http://agent/api``, ``Location: /api/next``) is to that path
        on the proxy (``/next``)."""
        if location == self._base or location.startswith(tuple(self._base + c for c in "/?#")):
            rest = location[len(self._base) :]  # (a query or a fragment: of the proxy's root)
            return str(self.public_for(request)).rstrip("/") + (rest if rest[:1] in ("", "/") else f"/{rest}")
        under = self.upstream.raw_path.rstrip("/")
        if under and location.startswith("/") and not location.startswith("//"):
            path = location.partition("?")[0].partition("#")[0]
            if path == under or path.startswith(under + "/"):
                rest = location[len(under) :]
                return rest if rest.startswith("/") else f"/{rest}"
        return location


class Admitted(Enum):
    """How far a client may follow a stream: not at all (other credentials, or unknown),
    as anyone may (it was opened without any), or with the credentials that opened it."""

    NO = "no"
    ANYONE = "anyone"
    WITH_CREDENTIALS = "with_credentials"


def _what_it_holds(held: LiveStream | Gone, last_id: str, admitted: Admitted) -> str:
    """What a refused reconnect is told of the stream it named no event of, beyond that it
    is held: only what tells nothing to a client that could not follow it already. The
    recorder's ids carry the stream's key, so they are named only to a client that named
    one of them (its key right) and may follow it; how many events it holds and the
    agent's own ids (as guessable as the agent makes them), only to a client carrying the
    credentials that opened it."""
    mine = admitted is not Admitted.NO and keyed(last_id, held.exchange_id, held.key)
    if isinstance(held, Gone):  # (that it was let go, and when, tells nothing of it)
        named = (mine or admitted is Admitted.WITH_CREDENTIALS) and held.first is not None
        ids = _ids_named((held.first, held.last) if named else (), mine)  # type: ignore[arg-type]
        return f"; the stream of exchange {held.exchange_id}{ids} was let go {held.when}; the log has it"
    if not (mine or admitted is Admitted.WITH_CREDENTIALS):
        return ""
    ids = held.ids()
    if not ids:
        return "; it holds none yet"
    return f"; it holds {len(ids)} events{_ids_named((ids[0], ids[-1]), mine)}"


def _ids_named(ends: tuple[str, str] | tuple[()], keyed_ok: bool) -> str:
    """The first and last ids, where they may be named: the recorder's only when
    ``keyed_ok`` (the client named one of them)."""
    if not ends or (not keyed_ok and any(recorders_exchange(i) is not None for i in ends)):
        return ""
    return f" ({ends[0]!r} to {ends[1]!r})"


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the recorder answered itself (``refused`` in the log), and why."""

    method: str
    path: str
    status: int
    reason: str


class _TeedBody:
    """A request body streamed to the upstream while its first ``cap`` bytes are kept."""

    def __init__(self, content: aiohttp.StreamReader, cap: int, first: bytes = b"") -> None:
        self.content = content
        self.first = first  # read from ``content`` already (a reconnect's, too big to answer)
        self.body = KeptBody(cap)

    async def stream(self) -> AsyncIterator[bytes]:
        keep = self.body.keep
        if self.first:
            first, self.first = self.first, b""
            keep(first)
            yield first
        async for chunk in self.content.iter_any():
            keep(chunk)
            yield chunk
        self.body.whole = True

    async def drain(self) -> None:
        """Read what the upstream never took (it failed first), for the log."""
        async for _ in self.stream():
            pass


class Exchange:
    """One request forwarded and its response streamed back; ended (in the log) exactly once."""

    def __init__(self, proxy: RecordingProxy, request: web.Request, exchange_id: int, t0: int) -> None:
        self.proxy = proxy
        self.request = request
        self.id = exchange_id
        self.t0 = t0
        self.writer = proxy.writer
        self.ended = False
        self.upstream_ended = False  # the upstream's body ended, all of it forwarded
        # Or the client left once sent the event that closes its stream: it had all it was owed.
        self.answered = False
        self.client_left = False  # before the end: a stop meanwhile does not change that
        self.teed: _TeedBody | None = None
        self.held = False  # its upstream stream is held (resuming): its reading ends it
        self.note: str | None = None  # what the log says of it besides how it ended
        self._sent: bytes | None = None

    def offset(self) -> int:
        return time.perf_counter_ns() - self.t0

    @contextlib.contextmanager
    def _recording(self) -> Iterator[LogProducer]:
        """Steps of recording (not chunks): once the log is closed, they are skipped and
        the rest of the exchange is forwarded unrecorded (the log ended it, ``log_closed``)."""
        try:
            yield self.writer
        except WriterClosed:
            self.writer = self.proxy.unrecorded()

    async def run(self, body: bytes | _TeedBody | None) -> web.StreamResponse:
        try:
            return await self._run(body)
        finally:
            if not self.ended and not self.held:  # cancelled: the client left, or the proxy is stopping
                if self.upstream_ended or self.answered:  # the client left as the last bytes reached it
                    self.end(Outcome.COMPLETE)
                elif self.proxy.stopping and not self.client_left:
                    self.end(Outcome.PROXY_STOPPED, "tasktape record stopped during the exchange")
                else:
                    self.end(Outcome.CLIENT_DISCONNECTED, "the client went away mid-exchange")

    def upstream_headers(self) -> CIMultiDict[str]:
        """The client's request headers as the upstream is sent them."""
        return upstream_headers(self.proxy, self.request)

    async def _run(self, body: bytes | _TeedBody | None) -> web.StreamResponse:
        request, proxy = self.request, self.proxy
        headers = self.upstream_headers()
        if isinstance(body, _TeedBody):
            self.teed, data, sent = body, body.stream(), None
        else:
            data = sent = body
        self._sent = sent
        card = proxy.rewrite_cards and is_card_request(request.method, request.path, sent)
        if card:
            headers.popall("Accept-Encoding", None)  # a compressed card could not be rewritten
        assert proxy._session is not None
        try:
            upstream = await proxy._session.request(
                request.method,
                proxy.upstream_url(request.raw_path),
                headers=headers,
                data=data,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return await self._bad_gateway(f"upstream {proxy.upstream} {_failure(exc)}")
        try:
            if upstream.status < 200:
                # A switch the client never asked for (a WebSocket upgrade is refused before
                # it goes out): passed on, the client would take its connection as switched.
                return await self._bad_gateway(
                    f"upstream {proxy.upstream} answered {upstream.status} {upstream.reason} to a request "
                    "that asked for no protocol switch: tasktape record carries HTTP exchanges, not "
                    "upgraded connections"
                )
            if (coding := other_transfer_coding(upstream.headers)) is not None:
                # The client would be sent the coded bytes under chunked alone, as a plain body.
                return await self._bad_gateway(
                    f"upstream {proxy.upstream} answered with Transfer-Encoding {coding!r}: tasktape "
                    "record passes response bodies chunked or of a length, not under another coding"
                )
            return await self._relay(upstream, card)
        finally:
            if not self.held:
                upstream.close()

    async def _bad_gateway(self, reason: str) -> web.Response:
        """The client's answer when the upstream gave none it could be sent: a 502, recorded as such."""
        if self.teed is not None:
            await self.teed.drain()
        response = error_response(502, reason)
        with self._recording() as writer:
            writer.response_head(self.id, status=502, headers=None, is_sse=False, ttfb_ns=self.offset())
            writer.chunk(self.id, self.offset(), response.body)  # type: ignore[arg-type]
        self.end(Outcome.UPSTREAM_ERROR, reason)
        return response

    async def _unsent_head(self, exc: ValueError) -> web.StreamResponse:
        """The client's 502 when aiohttp refused to send the upstream's head. It goes without
        a length: the refused head set the connection's framing, and chunked, once set, stays."""
        answer = await self._bad_gateway(
            f"upstream {self.proxy.upstream} answered with a head that cannot be passed on: {describe(exc)}"
        )
        response = web.StreamResponse(status=502, headers={"Content-Type": answer.headers["Content-Type"]})
        await response.prepare(self.request)
        await response.write(answer.body)  # type: ignore[arg-type]
        await response.write_eof()
        return response

    async def _relay(self, upstream: aiohttp.ClientResponse, card: bool) -> web.StreamResponse:
        request = self.request
        is_sse = upstream.content_type == "text/event-stream"
        named = as_named(upstream.headers, upstream.raw_headers)
        coding = joined(upstream.headers.items(), "Content-Encoding")
        with self._recording() as writer:
            if self.teed is not None:
                self.teed.body.log_if_whole(writer, self.id)
            writer.response_head(
                self.id,
                status=upstream.status,
                headers=named,
                is_sse=is_sse,
                ttfb_ns=self.offset(),
                content_encoding=coding,
            )
        headers = end_to_end(named, upstream.headers.get("Connection", ""))
        if dropped_headers := left_out(headers):
            self.noted(
                f"the response header {', '.join(dropped_headers)} was left out of what the client "
                "was sent: its value holds a control character, which HTTP does not allow"
            )
        if upstream.reason is not None and unsendable(upstream.reason):
            # Changed where it is read: a held stream's relay sends it too.
            upstream.reason = standard_reason(upstream.status)
            self.noted(
                f"the reason phrase was sent as {upstream.reason!r}: the upstream's holds a control "
                "character, which HTTP does not allow"
            )
        if "Location" in headers:
            _relocate(headers, self.proxy.local_location(headers["Location"], request))
        if card and not is_sse:
            return await self._relay_card(upstream, headers)
        if is_sse and self.proxy.live is not None:
            if coding is None:
                self.held = True
                return await relay_held(self, upstream, headers)
            # An encoded stream cannot be given ids or cut into events: it passes as ever.
            self.noted(
                f"not held for resuming: the upstream sent the stream with Content-Encoding {coding}, "
                "which cannot be given ids or cut into events"
            )
        response = Relayed(status=upstream.status, reason=upstream.reason, headers=headers)
        # Whatever the upstream has sent so far is forwarded (and recorded) as one chunk:
        # one event at a time when it paces them, bigger pieces when the client lags.
        # ``tail``: the last reads, after an empty one while it still holds the stream's start.
        tail: deque[bytes] = deque((b"",), maxlen=TAIL_READS)
        read, write, chunk_to_log, offset, keep = (
            upstream.content.readany,
            response.write,
            self.writer.chunk,
            self.offset,
            tail.append,
        )
        try:
            try:
                await response.prepare(request)
            except ValueError as exc:  # aiohttp refused to send the head: none of it went out
                return await self._unsent_head(exc)
            while True:
                try:
                    data = await read()
                except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError) as exc:
                    # The upstream dropped mid-stream: end the client's stream just as
                    # abruptly (no terminating chunk), so the client sees the same failure.
                    self.end(Outcome.UPSTREAM_DISCONNECTED, dropped(exc))
                    request.protocol.force_close()
                    return response
                if not data:
                    self.upstream_ended = True
                    break
                keep(data)
                try:
                    chunk_to_log(self.id, offset(), data)
                except WriterClosed:  # the log was closed under the stream: it goes on unrecorded
                    self.writer = self.proxy.unrecorded()
                    chunk_to_log = self.writer.chunk
                await write(data)
            await response.write_eof()
        except ConnectionError as exc:
            self.client_left = True
            if self.upstream_ended or await self._ends_now(read, self._closing_sent(upstream, tail)):
                self.end(Outcome.COMPLETE)
            else:
                self.end(Outcome.CLIENT_DISCONNECTED, f"the client went away mid-response: {describe(exc)}")
            return response
        except asyncio.CancelledError:  # the client went away (aiohttp cancels the handler)
            self.client_left = not self.proxy.stopping
            if self.client_left and await self._ends_now(read, self._closing_sent(upstream, tail)):
                self.answered = True
            raise
        self.end(Outcome.COMPLETE)
        return response

    async def _ends_now(self, read: Callable[[], Awaitable[bytes]], closed: bool) -> bool:
        """The client left just as the last bytes reached it: whether the exchange is
        complete, its log holding exactly what the client was sent. It is if the upstream
        ends within END_GRACE with nothing more; or, when those bytes ``closed`` the stream
        by its protocol, if nothing more comes in that time (the OpenAI SDKs leave on
        [DONE], before the server ends its body: the client had all it was owed). Either
        way the upstream is let go then, as it sees any client that leaves."""
        try:
            more = await asyncio.wait_for(read(), END_GRACE)
        except TimeoutError:
            return closed
        except (aiohttp.ClientError, OSError):
            return closed
        if more == b"":
            return True
        if closed:
            self.noted("it had been sent the stream's closing event; the upstream then sent more")
        return False

    def _closing_sent(self, upstream: aiohttp.ClientResponse, tail: deque[bytes]) -> bool:
        """Whether the bytes forwarded last end with the event that closes the stream by the
        protocol of its request. Not told of a body under a Content-Encoding: its end cannot
        be read without all before it."""
        if upstream.content_type != "text/event-stream" or "Content-Encoding" in upstream.headers:
            return False
        protocol = asked_protocol(self.request, self.request_body())
        return protocol is not None and closed_by(protocol, tail)

    async def _relay_card(self, upstream: aiohttp.ClientResponse, headers: Any) -> web.Response:
        """Agent cards are small: read whole, record as served, rewrite for the client."""
        try:
            original = await upstream.read()
        except (aiohttp.ClientError, OSError) as exc:
            self.end(Outcome.UPSTREAM_DISCONNECTED, dropped(exc))
            self.request.protocol.force_close()
            raise web.HTTPBadGateway() from exc
        with self._recording() as writer:
            writer.chunk(self.id, self.offset(), original)
        encoded = "Content-Encoding" in upstream.headers  # sent anyway: it stays as it is
        rewritten = (
            None
            if encoded
            else rewrite_card(original, self.proxy.upstream, self.proxy.public_for(self.request))
        )
        headers.popall("Content-Length", None)
        self.end(Outcome.COMPLETE)
        return RelayedWhole(
            status=upstream.status, reason=upstream.reason, headers=headers, body=rewritten or original
        )

    def request_body(self) -> bytes | None:
        """The request's body as forwarded (as far as it was kept, when streamed through)."""
        return bytes(self.teed.body.kept) if self.teed is not None else self._sent

    def noted(self, note: str) -> None:
        """Something the log (and the console) says of the exchange however it ends."""
        self.note = note if self.note is None else f"{self.note}; {note}"

    def end(self, outcome: str, error: str | None = None) -> None:
        """Say in the log how the exchange ended (once)."""
        if self.ended:
            return
        self.ended = True
        with self._recording() as writer:
            if self.teed is not None:  # a body streamed through: the log gets what was kept
                self.teed.body.log(writer, self.id)
            error = "; ".join(e for e in (error, self.note) if e) or None
            done = writer.end_exchange(self.id, duration_ns=self.offset(), outcome=outcome, error=error)
            # (A NullWriter's summary tells of nothing recorded.)
            if self.proxy.on_exchange is not None and not isinstance(writer, NullWriter):
                callback, told = self.proxy.on_exchange, self.proxy.told
                done.add_done_callback(
                    lambda f: f.cancelled() or f.exception() or told("on_exchange", callback, f.result())
                )


def _relocate(headers: CIMultiDict[str], location: str) -> None:
    """Set the Location of ``headers``, its name spelt as the upstream spelt it."""
    name = next(name for name in headers if name.lower() == "location")
    headers[name] = location


def closed_by(protocol: Protocol, tail: deque[bytes]) -> bool:
    """Whether a stream's last reads end with an event ``protocol`` says closes it, and
    nothing after it a client reads as an event. Unless ``tail`` begins with an empty read
    (the stream's start), it may begin mid-event: its first event tells nothing."""
    whole = not tail[0]
    decoder = SSEDecoder(keep_raw=False, start=whole)
    decoded = [e for read in tail for e in decoder.feed(read)] + decoder.close()
    events = [e for e in decoded if is_event(e.complete, e.data)]
    last = events[-1] if len(events) > (0 if whole else 1) else None
    return last is not None and last.complete and protocol.closes(last.data, last.event)


def _failure(exc: BaseException) -> str:
    """Why the upstream gave no answer the client could be sent, for a 502."""
    if _no_status_line(exc):
        # aiohttp reads what follows a response's end as the next one: it fails the
        # response before it (or the next request on the connection), not what was sent.
        return (
            "sent bytes where no HTTP response starts: past the end of a response (more than "
            f"its Content-Length, or a body where none goes: to a HEAD, a 204 or a 304), or not HTTP at all: "
            f"{describe(exc)}"
        )
    # (Another response aiohttp could not read is an answer, if one it cannot pass on.)
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"answered what could not be read: {describe(exc)}"
    return f"failed before answering: {describe(exc)}"


def _no_status_line(exc: BaseException | None) -> bool:
    """Whether aiohttp failed to read a status line."""
    while exc is not None:
        if isinstance(exc, BadStatusLine):
            return True
        exc = exc.__cause__
    return False


def upstream_headers(proxy: RecordingProxy, request: web.Request) -> CIMultiDict[str]:
    """A client's request headers as the upstream is sent them."""
    headers = for_upstream(
        request_lines(request),
        connection=request.headers.get("Connection", ""),
        upstream_host=proxy._upstream_host,
        client_ip=request.remote,
        scheme=request.scheme,
        host=authority(request),
    )
    previous = ", ".join(headers.popall("Via", ()))
    headers["Via"] = f"{previous}, {proxy._via}" if previous else proxy._via  # RFC 9110 7.6.3
    if proxy._authorization and "Authorization" not in headers:
        headers["Authorization"] = proxy._authorization
    return headers


def authority(request: web.Request) -> str:
    """The host and port the client reached: its Host header's, or without one (HTTP/1.0)
    the listening socket's address, port included (aiohttp's ``request.host`` then names
    the host alone, and a client sent there would go to port 80)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if request.headers.get("Host") or not isinstance(sockname, tuple):  # (a Unix socket: a path)
        return request.host
    host, port = sockname[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_options(
    writer: Any,
    public_url: str | None,
    max_request_body: Any,
    connect_timeout: Any,
    header_timeout: Any,
    hold: Any,
    hold_bytes: Any,
    rejoin_for: Any,
) -> None:
    """What a proxy is given, checked as the command line checks it: a wrong one fails
    here, not at the first request (or, a NaN hold, when its app is built)."""
    if not isinstance(writer, LogProducer):
        raise UsageError(f"writer is a LogWriter or ProcessLogWriter, not {type(writer).__name__}")
    if public_url is not None:
        http_url(public_url, "the public URL")
    for name, value, whole in (
        ("max_request_body", max_request_body, True),
        ("connect_timeout", connect_timeout, False),
        ("header_timeout", header_timeout, False),
        ("hold_bytes", hold_bytes, True),
        ("rejoin_for", rejoin_for, False),
        *((("hold", hold, False),) if hold is not None else ()),
    ):
        check_bound(name, value, whole=whole, least=0)


def upstream_url(upstream: str, redactor: Redactor | None = None) -> URL:
    """The upstream as a URL; a UsageError unless it is an absolute http(s) one (showing it
    redacted by ``redactor``, the defaults without one)."""
    return http_url(upstream, "the upstream", redactor)


def http_url(value: str, what: str, redactor: Redactor | None = None) -> URL:
    """``value`` as a URL; a UsageError naming ``what`` unless it is an absolute http(s) one."""
    try:
        url = URL(value)
    except ValueError:
        url = None
    if url is None or not url.is_absolute() or url.scheme not in ("http", "https") or not url.host:
        raise UsageError(f"{what} must be an http:// or https:// URL, not {shown_url(value, redactor)!r}")
    if "?" in value or "#" in value:  # a request's own path and query are put after it
        raise UsageError(f"{what} cannot have a query string or a fragment: {shown_url(value, redactor)!r}")
    return url


def shown_url(value: str, redactor: Redactor | None = None) -> str:
    """A URL given as an option, as an error shows it: all before its last '@' after the
    scheme left out (a password with a '#' or '?' in it is no password to a URL parser),
    and its query's credentials redacted as the log's are (by ``redactor``: the names the
    user gave too)."""
    scheme, sep, rest = value.partition("://")
    return (redactor or Redactor()).url(scheme + sep + rest.rpartition("@")[2] if sep else value)


def points_at(url: URL, address: tuple[str, int]) -> bool:
    """Whether ``url`` names the listening socket ``address`` itself: a recorder that
    would forward to itself."""
    if url.port != address[1]:
        return False
    try:
        infos = socket.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM)
        targets = {ipaddress.ip_address(info[4][0]) for info in infos}
        bound = ipaddress.ip_address(address[0])
    except (OSError, ValueError):
        return False
    if bound.is_unspecified:  # listening everywhere: loopback reaches it too
        return any(t.is_loopback or t == bound for t in targets)
    return bound in targets


# A target with a scheme (``http://...``); any other but a path is authority-form (or ``*``).
_ABSOLUTE_FORM = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://")


def logged_target(target: str) -> tuple[str, str | None]:
    """A refused request's target as the log keeps it: path and query apart, so the query
    is redacted like any other; an absolute-form target (what a client whose HTTP_PROXY
    points here sends) loses its user and password, and so does an authority-form one
    (``CONNECT user:password@host:443``), which is all authority: all before its last '@'."""
    if not target.startswith("/") and not _ABSOLUTE_FORM.match(target):
        return target.rpartition("@")[2], None
    path, _, query = target.partition("?")
    path = path.partition("#")[0]
    if not target.startswith("/"):
        scheme, sep, rest = path.partition("://")
        authority, slash, tail = rest.partition("/")
        path = f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{tail}"
    return path, query.partition("#")[0] or None


def error_response(status: int, message: str) -> web.Response:
    body = json.dumps({"error": {"code": status, "message": message, "source": "tasktape"}})
    return web.Response(status=status, text=body, content_type="application/json")


def _ambiguous(last_id: str, given: int) -> str:
    """Why a reconnect after an id the agent gave several events is refused."""
    return (
        f"the agent gave {given} events of the stream the id {shown_id(last_id)}: which of them this "
        "client got last cannot be told, nor what it missed (it would be sent events twice); the "
        "stream is resumed only after an id that names one event"
    )
