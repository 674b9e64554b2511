"""Rejoining an agent stream that broke, for a resuming recorder: the stream's protocol
says how to follow it again (A2A: ``tasks/{id}:subscribe``) and what its clients are owed
from the new stream's first event; the subscribe is sent at once, then again after 0.2 s,
0.4 s, ... (at most 5 s apart) until ``--rejoin-for`` runs out or the agent refuses it.
Each subscribe is an exchange of its own in the log, and each rejoin a row of ``resumes``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, NamedTuple

import aiohttp

from tasktape.eventlog import SSEEvent
from tasktape.eventlog.http_fields import joined
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.protocols import recognise
from tasktape.eventlog.protocols.base import CatchUp, Protocol, Request, Resubscription
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide

from .failure import describe
from .live import LiveStream

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiohttp import web

    from .recorder import Exchange, RecordingProxy

FIRST_RETRY = 0.2  # seconds before the second subscribe; the first goes at once
LAST_RETRY = 5.0  # the longest wait between two
KEPT_ANSWER = 16 * 1024 * 1024  # bytes of an answer that is no stream read and kept
_RETRIED = frozenset({408, 425, 429})  # and 5xx: the agent may answer the next one
# Not sent with a subscribe: it has no body, and its stream must reach clients as it comes.
_DROPPED = ("Content-Length", "Content-Type", "Content-Encoding", "Last-Event-ID", "Accept-Encoding")

Subscribed = tuple["Exchange", aiohttp.ClientResponse]


class Failed(NamedTuple):
    """A subscribe that gave no stream: why, and whether the next one may."""

    why: str
    retried: bool


class Rejoin:
    """The rejoins of one held stream to its agent, for as long as it is held."""

    def __init__(
        self, proxy: RecordingProxy, stream: LiveStream, original: Request, client: web.Request
    ) -> None:
        """``original``: the request that opened the stream; ``client``: the client request
        whose headers (credentials among them) the subscribes carry."""
        self.proxy = proxy
        self.stream = stream
        self.request = original
        self.client = client
        self.ended = False  # a made-up event closed the stream (the snapshot's task had ended)
        # Rejoins that bring nothing new share one --rejoin-for: an agent whose subscribes
        # break at once cannot keep the stream held for ever.
        self._deadline: float | None = None
        self._held = -1
        # Told whether the agent let the client follow the task (see _admission), by its
        # first answer that tells: waited for where asking for the task could not tell.
        self.admitted: asyncio.Future[bool] | None = None
        self.taken_up: str | None = None  # see Resume.taken_up

    @classmethod
    def of(cls, exchange: Exchange, stream: LiveStream) -> Rejoin:
        """The rejoins of the stream an exchange of this run opened."""
        request = exchange.request
        headers = list(request.headers.items())
        original = Request(request.method, request.rel_url.raw_path_qs, headers, exchange.request_body())
        return cls(exchange.proxy, stream, original, request)

    @functools.cached_property
    def protocol(self) -> Protocol | None:
        """The stream's protocol: asked once it is needed (few streams break)."""
        return recognise(self.request)

    def closed(self) -> bool:
        """Whether the stream's last event is its protocol's closing one."""
        return ends_closed(self.stream, self.protocol)

    def closed_later(self) -> Callable[[LiveStream], bool]:
        """``closed``, to be asked of the stream once it has ended, if ever (a reconnect to
        it): it holds the original request, not the client's request, nor the stream (a
        stream let go is freed at once, not left to the garbage collector)."""
        request = self.request
        return lambda stream: ends_closed(stream, recognise(request))

    def closes(self, event: SSEEvent) -> bool:
        """Whether this event of a rejoined stream is its last (an agent may leave a
        subscribe open past it, where the first stream would have ended)."""
        return self.protocol is not None and self.protocol.closes(event.data, event.event)

    async def again(self, why: str) -> Subscribed | None:
        """The stream followed anew, or None (said in the log) when it cannot be."""
        sent = self.stream.sent_data()
        last_id = self.stream.last_agent_id()
        plan = self.protocol.resubscription(self.request, sent, last_id) if self.protocol else None
        if plan is None:
            cannot = (
                "no protocol recognised the request, so nothing knows how to follow its stream again"
                if self.protocol is None
                else f"{self.protocol.name} cannot follow it again (it had ended or not begun"
                + ("; the agent gave the last event sent no id)" if last_id is None else ")")
            )
            self._note(ResumeOutcome.NOT_RESUMABLE, sent, error=f"{why}; {cannot}")
            return None
        loop = asyncio.get_running_loop()
        if self._deadline is None or self.stream.size > self._held:
            self._deadline = loop.time() + self.proxy.rejoin_for
        self._held = self.stream.size
        deadline, delay, attempts = self._deadline, FIRST_RETRY, 0
        while True:
            attempts += 1
            answer = await self._subscribe(plan, deadline)
            if not isinstance(answer, Failed):
                first = functools.partial(self._caught_up, sent=sent, by=answer[0].id, attempts=attempts)
                self.stream.rejoin(first)
                return answer
            looked = None if answer.retried else await self._look_up(sent, attempts, deadline)
            if looked:
                return None  # the task had ended: its clients were caught up, their streams ended
            if looked is False and loop.time() < deadline:
                answer = Failed(f"{answer.why}, and asking for the task broke off", retried=True)
            if not answer.retried or loop.time() >= deadline:
                spent = f"; no subscribe succeeded in {self.proxy.rejoin_for:g} s" if answer.retried else ""
                error = f"{why}; {answer.why}{spent}"
                self._note(ResumeOutcome.GAVE_UP, sent, attempts=attempts, error=error)
                return None
            await asyncio.sleep(min(delay, deadline - loop.time()))  # the last try at the deadline
            delay = min(delay * 2, LAST_RETRY)

    def _caught_up(self, first: SSEEvent, *, sent: list[str], by: int, attempts: int) -> bool:
        """The new stream's first event: clients get the events they are owed, made up
        from it; whether it is sent on itself."""
        assert self.protocol is not None
        last = self.stream.last_id()
        catch, made = caught_up(self.stream, self.protocol, sent, first)
        self.ended = self._ends(catch)
        gap = "; ".join(catch.gaps) or None
        outcome = ResumeOutcome.GAP if gap else ResumeOutcome.REJOINED
        self._note(
            outcome,
            sent,
            last_event_id=last,
            new_exchange_id=by,
            attempts=attempts,
            synthesized=made,
            error=gap,
        )
        return catch.send_first

    async def _subscribe(self, plan: Resubscription, deadline: float) -> Subscribed | Failed:
        """One subscribe, recorded: its stream, or why not."""
        sent = await self._send(plan, deadline)
        if isinstance(sent, Failed):
            return sent
        recording, response = sent
        is_sse = response.content_type == "text/event-stream"
        if response.status == 200 and is_sse and "Content-Encoding" not in response.headers:
            recording.held = True
            return recording, response
        await self._read_answer(recording, response, deadline)
        why = f"the agent answered the subscribe with {response.status} {response.content_type}"
        recording.end(Outcome.COMPLETE, why)
        return Failed(why, retried=response.status >= 500 or response.status in _RETRIED)

    async def _look_up(self, sent: list[str], attempts: int, deadline: float) -> bool | None:
        """The agent would not be subscribed to: ask it where the task stands, and if that
        ends it, catch the clients up from its answer and end their streams cleanly (True).
        False: the answer broke off on the way (ask again); None: it does not help."""
        assert self.protocol is not None
        plan = self.protocol.lookup(self.request, sent)
        answer = None if plan is None else await self._send(plan, deadline)
        if answer is None:
            return None
        if isinstance(answer, Failed):
            return False
        recording, response = answer
        body, whole = await self._read_answer(recording, response, deadline)
        recording.end(Outcome.COMPLETE if whole else Outcome.UPSTREAM_DISCONNECTED)
        if not whole:
            return False
        if response.status != 200 or "Content-Encoding" in response.headers:
            return None
        last = self.stream.last_id()
        catch = self.protocol.catch_up(sent, body.decode("utf-8", "replace"))
        if catch.send_first or not self._ends(catch):
            return None  # no task in the answer, or one that goes on: nothing ends the stream
        made = tuple(self.stream.add_made(data) for data in catch.events)
        self.stream.end(Outcome.COMPLETE, closed=True)
        gap = "; ".join(catch.gaps) or None
        self._note(
            ResumeOutcome.CAUGHT_UP,
            sent,
            last_event_id=last,
            new_exchange_id=recording.id,
            attempts=attempts,
            synthesized=made,
            error=gap,
        )
        return True

    async def lets_follow(self) -> bool | None:
        """Whether the agent lets this rejoin's client follow the task, asked for the task
        with its headers (see _admission); None also for a 2xx that holds no task (a
        JSON-RPC error), or when there is no way to ask."""
        sent = self.stream.sent_data()
        plan = self.protocol.lookup(self.request, sent) if self.protocol else None
        deadline = asyncio.get_running_loop().time() + self.proxy.rejoin_for
        answer = None if plan is None else await self._send(plan, deadline)
        if answer is None or isinstance(answer, Failed):
            return None
        assert self.protocol is not None  # (it made the plan)
        recording, response = answer
        body, whole = await self._read_answer(recording, response, deadline)
        recording.end(Outcome.COMPLETE if whole else Outcome.UPSTREAM_DISCONNECTED)
        verdict = _admission(response.status)
        holds_task = whole and not self.protocol.catch_up(sent, body.decode("utf-8", "replace")).send_first
        if verdict and not holds_task:
            return None  # (no task in the answer)
        return verdict

    async def _send(self, plan: Resubscription, deadline: float) -> Subscribed | Failed:
        """One request to the agent for the stream, recorded as an exchange of its own."""
        from .recorder import Exchange, upstream_headers  # noqa: PLC0415 (the recorder imports this module)

        proxy = self.proxy
        headers = upstream_headers(proxy, self.client)
        for name in _DROPPED:
            headers.popall(name, None)
        headers.update(plan.headers)
        path, _, query = plan.path.partition("?")
        new_id = proxy.writer.begin_exchange(
            proxy.capture_id,  # type: ignore[arg-type]
            method=plan.method,
            path=path,
            query=query or None,
            request_headers=list(headers.items()),
            request_body=plan.body,
            started_ns=time.time_ns(),
        )
        recording = Exchange(proxy, self.client, new_id, time.perf_counter_ns())
        assert proxy._session is not None
        waited = _within(deadline)
        try:
            url = proxy.upstream_url(plan.path)
            async with asyncio.timeout(waited):
                response = await proxy._session.request(
                    plan.method, url, headers=headers, data=plan.body, allow_redirects=False
                )
        except TimeoutError:
            why = f"the agent did not answer within {waited:.1f} s (--rejoin-for)"
            recording.end(Outcome.UPSTREAM_ERROR, why)
            return Failed(why, retried=True)
        except (aiohttp.ClientError, OSError) as exc:
            why = f"the request failed before an answer: {describe(exc)}"
            recording.end(Outcome.UPSTREAM_ERROR, why)
            return Failed(why, retried=True)
        verdict, admitted = _admission(response.status), self.admitted
        if admitted is not None and not admitted.done() and verdict is not None:
            admitted.set_result(verdict)
        proxy.writer.response_head(
            new_id,
            status=response.status,
            headers=list(response.headers.items()),
            is_sse=response.content_type == "text/event-stream",
            ttfb_ns=recording.offset(),
            content_encoding=joined(response.headers.items(), "Content-Encoding"),
        )
        return recording, response

    async def _read_answer(
        self, recording: Exchange, response: aiohttp.ClientResponse, deadline: float
    ) -> tuple[bytes, bool]:
        """An answer that is no stream, read (as far as the log keeps it, and within the
        rejoin's time) and recorded, and whether it came whole."""
        body, whole = b"", True
        try:
            async with asyncio.timeout(_within(deadline)):
                while len(body) < KEPT_ANSWER and (data := await response.content.readany()):
                    body += data
        except (aiohttp.ClientError, OSError, TimeoutError):
            whole = False
        finally:
            response.close()
        if body:
            self.proxy.writer.chunk(recording.id, recording.offset(), body)
        return body, whole

    def _ends(self, catch: CatchUp) -> bool:
        """Whether the events a catch-up made include the stream's closing one."""
        assert self.protocol is not None
        return any(self.protocol.closes(data, None) for data in catch.events)

    def _note(self, outcome: ResumeOutcome, sent: list[str], **fields: object) -> None:
        """A row of ``resumes`` for this rejoin (its last event id, unless given: the last
        one clients have been sent)."""
        fields.setdefault("last_event_id", self.stream.last_id())
        side, events = ResumeSide.UPSTREAM, len(sent)
        fields.setdefault("taken_up", self.taken_up)
        resume = Resume(self.stream.exchange_id, side, outcome, events_from_log=events, **fields)  # type: ignore[arg-type]
        self.proxy.resumed(resume)


