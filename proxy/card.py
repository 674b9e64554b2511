"""Agent card rewriting: the official a2a-sdk client dials the URLs a card lists, so a
card served through the proxy must list the proxy, or the client's traffic bypasses it."""

from __future__ import annotations

import json
from typing import Any

from yarl import URL

from tasktape.eventlog.a2a_terms import CARD_METHODS, CARD_PATHS, is_jsonrpc

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def is_card_request(method: str, path: str, body: bytes | None) -> bool:
    """A request whose answer is an agent card (a well-known path, or a JSON-RPC call)."""
    if method == "GET" and path.endswith(CARD_PATHS):
        return True
    if method != "POST" or not body or not any(m.encode() in body for m in CARD_METHODS):
        return False
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("method") in CARD_METHODS


def rewrite_card(body: bytes, upstream: URL, public: URL) -> bytes | None:
    """The card with every ``url`` that points at the upstream pointing at ``public``
    instead; None when the body is not JSON or nothing pointed at the upstream."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    changed = _rewrite(doc, upstream, public)
    if not changed:
        return None
    return json.dumps(doc, ensure_ascii=False).encode()


def _rewrite(node: Any, upstream: URL, public: URL) -> bool:
    changed = False
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "url" and isinstance(value, str) and (moved := _move(value, upstream, public)):
                node[key] = moved
                changed = True
            else:
                changed |= _rewrite(value, upstream, public)
    elif isinstance(node, list):
        for item in node:
            changed |= _rewrite(item, upstream, public)
    return changed


def _move(value: str, upstream: URL, public: URL) -> str | None:
    try:
        url = URL(value)
    except ValueError:
        return None
    if not url.is_absolute() or url.scheme != upstream.scheme or url.port != upstream.port:
        return None
    same_host = url.host == upstream.host or {url.host, upstream.host} <= _LOOPBACK
    prefix = upstream.path.rstrip("/")
    if not same_host or not (url.path == prefix or url.path.startswith(prefix + "/") or not prefix):
        return None
    rest = url.raw_path[len(upstream.raw_path.rstrip("/")) :]
    if rest == "/" and not value.split("?", maxsplit=1)[0].endswith("/"):
        rest = ""  # keep "http://host:port" without the slash yarl adds
    moved = str(public).rstrip("/") + rest
    if url.raw_query_string:
        moved += "?" + url.raw_query_string
    return moved


def point_card_at(body: bytes, public: URL) -> bytes | None:
    """A recorded card, or a JSON-RPC answer holding one in ``result``, with every ``url``
    that points where its interfaces did (``supportedInterfaces``, and the 0.3 ``url`` and
    ``additionalInterfaces``) moved to ``public``, paths kept, as the recorder moves them
    live: a replayed card must send the client back to the replay server. None when
    nothing moved."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    card = doc.get("result") if is_jsonrpc(doc) else doc
    if not isinstance(card, dict):
        return None
    changed = False
    for origin in _interface_origins(card) - {public.origin()}:
        changed |= _rewrite(doc, origin, public)
    return json.dumps(doc, ensure_ascii=False).encode() if changed else None


def _interface_origins(card: dict[str, Any]) -> set[URL]:
    """Where a card's interfaces point: the recorded agent, as its card names it."""
    holders = [
        card,
        *(
            i
            for key in ("supportedInterfaces", "additionalInterfaces")
            for i in card.get(key) or []
            if isinstance(i, dict)
        ),
    ]
    origins: set[URL] = set()
    for holder in holders:
        value = holder.get("url")
        if isinstance(value, str):
            try:
                origins.add(URL(value).origin())
            except ValueError:  # not an absolute URL
                continue
    return origins
