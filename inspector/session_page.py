"""The data of the MCP session page: one session's exchanges read back from the log, each
request with its progress and its result or error wherever they arrived (on its own POST
stream, in its JSON answer, or on a GET stream that resumed it), the requests the server
sent while it waited (and the client's answers to them), and the findings
``tasktape check`` saved about them.

A session is what ``Mcp-Session-Id`` names. Exchanges without one (the stateless
2026-07-28 revision) make one session per capture, named ``capture-<capture id>``, unless
a session id is that name: the page of that name is the session's then.
Times are milliseconds since the session's first request arrived.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any

from tasktape.eventlog import EventLog
from tasktape.eventlog.frames import Repeats
from tasktape.eventlog.jsonrpc_ids import id_key
from tasktape.eventlog.protocols import ProtocolName
from tasktape.eventlog.protocols.mcp import (
    FAILED,
    LOG,
    PROGRESS,
    TOOL_CALL,
    VERSION_HEADER,
    MCPFinish,
    MCPKind,
    Wait,
    answer_of,
    log_text,
    message_kind,
    reply_text,
    request_text,
)

from .display import Excerpt, excerpt, ms_or_none, one_moment, parse_json, row_number
from .findings import SavedFinding, saved_findings

_ANSWERS = frozenset({MCPKind.RESPONSE, MCPKind.ERROR})  # a client's POST that answers the server
STATELESS = "capture-"  # the session name of a capture's exchanges that carry no session id
SERVER_INFO = "io.modelcontextprotocol/serverInfo"  # where 2026-07-28 names the server
MCP = ProtocolName.MCP.value
# The page lists a big session's first LISTED_ROWS tool calls and exchanges and its last
# LISTED_TAIL (each a row would make megabytes); Datasette's exchanges table has the rest.
# Alike for both lists, so every call the exchanges table lists is listed among the calls.
LISTED_ROWS, LISTED_TAIL = 200, 20
_EXCHANGES = (
    "SELECT x.*, (SELECT count(*) FROM events e WHERE e.exchange_id = x.id) AS event_count"
    " FROM exchanges x WHERE x.protocol = :p AND {where} ORDER BY x.started_ns, x.id"
)
# The session of the MCP exchange ``x`` as load_session reads a name: its session id, else
# its capture's stateless session, unless a session id takes that name (that page is the
# session's, and these exchanges have none: NULL).
SESSION_OF_X = f"""CASE WHEN x.session_id IS NOT NULL THEN x.session_id
  WHEN NOT EXISTS (SELECT 1 FROM exchanges s WHERE s.session_id = '{STATELESS}' || x.capture_id
    AND s.protocol = '{MCP}') THEN '{STATELESS}' || x.capture_id END"""
# The exchanges of x's session other than x, before (<) or after (>) it in the page's order.
_OTHERS = f"""SELECT 1 FROM exchanges o WHERE o.protocol = '{MCP}'
  AND (o.session_id = x.session_id OR (x.session_id IS NULL AND o.session_id IS NULL
       AND o.capture_id = x.capture_id))
  AND (o.started_ns, o.id) {{}} (x.started_ns, x.id)"""
# Where the page of an exchange's session (``:id``) shows it: the session's name (NULL:
# none), and whether the page lists it, being among its first LISTED_ROWS or last
# LISTED_TAIL exchanges (the counts stop there: a big session is not counted through).
PLACE_ON_PAGE = f"""SELECT {SESSION_OF_X} AS session,
  (SELECT count(*) FROM ({_OTHERS.format("<")} ORDER BY o.id LIMIT {LISTED_ROWS})) < {LISTED_ROWS}
  OR (SELECT count(*) FROM ({_OTHERS.format(">")} ORDER BY o.id DESC LIMIT {LISTED_TAIL})) < {LISTED_TAIL}
  AS listed
