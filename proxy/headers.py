"""Which headers a reverse proxy passes on, and what it adds (RFC 9110 section 7.6)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from http import HTTPStatus

from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy

from tasktape.eventlog.http_fields import joined, unsendable

from .request_keys import request_key

# How much header a request from a client, or a response from the upstream, may carry.
# aiohttp's defaults (8 KiB a line, 128 headers) refuse what agents, their frameworks and
# browsers send and accept every day (large cookies, tokens, Link and CSP headers); these
# are about what common proxies allow for one header (envoy: 60 KiB in all). aiohttp has no
# limit on all headers together, so their number bounds that (32 MiB at most).
MAX_LINE = 64 * 1024  # bytes: a request or status line, a header name or value
MAX_HEADERS = 512
HEADER_LIMITS = {"max_line_size": MAX_LINE, "max_field_size": MAX_LINE, "max_headers": MAX_HEADERS}

# How long a connection may take to send a request's head: from its opening, or from the
# end of the previous response. aiohttp closes a connection whose handler still waits for
# a whole request head when its keep-alive time runs out, however slowly bytes trickle in
# (a slowloris client); its own default is an hour.
HEADER_TIMEOUT = 60.0  # seconds


def head_timeout(seconds: float = HEADER_TIMEOUT) -> dict[str, float]:
    """The request handler arguments that bound the time to a request's head."""
    return {"keepalive_timeout": seconds}


# Hop-by-hop: meaningful for one connection only, never forwarded.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def asks_websocket(headers: Mapping[str, str]) -> bool:
    """Whether a request asks to switch its connection to WebSocket (RFC 6455): an
    ``Upgrade: websocket`` its ``Connection`` header names. (An h2c upgrade may be ignored:
    its client goes on in HTTP/1.1.)"""
    tokens = {t.strip().lower() for t in headers.get("Connection", "").split(",")}
    wanted = {t.strip().lower() for t in headers.get("Upgrade", "").split(",")}
    return "upgrade" in tokens and "websocket" in wanted


def end_to_end(headers: Iterable[tuple[str, str]], connection: str = "") -> CIMultiDict[str]:
    """The headers minus hop-by-hop ones, including any the Connection header names."""
    named = {token.strip().lower() for token in connection.split(",") if token.strip()}
    return CIMultiDict((k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() not in named)


# What aiohttp refuses in a header value it sends (RFC 9110 section 5.5): a control
# character but a tab. The upstream's client read it; passed on it would fail the answer.
def standard_reason(status: int) -> str:
    """The reason phrase RFC 9110 gives ``status`` (none for a status it does not name)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def as_named(headers: CIMultiDictProxy[str], raw: Sequence[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """Header lines with their names as the sender spelt them: aiohttp's parser spells
    those it knows its own way (ETag as Etag), and keeps the lines as they came, one for
    one, in ``raw``. The values are the parsed ones (decoded, trailing blanks off)."""
    if len(raw) != len(headers):  # (headers not from aiohttp's parser: as they are)
        return list(headers.items())
    return [
        (name.decode("utf-8", "surrogateescape"), value)
        for (name, _), value in zip(raw, headers.values(), strict=True)
    ]


# A request's header lines as_named, worked out once: both the upstream and the log get them.
_NAMED = request_key("tasktape.named", list)


def request_lines(request: web.Request) -> list[tuple[str, str]]:
    """A request's header lines, their names as the client spelt them."""
    named = request.get(_NAMED)
    if named is None:
        named = request[_NAMED] = as_named(request.headers, request.raw_headers)
    return named


def other_transfer_coding(headers: CIMultiDictProxy[str]) -> str | None:
    """A message's Transfer-Encoding when it holds a coding but chunked, which aiohttp
    leaves on the bytes it takes the chunks off: passed on, they would be a plain body."""
    value = joined(headers.items(), hdrs.TRANSFER_ENCODING) or ""
    codings = (coding.strip().lower() for coding in value.split(","))
    return value if any(coding not in ("", "chunked") for coding in codings) else None


def left_out(headers: CIMultiDict[str]) -> list[str]:
    """Take the headers whose values cannot be sent (a control character) out of
    ``headers``: their names."""
    names = [name for name, value in headers.items() if unsendable(value)]
    for name in dict.fromkeys(names):
        kept = [v for v in headers.getall(name) if not unsendable(v)]
        headers.popall(name)
        for value in kept:
            headers.add(name, value)
    return list(dict.fromkeys(names))


def for_upstream(
    headers: Iterable[tuple[str, str]],
    *,
    connection: str,
    upstream_host: str,
    client_ip: str | None,
    scheme: str,
    host: str | None,
) -> CIMultiDict[str]:
    """Request headers for the upstream: end-to-end ones untouched (A2A-Version among
    them), Host set to the upstream's, and the X-Forwarded-* trail extended."""
    out = end_to_end(headers, connection)
    out.popall("Expect", None)  # the proxy has already answered any 100-continue
    out["Host"] = upstream_host
    if client_ip:
        # Every line the client sent, joined (RFC 9110 5.3), as Via is.
        previous = ", ".join(out.getall("X-Forwarded-For", ()))
        out["X-Forwarded-For"] = f"{previous}, {client_ip}" if previous else client_ip
    out.setdefault("X-Forwarded-Proto", scheme)
    if host:
        out.setdefault("X-Forwarded-Host", host)
    return out


# What aiohttp adds to every response it sends unless given: its own name as the Server,
# and a Content-Type of application/octet-stream for a body. A response passed on from the
# upstream gets neither (a client sniffs a body sent without a type). A Date is added, as
# a proxy must where the upstream sent none (RFC 9110 section 6.6.1).
_NOT_ADDED = (hdrs.SERVER, hdrs.CONTENT_TYPE)


class _AsSent:
    """aiohttp's headers on a response, less those it added that the upstream did not send."""

    headers: CIMultiDict[str]

    async def _prepare_headers(self) -> None:
        given = [name for name in _NOT_ADDED if name in self.headers]
        await super()._prepare_headers()  # type: ignore[misc]
        for name in _NOT_ADDED:
            if name not in given:
                self.headers.popall(name, None)


class Relayed(_AsSent, web.StreamResponse):
    """A streamed response with the upstream's headers."""


class RelayedWhole(_AsSent, web.Response):
    """A response read whole (and rewritten) with the upstream's headers."""
