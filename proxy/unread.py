"""Requests aiohttp cannot read (headers past the limits, a broken request line, TLS sent
to a plain-HTTP port) are answered with a 400 before any handler runs. These hooks let the
recorder log them as refused, and every server of tasktape's say so on stderr in one line,
both without the bytes aiohttp quotes from the request: those may hold a token."""

from __future__ import annotations

import logging
from typing import Protocol

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError

from .failure import unquoted
from .request_keys import request_key

# Set on every request the proxy's handlers see; aiohttp answered the others itself.
HANDLED = request_key("tasktape.handled", bool)


class Refuser(Protocol):
    """What the access log reports to: the recording proxy."""

    def log_unread(self, status: int, reason: str) -> None: ...


def reason_for(said: str, fallback: str) -> str:
    """aiohttp's description of what it could not read, cut where it quotes the request."""
    return unquoted(said).strip().rstrip(".:") or fallback


class UnreadRequests(AbstractAccessLogger):
    """An access log that passes on only the requests aiohttp answered without a handler.
    Its ``logger`` is the proxy (see ``handler_args``)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        if HANDLED not in request:
            said = response.text if isinstance(response, web.Response) and response.text else ""
            proxy: Refuser = self.logger  # type: ignore[assignment]
            proxy.log_unread(response.status, reason_for(said, response.reason))


class _OneLine(logging.Filter):
    """aiohttp logs an unreadable request with a traceback whose message quotes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "a client"
            record.msg = "tasktape: refused a request from %s that could not be read: %s"
            record.args = (remote, reason_for(exc.message, type(exc).__name__))
            record.exc_info = None
        return True


server_log = logging.getLogger("tasktape.http")
server_log.addFilter(_OneLine())


def handler_args(proxy: Refuser | None = None) -> dict[str, object]:
    """What a server's application passes to aiohttp's request handlers: the one-line
    report, and with a ``proxy``, the log of what it could not read."""
    if proxy is None:
        return {"logger": server_log}
    return {"access_log_class": UnreadRequests, "access_log": proxy, "logger": server_log}