FROM exchanges x WHERE x.id = :id AND x.protocol = '{MCP}'"""


@dataclass
class Progress:
    """One progress notification, where and when it arrived."""

    at_ms: float
    progress: float | None
    total: float | None
    message: str | None
    exchange_id: int
    seq: int | None

    @property
    def label(self) -> str:
        done = "?" if self.progress is None else f"{self.progress:g}"
        return done if self.total is None else f"{done}/{self.total:g}"


class StoryKind(StrEnum):
    """What a line of a request's story (its log messages and the server's requests, in
    the order they came) is."""

    LOG = "log"
    REQUEST = "server request"


class Tie(StrEnum):
    """How a server's request is known to be part of a client's request."""

    # On the request's own stream (the SDKs send it there when the server names the request
    # it serves), or naming the request's progress token in its params._meta.
    FOR = "for this call"
    # On another stream (the GET stream), while the request waited for its answer: MCP
    # gives no other sign of which request it serves.
    DURING = "during the call"


@dataclass
class LogLine:
    """A log message the server sent while it answered a request."""

    at_ms: float
    text: str | None  # its level, then its data
    exchange_id: int
    seq: int | None
    kind: StoryKind = StoryKind.LOG


@dataclass
class Reply:
    """The client's answer to a server's request: a POST of its own."""

    exchange_id: int
    at_ms: float  # when the POST was sent
    status: int | None
    text: str | None  # what it answered (a result, as JSON), or its error's code and message
    error: bool


@dataclass
class ServerRequest:
    """A request the server sent the client (sampling, elicitation, roots), where and when it
    arrived, and the client's answer."""

    at_ms: float
    method: str
    text: str  # its method, then what it asks
    rpc_id: Any
    exchange_id: int
    seq: int | None
    tie: Tie = Tie.DURING
    reply: Reply | None = None
    kind: StoryKind = StoryKind.REQUEST

    @property
    def tied(self) -> bool:
        return self.tie is Tie.FOR

    @property
    def reply_ms(self) -> float | None:
        """How long the client took to answer."""
        return None if self.reply is None else self.reply.at_ms - self.at_ms


@dataclass
class Answer:
    """The response to a request: its result (a tool's, which may say the tool failed) or
    its error."""

    at_ms: float
    finish: MCPFinish
    text: str | None  # a tool result's text, or the error's code and message
    result: Any  # the result (or error) object
    exchange_id: int
    seq: int | None  # None: the JSON body of a response that is not a stream

    @property
    def error(self) -> bool:
        """Whether the request failed: a JSON-RPC error, or a tool that failed."""
        return self.finish in FAILED

    @property
    def label(self) -> str:
        return {MCPFinish.TOOL_ERROR: "tool error"}.get(self.finish, self.finish.value)


