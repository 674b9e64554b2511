"""The replay server: answers requests with recorded exchanges, at the recorded pace
(``speed`` times faster), byte for byte; resumes streams from ``Last-Event-ID``; serves
``tasks/{id}:subscribe`` from the task as it runs in replay time; injects faults on
demand; and keeps a fidelity record of its answers (``/_tasktape/`` has the control API)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

# Imported by their full names: ``from . import settings`` takes the package's attribute,
# which outlives a module a test process unloaded (pytester's in-process runs do), and so
# would pair a reloaded ``Faults`` with the checks of the one before.
import tasktape.replay.control as control  # noqa: PLR0402 - see above
import tasktape.replay.fidelity as fidelity  # noqa: PLR0402 - see above
import tasktape.replay.settings as settings  # noqa: PLR0402 - see above
from tasktape.errors import FaultError, UsageError
from tasktape.eventlog import LogProducer
from tasktape.eventlog.content_coding import TooLarge, decode_body
from tasktape.eventlog.exchange_rows import MAX_BODY
from tasktape.eventlog.frames import protocol_of
from tasktape.eventlog.http_fields import field_problem, joined
from tasktape.eventlog.jsonrpc_ids import NO_ID, jsonrpc_id_edits, rpc_id, same_id
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.producer import NullWriter, check_bound, check_options
from tasktape.eventlog.protocols import ProtocolName, by_name, protocols
from tasktape.eventlog.recorded import Recorded, read_log
from tasktape.eventlog.redact import Redactor
from tasktape.eventlog.requests import SUBSCRIBE_METHODS, classify_request
from tasktape.eventlog.spans import Chunks, StreamEvent, events_in
from tasktape.proxy import RecordingProxy, unread
from tasktape.proxy.card import point_card_at
from tasktape.proxy.headers import HEADER_LIMITS, HEADER_TIMEOUT, end_to_end, head_timeout
from tasktape.proxy.hosts import host_guard
from tasktape.proxy.recorder import AS_SENT
from tasktape.proxy.request_keys import request_key

from .armed import Armed, for_request, give_back, header_faults
from .call_messages import CallMessages
from .choosing import ID_PREFIX, Recordings, is_card
from .fault_edits import clash, land, land_on_head
from .faults import HEADER as FAULT_HEADER
from .faults import Faults
from .fidelity import Digest, Divergence, Served
from .framing import length_problem, redacted
from .kept import Kept
from .matching import Incoming, MatchRules, Shown
from .misses import MISS_HINT, Miss, miss
from .modes import NOTHING_REPLAYED, ReplayMode
from .own_answers import error
from .sending import STOPPING, Answer, Message, Stopping, cut_short, due, send
from .streams import after, apply_edits, outside, with_ids
from .tasks import Subscription, Tasks

log = logging.getLogger("tasktape.replay")
NO_BODY = Digest.of(b"")  # what a HEAD's answer holds, as its recording is compared
CONFIGURED = "at start"  # the source of the specs a server is given (--fault, the marker)
FORWARDED = "the request was forwarded live to the upstream, and faults are made on replayed answers only"
# Why a recording whose body is decoded only in part cannot be sent: the wire bytes are
# gone (the decoded part, encoded again, would be other bytes), and the two halves together
# are no body a client can read.
PARTLY_DECODED = (
    "the log holds its body decoded only in part and the rest as it came, still encoded,"
    " which together are no body a client can read"
)


@dataclass(frozen=True)
class Unapplied:
    """The faults a request asked for (X-Tasktape-Fault) that were not made: it was
    forwarded live (passthrough, or a miss in record-missing)."""

    request: str
    fault: str

    def __str__(self) -> str:
        return f"{FAULT_HEADER} {self.fault} of {self.request} not applied: {FORWARDED}"

    def as_json(self) -> dict[str, str]:
        return {"request": self.request, "fault": self.fault, "reason": FORWARDED}


@dataclass
class ReplayStats:
    """What a replay server did: requests served and forwarded, counted; misses, requests
    answered with the replay's own error (refused) and faults not made, as ``Kept``."""

    served: int = 0
    forwarded: int = 0
    every: bool = False  # every miss, refusal and fault not made in full (a test's server)
    misses: Kept[Miss] = field(init=False)
    refusals: Kept[str] = field(init=False)
    not_applied: Kept[Unapplied] = field(init=False)

    def __post_init__(self) -> None:
        self.misses = Kept(lambda m: m.alike, self.every)
        self.refusals = Kept(str, self.every)
        self.not_applied = Kept(str, self.every)

    @property
    def missed(self) -> list[Miss]:
        """The misses kept in full, each with the closest recordings."""
        return self.misses.items

    @property
    def refused(self) -> list[str]:
        """The refusals kept in full: each request, and why."""
        return self.refusals.items

    @property
    def unapplied(self) -> list[Unapplied]:
        """The faults not made kept in full."""
        return self.not_applied.items


