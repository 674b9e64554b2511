"""MCP over Streamable HTTP: JSON-RPC 2.0 messages, POSTed by the client and answered
with JSON or an SSE stream; a GET stream for what the server sends unasked; SSE event
ids and ``Last-Event-ID`` for resumption (revisions 2025-06-18 and 2025-11-25, with
``Mcp-Session-Id``, and the stateless 2026-07-28).

An exchange is MCP when its request carries ``MCP-Protocol-Version`` or
``Mcp-Session-Id``, or posts a JSON-RPC message whose method is MCP's. Event kinds:
``request`` (the server asks the client), ``response``, ``notification``, ``log`` (a log
message, ``notifications/message``), ``error`` (an error response), ``priming`` (an event
without data, sent so that a client has an id to resume from) and ``other``. A response
finishes its request as a ``result``, a ``tool_error`` (a result with ``isError`` true: the
tool failed) or an ``error`` (a JSON-RPC error).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from ..a2a_terms import is_jsonrpc
from ..classify import Classification, json_or_none
from ..frames import Frame, Problem, Repeats, Stream, readable
from ..jsonrpc_ids import NO_ID, Edit, batch_id_edits, batch_ids, id_key, is_batch, same_id, value_edits
from ..spans import Chunks, StreamEvent
from .base import (
    Protocol,
    Regenerated,
    Request,
    RequestInfo,
    Resubscription,
    StreamReader,
    among,
    classified,
    json_text,
    last_state,
    parsed,
    quoted,
)

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"

# The methods a client sends (requests and notifications), across the revisions.
CLIENT_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "completion/complete",
        "logging/setLevel",
        "server/discover",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
        "notifications/roots/list_changed",
    }
)
TOOL_CALL = "tools/call"
PROGRESS = "notifications/progress"
LOG = "notifications/message"
SERVER_ERROR = -32000  # JSON-RPC's first code for errors a server defines
_SPACED = (", ", ": ")  # how a value in a line of text is written


class MCPKind(StrEnum):
    REQUEST = "request"  # a request of the server's: its method, and what it asks, are its text
    RESPONSE = "response"
    NOTIFICATION = "notification"
    LOG = "log"  # a log message (notifications/message): its level and data are its text
    ERROR = "error"
    PRIMING = "priming"
    OTHER = "other"


class MCPFinish(StrEnum):
    """How a response answers its request (its event's state, the exchange's finish)."""

    RESULT = "result"
    TOOL_ERROR = "tool_error"  # a result with isError true: how MCP says a tool failed
    ERROR = "error"  # a JSON-RPC error: the request itself failed


FAILED = frozenset({MCPFinish.TOOL_ERROR, MCPFinish.ERROR})
ANSWERS = frozenset({MCPKind.RESPONSE, MCPKind.ERROR})  # the kinds of event that answer a request


def message_kind(obj: Any) -> MCPKind:
    """The kind of one JSON-RPC message."""
    if not isinstance(obj, dict) or obj.get("jsonrpc") != "2.0":
        return MCPKind.OTHER
    if isinstance(obj.get("method"), str):
        return MCPKind.REQUEST if "id" in obj else MCPKind.NOTIFICATION
    if "id" in obj and "error" in obj:
        return MCPKind.ERROR
    if "id" in obj and "result" in obj:
        return MCPKind.RESPONSE
    return MCPKind.OTHER


def result_text(result: Any) -> str | None:
    """The text a result carries: a tool result's text content, joined."""
    if not isinstance(result, dict):
        return None
    content = result.get("content")
    if not isinstance(content, list):
        return None
    texts = [t for c in content if isinstance(c, dict) and isinstance(t := c.get("text"), str)]
    return "".join(texts) if texts else None


def error_text(error: Any) -> str | None:
    if not isinstance(error, dict):
        return None
    code, message = error.get("code"), error.get("message")
    if code is None or not isinstance(message, str):
        return None
    # A code that is an object or a list as JSON (left out when nested too deep to write).
    said = json_text(code, _SPACED) if isinstance(code, list | dict) else code
    return message if said is None else f"{said}: {message}"