@dataclass
class SessionExchange:
    """One HTTP exchange of the session, with what its request got."""

    id: int
    method: str
    path: str
    rpc_method: str | None
    rpc_id: Any  # the JSON-RPC request's id (None: a notification, the GET, the DELETE)
    status: int | None
    is_sse: bool
    outcome: str | None
    error: str | None
    start_ms: float
    ttfb_ms: float | None
    end_ms: float | None
    last_event_id: str | None  # the Last-Event-ID a GET resumed from
    protocol_version: str | None  # the request's MCP-Protocol-Version
    tool: str | None = None  # for a tools/call: the tool, and its arguments as JSON
    arguments: str | None = None
    events: int = 0
    progress: list[Progress] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    asked: list[ServerRequest] = field(default_factory=list)  # the server's requests while it waited
    answer: Answer | None = None
    replies_to: str | None = None  # for the client's answer to a server's request: its method
    resumed_on: list[int] = field(default_factory=list)  # the GETs that carried its messages
    carried: list[int] = field(default_factory=list)  # for a GET: the requests whose messages it carried

    @property
    def label(self) -> str:
        if self.replies_to is not None:
            return f"{self.rpc_method} to {self.replies_to}"
        return self.rpc_method if self.rpc_method and self.rpc_method != self.method else self.method

    @property
    def open(self) -> bool:
        """Whether the log holds no end of it yet: its recorder is still writing it (or
        was killed)."""
        return self.outcome is None

    @property
    def is_call(self) -> bool:
        return self.rpc_method == TOOL_CALL

    @property
    def story(self) -> list[LogLine | ServerRequest]:
        """Its log messages and the server's requests, in the order they came."""
        return sorted([*self.logs, *self.asked], key=lambda m: m.at_ms)

    def waits_at(self, at_ms: float) -> bool:
        """Whether it was waiting for its answer then: sent, and not yet answered (nor its
        exchange ended, when no answer came)."""
        return Wait(self.start_ms, self.answer.at_ms if self.answer is not None else self.end_ms).at(at_ms)

    @property
    def duration_ms(self) -> float | None:
        """Request to its answer, wherever that arrived; else to the end of the exchange."""
        if self.answer is not None:
            return self.answer.at_ms - self.start_ms
        return None if self.end_ms is None else self.end_ms - self.start_ms

    @property
    def detail(self) -> str | None:
        """What the exchange came to, in a few words."""
        answer = self.answer
        if answer is not None and answer.error:
            return f"{answer.label} {answer.text}" if answer.text else answer.label
        result = answer.result if answer is not None and isinstance(answer.result, dict) else {}
        if self.rpc_method in ("initialize", "server/discover"):
            versions = result.get("supportedVersions")
            version = _negotiated(result) or (
                ", ".join(map(str, versions)) if isinstance(versions, list) else None
            )
            said = [f"protocol {version}" if version else None, _server(result)]
            return " · ".join(s for s in said if s) or None
        if self.rpc_method == "tools/list" and isinstance(result.get("tools"), list):
            names = [
                t["name"] for t in result["tools"] if isinstance(t, dict) and isinstance(t.get("name"), str)
            ]
            return "tools: " + ", ".join(names)
        if self.method == "GET":
            what = "the server's stream" if self.last_event_id is None else "resumed"
            carried = ", ".join(f"#{i}" for i in self.carried)
            return f"{what}, carrying the messages of {carried}" if carried else what
        if self.method == "DELETE":
            return "ends the session"
        if self.rpc_method in _ANSWERS and self.status == 202:
            return "accepted"
        if self.rpc_id is None and self.rpc_method is not None and self.status == 202:
            return "notification, accepted"
        return answer.text if answer is not None else None


@dataclass
class SessionPage:
    session_id: str
    capture_id: int | None  # for a stateless session: the capture it groups
    exchanges: list[SessionExchange]
    findings: list[SavedFinding]

    @property
    def calls(self) -> list[SessionExchange]:
        return [x for x in self.exchanges if x.is_call]

    @property
    def others(self) -> list[SessionExchange]:
        return [x for x in self.exchanges if not x.is_call]

    @cached_property
    def listed_calls(self) -> Excerpt[SessionExchange]:
        """The tool calls the page lists: all of them, unless the session is big."""
        return excerpt(self.calls, LISTED_ROWS, LISTED_TAIL)

    @cached_property
    def listed_exchanges(self) -> Excerpt[SessionExchange]:
        """The exchanges the page's table lists: all of them, unless the session is big."""
        return excerpt(self.exchanges, LISTED_ROWS, LISTED_TAIL)

    @cached_property
    def listed_ids(self) -> frozenset[int]:
        """The exchanges listed on the page: a link to another goes to its row."""
        listed = self.listed_exchanges
        return frozenset(x.id for x in [*listed.head, *listed.tail])

    @property
    def tools(self) -> list[str]:
        """The tools called, each once, in the order first called."""
        return list(dict.fromkeys(x.tool for x in self.calls if x.tool))

    @property
    def by_id(self) -> dict[int, SessionExchange]:
        return {x.id: x for x in self.exchanges}

    @property
    def notifications(self) -> int:
        """Progress notifications, across the calls."""
        return sum(len(x.progress) for x in self.exchanges)

    @property
    def errors(self) -> int:
        return sum(1 for x in self.exchanges if x.answer is not None and x.answer.error)

    @property
    def duration_ms(self) -> float:
        ends = [x.end_ms for x in self.exchanges if x.end_ms is not None]
        ends += [x.answer.at_ms for x in self.exchanges if x.answer is not None]
        return max(ends, default=0.0)

    @property
    def protocol_version(self) -> str | None:
        """As initialize negotiated it, else as the requests named it."""
        answers = [x.answer.result for x in self.exchanges if x.answer is not None]
        negotiated = [v for v in map(_negotiated, answers) if v]
        named = [x.protocol_version for x in self.exchanges if x.protocol_version]
        return next(iter(negotiated + named), None)

    @property
    def server(self) -> str | None:
        answers = [x.answer.result for x in self.exchanges if x.answer is not None]
        return next((s for s in map(_server, answers) if s), None)


