"""Keys of what tasktape's handlers keep on a request: typed ``web.RequestKey``s where
aiohttp has them (3.14 on), plain names before (which raise no warning there)."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def request_key(name: str, kind: type) -> Any:
    """The key ``name`` of a value of ``kind`` kept on a request."""
    return web.RequestKey(name, kind) if hasattr(web, "RequestKey") else name