def answer_of(message: dict[str, Any]) -> tuple[MCPFinish, str | None, Any]:
    """How a response (or error response) answers its request, its text, and its result
    (or error) object."""
    if "error" in message:
        return MCPFinish.ERROR, error_text(message["error"]), message["error"]
    result = message["result"]
    failed = isinstance(result, dict) and result.get("isError") is True
    return (MCPFinish.TOOL_ERROR if failed else MCPFinish.RESULT), result_text(result), result


def request_text(method: str, params: Any) -> str:
    """A server's request as one line: its method, then what it asks of the user (an
    elicitation's message) or of the model (a sampling request's last message)."""
    asked = None
    if isinstance(params, dict):
        asked = params.get("message")
        messages = params.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
            content = messages[-1].get("content")
            parts = content if isinstance(content, list) else [content]
            texts = [t for c in parts if isinstance(c, dict) and isinstance(t := c.get("text"), str)]
            asked = "".join(texts) or asked
    return f"{method}: {asked}" if isinstance(asked, str) and asked else method


def reply_text(method: str, result: Any) -> str | None:
    """The client's answer to a server's request as one line: a sampling request's message
    (its text, the model, why it stopped), an elicitation's action and what the user gave,
    the roots listed; None for another."""
    if not isinstance(result, dict):
        return None
    if method == "sampling/createMessage":
        content = result.get("content")
        parts = content if isinstance(content, list) else [content]
        text = "".join(t for c in parts if isinstance(c, dict) and isinstance(t := c.get("text"), str))
        about = [v for k in ("model", "stopReason") if isinstance(v := result.get(k), str)]
        return f"{text} ({', '.join(about)})" if about else text or None
    if method == "elicitation/create" and isinstance(action := result.get("action"), str):
        given = result.get("content")
        shown = None if given is None else json_text(given, _SPACED)
        return action if shown is None else f"{action}: {shown}"
    if method == "roots/list" and isinstance(roots := result.get("roots"), list):
        uris = [u for r in roots if isinstance(r, dict) and isinstance(u := r.get("uri"), str)]
        return f"roots: {', '.join(uris)}" if uris else "no roots"
    return None


def log_text(params: Any) -> str | None:
    """A log message as one line: its level (and logger), then its data (any JSON: a
    string as it is, else as JSON)."""
    if not isinstance(params, dict) or "data" not in params:
        return None
    data = params["data"]
    line = data if isinstance(data, str) else json_text(data, _SPACED)
    if line is None:
        return None
    level, logger = params.get("level"), params.get("logger")
    said = level if isinstance(level, str) else ""
    if isinstance(logger, str) and logger:
        said = f"{said} [{logger}]".lstrip()
    return f"{said}: {line}" if said else line


# What a server sends unasked on the session's GET stream, as part of the call it serves
# (mcp 1.x sends a tool's sampling request, elicitation or log message there when the tool
# does not name its request): its requests and notifications.
SENT_FOR_A_CALL = frozenset({MCPKind.REQUEST, MCPKind.NOTIFICATION})


@dataclass(frozen=True)
class Wait:
    """A client's request from when it was sent until its answer came (or, with no
    answer, its exchange ended; None: it never did), on one clock."""

    start: float
    until: float | None

    def at(self, moment: float) -> bool:
        """Whether it was waiting for its answer at ``moment``: sent, not yet answered."""
        return self.start <= moment and (self.until is None or moment <= self.until)


def is_call(body: Any) -> bool:
    """Whether a request body is a tool call (``tools/call``)."""
    return message_kind(body) is MCPKind.REQUEST and body["method"] == TOOL_CALL


def is_standing(request: Request) -> bool:
    """Whether a request opens the session's GET stream afresh (without Last-Event-ID: it
    resumes no stream)."""
    return request.method == "GET" and not request.header("Last-Event-ID")


def sent_for_a_call(data: str) -> str | None:
    """The method of an event of the GET stream that a server sends as part of a call
    under way (a request of its own, a notification); None for any other (a priming event)."""
    message = parsed(data, MCPKind.OTHER) if data else None
    if not isinstance(message, dict) or message_kind(message) not in SENT_FOR_A_CALL:
        return None
    return message["method"]


def during(calls: Sequence[Wait], moment: float) -> list[int]:
    """The calls a message the GET stream carried at ``moment`` is part of: each waiting
    for its answer then. MCP gives no other sign of which one it serves (a message on a
    call's own stream, or naming its progress token, is that call's)."""
    return [n for n, call in enumerate(calls) if call.at(moment)]