def _negotiated(result: Any) -> str | None:
    version = result.get("protocolVersion") if isinstance(result, dict) else None
    return version if isinstance(version, str) else None


def _server(result: Any) -> str | None:
    """The server's name and version, from initialize (or a 2026-07-28 answer's _meta)."""
    if not isinstance(result, dict):
        return None
    meta = result.get("_meta")
    info = result.get("serverInfo") or (meta.get(SERVER_INFO) if isinstance(meta, dict) else None)
    if not isinstance(info, dict) or not isinstance(info.get("name"), str):
        return None
    version = info.get("version")
    return f"server {info['name']}" + (f" {version}" if isinstance(version, str) and version else "")


def load_session(path: str | Path, session_id: str) -> SessionPage | None:
    """The session's page data, or None when the log has no MCP exchanges of that session:
    read as the log was at one moment, however a recorder writes it meanwhile."""
    with one_moment(path) as log:
        rows = list(log.db.query(_EXCHANGES.format(where="session_id = :s"), {"p": MCP, "s": session_id}))
        capture_id = _capture(session_id) if not rows else None
        if capture_id is not None:
            where = "session_id IS NULL AND capture_id = :c"
            rows = list(log.db.query(_EXCHANGES.format(where=where), {"p": MCP, "c": capture_id}))
        if not rows:
            return None
        origin = min(r["started_ns"] for r in rows)
        exchanges = [_exchange(r, origin) for r in rows]
        _read_messages(log, rows, exchanges, origin)
        return SessionPage(session_id, capture_id, exchanges, saved_findings(log, [x.id for x in exchanges]))


def _capture(session_id: str) -> int | None:
    """The capture a stateless session's name stands for."""
    number = session_id.removeprefix(STATELESS)
    return row_number(number) if session_id.startswith(STATELESS) else None


def _header(headers: Any, name: str) -> str | None:
    """A header's first value, from the log's JSON array of [name, value] pairs."""
    pairs = parse_json(headers)
    name = name.lower()
    for pair in pairs if isinstance(pairs, list) else ():
        if isinstance(pair, list) and len(pair) == 2 and str(pair[0]).lower() == name:
            return str(pair[1])
    return None


def _exchange(r: dict[str, Any], origin: int) -> SessionExchange:
    start = (r["started_ns"] - origin) / 1e6
    duration = ms_or_none(r["duration_ns"])
    body = parse_json(r["request_body"])
    body = body if isinstance(body, dict) else {}
    params = body.get("params") if isinstance(body.get("params"), dict) else {}
    call = r["rpc_method"] == TOOL_CALL
    arguments = params.get("arguments") if call else None
    return SessionExchange(
        id=r["id"],
        method=r["method"],
        path=r["path"],
        rpc_method=r["rpc_method"],
        rpc_id=body.get("id") if message_kind(body) is MCPKind.REQUEST else None,
        status=r["status"],
        is_sse=bool(r["is_sse"]),
        outcome=r["outcome"],
        error=r["error"],
        start_ms=start,
        ttfb_ms=ms_or_none(r["ttfb_ns"]),
        end_ms=None if duration is None else start + duration,
        last_event_id=_header(r["request_headers"], "Last-Event-ID"),
        protocol_version=_header(r["request_headers"], VERSION_HEADER),
        tool=params.get("name") if call and isinstance(params.get("name"), str) else None,
        arguments=None if arguments is None else json.dumps(arguments, ensure_ascii=False),
        events=r["event_count"],
    )


