"""The replay server's control API, for browser tests and out-of-process clients:

    POST /_tasktape/faults   {"fault": SPEC} arms a fault spec (its scope counts from now)
    GET  /_tasktape/faults   the armed specs, with how often each applied
    GET  /_tasktape/report   the fidelity report
    POST /_tasktape/reset    faults back to those configured, no task started

Only loopback clients are answered (others get a 403), and a POST must say its body is
JSON: a web page elsewhere cannot send that without a CORS preflight, which this never
grants, so a page a tester visits cannot arm faults in their replay.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tasktape.errors import FaultError

from .faults import Faults

if TYPE_CHECKING:
    from .server import ReplayServer

PREFIX = "/_tasktape"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def routes(server: ReplayServer) -> list[web.RouteDef]:
    async def arm(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("fault"), str):
            return _answer(400, {"error": 'send {"fault": SPEC}, such as {"fault": "drop-after=3;times=1"}'})
        try:
            armed = server.arm(Faults.parse(doc["fault"]), "POST /_tasktape/faults")
        except FaultError as exc:
            return _answer(400, {"error": str(exc)})
        return _answer(200, {"armed": armed.as_json()})

    async def faults(request: web.Request) -> web.Response:
        return _answer(200, {"armed": [a.as_json() for a in server.armed]})

    async def report(request: web.Request) -> web.Response:
        return _answer(200, server.report())

    async def reset(request: web.Request) -> web.Response:
        server.reset()
        return _answer(200, {"reset": True, "armed": [a.as_json() for a in server.armed]})

    return [
        web.post(f"{PREFIX}/faults", _guarded(arm, body=True)),
        web.get(f"{PREFIX}/faults", _guarded(faults)),
        web.get(f"{PREFIX}/report", _guarded(report)),
        web.post(f"{PREFIX}/reset", _guarded(reset, body=True)),
    ]


def _guarded(handler: Handler, *, body: bool = False) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not _loopback(request.remote):
            return _answer(403, {"error": "the control API answers loopback clients only"})
        if body and request.content_type != "application/json":
            return _answer(415, {"error": "send Content-Type: application/json"})
        return await handler(request)

    guarded.__doc__ = handler.__doc__
    return guarded


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:
        return False


def _answer(status: int, doc: Any) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(doc, ensure_ascii=False), content_type="application/json"
    )
