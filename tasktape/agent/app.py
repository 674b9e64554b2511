"""The demo agent's HTTP surface: the A2A v1.0 REST binding, the JSON-RPC binding on
``POST /jsonrpc``, and an agent card listing both.

As the hosted API documents: every SSE event carries an ``id:`` line (``Last-Event-ID`` is
not read); REJECTED and AUTH_REQUIRED are only visible on JSON-RPC, REST shows them as
FAILED with a descriptive status message; canceling a terminal task is 409 Conflict.
Push notifications and an extended agent card are not offered (the card says neither).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, NamedTuple

from aiohttp import web

from tasktape.errors import A2AError
from tasktape.eventlog.a2a_terms import TaskState
from tasktape.eventlog.uids import read_time
from tasktape.proxy.hosts import host_guard

from .ids import new_id
from .protocol import (
    ERROR_DOMAIN,
    ERROR_INFO,
    VERSION_HEADER,
    ErrorKind,
    Method,
    boolean,
    check_message,
    check_version,
    dump_json,
    history_length,
    integer,
    message_text,
    named_task_id,
    read_json,
)
from .scenarios import Scenario, choose, script_for
from .tasks import INTERRUPTED, KEPT_ENDED, TERMINAL, Event, Frame, TaskRun, TaskStore, timestamp

JSONRPC_PATH = "/jsonrpc"
_TASK = r"{task_id:[^/:]+}"
# REST clients never see these states; they get FAILED with this explanation first.
_REST_MAPPED = {
    "TASK_STATE_REJECTED": "rejected before processing",
    "TASK_STATE_AUTH_REQUIRED": "a connector requires authentication",
}
_NO_PUSH = "push notifications are not supported: the agent card does not offer them"
_NO_EXTENDED_CARD = "this agent has no extended agent card: its card does not offer one"

Render = Callable[[Frame], Frame]

# ListTasks: the spec's default and largest page.
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100

STORE = web.AppKey("store", TaskStore)
PUBLIC_URL = web.AppKey("public_url", str)


def create_agent_app(
    *,
    pace: float = 1.0,
    public_url: str | None = None,
    kept_ended: int = KEPT_ENDED,
    allowed_hosts: frozenset[str] | None = None,
) -> web.Application:
    """The demo agent as an aiohttp application. ``pace`` scales every delay (0: none; not
    a finite number of 0 or more: a ``UsageError``); ``public_url`` is the base URL its card
    lists (default: the one each request used); ``kept_ended``: how many ended tasks it
    keeps (the earliest to end are forgotten first: TaskNotFound); ``allowed_hosts``: the
    only Host names it answers (421 to others: it lists every task to whoever asks), None
    all of them."""
    guard = [host_guard(allowed_hosts, "tasktape agent")] if allowed_hosts is not None else []
    app = web.Application(middlewares=guard)
    app[STORE] = TaskStore(pace, kept_ended)
    app[PUBLIC_URL] = public_url or ""
    app.router.add_get("/.well-known/agent-card.json", card)
    app.router.add_post("/message:send", rest_send)
    app.router.add_post("/message:stream", rest_stream)
    app.router.add_get("/tasks", rest_list)
    app.router.add_get(f"/tasks/{_TASK}", rest_get)
    app.router.add_post(f"/tasks/{_TASK}:cancel", rest_cancel)
    app.router.add_route("GET", f"/tasks/{_TASK}:subscribe", rest_subscribe)
    app.router.add_route("POST", f"/tasks/{_TASK}:subscribe", rest_subscribe)
    app.router.add_post(f"/tasks/{_TASK}/pushNotificationConfigs", rest_push_configs)
    app.router.add_get(f"/tasks/{_TASK}/pushNotificationConfigs", rest_push_configs)
    app.router.add_get(f"/tasks/{_TASK}/pushNotificationConfigs/{{config_id}}", rest_push_configs)
    app.router.add_delete(f"/tasks/{_TASK}/pushNotificationConfigs/{{config_id}}", rest_push_configs)
    app.router.add_get("/extendedAgentCard", rest_extended_card)
    app.router.add_post(JSONRPC_PATH, jsonrpc)
    app.on_shutdown.append(_stop_tasks)
    return app


async def _stop_tasks(app: web.Application) -> None:
    await app[STORE].close()


def _base(request: web.Request) -> str:
    return request.app[PUBLIC_URL].rstrip("/") or f"{request.scheme}://{request.host}"


async def card(request: web.Request) -> web.Response:
    base = _base(request)
    return _answer(
        {
            "name": "tasktape demo agent",
            "description": "Streams realistic A2A v1.0 task runs, chosen by words in the message: "
            + ", ".join(s.value for s in Scenario if s is not Scenario.COMPLETED)
            + " (default: completed).",
            "version": "1.0.0",
            "supportedInterfaces": [
                {"url": base, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
                {"url": base + JSONRPC_PATH, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            ],
            "capabilities": {"streaming": True},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain", "application/json"],
            "skills": [
                {
                    "id": "answer",
                    "name": "Answer with citations",
                    "description": "Answers a question, citing the data it used.",
                    "tags": ["demo"],
                }
            ],
        }
    )


# -- the work shared by both bindings ------------------------------------------------------------


class SendRequest(NamedTuple):
    """A SendMessage request, checked: its message and what its configuration asks."""

    message: Frame
    return_immediately: bool
    history_length: int | None


def _send_request(params: Any) -> SendRequest:
    if not isinstance(params, dict):
        raise ErrorKind.INVALID_PARAMS.error("the request needs a message")
    message = check_message(params.get("message"))
    configuration = params.get("configuration") or {}
    if not isinstance(configuration, dict):
        raise ErrorKind.INVALID_PARAMS.error("configuration: an object")
    return SendRequest(message, boolean(configuration, "returnImmediately"), history_length(configuration))


def _start(request: web.Request, send: SendRequest) -> tuple[TaskRun, asyncio.Queue[Event | None]]:
    """Start a task for a SendMessage request, or resume the interrupted task it names;
    returns it with a queue of its events from the first (a task snapshot) on."""
    message = send.message
    store = request.app[STORE]
    if message.get("taskId"):
        run = _task(request, message["taskId"])
        if run.state in TERMINAL:
            raise ErrorKind.UNSUPPORTED_OPERATION.error(
                f"task {run.id} is {run.state}: a terminal task takes no more messages"
            )
        if not run.takes_input:
            # Still interrupted, it is being resumed: WORKING is its run's first step.
            state = TaskState.WORKING if run.state in INTERRUPTED else run.state
            raise ErrorKind.UNSUPPORTED_OPERATION.error(
                f"task {run.id} is {state}: only an interrupted task takes more input"
            )
        script = script_for(Scenario.COMPLETED, len(store.contexts[run.context_id]))
    else:
        # The scenario is chosen before the task exists: a task is made only to be run.
        scenario = choose(message_text(message))
        run = store.new(message.get("contextId"))
        script = script_for(scenario, len(store.contexts[run.context_id]))
    # The script's events come once this handler awaits: watching now misses none.
    run.start(message, script)
    queue = run.watch()
    run.snapshot_event()
    return run, queue


async def _send(request: web.Request, params: Any) -> Frame:
    """SendMessage on either binding: the task once it settles (terminal or interrupted),
    or, with ``returnImmediately``, as it is right after it starts, running on."""
    send = _send_request(params)
    run, queue = _start(request, send)
    run.unwatch(queue)
    if send.return_immediately:
        # One step of the run: the task shows WORKING, not the INPUT_REQUIRED it resumes from.
        await asyncio.sleep(0)
    else:
        await run.settled()
    return {"task": run.snapshot(history_length=send.history_length)}


def _task(request: web.Request, task_id: str) -> TaskRun:
    run = request.app[STORE].get(task_id)
    if run is None:
        raise ErrorKind.TASK_NOT_FOUND.error(f"task {task_id} not found")
    return run


def _list_tasks(request: web.Request, params: Mapping[str, Any], render: Render) -> Frame:
    """ListTasks: the tasks the filters let through, most recently updated first, a page at
    a time (the page token is the last task's place in that order); states as ``render``
    shows them to the binding (REST: no REJECTED)."""
    context_id = params.get("contextId") or None
    if context_id is not None and not isinstance(context_id, str):
        raise ErrorKind.INVALID_PARAMS.error("contextId: a string")
    status = params.get("status")
    if status == TaskState.UNSPECIFIED:  # protobuf JSON's spelling of "no filter"
        status = None
    states = [s for s in TaskState if s is not TaskState.UNSPECIFIED]
    if status is not None and status not in states:
        raise ErrorKind.INVALID_PARAMS.error(f"status: one of {', '.join(states)}, got {status!r}")
    page_size = integer(params, "pageSize", low=1, high=MAX_PAGE_SIZE) or DEFAULT_PAGE_SIZE
    history = history_length(params)
    artifacts = boolean(params, "includeArtifacts")
    after = _moment(params.get("statusTimestampAfter"))
    cursor = _cursor(params.get("pageToken"))
    matching: list[tuple[TaskRun, Frame]] = []
    for run in sorted(request.app[STORE].tasks.values(), key=_place, reverse=True):
        if (context_id and run.context_id != context_id) or (after and run.updated < after):
            continue
        task = render({"task": run.snapshot(history_length=history, artifacts=artifacts)})["task"]
        if status in (None, task["status"]["state"]):
            matching.append((run, task))
    start = 0
    if cursor is not None:
        start = next((i for i, (run, _) in enumerate(matching) if _place(run) < cursor), len(matching))
    page = matching[start : start + page_size]
    more = start + page_size < len(matching)
    return {
        "tasks": [task for _, task in page],
        "nextPageToken": _page_token(page[-1][0]) if more else "",
        "pageSize": page_size,
        "totalSize": len(matching),
    }


def _place(run: TaskRun) -> tuple[str, str]:
    """A task's place in the list: its last update (a fixed-width UTC time, which sorts as
    text), then its id (UUIDv7: creation order)."""
    return timestamp(run.updated), run.id


def _page_token(run: TaskRun) -> str:
    return base64.urlsafe_b64encode(json.dumps(_place(run)).encode()).decode()


def _cursor(token: Any) -> tuple[str, str] | None:
    if not token:
        return None
    try:
        place = json.loads(base64.urlsafe_b64decode(str(token).encode()))
    except (ValueError, binascii.Error):
        place = None
    if not (isinstance(place, list) and len(place) == 2 and all(isinstance(p, str) for p in place)):
        raise ErrorKind.INVALID_PARAMS.error(f"pageToken: not one this agent issued: {token!r}")
    return place[0], place[1]


def _moment(value: Any) -> datetime | None:
    """``statusTimestampAfter``: an ISO 8601 time (UTC if it names no zone)."""
    if value is None:
        return None
    moment = read_time(str(value))
    if moment is None:
        raise ErrorKind.INVALID_PARAMS.error(f"statusTimestampAfter: an ISO 8601 time, got {value!r}")
    return moment


def _for_rest(frame: Frame) -> Frame:
    """REST shows REJECTED and AUTH_REQUIRED as FAILED, with a status message saying why."""
    body = frame.get("statusUpdate") or frame.get("task")
    state = (body or {}).get("status", {}).get("state")
    if state not in _REST_MAPPED:
        return frame
    frame = copy.deepcopy(frame)
    status = (frame.get("statusUpdate") or frame["task"])["status"]
    status["state"] = "TASK_STATE_FAILED"
    message = status.get("message") or {"role": "ROLE_AGENT", "parts": [{"text": ""}]}
    reason = _REST_MAPPED[state]
    message["parts"] = [{"text": f"Failed: {reason}. " + message["parts"][0].get("text", "")}]
    status["message"] = message
    return frame


async def _sse(
    request: web.Request, run: TaskRun, queue: Any, render: Render, *, first: bool
) -> web.StreamResponse:
    """Stream a task's events as SSE until it settles; ``first``: this is the stream that
    created the task (the "drop" scenario cuts it). A client that leaves ends its stream,
    not the task, which runs on (a subscribe follows it again)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    sent = 0
    try:
        await response.prepare(request)
        while (event := await queue.get()) is not None:
            event_id, frame = event
            data = dump_json(render(frame), separators=(",", ":"), ensure_ascii=False)
            raw = f"id: {event_id}\ndata: {data}\n\n".encode()
            if first and run.drop_after is not None and sent >= run.drop_after:
                # The connection drops halfway through an event, without the terminating chunk.
                await response.write(raw[: len(raw) // 2])
                request.protocol.force_close()
                return response
            await response.write(raw)
            sent += 1
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left (a write found its connection gone): its stream ends there, quietly
    finally:
        run.unwatch(queue)
    return response


def _subscription(run: TaskRun) -> Any:
    """A queue starting with a task snapshot, then the live events (if still running)."""
    return _Prepend((new_id("evt"), {"task": run.snapshot()}), run.watch())


class _Prepend:
    """A queue-like that yields one event first, then those of another queue."""

    def __init__(self, first: Any, rest: Any) -> None:
        self.first, self.rest = first, rest

    async def get(self) -> Any:
        if self.first is not None:
            event, self.first = self.first, None
            return event
        return await self.rest.get()


# -- REST ---------------------------------------------------------------------------------------


def _version(request: web.Request) -> str | None:
    # The spec lets a client name it in a query parameter instead of the header.
    return request.headers.get(VERSION_HEADER) or request.query.get(VERSION_HEADER)


def _rest(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            check_version(_version(request))
            return await handler(request)
        except A2AError as exc:
            # google.rpc.Status, with the ErrorInfo that tells apart A2A errors of one HTTP status.
            kind = ErrorKind.of(exc)
            info = {"@type": ERROR_INFO, "reason": kind.name, "domain": ERROR_DOMAIN}
            error = {"code": exc.http, "status": kind.status, "message": exc.message, "details": [info]}
            return _answer({"error": error}, status=exc.http)

    return wrapped


async def _json(request: web.Request) -> Any:
    """The request's body; unreadable, a parse error (``A2AError``), on either binding."""
    try:
        return await request.json(loads=read_json)
    except ValueError:
        raise ErrorKind.PARSE_ERROR.error("the body is not JSON") from None


@_rest
async def rest_send(request: web.Request) -> web.Response:
    return _answer(_for_rest(await _send(request, await _json(request))))


@_rest
async def rest_stream(request: web.Request) -> web.StreamResponse:
    run, queue = _start(request, _send_request(await _json(request)))
    return await _sse(request, run, queue, _for_rest, first=True)


@_rest
async def rest_get(request: web.Request) -> web.Response:
    run = _task(request, request.match_info["task_id"])
    snapshot = run.snapshot(history_length=history_length(request.query))
    return _answer(_for_rest({"task": snapshot})["task"])


@_rest
async def rest_list(request: web.Request) -> web.Response:
    return _answer(_list_tasks(request, request.query, _for_rest))


@_rest
async def rest_cancel(request: web.Request) -> web.Response:
    run = _task(request, request.match_info["task_id"])
    run.cancel()  # NotCancelable is an A2AError: 409 for a task that has ended
    return _answer(run.snapshot())


@_rest
async def rest_subscribe(request: web.Request) -> web.StreamResponse:
    run = _task(request, request.match_info["task_id"])
    return await _sse(request, run, _subscription(run), _for_rest, first=False)


@_rest
async def rest_push_configs(request: web.Request) -> web.Response:
    raise ErrorKind.PUSH_NOTIFICATION_NOT_SUPPORTED.error(_NO_PUSH)


@_rest
async def rest_extended_card(request: web.Request) -> web.Response:
    raise ErrorKind.UNSUPPORTED_OPERATION.error(_NO_EXTENDED_CARD)


# -- JSON-RPC -----------------------------------------------------------------------------------


async def jsonrpc(request: web.Request) -> web.StreamResponse:
    try:
        body = await _json(request)
    except A2AError as exc:
        return _rpc_error(None, exc.rpc, f"parse error: {exc.message}")
    rpc_id = body.get("id") if isinstance(body, dict) else None
    # JSON-RPC 2.0: an id is a string, a number or null; a request with any other is invalid.
    if not isinstance(rpc_id, str | int | float | None) or isinstance(rpc_id, bool):
        return _rpc_error(
            None, ErrorKind.INVALID_REQUEST.rpc, "invalid request: id must be a string or a number"
        )
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        return _rpc_error(rpc_id, ErrorKind.INVALID_REQUEST.rpc, "invalid request")
    params = body.get("params") or {}

    def wrap(frame: Frame) -> Frame:
        return {"jsonrpc": "2.0", "id": rpc_id, "result": frame}

    try:
        check_version(_version(request))
        if body["method"] not in list(Method):
            raise ErrorKind.METHOD_NOT_FOUND.error(f"method not found: {body['method']}")
        if not isinstance(params, dict):
            raise ErrorKind.INVALID_PARAMS.error("params: an object")
        match Method(body["method"]):
            case Method.SEND_MESSAGE:
                return _answer(wrap(await _send(request, params)))
            case Method.SEND_STREAMING_MESSAGE:
                run, queue = _start(request, _send_request(params))
                return await _sse(request, run, queue, wrap, first=True)
            case Method.GET_TASK:
                run = _task(request, named_task_id(params))
                return _answer(wrap(run.snapshot(history_length=history_length(params))))
            case Method.LIST_TASKS:
                return _answer(wrap(_list_tasks(request, params, _as_sent)))
            case Method.CANCEL_TASK:
                run = _task(request, named_task_id(params))
                run.cancel()
                return _answer(wrap(run.snapshot()))
            case Method.SUBSCRIBE_TO_TASK:
                run = _task(request, named_task_id(params))
                return await _sse(request, run, _subscription(run), wrap, first=False)
            case Method.GET_EXTENDED_AGENT_CARD:
                raise ErrorKind.UNSUPPORTED_OPERATION.error(_NO_EXTENDED_CARD)
            case _:  # the four push notification config methods
                raise ErrorKind.PUSH_NOTIFICATION_NOT_SUPPORTED.error(_NO_PUSH)
    except A2AError as exc:
        return _rpc_error(rpc_id, exc.rpc, exc.message)


def _as_sent(frame: Frame) -> Frame:
    """JSON-RPC shows every state as it is."""
    return frame


def _rpc_error(rpc_id: Any, code: int, message: str) -> web.Response:
    return _answer({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})


def _answer(body: Any, status: int = 200) -> web.Response:
    """A JSON answer, never with a NaN or an infinity in it (no JSON to other clients)."""
    return web.json_response(body, status=status, dumps=dump_json)