def _progress_token(message: Any) -> Any:
    """The progress token a message names in its params._meta, if any."""
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _messages(
    log: EventLog, rows: list[dict[str, Any]], origin: int
) -> list[tuple[float, int, int | None, Any]]:
    """Every message the server sent in the session, in arrival order, each once (a
    resumed stream may send an event again): (at, exchange id, seq, the message)."""
    found: list[tuple[float, int, int | None, Any]] = []
    repeats = Repeats()
    answered = log.reconnects_answered()
    for r in rows:
        start = (r["started_ns"] - origin) / 1e6
        if not r["is_sse"]:
            body = parse_json(r["response_body"])
            end = start + (ms_or_none(r["duration_ns"] or r["ttfb_ns"]) or 0.0)
            for message in body if isinstance(body, list) else [body]:
                found.append((end, r["id"], None, message))
            continue
        events = list(
            log.db.query(
                "SELECT seq, offset_ns, event_id, data, complete FROM events WHERE exchange_id = ?"
                " ORDER BY seq",
                [r["id"]],
            )
        )
        last_event_id = _header(r["request_headers"], "Last-Event-ID")
        again = repeats.of([e["event_id"] for e in events], last_event_id, answered=r["id"] in answered)
        found.extend(
            (start + e["offset_ns"] / 1e6, r["id"], e["seq"], parse_json(e["data"]))
            for e in events
            if e["complete"] and e["event_id"] not in again
        )
    found.sort(key=lambda m: m[:2])
    return found


def _read_messages(
    log: EventLog, rows: list[dict[str, Any]], exchanges: list[SessionExchange], origin: int
) -> None:
    """Give each request its answer, its progress and the server's requests it waited on,
    and note the GETs that carried them."""
    by_id = {x.id: x for x in exchanges}
    requests: dict[tuple[str, Any], list[SessionExchange]] = {}
    tokens: dict[tuple[str, Any], list[SessionExchange]] = {}
    for r, x in zip(rows, exchanges, strict=True):
        if x.rpc_id is not None and (key := id_key(x.rpc_id)) is not None:
            requests.setdefault(key, []).append(x)
        token = _progress_token(parse_json(r["request_body"]))
        if token is not None and (key := id_key(token)) is not None:
            tokens.setdefault(key, []).append(x)
    asks: list[tuple[ServerRequest, SessionExchange | None]] = []  # each with the request it names
    for at, exchange_id, seq, message in _messages(log, rows, origin):
        carrier = by_id[exchange_id]
        kind = message_kind(message)
        target: SessionExchange | None = None
        if kind is MCPKind.REQUEST:
            method, params = message["method"], message.get("params")
            asked = ServerRequest(at, method, request_text(method, params), message["id"], exchange_id, seq)
            asks.append((asked, _asked(_with_id(tokens, _progress_token(message)), carrier, at)))
        elif kind in (MCPKind.RESPONSE, MCPKind.ERROR):
            target = _asked(_with_id(requests, message.get("id")), carrier, at)
            if target is not None:  # (answered twice, which check flags: the last, as stream_summary)
                target.answer = Answer(at, *answer_of(message), exchange_id, seq)
        elif kind is MCPKind.NOTIFICATION and message.get("method") == LOG:
            # No id says which request a log message is about: the one whose stream carried it.
            carrier.logs.append(LogLine(at, log_text(message.get("params")), exchange_id, seq))
        elif kind is MCPKind.NOTIFICATION and message.get("method") == PROGRESS:
            params = message.get("params") if isinstance(message.get("params"), dict) else {}
            target = _asked(_with_id(tokens, params.get("progressToken")), carrier, at)
            if target is not None:
                target.progress.append(
                    Progress(
                        at,
                        _number(params.get("progress")),
                        _number(params.get("total")),
                        params.get("message") if isinstance(params.get("message"), str) else None,
                        exchange_id,
                        seq,
                    )
                )
        if target is not None and target is not carrier:
            if carrier.id not in target.resumed_on:
                target.resumed_on.append(carrier.id)
            if target.id not in carrier.carried:
                carrier.carried.append(target.id)
    _tie(asks, by_id, exchanges)
    _link_replies(rows, exchanges, [asked for asked, _ in asks])