class MCP(Protocol):
    name = "mcp"
    kinds = MCPKind
    # Clients number requests afresh, and the SDKs use the id as the progress token.
    regenerated: ClassVar[Regenerated] = Regenerated(pointers=(("params", "_meta", "progressToken"),))
    delta_separator: ClassVar[str] = "\n"  # each event a message: progress, a log line, a request
    resumes_streams: ClassVar[bool] = True  # a server may end a stream for its client to poll
    # A 404 tells a client its session has ended: the SDK says "Session terminated" and
    # drops the miss's reason.
    miss_status: ClassVar[int | None] = 400
    read_operations: ClassVar[frozenset[str]] = frozenset(
        {"ping", "tools/list", "prompts/list", "prompts/get"}
        | {"resources/list", "resources/read", "resources/templates/list"}
    )

    def claims(self, request: Request) -> bool:
        if request.header(VERSION_HEADER) is not None or request.header(SESSION_HEADER) is not None:
            return True
        body = request.json()
        return any(
            isinstance(m, dict) and m.get("jsonrpc") == "2.0" and among(m.get("method"), CLIENT_METHODS)
            for m in _sent(body)
        )

    def request_info(self, request: Request) -> RequestInfo:
        """A batch's operation is its messages' (``tools/call, ping``); it has no one id."""
        body = request.json()
        if is_batch(body):
            names = ", ".join(n for m in body if (n := _operation(m)) is not None)
            return RequestInfo(None, names or None, None, None, None, request.header(SESSION_HEADER))
        method = rpc_id = None
        if isinstance(body, dict):
            method = body.get("method") if isinstance(body.get("method"), str) else None
            rpc_id = body.get("id")
        if method is None and request.method != "POST":
            method = request.method  # the GET stream, the DELETE that ends a session
        elif method is None and message_kind(body) in (MCPKind.RESPONSE, MCPKind.ERROR):
            method = message_kind(body).value  # the client's answer to a request of the server's
        return RequestInfo(None, method, None, None, rpc_id, request.header(SESSION_HEADER))

    def path_names_operation(self, binding: str | None) -> bool:
        return False  # JSON-RPC, on one endpoint

    def session(self, response_headers: Sequence[tuple[str, str]]) -> str | None:
        name = SESSION_HEADER.lower()
        return next((v for k, v in response_headers if k.lower() == name), None)

    def reader(self) -> MCPReader:
        return MCPReader()

    def state_note(self, stream: Stream) -> str | None:
        """``answered: result`` (or ``tool_error``, ``error``) once the response came, else
        the last progress reported (``last progress 1 of 3``)."""
        finish = last_state(stream)
        if finish is not None:
            return f"answered: {finish}"
        progress = [m for f, m in _messages(stream) if _is_progress(m)]
        return _progress_note(progress[-1].get("params")) if progress else None

    def ended(self, stream: Stream) -> bool:
        """A stream that carried the response owes nothing after it: a POST stream's
        request is answered, and mcp 1.x closes a GET resuming one once the answer came. A
        batch's stream owes the answer to each of its requests."""
        asked = batch_ids(stream.request_body)
        if asked is None:
            return any(f.complete and f.c.kind in ANSWERS for f in stream.frames)
        answered = {id_key(m["id"]) for _, m in _messages(stream) if message_kind(m) in ANSWERS}
        return all(id_key(i) in answered for i in asked if i is not NO_ID)

    def ends_with_close(self, request: Request) -> bool:
        """A POST's stream ends with the answer to its request; the GET stream has no end."""
        return request.method == "POST"

    def closes(self, data: str, event_type: str | None) -> bool:
        """The answer to the request (its result or error): a POST stream ends with it."""
        return message_kind(parsed(data, MCPKind.OTHER)) in (MCPKind.RESPONSE, MCPKind.ERROR)

    def error_answer(self, request: Request, message: str, details: Mapping[str, Any]) -> Any:
        """A JSON-RPC error answering the request by its id: the SDKs show its message (of
        an HTTP error status alone, they say only that the server failed). A batch's: an
        array of them, one for each of its requests."""
        body = request.json()
        error = {"code": SERVER_ERROR, "message": message, "data": dict(details)}
        answers = [
            {"jsonrpc": "2.0", "id": m["id"], "error": error}
            for m in _sent(body)
            if message_kind(m) is MCPKind.REQUEST
        ]
        if not answers:
            return None
        return answers if is_batch(body) else answers[0]

    def answer_edits(
        self, recorded: Request, incoming: Request, chunks: Chunks, events: Sequence[StreamEvent] | None
    ) -> tuple[list[Edit], list[str]]:
        """The progress notifications carry the client's progress token: replay matching
        ignores it, and a client drops progress of a token it did not give. A client that
        gave none asked for no progress: its answer has none. A batch's answers carry the
        ids of its requests (a single request's, the replay gives it), and the progress of
        each request its token."""
        old, new = recorded.json(), incoming.json()
        edits, said = _batch_id_edits(old, new, chunks, events)
        for old_message, new_message in _paired(old, new):
            more, told = _progress_edits(old_message, new_message, chunks, events)
            edits, said = edits + more, said + told
        return edits, said

    def resumable(self, resuming: Request, recorded: Request) -> bool:
        """A client resumes a POST stream that broke with a GET of the endpoint carrying
        the id of the last event it got, in its session."""
        return (
            resuming.method == "GET"
            and recorded.method == "POST"
            and resuming.path == recorded.path
            and resuming.header(SESSION_HEADER) == recorded.header(SESSION_HEADER)
        )

    def resubscription(
        self, request: Request, sent: Sequence[str], last_id: str | None
    ) -> Resubscription | None:
        """A ``GET`` of the endpoint with ``Last-Event-ID``, as a client resumes: a server
        that keeps its events (an event store) replays the stream after that event, then
        goes on with it. Only for a stream whose last event sent had an id (from an earlier
        one, the server would send again what came after it) and whose answer had not come
        yet; the session and protocol version headers go as the client sent them."""
        if last_id is None or (sent and self.closes(sent[-1], None)):
            return None
        headers = (("Accept", "text/event-stream"), ("Last-Event-ID", last_id))
        return Resubscription("GET", request.path, None, headers)


