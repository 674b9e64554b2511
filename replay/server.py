"""The replay server: answers requests with recorded exchanges, at the recorded pace
(``speed`` times faster), byte for byte; resumes streams from ``Last-Event-ID``; serves
``tasks/{id}:subscribe`` from a task's recorded events; injects faults on demand."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from yarl import URL

from tasktape.errors import FaultError, UsageError
from tasktape.eventlog import LogProducer, classify
from tasktape.eventlog.content_coding import decode_body
from tasktape.eventlog.frames import protocol_of
from tasktape.eventlog.http_fields import field_problem
from tasktape.eventlog.producer import NullWriter
from tasktape.eventlog.recorded import Recorded, read_log
from tasktape.eventlog.requests import classify_request
from tasktape.eventlog.spans import Chunks, StreamEvent, events_in
from tasktape.proxy import RecordingProxy, unread
from tasktape.proxy.card import CARD_METHODS, CARD_PATHS, point_card_at
from tasktape.proxy.headers import HEADER_LIMITS, HEADER_TIMEOUT, end_to_end, head_timeout
from tasktape.proxy.hosts import host_guard
from tasktape.proxy.recorder import AS_SENT

from .faults import HEADER as FAULT_HEADER
from .faults import Faults
from .matching import Incoming, MatchRules, mismatches
from .modes import ReplayMode
from .streams import after, apply_edits, jsonrpc_id_edits, split_at, with_ids

log = logging.getLogger("tasktape.replay")
CLIENT_LEFT = "client_disconnected"
ID_PREFIX = "tt"  # ids added with add_ids: "tt<exchange>.<event>"


@dataclass
class Miss:
    request: str
    closest: list[dict[str, Any]]


@dataclass
class ReplayStats:
    served: int = 0
    forwarded: int = 0
    missed: list[Miss] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # requests answered with the replay's own error


class ReplayServer:
    """An aiohttp application serving ``recorded``."""

    def __init__(
        self,
        recorded: list[Recorded],
        *,
        speed: float = 1.0,
        mode: ReplayMode = ReplayMode.REPLAY,
        upstream: str | None = None,
        writer: LogProducer | None = None,
        log_path: str | Path | None = None,
        add_ids: bool = False,
        faults: Faults | None = None,
        miss_status: int = 404,
        ignore: tuple[str, ...] = (),
        match_headers: tuple[str, ...] = (),
        allow_repeats: bool = False,
        allowed_hosts: frozenset[str] | None = None,
        header_timeout: float = HEADER_TIMEOUT,
    ) -> None:
        if mode is not ReplayMode.REPLAY and not upstream:
            raise UsageError(f"mode {mode.value} sends requests to an upstream: give one")
        if mode is ReplayMode.RECORD_MISSING and (writer is None or log_path is None):
            raise UsageError("mode record-missing records into a log: give its writer and path")
        self.log_path = Path(log_path) if log_path else None
        self.recorded: list[Recorded] = []
        self.used: list[int] = []  # times each recording was served
        self._by_route: dict[tuple[str, str], list[int]] = {}  # (method, path): indexes
        for r in recorded:
            self._add(r)
        self.speed = speed
        self.mode = mode
        self.add_ids = add_ids
        self.faults = faults or Faults()
        self.miss_status = miss_status
        self.rules = MatchRules.of(ignore, match_headers)
        self.allow_repeats = allow_repeats
        self.stats = ReplayStats()
        self._events: dict[int, list[StreamEvent]] = {}
        self.proxy: RecordingProxy | None = None
        if upstream:
            recording = mode is ReplayMode.RECORD_MISSING
            self.proxy = RecordingProxy(
                upstream,
                writer if recording and writer else NullWriter(),
                on_exchange=self._recorded_anew if recording else None,
            )
        # A client pointed here instead of at its agent sends the same (big) headers.
        self.app = web.Application(
            handler_args={
                **HEADER_LIMITS,
                **head_timeout(header_timeout),
                **unread.handler_args(),
                **AS_SENT,
            },
            middlewares=[host_guard(allowed_hosts, "tasktape replay")] if allowed_hosts else [],
        )
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        if self.proxy is not None:
            proxy = self.proxy
            self.app.on_startup.append(lambda _app: proxy.start())
            self.app.on_cleanup.append(lambda _app: proxy.close())
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what was used -----------------------------------------------------------------------

    def unused(self) -> list[Recorded]:
        return [r for r, n in zip(self.recorded, self.used, strict=True) if not n]

    # -- serving -------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self._loop = asyncio.get_running_loop()
        start = self._loop.time()
        if not request.raw_path.startswith("/"):
            # What a client sends a forward proxy (GET http://elsewhere/x): in the modes that
            # forward, the upstream would be given that as its path.
            return _error(
                400, "absolute-form request targets are not accepted: tasktape replay is not a forward proxy"
            )
        try:
            faults = (
                Faults.parse(request.headers[FAULT_HEADER], self.faults)
                if FAULT_HEADER in request.headers
                else self.faults
            )
        except FaultError as exc:
            return _error(400, f"{FAULT_HEADER}: {exc}")
        if self.mode is ReplayMode.PASSTHROUGH:
            return await self._forward(request)
        sent = await request.read() if request.body_exists else None
        # Matched as the log keeps request bodies: decoded from their Content-Encoding.
        body = None if sent is None else decode_body(sent, request.headers.get("Content-Encoding"))[0]
        incoming = Incoming(
            request.method,
            request.rel_url.raw_path,
            request.rel_url.raw_query_string or None,
            body,
            list(request.headers.items()),
        )
        last_id = request.headers.get("Last-Event-ID")
        index = self._match(incoming) if last_id is None else self._match_resumed(incoming, last_id)
        if index is not None:
            self.stats.served += 1
            return await self._serve(request, incoming, index, faults, start)
        info = classify_request(incoming.method, incoming.path, body)
        if info.rpc_method in ("SubscribeToTask", "tasks/resubscribe") and info.task_id:
            chunks = self._task_stream(info.task_id, info.binding, info.rpc_id)
            if chunks is not None:
                self.stats.served += 1
                return await self._subscription(request, chunks, faults, start)
        if self.mode is ReplayMode.RECORD_MISSING:
            return await self._forward(request, sent)
        return self._miss(incoming)

    def _matching(self, incoming: Incoming) -> list[int]:
        """Indexes of the recordings that match, in recorded order."""
        candidates = self._by_route.get((incoming.method, incoming.path), [])
        return [i for i in candidates if not mismatches(incoming, self.recorded[i], self.rules)]

    def _add(self, recorded: Recorded, used: int = 0) -> None:
        if recorded.protocol is None:  # recognised once, not on every comparison
            protocol = protocol_of(recorded)
            recorded.protocol = None if protocol is None else protocol.name
        self._by_route.setdefault((recorded.method, recorded.path), []).append(len(self.recorded))
        self.recorded.append(recorded)
        self.used.append(used)

    def _match(self, incoming: Incoming) -> int | None:
        matching = self._matching(incoming)
        unused = [i for i in matching if not self.used[i]]
        if unused:
            index = unused[0]  # identical requests are answered in recorded order
        elif matching and (self.allow_repeats or _is_card(self.recorded[matching[-1]])):
            index = matching[-1]  # a card is the same however often it is asked for
        else:
            return None
        self.used[index] += 1
        return index

    def _match_resumed(self, incoming: Incoming, last_id: str) -> int | None:
        """A reconnecting client repeats its request with Last-Event-ID: the recording of
        that very resumption (a client reconnecting as it did when recorded, an MCP GET
        after a closed POST stream) is served as it was; else it resumes the recorded
        stream that holds that event (served before, most likely), or else the one the
        request would get anyway."""
        matching = self._matching(incoming)
        again = [i for i in matching if not self.used[i] and _last_event_id(self.recorded[i]) == last_id]
        if again:
            self.used[again[0]] += 1
            return again[0]
        holding = [i for i in matching if self.recorded[i].is_sse and self._holds(i, last_id)]
        if holding:
            return holding[-1]
        return self._match(incoming)

    def _holds(self, index: int, event_id: str) -> bool:
        if any(e.id == event_id for e in self.events_of(index)):
            return True
        prefix = f"{ID_PREFIX}{index + 1}."
        return self.add_ids and event_id.startswith(prefix)

    def _miss(self, incoming: Incoming) -> web.Response:
        scored = []
        for i, r in enumerate(self.recorded):
            reasons = mismatches(incoming, r, self.rules)
            if not reasons:
                reasons = [f"already served {self.used[i]} time(s); identical requests replay in order"]
            weight = sum(3 if x.startswith("method") else 2 if x.startswith("path") else 1 for x in reasons)
            scored.append((weight, i, reasons))
        closest = [
            {
                "request": self.recorded[i].request_line,
                "recorded": self.recorded[i].origin,
                "differs": reasons,
            }
            for _, i, reasons in sorted(scored)[:3]
        ]
        self.stats.missed.append(Miss(incoming.request_line, closest))
        log.warning("tasktape replay: no recording matches %s", incoming.request_line)
        return _error(
            self.miss_status,
            f"no recorded exchange matches {incoming.request_line}",
            closest=closest,
            hint="record it (mode record-missing), or ignore fields that change between runs (--ignore)",
        )

    async def _forward(self, request: web.Request, body: bytes | None = None) -> web.StreamResponse:
        """To the upstream through the recorder, with the body as the client sent it
        (``body``, once this server has read it)."""
        assert self.proxy is not None
        self.stats.forwarded += 1
        return await self.proxy.handle(request, body)

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

    def events_of(self, index: int) -> list[StreamEvent]:
        if index not in self._events:
            self._events[index] = events_in(self.recorded[index].chunks)
        return self._events[index]

    async def _serve(
        self, request: web.Request, incoming: Incoming, index: int, faults: Faults, start: float
    ) -> web.StreamResponse:
        recorded = self.recorded[index]
        if faults.status:
            return _error(faults.status, f"fault injected: status {faults.status}")
        chunks, changed = self._prepared(recorded, index, incoming, request)
        # A recording that was cut short replays cut short, at the recorded moment.
        cut_ns = (recorded.duration_ns or 0) if recorded.cut_short else None
        end_ns = recorded.duration_ns
        last_id = request.headers.get("Last-Event-ID")
        if recorded.is_sse and last_id is not None and last_id != _last_event_id(recorded):
            resumed = self._resume(recorded, chunks, last_id)
            if isinstance(resumed, web.Response):
                # Nothing of it was served: the recording stays for the next request.
                self.used[index] -= 1
                self.stats.served -= 1
                self.stats.refused.append(f"{incoming.request_line} (Last-Event-ID {last_id!r})")
                return resumed
            (chunks, since_ns), changed = resumed, True
            cut_ns = None if cut_ns is None else max(0, cut_ns - since_ns)
            end_ns = None if end_ns is None else max(0, end_ns - since_ns)
        headers = end_to_end(_sendable(recorded))
        if changed or recorded.decoded_from or recorded.response_body_truncated:
            headers.popall("Content-Length", None)
        if recorded.decoded_from:
            headers.popall("Content-Encoding", None)  # the recording holds the decoded body
        return await self._send(
            request,
            recorded.status or 200,
            headers,
            recorded.ttfb_ns,
            chunks,
            recorded.is_sse,
            faults,
            start,
            cut_ns=cut_ns,
            end_ns=end_ns if recorded.is_sse else None,
            hold=recorded.outcome == CLIENT_LEFT and recorded.is_sse,
        )

    def _prepared(
        self, recorded: Recorded, index: int, incoming: Incoming, request: web.Request
    ) -> tuple[Chunks, bool]:
        """The recorded chunks as this request gets them: its JSON-RPC id, added SSE ids,
        a card pointing here. Second: whether any byte changed."""
        chunks = recorded.chunks
        edits = []
        theirs, mine = _rpc_id(recorded.request_body), _rpc_id(incoming.body)
        if theirs is not _NO_ID and mine is not _NO_ID and mine != theirs:
            events = self.events_of(index) if recorded.is_sse else None
            edits += jsonrpc_id_edits(chunks, events, theirs, mine)
        if self.add_ids and recorded.is_sse:
            edits += with_ids(self.events_of(index), f"{ID_PREFIX}{index + 1}.")
        if edits:
            chunks = apply_edits(chunks, edits)
        if _is_card(recorded) and chunks:
            public = URL.build(scheme=request.scheme, authority=request.host)
            card = point_card_at(b"".join(d for _, d in chunks), public)
            if card is not None:
                return [(chunks[-1][0], card)], True
        return chunks, bool(edits)

    def _resume(self, recorded: Recorded, chunks: Chunks, last_id: str) -> tuple[Chunks, int] | web.Response:
        """What follows the event ``last_id``, and that event's offset (the rest's new zero)."""
        events = events_in(chunks)
        for event in events:
            if event.id == last_id:
                return after(chunks, event.end, event.offset_ns), event.offset_ns
        known = [e.id for e in events if e.id is not None]
        if not known:
            hint = "this stream was recorded without event ids: replay with add_ids (--add-ids) to resume it"
        else:
            hint = f"its event ids run from {known[0]!r} to {known[-1]!r}"
        return _error(
            400,
            f"Last-Event-ID {last_id!r} names no event of the recorded stream "
            f"({recorded.request_line}, {recorded.origin}); {hint}",
        )

    def _task_stream(self, task_id: str, binding: str | None, rpc_id: Any) -> Chunks | None:
        """A task's recorded events as one stream (each event once), for a subscribe
        nothing recorded answers; None when the task was never streamed."""
        chunks: Chunks = []
        seen: set[str] = set()
        clock = 0
        for index, recorded in enumerate(self.recorded):
            if not recorded.is_sse:
                continue
            first: int | None = None
            for n, event in enumerate(self.events_of(index), 1):
                frame = classify(event.data)
                if not event.complete or frame.task_id != task_id:
                    continue
                event_id = event.id or (f"{ID_PREFIX}{index + 1}.{n}" if self.add_ids else None)
                if event_id is not None and event_id in seen:
                    continue
                if event_id is not None:
                    seen.add(event_id)
                first = event.offset_ns if first is None else first
                data = _as_binding(event.data, binding, rpc_id)
                head = f"id: {event_id}\n" if event_id is not None else ""
                chunks.append((clock + event.offset_ns - first, f"{head}data: {data}\n\n".encode()))
            if first is not None:
                clock = chunks[-1][0]
        return chunks or None

    async def _subscription(
        self, request: web.Request, chunks: Chunks, faults: Faults, start: float
    ) -> web.StreamResponse:
        if faults.status:
            return _error(faults.status, f"fault injected: status {faults.status}")
        if "Last-Event-ID" in request.headers:
            last_id = request.headers["Last-Event-ID"]
            events = events_in(chunks)
            found = next((e for e in events if e.id == last_id), None)
            if found is None:
                self.stats.refused.append(f"{request.method} {request.path} (Last-Event-ID {last_id!r})")
                return _error(400, f"Last-Event-ID {last_id!r} names no recorded event of this task")
            chunks = after(chunks, found.end, found.offset_ns)
        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        return await self._send(request, 200, headers, 0, chunks, True, faults, start)

    async def _send(
        self,
        request: web.Request,
        status: int,
        headers: Any,
        ttfb_ns: int,
        chunks: Chunks,
        is_sse: bool,
        faults: Faults,
        start: float,
        *,
        cut_ns: int | None = None,
        end_ns: int | None = None,
        hold: bool = False,
    ) -> web.StreamResponse:
        """Status and headers at the recorded time to first byte, each chunk at
        ``start + offset / speed`` (an absolute schedule: no drift builds up); with
        ``cut_ns``, the connection drops at that offset instead of ending cleanly; a stream
        ends at ``end_ns`` (a server that closes a stream some time after its last event
        tells its client something: an MCP client resumes then); with ``hold``, the stream
        stays open after its last chunk until the client leaves (as the recorded one was,
        when its client ended it)."""
        loop = asyncio.get_running_loop()
        speed = self.speed
        shift = faults.delay_headers_ms / 1000
        await _until(loop, start + (ttfb_ns / 1e9 / speed if speed else 0) + shift)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        cut = _fault_point(chunks, is_sse, faults)
        before, rest = split_at(chunks, cut) if cut is not None else (chunks, [])
        for offset, data in before:
            await _until(loop, start + (offset / 1e9 / speed if speed else 0) + shift)
            await response.write(data)
        if cut is not None and faults.drop_after is not None:
            request.protocol.force_close()  # abruptly, without the terminating chunk
            return response
        if cut is not None:
            shift += faults.stall_ms / 1000
            await asyncio.sleep(faults.stall_ms / 1000)
        for offset, data in rest:
            await _until(loop, start + (offset / 1e9 / speed if speed else 0) + shift)
            await response.write(data)
        if hold:
            await _until_gone(request)
            return response
        if cut_ns is not None:
            await _until(loop, start + (cut_ns / 1e9 / speed if speed else 0) + shift)
            request.protocol.force_close()
            return response
        if end_ns is not None:
            await _until(loop, start + (end_ns / 1e9 / speed if speed else 0) + shift)
        await response.write_eof()
        return response


def _fault_point(chunks: Chunks, is_sse: bool, faults: Faults) -> int | None:
    """The byte where a drop or stall happens: after event N (or chunk N of a body)."""
    n = faults.drop_after if faults.drop_after is not None else faults.stall_after
    if n is None:
        return None
    if is_sse:
        complete = [e for e in events_in(chunks) if e.complete]
        return complete[n - 1].end if 0 < n <= len(complete) else (0 if n == 0 else None)
    ends = []
    total = 0
    for _, data in chunks:
        total += len(data)
        ends.append(total)
    return ends[n - 1] if 0 < n <= len(ends) else (0 if n == 0 else None)


async def _until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    delay = when - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def _until_gone(request: web.Request) -> None:
    """Until the client has closed the connection (or the server stops)."""
    while (transport := request.transport) is not None and not transport.is_closing():
        await asyncio.sleep(0.05)


_NO_ID = object()


def _rpc_id(body: bytes | None) -> Any:
    """The id of a JSON-RPC request body, or _NO_ID."""
    try:
        obj = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _NO_ID
    if isinstance(obj, dict) and obj.get("jsonrpc") == "2.0" and "method" in obj and "id" in obj:
        return obj["id"]
    return _NO_ID


def _last_event_id(recorded: Recorded) -> str | None:
    """The Last-Event-ID the recorded request resumed from."""
    return next((v for k, v in recorded.request_headers if k.lower() == "last-event-id"), None)


def _is_card(recorded: Recorded) -> bool:
    if recorded.path.endswith(CARD_PATHS):
        return True
    info = classify_request(recorded.method, recorded.path, recorded.request_body)
    return info.rpc_method in CARD_METHODS


def _as_binding(data: str, binding: str | None, rpc_id: Any) -> str:
    """An event's data for the binding the subscriber speaks."""
    try:
        frame = json.loads(data)
    except ValueError:
        return data
    if isinstance(frame, dict) and "jsonrpc" in frame:
        frame = frame.get("result", frame)
    if binding == "jsonrpc":
        frame = {"jsonrpc": "2.0", "id": rpc_id, "result": frame}
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def _error(status: int, message: str, **details: Any) -> web.Response:
    body = {"error": {"code": status, "message": message, "source": "tasktape replay", **details}}
    return web.Response(
        status=status, text=json.dumps(body, ensure_ascii=False), content_type="application/json"
    )


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
