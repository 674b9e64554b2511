"""Which Host names a server bound to loopback answers. A page on any web site can make a
browser send requests to 127.0.0.1 under a name of its own that it re-points there (DNS
rebinding), and read the answers: the recorder's and replay's logs and agents. A loopback
server answers only loopback names, and the names it is told."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refuse = Callable[[web.Request, int, str], web.StreamResponse]


def host_name(host: str) -> str:
    """The name of a Host header, without its port (``[::1]:7470`` -> ``[::1]``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if ":" in host else host


def allowed_hosts(extra: Iterable[str]) -> frozenset[str]:
    """The loopback names and ``extra`` ones (``--allow-host``), compared without ports."""
    return LOOPBACK_NAMES | {host_name(name) for name in extra}


def answered(host: str, allowed: frozenset[str]) -> bool:
    """Whether a request with this Host is answered: one naming an allowed name, or none
    (an HTTP/1.0 client may send none; a browser, which a rebinding page drives, always does)."""
    return not host or host_name(host) in allowed


def refusal(host: str, command: str) -> str:
    return (
        f"Host {host!r} is not a name {command} answers: it listens on loopback, and answers "
        "localhost, 127.0.0.1 and [::1] (a page re-pointing a name of its own here could read it); "
        f"to serve this name too, start it with --allow-host {host_name(host) or 'NAME'}"
    )


def refusal_body(host: str, command: str) -> bytes:
    return json.dumps(
        {"error": {"code": 421, "message": refusal(host, command), "source": "tasktape"}}
    ).encode()


class AsgiHostGuard:
    """The same for an ASGI application (Datasette under ``tasktape inspect``)."""

    def __init__(self, app: Any, allowed: frozenset[str], command: str) -> None:
        self.app, self.allowed, self.command = app, allowed, command

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not answered(host, self.allowed):
                body = refusal_body(host, self.command)
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ]
                await send({"type": "http.response.start", "status": 421, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def host_guard(allowed: frozenset[str], command: str, refuse: Refuse | None = None) -> Callable[..., object]:
    """An aiohttp middleware answering 421 to a request whose Host is not ``allowed``;
    ``refuse`` builds (and logs) that answer, by default a JSON error."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host", "")
        if answered(host, allowed):
            return await handler(request)
        reason = refusal(host, command)
        if refuse is not None:
            return refuse(request, 421, reason)
        return web.Response(status=421, body=refusal_body(host, command), content_type="application/json")

    return guard