def _stream_of(carrier: SessionExchange, by_id: dict[int, SessionExchange]) -> SessionExchange | None:
    """The client's request whose stream carried a message: its POST's, or a GET resuming it."""
    if carrier.rpc_id is not None:
        return carrier
    resumed = carrier.last_event_id is not None and len(carrier.carried) == 1
    return by_id[carrier.carried[0]] if resumed else None


def _tie(
    asks: list[tuple[ServerRequest, SessionExchange | None]],
    by_id: dict[int, SessionExchange],
    exchanges: list[SessionExchange],
) -> None:
    """Put each server's request in the story of the request it is for, when a progress
    token or the stream it came on says which; else in that of each tool call waiting
    when it came."""
    unclaimed: list[ServerRequest] = []
    for asked, named in asks:
        owner = named or _stream_of(by_id[asked.exchange_id], by_id)
        if owner is None:
            unclaimed.append(asked)
            continue
        asked.tie = Tie.FOR
        owner.asked.append(asked)
    calls = iter(x for x in exchanges if x.is_call)  # in the order sent, as the requests came
    waiting: list[SessionExchange] = []
    upcoming = next(calls, None)
    for asked in unclaimed:
        while upcoming is not None and upcoming.start_ms <= asked.at_ms:
            waiting.append(upcoming)
            upcoming = next(calls, None)
        waiting = [x for x in waiting if x.waits_at(asked.at_ms)]  # once answered, for good
        for x in waiting:
            x.asked.append(asked)


def _link_replies(
    rows: list[dict[str, Any]], exchanges: list[SessionExchange], asks: list[ServerRequest]
) -> None:
    """Link each client's answer and the server's request it answers: of those with its id
    not yet answered, the latest sent before it (a server may use an id again once it is
    answered)."""
    by_key: dict[tuple[str, Any] | None, list[ServerRequest]] = {}
    for asked in asks:
        by_key.setdefault(id_key(asked.rpc_id), []).append(asked)
    for r, x in zip(rows, exchanges, strict=True):
        body = parse_json(r["request_body"])
        if message_kind(body) not in _ANSWERS or (key := id_key(body.get("id"))) is None:
            continue
        waiting = [a for a in by_key.get(key, []) if a.reply is None]
        asked = next((a for a in reversed(waiting) if a.at_ms <= x.start_ms), next(iter(waiting), None))
        if asked is not None:
            x.replies_to = asked.method
            asked.reply = _reply(body, x, asked.method)


def _reply(body: dict[str, Any], x: SessionExchange, method: str) -> Reply:
    """The client's answer to a server's ``method`` request: read as the request asks (a
    sampled message's text), else its result as JSON."""
    finish, text, result = answer_of(body)
    if finish is not MCPFinish.ERROR:
        text = reply_text(method, result) or text or json.dumps(result, ensure_ascii=False)
    return Reply(x.id, x.start_ms, x.status, text, finish in FAILED)


def _with_id(exchanges: dict[tuple[str, Any], list[SessionExchange]], rpc_id: Any) -> list[SessionExchange]:
    """The exchanges under an id (or progress token); none for what is no id."""
    key = id_key(rpc_id)
    return [] if key is None else exchanges.get(key, [])


def _asked(candidates: list[SessionExchange], carrier: SessionExchange, at: float) -> SessionExchange | None:
    """Which of the requests with a message's id (or progress token) it is about: the one
    whose response carried it, else the latest one sent before it (clients that share a
    capture without a session may number their requests alike)."""
    if any(x is carrier for x in candidates):
        return carrier
    return next((x for x in reversed(candidates) if x.start_ms <= at), None)


def _number(value: Any) -> float | None:
    """A number a message gives, or None for what is none (JSON's ``1e999`` and ``NaN``
    read as infinity and NaN: no progress a page can show or JSON can hold)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None