# A forwarded request's X-Tasktape-Fault, until its answer's head.
ASKED_FAULTS = request_key("tasktape.asked_faults", Faults)


class ReplayServer:
    """An aiohttp application serving ``recorded``."""

    def __init__(
        self,
        recorded: list[Recorded],
        *,
        speed: float = 1.0,
        mode: ReplayMode | str = ReplayMode.REPLAY,
        upstream: str | None = None,
        writer: LogProducer | None = None,
        log_path: str | Path | None = None,
        add_ids: bool = False,
        faults: Faults | str | Sequence[Faults | str] | None = None,
        miss_status: int | None = None,
        ignore: tuple[str, ...] = (),
        match_headers: tuple[str, ...] = (),
        allow_repeats: bool = False,
        allowed_hosts: frozenset[str] | None = None,
        header_timeout: float = HEADER_TIMEOUT,
        prefer: str | None = None,
        miss_hint: str = MISS_HINT,
        redactor: Redactor | None = None,
        every_answer: bool = False,
    ) -> None:
        mode = ReplayMode.parse(mode)  # its name will do ("passthrough"), a typo will not
        if mode is not ReplayMode.REPLAY and not upstream:
            raise UsageError(f"mode {mode.value} sends requests to an upstream: give one")
        if mode is ReplayMode.RECORD_MISSING and (writer is None or log_path is None):
            raise UsageError("mode record-missing records into a log: give its writer and path")
        recorded = settings.recordings(recorded)
        check_bound("header_timeout", header_timeout, whole=False, least=0)
        check_options(redactor, None)
        given = [Faults.checked(f) for f in settings.fault_specs(faults)]
        if mode is ReplayMode.PASSTHROUGH and given:
            raise UsageError(NOTHING_REPLAYED)
        self.speed = settings.speed(speed)
        self.miss_status = None if miss_status is None else settings.miss_status(miss_status)
        self.log_path = Path(log_path) if log_path else None
        # What the user redacts (the defaults, if none): reports of requests hide it too.
        self.recordings = Recordings(
            MatchRules.of(ignore, match_headers),
            Shown.knowing(redactor or Redactor(), recorded),
            allow_repeats=allow_repeats,
            prefer=prefer,
            add_ids=add_ids,
        )
        self._digests: dict[int, Digest] = {}
        self._unframed: set[int] = set()  # recordings whose Content-Length is not their body's
        # What the replay sends otherwise than recorded, said as it loads (a Content-Length an
        # edit made wrong, not redaction; a body cut or decoded in part when recorded): each
        # with the index of its recording, as what a test was served is told by.
        self.not_as_recorded: list[tuple[int, str]] = []
        self.tasks = Tasks(self.recorded, self.events_of, self._event_id)
        self.calls = CallMessages(self.recorded, self.events_of, self._event_id)
        # The protocols (plug-ins found, modules loaded: some 20-30 ms) now, not on the first
        # request, whose answer would start that much behind its recorded pace.
        protocols()
        for r in recorded:
            self._add(r)
        self.mode = mode
        self._configured = given  # armed again by a reset (each names a fault: checked)
        self.armed = [Armed(f, CONFIGURED) for f in self._configured]
        # The fidelity record: all answers counted, the latest and the first that differed in
        # full (``every_answer``: all in full, for a server as short-lived as a test).
        self.fidelity = fidelity.Record(every_answer=every_answer)
        self.miss_hint = miss_hint  # what a miss's answer suggests, in the words of who serves it
        self.stats = ReplayStats(every=every_answer)  # (as the fidelity record keeps answers)
        self.proxy: RecordingProxy | None = None
        if upstream:
            recording = mode is ReplayMode.RECORD_MISSING
            self.proxy = RecordingProxy(
                upstream,
                writer if recording and writer else NullWriter(),
                on_exchange=self._recorded_anew if recording else None,
            )
        # A client pointed here instead of at its agent sends the same (big) headers, and
        # bodies as big as a recorder keeps (bigger ones are refused: see ``handle``).
        self.app = web.Application(
            client_max_size=MAX_BODY,
            handler_args={
                **HEADER_LIMITS,
                **head_timeout(header_timeout),
                **unread.handler_args(),
                **AS_SENT,
            },
            middlewares=[host_guard(allowed_hosts, "tasktape replay")] if allowed_hosts else [],
        )
        self._control = control.api(self)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.app.on_response_prepare.append(self._unapplied)
        self.app[STOPPING] = stopping = Stopping()

        async def serving(_app: web.Application) -> None:
            stopping.now = False  # (served again after a stop)

        async def stop(_app: web.Application) -> None:
            stopping.now = True

        self.app.on_startup.append(serving)
        self.app.on_shutdown.append(stop)
        if self.proxy is not None:
            proxy = self.proxy
            self.app.on_startup.append(lambda _app: proxy.start())
            self.app.on_cleanup.append(lambda _app: proxy.close())
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the recordings, and what was used -------------------------------------------------------

    @property
    def recorded(self) -> list[Recorded]:
        return self.recordings.recorded

    @property
    def used(self) -> list[int]:
        """Times each recording was served."""
        return self.recordings.used

    @property
    def resumed(self) -> set[int]:
        """Recordings served only to clients resuming them."""
        return self.recordings.resumed

    @property
    def rules(self) -> MatchRules:
        return self.recordings.rules

    @property
    def add_ids(self) -> bool:
        return self.recordings.add_ids

    def events_of(self, index: int) -> list[StreamEvent]:
        return self.recordings.events_of(index)

    def unused(self) -> list[Recorded]:
        return self.recordings.unused()

    # -- serving -------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if control.owns(request.rel_url.path):
            # Told apart by the path decoded, as recordings are matched: a spelling such as
            # /_tasktape%2Freport is never matched, nor forwarded to the upstream.
            return await self._control(request)
        self._loop = asyncio.get_running_loop()
        start = self._loop.time()
        if not request.raw_path.startswith("/"):
            # What a client sends a forward proxy (GET http://elsewhere/x): in the modes that
            # forward, the upstream would be given that as its path.
            return self._refuse(
                f"{request.method} {request.raw_path} (an absolute-form request target)",
                400,
                "absolute-form request targets are not accepted: tasktape replay is not a forward proxy",
            )
        line = f"{request.method} {request.rel_url.path}"
        spec = request.headers.get(FAULT_HEADER)
        try:
            header = None if spec is None else header_faults(spec)
        except FaultError as exc:
            return self._refuse(f"{line} ({FAULT_HEADER} {spec!r}: {exc})", 400, f"{FAULT_HEADER}: {exc}")
        upstream_request = self._for_upstream(request)
        if self.mode is ReplayMode.PASSTHROUGH:
            return await self._forward(upstream_request, None, header)
        try:
            sent = await request.read() if request.body_exists else None
        except web.HTTPRequestEntityTooLarge:
            return self._too_big(line)
        # Matched as the log keeps request bodies: decoded from their Content-Encoding, within
        # the same bound; one that cannot be decoded, as sent (as a recorder keeps it).
        encoding = joined(request.headers.items(), "Content-Encoding")  # (every line of it)
        body, undecodable = (None, None) if sent is None else decode_body(sent, encoding, MAX_BODY)
        if isinstance(undecodable, TooLarge):
            return self._too_big(line, encoding)
        incoming = Incoming(
            request.method,
            request.rel_url.path,  # decoded, as the agent's server reads it (%3A is ":")
            request.rel_url.raw_query_string or None,
            body,
            list(request.headers.items()),
        )
        last_id = last_event_id(request)
        recordings = self.recordings
        if last_id is None:
            matched = recordings.match(incoming)
        else:
            matched = recordings.match_resumed(incoming, last_id)
        if matched is not None:
            self.stats.served += 1
            return await self._serve(request, incoming, *matched, header, start)
        head = recordings.head_of_get(incoming)
        if head is not None:
            self.stats.served += 1
            return await self._head(request, incoming, head, header, start)
        info = classify_request(incoming.method, incoming.path, body)
        if info.rpc_method in SUBSCRIBE_METHODS and info.task_id:
            answer = self.tasks.subscribe(info.task_id, info.binding, info.rpc_id, last_id, start, self.speed)
            if isinstance(answer, str):
                return self._refuse(f"{self._line(incoming)} (Last-Event-ID {last_id!r})", 400, answer)
            if answer is not None:
                self.stats.served += 1
                return await self._subscription(request, incoming, answer, header, start)
        if self.mode is ReplayMode.RECORD_MISSING:
            return await self._forward(upstream_request, sent, header)
        if undecodable is not None:
            return self._refuse(
                f"{self._line(incoming)} (Content-Encoding {encoding}: {undecodable})",
                400,
                f"the request body cannot be decoded from its Content-Encoding {encoding} to match it "
                f"({undecodable}), and no recording holds it as sent",
            )
        return self._miss(incoming, last_id)

    def _too_big(self, line: str, encoding: str | None = None) -> web.Response:
        """The refusal of a body bigger than is matched: as sent, or decoded from ``encoding``."""
        decoded = "" if encoding is None else f" decoded from its Content-Encoding {encoding}"
        return self._refuse(
            f"{line} (a body over {MAX_BODY:,} bytes{decoded})",
            413,
            f"the request body is over {MAX_BODY:,} bytes{decoded}: tasktape replay reads a body whole "
            "to match it, up to what a recorder keeps of one by default (--max-body)",
        )

    def _refuse(self, what: str, status: int, message: str) -> web.Response:
        """The replay's own error, for a request it cannot answer as the agent would:
        counted as refused (``what``: the request, and why)."""
        self.stats.refusals.add(what)
        return error(status, message)

    def _unreadable(self, incoming: Incoming, recorded: Recorded) -> web.Response:
        """A recording whose body no client can read (decoded in part, the rest encoded) is
        not sent: the replay's own error says why."""
        self.stats.served -= 1
        why = f"{recorded.partly_decoded}: {PARTLY_DECODED}"
        line = self._line(incoming)
        return self._refuse(
            f"{line} ({recorded.origin}: {why})",
            502,
            f"the recording of {line} ({recorded.origin}) cannot be sent: {why}",
        )

    def _line(self, incoming: Incoming) -> str:
        """The request's line as reports show it: no credential's value."""
        return self.recordings.shown.request_line(incoming)

    def _for_upstream(self, request: web.Request) -> web.Request:
        """The request as an upstream may be sent it: without the replay's own fault header,
        which neither the agent nor a recording is to see. (Made before the body is read:
        aiohttp clones no request after that.)"""
        if self.proxy is None or FAULT_HEADER not in request.headers:
            return request
        headers = CIMultiDict(request.headers)
        headers.popall(FAULT_HEADER)
        return request.clone(headers=headers)

    def _add(self, recorded: Recorded, used: int = 0) -> None:
        if recorded.protocol is None:  # recognised once, not on every comparison
            protocol = protocol_of(recorded)
            recorded.protocol = None if protocol is None else protocol.name
        index = len(self.recorded)
        problem = length_problem(recorded)
        if problem is not None:
            # Sent, it would hang the client (too long) or cut the body (too short).
            self._unframed.add(index)
        whys = _not_as_recorded(recorded)
        if problem is not None and not redacted(recorded):
            whys.insert(0, f"{problem}; it is left out, and the body sent whole")
        for why in whys:
            said = f"{self.recordings.shown.request_line(recorded)} ({recorded.origin}): {why}"
            self.not_as_recorded.append((index, said))
            log.warning("tasktape replay: %s", said)
        self.recordings.add(recorded, used)
        self.tasks.changed()
        self.calls.changed()

    async def _head(
        self, request: web.Request, incoming: Incoming, index: int, header: Faults | None, start: float
    ) -> web.StreamResponse:
        """A recorded GET's status and headers, without its body: the recording stays for
        the GET. It gets the faults the GET would get on its head, and counts for their
        scopes as the GET would."""
        recorded = self.recorded[index]
        if recorded.partly_decoded:
            return self._unreadable(incoming, recorded)
        headers = end_to_end(_sendable(recorded))
        if recorded.decoded_from:
            headers.popall("Content-Encoding", None)  # the recording holds the decoded body
        if not recorded.is_sse:
            # The length the GET's body goes out with (a card pointing here), as a HEAD says it.
            chunks, _ = self._prepared(recorded, index, (recorded, incoming), request)
            headers["Content-Length"] = str(sum(len(data) for _, data in chunks))
        served = Served(incoming.method, incoming.path, recorded.origin, lambda: NO_BODY)
        answer = Answer(recorded.status or 200, headers, 0, [], recorded.is_sse, start)
        return await self._send(request, incoming, answer, header, served, recorded.protocol)

    def _miss(self, incoming: Incoming, last_id: str | None) -> web.Response:
        missed, answer = miss(self.recordings, incoming, last_id, self.miss_hint, self.miss_status)
        self.stats.misses.add(missed)
        return answer

    async def _forward(
        self, request: web.Request, body: bytes | None, header: Faults | None
    ) -> web.StreamResponse:
        """To the upstream through the recorder, with the body as the client sent it
        (``body``, once this server has read it). It gets no faults: those the request asked
        for are said not to be made, not dropped in silence, where a replayed answer would
        have got them (the scope's path, a stream for faults on events)."""
        assert self.proxy is not None
        self.stats.forwarded += 1
        if header:
            request[ASKED_FAULTS] = header  # told once the answer's head shows what it is
        return await self.proxy.handle(request, body)

    async def _unapplied(self, request: web.Request, response: web.StreamResponse) -> None:
        """As a forwarded answer's head goes out (before the client has any of it): the
        faults its request asked for, which it did not get, said where a replayed answer
        would have got them."""
        header = request.get(ASKED_FAULTS)
        path = request.rel_url.path
        if header and Armed(header, FAULT_HEADER).takes(path, response.content_type == "text/event-stream"):
            unapplied = Unapplied(f"{request.method} {path}", ";".join(header.fault_items()))
            self.stats.not_applied.add(unapplied)
            log.warning("tasktape replay: %s", unapplied)

    def _recorded_anew(self, summary: Any) -> None:
        """record-missing: what was just recorded (committed: this runs once it is)
        replays from now on. Called from the log writer's thread."""
        if self._loop is None or self.log_path is None:
            return
        (recorded,) = read_log(self.log_path, [summary.exchange_id])

        def add() -> None:
            # It answered the request that recorded it: an identical request in this run
            # is a new episode (recorded too), and a later run replays both in order.
            self._add(recorded, used=1)

        # The writer finishes its last exchanges as the server stops: once the loop has
        # closed, there is nothing left to replay them to.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(add)

    def _digest(self, index: int) -> Digest:
        """The recording's body as the fidelity record compares it (worked out once)."""
        if index not in self._digests:
            self._digests[index] = Digest.of(self.recorded[index].body)
        return self._digests[index]

    async def _serve(
        self,
        request: web.Request,
        incoming: Incoming,
        index: int,
        counted: bool,
        header: Faults | None,
        start: float,
    ) -> web.StreamResponse:
        recorded = self.recorded[index]
        if recorded.partly_decoded:
            self.used[index] -= counted  # nothing of it was served
            return self._unreadable(incoming, recorded)
        # The ids of the request it answers in this run: the rewrites a stream's start got
        # go with what resumes it too (MCP: a GET after a POST stream).
        origin, asked = self.recordings.answering(index, incoming, counted)
        chunks, rewrites = self._prepared(recorded, index, (self.recorded[origin], asked), request)
        # A recording that was cut short replays cut short, at the recorded moment.
        cut_ns = (recorded.duration_ns or 0) if recorded.cut_short else None
        end_ns = recorded.duration_ns
        last_id = last_event_id(request)
        resumed_after = None
        if recorded.is_sse and last_id is not None and last_id != recorded.resumed_from:
            resumed = self._resume(index, chunks, last_id)
            if isinstance(resumed, str):
                # Nothing of it was served: the recording stays for the next request.
                self.used[index] -= counted
                self.stats.served -= 1
                return self._refuse(f"{self._line(incoming)} (Last-Event-ID {last_id!r})", 400, resumed)
            chunks, since_ns = resumed
            resumed_after = since_ns
            cut_ns = None if cut_ns is None else max(0, cut_ns - since_ns)
            end_ns = None if end_ns is None else max(0, end_ns - since_ns)
        refused = self._unclear(incoming, header, recorded.is_sse, chunks, recorded.protocol)
        if refused is not None:
            self.used[index] -= counted  # nothing of it was served
            return refused
        session = self.recordings.session_of(incoming)
        gave: list[Message] = []
        if counted:
            self.recordings.answered(index, incoming)
            # What it sent on the session's GET stream while this call waited goes out now.
            gave = self.calls.called(index, session, start, self.speed)
        # Not worked out before sending: hashing a long body would hold back its first chunk.
        served = Served(incoming.method, incoming.path, recorded.origin, lambda: self._digest(index))
        for rewrite in rewrites:
            served.because(Divergence.REWRITE, rewrite)
        if resumed_after is not None:
            served.because(Divergence.RESUME, f"after event {last_id}")
            self.resumed.add(index)
            # Its tasks have run since the stream began, however long ago that was.
            self.tasks.resuming(index, due(start, -resumed_after, self.speed))
        elif recorded.is_sse:
            self.tasks.serving(index, start)  # its tasks run from now, in replay time
        headers = end_to_end(_sendable(recorded))
        # A length the recording says of its own body is said anew of the body edited.
        framed = (
            "Content-Length" in headers
            and index not in self._unframed
            and not recorded.response_body_truncated
        )
        if (
            rewrites
            or last_id is not None
            or recorded.decoded_from
            or recorded.response_body_truncated
            or index in self._unframed
        ):
            headers.popall("Content-Length", None)
        if recorded.decoded_from:
            headers.popall("Content-Encoding", None)  # the recording holds the decoded body
        answer = Answer(
            recorded.status or 200,
            headers,
            recorded.ttfb_ns,
            chunks,
            recorded.is_sse,
            start,
            cut_ns=cut_ns,
            end_ns=end_ns if recorded.is_sse else None,
            # A GET stream (MCP's standalone one) is the server's to keep open: the client that
            # ended it is answered as that server would; any other breaks off where it did.
            hold=recorded.outcome == Outcome.CLIENT_DISCONNECTED
            and recorded.is_sse
            and recorded.method == "GET",
            framed=framed,
            joined=self.calls.joined(index, session),
            gave=gave,
        )
        return await self._send(
            request, incoming, answer, header, served, recorded.protocol, index if counted else None
        )

    def _unclear(
        self, incoming: Incoming, header: Faults | None, is_sse: bool, chunks: Chunks, protocol: str | None
    ) -> web.Response | None:
        """The refusal of a request whose own spec says nothing clear of the stream it would
        get (no-final and another fault on its closing event, which only the stream shows),
        as one naming two faults for one event is refused; None for any other, and for a
        spec whose path or kind of answer leaves this one out (``p=``: it is for this one)."""
        if header is None or not is_sse or not Armed(header, FAULT_HEADER).could_take(incoming.path, is_sse):
            return None
        why = clash(chunks, header, _closing(protocol))
        if why is None:
            return None
        self.stats.served -= 1
        return self._refuse(
            f"{self._line(incoming)} ({FAULT_HEADER} {str(header)!r}: {why})", 400, f"{FAULT_HEADER}: {why}"
        )

    async def _send(
        self,
        request: web.Request,
        incoming: Incoming,
        answer: Answer,
        header: Faults | None,
        served: Served,
        protocol_name: str | None,
        counted: int | None = None,
    ) -> web.StreamResponse:
        """Send an answer with the faults its scopes give it (a spec whose faults the
        answer was too short for keeps its count for the next one). ``counted``: the
        recording the answer used up, which a status fault gives back."""
        self.fidelity.opened(served)
        try:
            faults, taken = for_request(self.armed, header, incoming.path, answer.is_sse)
            bodiless = request.method == "HEAD"
            if faults.status:
                made = faults.status_items()
                give_back(taken, made)
                if counted is not None:
                    # None of it was sent: the client's retry gets it.
                    self.used[counted] -= 1
                return await self._faulty_status(served, faults, made, bodiless)
            if bodiless:
                landing = land_on_head(answer.chunks, faults)
            else:
                landing = land(answer.chunks, answer.is_sse, faults, _closing(protocol_name))
            give_back(taken, landing.applied)
            served.faults += landing.applied + [f"not applied: {m}" for m in landing.missed]
            if landing.applied:
                served.because(Divergence.FAULT, ", ".join(landing.applied))
            served.head_edited = faults.content_type is not None
            return await send(request, answer, faults, landing, served, self.speed)
        finally:
            for held in answer.joined.held_back() if answer.joined is not None else ():
                served.because(Divergence.REWRITE, held)
            self.fidelity.closed(served)  # however it ended: whole, cut short, a status fault

    async def _faulty_status(
        self, served: Served, faults: Faults, made: list[str], bodiless: bool
    ) -> web.Response:
        """The error a status fault answers with, as late and as typed as the spec says
        (``made``: those faults, written out); ``bodiless``: to a HEAD, its head only."""
        status = faults.status or 500
        # Named before the delay: a client that leaves during it left a faulty answer.
        served.faults += made
        served.because(Divergence.FAULT, ", ".join(made))
        served.head_edited = True
        try:
            await asyncio.sleep(faults.delay_headers_ms / 1000)
        except asyncio.CancelledError:  # the client went away, or the server is stopping
            cut_short(self.app, served)
            raise
        if status in (204, 304):  # answers that carry no body
            response = web.Response(status=status)
        else:
            response = error(status, f"fault injected: status {status}")
        if faults.content_type is not None:
            response.headers["Content-Type"] = faults.content_type
        body = response.body if isinstance(response.body, bytes) and not bodiless else b""
        served.body, served.bytes_sent = [(0, body)], len(body)
        served.late_s.append(0.0)
        served.finished = True
        return response

    def _prepared(
        self,
        recorded: Recorded,
        index: int,
        answering: tuple[Recorded, Incoming],
        request: web.Request,
    ) -> tuple[Chunks, list[str]]:
        """The recorded chunks as this request gets them: the JSON-RPC id (and what else
        its protocol rewrites) of the request they answer, ``answering``'s second where the
        recording answered its first; added SSE ids; a card pointing here. Second: what
        changed, if anything."""
        chunks = recorded.chunks
        edits, rewrites = [], []
        events = self.events_of(index) if recorded.is_sse else None
        answered, incoming = answering
        theirs, mine = rpc_id(answered.request_body), rpc_id(incoming.body)
        if theirs is not NO_ID and mine is not NO_ID and not same_id(mine, theirs):
            id_edits = jsonrpc_id_edits(chunks, events, theirs, mine)
            if id_edits:
                edits += id_edits
                rewrites.append(f"the JSON-RPC id {json.dumps(theirs)} is {json.dumps(mine)}")
        protocol = by_name(recorded.protocol)
        if protocol is not None:
            more, said = protocol.answer_edits(answered.as_request(), incoming.as_request(), chunks, events)
            edits += more
            rewrites += said
        # A call's messages on the GET stream go out with the call (``calls``), not on its clock.
        cut = self.calls.cut(index)
        edits += cut
        if self.add_ids and recorded.is_sse:
            id_edits = outside(with_ids(self.events_of(index), f"{ID_PREFIX}{index + 1}."), cut)
            if id_edits:
                edits += id_edits
                rewrites.append(f"SSE ids added to {len(id_edits)} events")
        if edits:
            chunks = apply_edits(chunks, edits)
        if is_card(recorded) and chunks:
            public = URL.build(scheme=request.scheme, authority=request.host)
            card = point_card_at(b"".join(d for _, d in chunks), public)
            if card is not None:
                return [(chunks[-1][0], card)], [*rewrites, f"the agent card points at {public}"]
        return chunks, rewrites

    def _resume(self, index: int, chunks: Chunks, last_id: str) -> tuple[Chunks, int] | str:
        """What follows the event ``last_id``, and that event's offset (the rest's new zero);
        or why there is none. Only whole events count: a client has seen no other (one cut
        off mid-event dispatched nothing)."""
        recorded = self.recorded[index]
        call_message = self.calls.resumed_at(index, last_id)  # sent with its call, not in ``chunks``
        if call_message is not None:
            end, since_ns = call_message
            return after(chunks, end, since_ns), since_ns
        events = [e for e in events_in(chunks) if e.complete]
        for event in events:
            if event.id == last_id:
                return after(chunks, event.end, event.offset_ns), event.offset_ns
        known = [e.id for e in events if e.id is not None]
        if not events:
            hint = "the recorded stream carried no events"
        elif not known:
            hint = "this stream was recorded without event ids: replay with add_ids (--add-ids) to resume it"
        else:
            hint = f"its event ids run from {known[0]!r} to {known[-1]!r}"
        return (
            f"Last-Event-ID {last_id!r} names no event of the recorded stream "
            f"({self.recordings.shown.request_line(recorded)}, {recorded.origin}); {hint}"
        )

    def _event_id(self, index: int, n: int, event: StreamEvent) -> str | None:
        """Event ``n`` of recording ``index``'s id: recorded, or added (--add-ids)."""
        return event.id or (f"{ID_PREFIX}{index + 1}.{n}" if self.add_ids else None)

    async def _subscription(
        self,
        request: web.Request,
        incoming: Incoming,
        subscription: Subscription,
        header: Faults | None,
        start: float,
    ) -> web.StreamResponse:
        refused = self._unclear(incoming, header, True, subscription.chunks, ProtocolName.A2A)
        if refused is not None:
            return refused
        digest = functools.cache(lambda: Digest.of(subscription.recorded))
        served = Served(incoming.method, incoming.path, subscription.exchange, digest)
        for why, detail in subscription.reasons:
            served.because(why, detail)
        headers = CIMultiDict({"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        answer = Answer(200, headers, 0, subscription.chunks, True, start)
        return await self._send(request, incoming, answer, header, served, ProtocolName.A2A)

    # -- the control API -----------------------------------------------------------------------

    def arm(self, faults: Faults | str, source: str) -> Armed:
        """Arm a spec: its scope counts from now."""
        faults = Faults.checked(faults)  # (a spec naming no fault too)
        if self.mode is ReplayMode.PASSTHROUGH:
            raise FaultError(NOTHING_REPLAYED)
        armed = Armed(faults, source)
        self.armed.append(armed)
        return armed

    def reset(self) -> None:
        """Faults armed as configured (their scopes counting afresh), no task started."""
        self.armed = [Armed(f, CONFIGURED) for f in self._configured]
        self.tasks.reset()
        self.calls.reset()
        self.recordings.reset_sessions()

    @property
    def served(self) -> list[Served]:
        """The fidelity record's answers kept in full, in the order they began."""
        return self.fidelity.kept

    def report(self) -> dict[str, Any]:
        """The fidelity report, as ``GET /_tasktape/report`` answers it."""
        return self.fidelity.report()


def last_event_id(request: web.Request) -> str | None:
    """The event a reconnecting client saw last; None for a fresh request. An empty
    Last-Event-ID names none (in SSE, an empty id is no last event): fresh too."""
    return request.headers.get("Last-Event-ID") or None


def _closing(protocol_name: str | None) -> Callable[[StreamEvent], bool]:
    """Whether an event closes a stream, as its protocol (by name) says: none, if unknown."""
    protocol = by_name(protocol_name)

    def closing(event: StreamEvent) -> bool:
        return protocol is not None and protocol.closes(event.data, event.event)

    return closing


def _not_as_recorded(recorded: Recorded) -> list[str]:
    """What makes a recording's body other than the one the upstream sent: said as it loads."""
    said = []
    if recorded.partly_decoded:
        said.append(f"{recorded.partly_decoded}: {PARTLY_DECODED}; it is answered with a 502 error")
    if recorded.response_body_truncated:
        kept = sum(len(data) for _, data in recorded.chunks)
        said.append(f"its body was cut when recorded (--max-body), {kept:,} bytes kept: it is replayed cut")
    return said


def _sendable(recorded: Recorded) -> list[tuple[str, str]]:
    """The recorded response headers that can be sent again. A log keeps what the upstream
    sent, which a lenient client may have accepted: the others are left out, and said so."""
    headers = []
    for name, value in recorded.response_headers or ():
        problem = field_problem(name, value)
        if problem is None:
            headers.append((name, value))
        else:
            log.warning("tasktape replay: %s %s: %s; it is left out", recorded.method, recorded.path, problem)
    return headers