class MCPReader(StreamReader):
    """The finish is the last answer's (``result``, ``tool_error`` or ``error``); the
    answer its text."""

    def event(self, data: str, event_type: str | None) -> Classification:
        if not data:
            return classified(MCPKind.PRIMING)
        return self._message(data)

    def body(self, data: bytes | str) -> Classification | None:
        return self._message(data) if data else None

    def _message(self, data: bytes | str) -> Classification:
        obj = parsed(data, MCPKind.OTHER)
        if not isinstance(obj, Classification):
            return self._one(obj)
        batch = json_or_none(data)  # (read again only when it is no JSON object)
        return self._batch(batch) if isinstance(batch, list) else obj

    def _batch(self, messages: list[Any]) -> Classification:
        """A batch (answers to one, or the server's messages) read message by message: it
        takes the kind, state and text of its last answer (else of its last message); a
        message that is none makes it one broken frame."""
        if not messages:
            return Classification(MCPKind.OTHER, parse_error="an empty batch")
        read = [self._one(m) for m in messages]
        for n, c in enumerate(read):
            if c.parse_error:
                return c._replace(parse_error=f"{c.parse_error} (at /{n} of the batch)")
        return next((c for c in reversed(read) if c.kind in ANSWERS), read[-1])

    def _one(self, obj: Any) -> Classification:
        kind = message_kind(obj)
        if kind is MCPKind.OTHER:
            return Classification(kind, parse_error="not a JSON-RPC 2.0 message")
        if kind in (MCPKind.RESPONSE, MCPKind.ERROR):
            state, text, _ = answer_of(obj)
            self.summary.finish, self.summary.answer = state, text
            return classified(kind, text, state)
        if kind is MCPKind.REQUEST:  # a request of the server's
            return classified(kind, request_text(obj["method"], obj.get("params")))
        params = obj.get("params")
        if obj["method"] == LOG:
            return classified(MCPKind.LOG, log_text(params))
        message = params.get("message") if isinstance(params, dict) else None
        return classified(kind, message if isinstance(message, str) else None)  # progress says one


# -- lifecycle rules ----------------------------------------------------------------------


def _messages(stream: Stream) -> Iterator[tuple[Frame, dict[str, Any]]]:
    for frame, message, _ in _numbered(stream):
        yield frame, message


