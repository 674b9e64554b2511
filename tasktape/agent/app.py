"""The demo agent's HTTP surface: the A2A v1.0 REST binding, the JSON-RPC binding on
``POST /jsonrpc``, and an agent card listing both.

As the hosted API documents: every SSE event carries an ``id:`` line (``Last-Event-ID`` is
not read); REJECTED and AUTH_REQUIRED are only visible on JSON-RPC, REST shows them as
FAILED with a descriptive status message; canceling a terminal task is 409 Conflict.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tasktape.errors import A2AError

from .ids import new_id
from .scenarios import Scenario, choose, script_for
from .tasks import INTERRUPTED, Event, Frame, TaskRun, TaskStore

JSONRPC_PATH = "/jsonrpc"
_TASK = r"{task_id:[^/:]+}"
# REST clients never see these states; they get FAILED with this explanation first.
_REST_MAPPED = {
    "TASK_STATE_REJECTED": "rejected before processing",
    "TASK_STATE_AUTH_REQUIRED": "a connector requires authentication",
}

STORE = web.AppKey("store", TaskStore)
PUBLIC_URL = web.AppKey("public_url", str)


def create_agent_app(*, pace: float = 1.0, public_url: str | None = None) -> web.Application:
    """The demo agent as an aiohttp application. ``pace`` scales every delay (0: none);
    ``public_url`` is the base URL its card lists (default: the one each request used)."""
    app = web.Application()
    app[STORE] = TaskStore(pace)
    app[PUBLIC_URL] = public_url or ""
    app.router.add_get("/.well-known/agent-card.json", card)
    app.router.add_post("/message:send", rest_send)
    app.router.add_post("/message:stream", rest_stream)
    app.router.add_get(f"/tasks/{_TASK}", rest_get)
    app.router.add_post(f"/tasks/{_TASK}:cancel", rest_cancel)
    app.router.add_route("GET", f"/tasks/{_TASK}:subscribe", rest_subscribe)
    app.router.add_route("POST", f"/tasks/{_TASK}:subscribe", rest_subscribe)
    app.router.add_post(JSONRPC_PATH, jsonrpc)
    app.on_shutdown.append(_stop_tasks)
    return app


async def _stop_tasks(app: web.Application) -> None:
    await app[STORE].close()


def _base(request: web.Request) -> str:
    return request.app[PUBLIC_URL].rstrip("/") or f"{request.scheme}://{request.host}"


async def card(request: web.Request) -> web.Response:
    base = _base(request)
    return web.json_response(
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


def _start(request: web.Request, params: Any) -> tuple[TaskRun, asyncio.Queue[Event | None]]:
    """Start a task for a SendMessage request, or resume the interrupted task it names;
    returns it with a queue of its events from the first (a task snapshot) on."""
    message = params.get("message") if isinstance(params, dict) else None
    if not isinstance(message, dict) or not isinstance(message.get("parts"), list):
        raise A2AError(400, -32602, "the request needs a message with parts")
    store = request.app[STORE]
    task_id = message.get("taskId")
    if task_id:
        run = store.get(task_id)
        if run is None:
            raise A2AError(404, -32001, f"task {task_id} not found")
        if run.state not in INTERRUPTED:
            raise A2AError(
                409, -32002, f"task {task_id} is {run.state}: only an interrupted task takes more input"
            )
        script = script_for(Scenario.COMPLETED, len(store.contexts[run.context_id]))
    else:
        run = store.new(message.get("contextId"))
        text = "".join(p.get("text", "") for p in message["parts"] if isinstance(p, dict))
        script = script_for(choose(text), len(store.contexts[run.context_id]))
    # The script's events come once this handler awaits: watching now misses none.
    run.start(message, script)
    queue = run.watch()
    run.snapshot_event()
    return run, queue


def _task(request: web.Request, task_id: str) -> TaskRun:
    run = request.app[STORE].get(task_id)
    if run is None:
        raise A2AError(404, -32001, f"task {task_id} not found")
    return run


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


Render = Callable[[Frame], Frame]


async def _sse(
    request: web.Request, run: TaskRun, queue: Any, render: Render, *, first: bool
) -> web.StreamResponse:
    """Stream a task's events as SSE until it settles; ``first``: this is the stream that
    created the task (the "drop" scenario cuts it)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    sent = 0
    try:
        while (event := await queue.get()) is not None:
            event_id, frame = event
            data = json.dumps(render(frame), separators=(",", ":"), ensure_ascii=False)
            raw = f"id: {event_id}\ndata: {data}\n\n".encode()
            if first and run.drop_after is not None and sent >= run.drop_after:
                # The connection drops halfway through an event, without the terminating chunk.
                await response.write(raw[: len(raw) // 2])
                request.protocol.force_close()
                return response
            await response.write(raw)
            sent += 1
    finally:
        run.unwatch(queue)
    await response.write_eof()
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


def _rest(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except A2AError as exc:
            status = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "FAILED_PRECONDITION"}[exc.http]
            return web.json_response(
                {"error": {"code": exc.http, "status": status, "message": exc.message}}, status=exc.http
            )

    return wrapped


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise A2AError(400, -32700, "the body is not JSON") from None


@_rest
async def rest_send(request: web.Request) -> web.Response:
    run, queue = _start(request, await _json(request))
    run.unwatch(queue)
    await run.settled()
    return web.json_response({"task": _for_rest({"task": run.snapshot()})["task"]})


@_rest
async def rest_stream(request: web.Request) -> web.StreamResponse:
    run, queue = _start(request, await _json(request))
    return await _sse(request, run, queue, _for_rest, first=True)


@_rest
async def rest_get(request: web.Request) -> web.Response:
    run = _task(request, request.match_info["task_id"])
    return web.json_response(_for_rest({"task": run.snapshot()})["task"])


@_rest
async def rest_cancel(request: web.Request) -> web.Response:
    run = _task(request, request.match_info["task_id"])
    run.cancel()  # NotCancelable is an A2AError: 409 for a task that has ended
    return web.json_response(run.snapshot())


@_rest
async def rest_subscribe(request: web.Request) -> web.StreamResponse:
    run = _task(request, request.match_info["task_id"])
    return await _sse(request, run, _subscription(run), _for_rest, first=False)


# -- JSON-RPC -----------------------------------------------------------------------------------


async def jsonrpc(request: web.Request) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        return _rpc_error(None, -32700, "parse error: the body is not JSON")
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or not isinstance(body.get("method"), str):
        return _rpc_error(body.get("id") if isinstance(body, dict) else None, -32600, "invalid request")
    rpc_id, method, params = body.get("id"), body["method"], body.get("params") or {}

    def wrap(frame: Frame) -> Frame:
        return {"jsonrpc": "2.0", "id": rpc_id, "result": frame}

    try:
        if method == "SendMessage":
            run, queue = _start(request, params)
            run.unwatch(queue)
            await run.settled()
            return web.json_response(wrap({"task": run.snapshot()}))
        if method == "SendStreamingMessage":
            run, queue = _start(request, params)
            return await _sse(request, run, queue, wrap, first=True)
        task_id = params.get("id") if isinstance(params, dict) else None
        if method == "GetTask":
            return web.json_response(wrap(_task(request, str(task_id)).snapshot()))
        if method == "CancelTask":
            run = _task(request, str(task_id))
            run.cancel()
            return web.json_response(wrap(run.snapshot()))
        if method == "SubscribeToTask":
            run = _task(request, str(task_id))
            return await _sse(request, run, _subscription(run), wrap, first=False)
    except A2AError as exc:
        return _rpc_error(rpc_id, exc.rpc, exc.message)
    return _rpc_error(rpc_id, -32601, f"method not found: {method}")


def _rpc_error(rpc_id: Any, code: int, message: str) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})
