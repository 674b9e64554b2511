"""The replay server's control API, for browser tests and out-of-process clients:

    POST /_tasktape/faults   {"fault": SPEC} arms a fault spec (its scope counts from now)
    GET  /_tasktape/faults   the armed specs, with how often each applied; request faults not made
    GET  /_tasktape/report   the fidelity report
    POST /_tasktape/reset    faults back to those given at start, no task started

Every path under /_tasktape/, and /_tasktape itself, is the server's own, told apart
decoded (/_tasktape%2Freport too): never matched against recordings, never forwarded. Only
loopback clients naming a loopback Host are answered, a request from a web page only from
the server's own origin, and a POST must say its body is JSON: a page elsewhere cannot send
that without a CORS preflight, which this never grants. So neither a page a tester visits
nor one re-pointing a name of its own at loopback arms faults.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from yarl import URL

from tasktape.errors import FaultError
from tasktape.eventlog.content_coding import TooLarge, decode_body
from tasktape.eventlog.http_fields import joined
from tasktape.proxy.hosts import LOOPBACK_NAMES, host_name

from .faults import Faults
from .own_answers import error

if TYPE_CHECKING:
    from .server import ReplayServer

PREFIX = "/_tasktape"
SOURCE = "POST /_tasktape/faults"
MAX_BODY = 64 * 1024  # a fault spec is a line
ARM_BODY = '{"fault": SPEC}'
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def owns(path: str) -> bool:
    """Whether a request's path, decoded, is the control API's: ``/_tasktape`` or one under
    it, however it is spelt (``/_tasktape%2Freport`` is ``/_tasktape/report``, as the
    replay reads every path)."""
    return path == PREFIX or path.startswith(f"{PREFIX}/")


def api(server: ReplayServer) -> Handler:
    """The handler of every path ``owns``: each route by its decoded path."""

    async def arm(request: web.Request) -> web.Response:
        body = await request.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return error(413, f"a fault spec is at most {MAX_BODY} bytes")
        # Decoded as the replay decodes the bodies it matches (a client may gzip its POSTs).
        encoding = joined(request.headers.items(), "Content-Encoding")
        body, problem = decode_body(body, encoding, MAX_BODY)
        if isinstance(problem, TooLarge):  # (the bound is this API's own, no option's)
            return error(
                413, f"a fault spec is at most {MAX_BODY} bytes, decoded from its Content-Encoding {encoding}"
            )
        if problem is not None:
            return error(400, problem)
        try:
            doc = json.loads(body) if body else None
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("fault"), str):
            return error(400, f'send {ARM_BODY}, such as {{"fault": "drop-after=3;times=1"}}')
        unknown = sorted(set(doc) - {"fault"})
        if unknown:
            named = ", ".join(json.dumps(k) for k in unknown)
            return error(400, f"unknown key(s) {named}: send {ARM_BODY}, its one key")
        try:
            armed = server.arm(Faults.parse(doc["fault"]), SOURCE)
        except FaultError as exc:
            return error(400, str(exc))
        return web.json_response({"armed": armed.as_json()})

    async def faults(request: web.Request) -> web.Response:
        armed = [a.as_json() for a in server.armed]
        kept = server.stats.not_applied
        unapplied = [{**u.as_json(), "times": n} for u, n in kept.distinct()]
        return web.json_response({"armed": armed, "not_applied": unapplied, "not_applied_total": kept.total})

    async def report(request: web.Request) -> web.Response:
        return web.json_response(server.report())

    async def reset(request: web.Request) -> web.Response:
        server.reset()
        return web.json_response({"reset": True, "armed": [a.as_json() for a in server.armed]})

    known = {"faults": ("GET", "POST"), "report": ("GET",), "reset": ("POST",)}
    handlers = {
        ("faults", "POST"): _guarded(arm, body=True),
        ("faults", "GET"): _guarded(faults),
        ("report", "GET"): _guarded(report),
        ("reset", "POST"): _guarded(reset, body=True),
    }

    async def elsewhere(request: web.Request) -> web.Response:
        allowed = known.get(_route(request))  # (none: the prefix itself)
        if allowed is not None:
            refused = error(405, f"{request.path} answers {' and '.join(allowed)}", allowed=list(allowed))
            refused.headers["Allow"] = ", ".join(allowed)  # as a 405 must say (RFC 9110)
            return refused
        return error(404, f"{request.path} is no part of the control API: see {', '.join(known)}")

    refused = _guarded(elsewhere)

    async def answer(request: web.Request) -> web.StreamResponse:
        # A HEAD is answered as its GET, without the body (aiohttp leaves it out).
        method = "GET" if request.method == "HEAD" else request.method
        return await handlers.get((_route(request), method), refused)(request)

    return answer


def _route(request: web.Request) -> str:
    """The control API's route a request names: its decoded path after ``/_tasktape/``."""
    return request.path.removeprefix(PREFIX).removeprefix("/")


def _guarded(handler: Handler, *, body: bool = False) -> Handler:
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not _loopback(request.remote) or host_name(request.headers.get("Host", "")) not in LOOPBACK_NAMES:
            return error(403, "the control API answers loopback clients, at a loopback name, only")
        origin = request.headers.get("Origin")
        if origin is not None and _authority(origin) != request.host.lower():
            return error(403, f"the control API answers pages of its own origin only, not {origin}")
        if body and request.content_type != "application/json":
            return error(415, "send Content-Type: application/json")
        return await handler(request)

    guarded.__doc__ = handler.__doc__
    return guarded


def _authority(origin: str) -> str | None:
    """An Origin's host and port, as a Host header names them; None for one that is no URL."""
    try:
        return URL(origin).raw_authority.lower()
    except ValueError:  # a bracket left open, a port out of range
        return None


def _loopback(remote: str | None) -> bool:
    try:
        address = ipaddress.ip_address((remote or "").split("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, on a dual-stack socket
    return (mapped or address).is_loopback