def _numbered(stream: Stream) -> Iterator[tuple[Frame, dict[str, Any], int | None]]:
    """The JSON-RPC messages of a stream's complete frames: each with its place in its
    batch (None: a frame of one message)."""
    for frame in stream.frames:
        if not frame.complete:
            continue
        if isinstance(frame.envelope, dict):
            yield frame, frame.envelope, None
        elif frame.data.lstrip().startswith("["):
            batch = json_or_none(frame.data)
            for n, message in enumerate(batch if isinstance(batch, list) else ()):
                if isinstance(message, dict) and is_jsonrpc(message):
                    yield frame, message, n


def _sent(body: Any) -> list[Any]:
    """The messages a request body sends: each of a batch's, or the body itself."""
    return body if is_batch(body) else [body]


def _operation(message: Any) -> str | None:
    """What a message of a batch does, as a single message's ``rpc_method`` says: its
    method; ``response`` or ``error`` for the client's answer to a request of the server's."""
    kind = message_kind(message)
    if kind in (MCPKind.REQUEST, MCPKind.NOTIFICATION):
        return message["method"]
    return kind.value if kind in ANSWERS else None


def _sessions(streams: Sequence[Stream]) -> list[list[Stream]]:
    """The streams of each session (a stateless exchange is a session of its own)."""
    sessions: dict[object, list[Stream]] = {}
    for stream in streams:
        key = stream.request.session_id or ("exchange", stream.index)
        sessions.setdefault(key, []).append(stream)
    return list(sessions.values())


def _bad_ids(stream: Stream, frame: Frame | None, message: Any) -> Iterator[Problem]:
    """A message whose id is no string, number or null: it is no one's answer."""
    if isinstance(message, dict) and "id" in message and id_key(message["id"]) is None:
        shown = json_text(message["id"], _SPACED) or quoted(message["id"])
        yield Problem(stream, frame, f"id {shown} is no string, number or null")


@dataclass
class _Request:
    """A client's request in a session, and where its first response came."""

    stream: Stream
    key: tuple[str, Any]
    message: dict[str, Any]  # the request (its exchange's body, or one of its batch's messages)
    answer: str | None = None  # the label of the frame that answered it


@dataclass(frozen=True)
class _Response:
    """A response in a session, to be matched with the request it answers."""

    stream: Stream
    frame: Frame
    key: tuple[str, Any]


