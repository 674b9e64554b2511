"""The replay server's own answers, as opposed to recordings: its errors, in one shape."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

SOURCE = "tasktape replay"


def error(status: int, message: str, *, answer: Any = None, **details: Any) -> web.Response:
    """A JSON error: ``{"error": {"code", "message", "source", ...details}}``, or
    ``answer`` (the error as the request's protocol says one)."""
    body = {"error": {"code": status, "message": message, "source": SOURCE, **details}}
    if answer is not None:
        body = answer
    return web.Response(
        status=status, text=json.dumps(body, ensure_ascii=False), content_type="application/json"
    )