def _within(deadline: float) -> float:
    """How long a request may wait for the agent: until ``deadline`` (loop time), and at
    least the first retry's wait, so that a try made at the deadline can be answered."""
    return max(deadline - asyncio.get_running_loop().time(), FIRST_RETRY)


def _admission(status: int) -> bool | None:
    """What an agent's answer says of whether the client it went for may follow the task:
    yes (a 2xx), no (a 401 or a 403), or nothing."""
    return True if 200 <= status < 300 else False if status in (401, 403) else None


def named_task(request: web.Request, body: bytes) -> tuple[str | None, str | None]:
    """The task and the session a client's request names (each None if none), as its
    protocol reads the request."""
    asked = _asked(request, body)
    protocol = recognise(asked)
    info = protocol.request_info(asked) if protocol is not None else None
    return (info.task_id, info.session_id) if info is not None else (None, None)


def agent_resumes(request: web.Request, body: bytes) -> bool:
    """Whether the agent takes a stream up again itself after a client's request like
    this one: its protocol says so. Of no protocol known, nothing tells, and an agent that
    does not read Last-Event-ID would send the stream again from its start: it is not
    asked (what the recorder holds answers)."""
    protocol = asked_protocol(request, body)
    return protocol is not None and protocol.resumes_streams


def asked_protocol(request: web.Request, body: bytes | None) -> Protocol | None:
    """The protocol a client's request (with ``body``) speaks, as the log would read it."""
    return recognise(_asked(request, body))


def _asked(request: web.Request, body: bytes | None) -> Request:
    return Request(request.method, request.rel_url.raw_path_qs, list(request.headers.items()), body)


def ends_closed(stream: LiveStream, protocol: Protocol | None) -> bool:
    """Whether the stream's last event is its protocol's closing one."""
    data = stream.last_data()
    return data is not None and protocol is not None and protocol.closes(data, None)


def caught_up(
    stream: LiveStream, protocol: Protocol, sent: list[str], first: SSEEvent
) -> tuple[CatchUp, tuple[str, ...]]:
    """Catch the stream's clients up from a rejoined stream's first event: what its
    protocol says they are owed, and the ids of the events made up for it (the same ids
    each time the same stream is rebuilt from the log)."""
    catch = protocol.catch_up(sent, first.data)
    return catch, tuple(stream.add_made(data) for data in catch.events)