def one_response(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Each request gets one response in its session: on its POST stream, or the GET that resumed it."""
    for session in _sessions(streams):
        steps: list[_Request | _Response] = []
        repeats = Repeats()
        for stream in session:
            yield from _read_exchange(stream, _sent_again(repeats, stream), steps)
        yield from _answered_twice(_in_time_order(steps))
        for step in steps:
            if not isinstance(step, _Request) or step.answer is not None:
                continue
            stream, body = step.stream, step.message
            if stream.status is not None and stream.status < 400 and not _cut_short(stream, session):
                yield Problem(stream, None, f"request {body['id']!r} ({body['method']}) got no response")


def _read_exchange(stream: Stream, again: set[str], steps: list[_Request | _Response]) -> Iterator[Problem]:
    """An exchange's ids that are no one's, and (into ``steps``) the requests it sends (a
    batch's each) and the responses it carries, but for those sent again."""
    for body in _sent(stream.request_body):
        # A server's request, and a client's answer to one, need an id the other can match.
        if message_kind(body) in (MCPKind.RESPONSE, MCPKind.ERROR):
            yield from _bad_ids(stream, None, body)
        elif message_kind(body) is MCPKind.REQUEST:
            if (key := id_key(body["id"])) is not None:
                steps.append(_Request(stream, key, body))
            elif stream.status is not None and stream.status < 400:
                yield from _bad_ids(stream, None, body)
    for frame, message in _messages(stream):
        kind = message_kind(message)
        if kind is MCPKind.REQUEST:
            yield from _bad_ids(stream, frame, message)
        if kind not in (MCPKind.RESPONSE, MCPKind.ERROR) or frame.sse_id in again:
            continue
        if (key := id_key(message.get("id"))) is None:
            yield from _bad_ids(stream, frame, message)
        else:
            steps.append(_Response(stream, frame, key))


def _in_time_order(steps: list[_Request | _Response]) -> list[_Request | _Response]:
    """A session's requests and responses as they were sent, when the log says when (a
    standing GET opened before a request may answer it); else in the order of the
    exchanges."""
    times = [s.stream.started_ns if isinstance(s, _Request) else s.frame.at_ns for s in steps]
    if any(t is None for t in times):
        return steps
    return [step for _, step in sorted(zip(times, steps, strict=True), key=lambda ts: ts[0])]


def _answered_twice(steps: list[_Request | _Response]) -> Iterator[Problem]:
    """Each response answers the request with its id still waiting for one (that of its own
    POST stream, else the latest sent): a client may use an id again once its request is
    answered. A response no waiting request accounts for is a second one."""
    waiting: dict[tuple[str, Any], list[_Request]] = {}
    latest: dict[tuple[str, Any], _Request] = {}
    for step in steps:
        if isinstance(step, _Request):
            waiting.setdefault(step.key, []).append(step)
            latest[step.key] = step
            continue
        candidates = waiting.get(step.key, [])
        if (request := _answered(step, candidates)) is not None:
            request.answer = step.stream.label(step.frame)
            candidates.remove(request)
        elif (first := latest.get(step.key)) is not None:
            rid = first.message["id"]
            yield Problem(
                step.stream, step.frame, f"a second response to request {rid!r} (the first: {first.answer})"
            )


def _answered(response: _Response, waiting: list[_Request]) -> _Request | None:
    """The request a response answers, among those waiting with its id."""
    own = next((r for r in waiting if r.stream is response.stream), None)
    return own or (waiting[-1] if waiting else None)


def _sent_again(repeats: Repeats, stream: Stream) -> set[str]:
    """The ids of the events a stream sends again (a resumed GET repeats those after its
    Last-Event-ID): they are left out, the events they repeat having been read."""
    return repeats.of([f.sse_id for f in stream.frames], stream.last_event_id)


def _cut_short(stream: Stream, session: list[Stream]) -> bool:
    """Whether a request's answer may simply not have come: its stream, or a GET resuming
    it (from one of its event ids), broke off."""
    ids = {f.sse_id for f in stream.frames if f.sse_id is not None}
    return not stream.complete or any(
        not other.complete
        for other in session
        if other.last_event_id is not None and other.last_event_id in ids
    )


def _progress_token(body: Any) -> Any:
    """The progress token a request carries (``params._meta.progressToken``), if any."""
    params = body.get("params") if isinstance(body, dict) and "method" in body else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get("progressToken") if isinstance(meta, dict) else None


def _is_progress(message: Any) -> bool:
    return isinstance(message, dict) and message.get("method") == PROGRESS


def _progress_note(params: Any) -> str | None:
    """``last progress 2 of 3`` (or ``last progress 2``, without a total) of a progress
    notification's params; None when its progress is no number."""
    done = params.get("progress") if isinstance(params, dict) else None
    if not _is_number(done):
        return None
    total = params.get("total")
    of = f" of {_number(total)}" if _is_number(total) else ""
    return f"last progress {_number(done)}{of}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: float) -> str:
    """A number as a note says it: 2, not 2.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _batch_id_edits(
    old: Any, new: Any, chunks: Chunks, events: Sequence[StreamEvent] | None
) -> tuple[list[Edit], list[str]]:
    """Edits making the answers to the requests of the recorded batch ``old`` carry the ids
    of the requests in their places in ``new``, and what they change."""
    old_ids, new_ids = batch_ids(old), batch_ids(new)
    if old_ids is None or new_ids is None:
        return [], []
    edits = batch_id_edits(chunks, events, old_ids, new_ids)
    written = {inserted for _, _, inserted in edits}
    said = [
        f"the JSON-RPC id {json.dumps(a)} is {json.dumps(b)}"
        for a, b in zip(old_ids, new_ids, strict=False)
        if a is not NO_ID and b is not NO_ID and not same_id(a, b) and json.dumps(b).encode() in written
    ]
    return edits, said


def _paired(old: Any, new: Any) -> list[tuple[Any, Any]]:
    """The recorded request's messages, each with the one in its place in the new request."""
    if is_batch(old) and is_batch(new):
        return list(zip(old, new, strict=False))
    return [(old, new)]


def _progress_edits(
    old_message: Any, new_message: Any, chunks: Chunks, events: Sequence[StreamEvent] | None
) -> tuple[list[Edit], list[str]]:
    """Edits making the progress of the recorded request ``old_message`` that of
    ``new_message`` (its token, or none), and what they change."""
    old, new = _progress_token(old_message), _progress_token(new_message)
    if events is None or old is None or (new is not None and same_id(old, new)):
        return [], []
    if new is None:
        return _without_progress(events, old)
    edits = value_edits(chunks, events, ("params", "progressToken"), old, new, _is_progress)
    return edits, [f"the progress token {json.dumps(old)} is {json.dumps(new)}"] if edits else []


def _without_progress(events: Sequence[StreamEvent], token: Any) -> tuple[list[Edit], list[str]]:
    """Edits leaving out the progress notifications of ``token``, and what they change. A
    complete event keeps its blank line (an empty line is no event): what replay adds to
    an event (an SSE id) goes just before it, next to the cut, not inside it."""
    progress = [e for e in events if _progress_of(e.data, token)]
    if not progress:
        return [], []
    edits = [(e.start, e.end - (len(e.terminator) if e.complete else 0) - e.start, b"") for e in progress]
    said = f"{len(progress)} progress notifications of token {json.dumps(token)} are left out"
    return edits, [f"{said}: the request gave no progress token"]


def _progress_of(data: str, token: Any) -> bool:
    """Whether an event's data is a progress notification of ``token``."""
    message = parsed(data, MCPKind.OTHER)
    params = message.get("params") if _is_progress(message) else None
    return isinstance(params, dict) and same_id(params.get("progressToken"), token)


def result_xor_error(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A response carries a result or an error, never both; an error has a code and a message."""
    for stream in streams:
        for frame, message, place in _numbered(stream):
            if "method" in message or "id" not in message:
                continue
            at = "" if place is None else f" (at /{place} of the batch)"
            if "result" in message and "error" in message:
                yield Problem(stream, frame, f"a response with both a result and an error{at}")
            elif "result" not in message and "error" not in message:
                yield Problem(stream, frame, f"a response with neither a result nor an error{at}")
            elif "error" in message and not _well_formed(message["error"]):
                yield Problem(stream, frame, f"an error without an integer code and a message{at}")


def _well_formed(error: Any) -> bool:
    """Whether a JSON-RPC error has what JSON-RPC 2.0 requires: an integer code, a message."""
    if not isinstance(error, dict):
        return False
    return type(error.get("code")) is int and isinstance(error.get("message"), str)


def progress_rising(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Each progress token's progress rises with every notification, and never passes its total."""
    for session in _sessions(streams):
        last: dict[Any, float] = {}
        repeats = Repeats()
        for stream in session:
            again = _sent_again(repeats, stream)
            # A token is unique among the requests under way: a new request that carries one
            # counts its progress afresh (the request that carried it before has been answered).
            for message in _sent(stream.request_body):
                token = _progress_token(message)
                if token is not None and (key := id_key(token)) is not None:
                    last.pop(key, None)
            for frame, message in _messages(stream):
                if message.get("method") != PROGRESS or frame.sse_id in again:
                    continue
                params = message.get("params") if isinstance(message.get("params"), dict) else {}
                token, progress, total = (
                    params.get("progressToken"),
                    params.get("progress"),
                    params.get("total"),
                )
                if not isinstance(progress, int | float):
                    yield Problem(stream, frame, f"progress of token {quoted(token)} is not a number")
                    continue
                if (key := id_key(token)) is None:
                    continue  # a token is a string or a number: this one is no one's
                before = last.get(key)
                if before is not None and progress <= before:
                    yield Problem(
                        stream, frame, f"progress of token {token!r} went from {before} to {progress}"
                    )
                if isinstance(total, int | float) and progress > total:
                    yield Problem(
                        stream, frame, f"progress {progress} of token {token!r} passes its total {total}"
                    )
                last[key] = progress


def well_formed(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Every event is one JSON-RPC 2.0 message (or an empty priming event), none cut off mid-way."""
    for stream in streams:
        yield from (problem for _, problem in readable(stream) if problem is not None)


MCP.rules = {
    "mcp-one-response": one_response,
    "mcp-result-xor-error": result_xor_error,
    "mcp-progress-rising": progress_rising,
    "mcp-frame": well_formed,
}
