"""For the inspector's protocol pages: one real log of every protocol besides A2A, recorded
through the proxy (MCP sessions with the official SDK, both generations when mcp 2.x is
installed; OpenAI and Anthropic token streams with their SDKs), plus a hand-made MCP session
that breaks its rules, with the checker's findings about it saved into the log."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import RecordFactory, Recording
from llm_servers import anthropic_app, openai_app
from test_llm_streams import chat, messages, responses
from test_mcp_sdk import MCP2, generation, recorded_session

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import load_into
from tasktape.eventlog.checker import check_log, save_findings
from tasktape.eventlog.recorded import read_log
from tasktape.proxy import RecordingProxy

# The answer, as its deltas: enough of them for gaps worth measuring.
PIECES = ("The ", "tape ", "keeps ", "every ", "token", ", ", "with ", "the ", "time ", "it ", "came", ".")
DELAY = 0.03  # seconds between two events of a token stream
BROKEN_SESSION = "broken-session"
HOSTILE = "back again <script>alert(1)</script>"  # what a server sends is shown, never run
PAUSE_MS = 400  # the paused copy of the chat stream waits this long before "token"
MS = 1_000_000


@contextlib.asynccontextmanager
async def recorder(path: Path) -> AsyncIterator[RecordFactory]:
    """Like conftest's ``record`` fixture, with every proxy writing into the one log at
    ``path`` (each proxy its own capture)."""
    writer = LogWriter(path)
    servers: list[TestServer] = []
    session = aiohttp.ClientSession(auto_decompress=False)

    async def start(upstream: web.Application | str) -> Recording:
        if isinstance(upstream, web.Application):
            up = TestServer(upstream, host="127.0.0.1")
            await up.start_server()
            servers.append(up)
            upstream = str(up.make_url("")).rstrip("/")
        proxy = RecordingProxy(upstream, writer)
        server = TestServer(proxy.app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return Recording(str(server.make_url("")).rstrip("/"), upstream, proxy, writer, path, session)

    try:
        yield start
    finally:
        await session.close()
        for server in reversed(servers):
            await server.close()
        await writer.aclose()


async def record_protocols(path: Path) -> dict[str, Any]:
    """Record the sessions and streams into ``path``; what the clients got, by name."""
    got: dict[str, Any] = {}
    async with recorder(path) as record:
        got["mcp1"], _ = await recorded_session(record, generation("mcp1"))
        got["mcp1-resumed"], _ = await recorded_session(record, generation("mcp1-resumed"))
        if (MCP2 / "mcp").is_dir():
            got["mcp2-stateless"], _ = await recorded_session(record, generation("mcp2-stateless"))
        rec = await record(openai_app(PIECES, delay=DELAY))
        got["chat"] = await chat(rec.url)
        got["responses"] = await responses(rec.url)
        rec = await record(anthropic_app(PIECES, delay=DELAY))
        got["messages"] = await messages(rec.url)
        rec = await record(anthropic_app(PIECES, delay=0, overloaded_after=2))
        with contextlib.suppress(anthropic.APIStatusError):
            await messages(rec.url)
        (await rec.log()).close()  # every exchange ended and committed
    return got


def add_broken_session(path: Path) -> None:
    """An MCP session whose tool call reports progress going back, then fails; the
    checker's findings about it saved into the log (as ``tasktape check`` does)."""
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "flaky", "arguments": {"times": 2}, "_meta": {"progressToken": 7}},
    }
    frames: list[dict[str, Any]] = [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": 7, "progress": done, "total": 3, "message": message},
        }
        for done, message in ((2, "halfway"), (1, HOSTILE))
    ]
    frames.append({"jsonrpc": "2.0", "id": 7, "error": {"code": -32603, "message": "flaky broke"}})
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(
            cap,
            method="POST",
            path="/mcp",
            request_headers=[("content-type", "application/json"), ("mcp-session-id", BROKEN_SESSION)],
            request_body=json.dumps(call).encode(),
            started_ns=time.time_ns(),
        )
        w.response_head(
            ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS
        )
        for n, frame in enumerate(frames, 1):
            w.chunk(ex, n * 30 * MS, f"event: message\ndata: {json.dumps(frame)}\n\n".encode())
        w.end_exchange(ex, duration_ns=(len(frames) + 1) * 30 * MS)
        w.end_capture(cap)
    with EventLog(path) as log:
        ids = [x["id"] for x in log.exchanges() if x["session_id"] == BROKEN_SESSION]
        findings = check_log(log, ids)
    save_findings(path, findings, exchange_ids=ids)


def add_paused_stream(path: Path) -> int:
    """The recorded chat stream once more, its bytes as they were, with a pause (a model
    thinking mid-answer) before the delta "token"; returns its exchange id."""
    with EventLog(path) as log:
        (chat_id,) = [x["id"] for x in log.exchanges() if x["rpc_method"] == "chat.completions"]
    (chat,) = read_log(path, [chat_id])
    at = next(i for i, (_, data) in enumerate(chat.chunks) if b'"content":"token"' in data)
    chunks = [
        (offset + (PAUSE_MS * MS if i >= at else 0), data) for i, (offset, data) in enumerate(chat.chunks)
    ]
    paused = dataclasses.replace(chat, chunks=chunks, duration_ns=(chat.duration_ns or 0) + PAUSE_MS * MS)
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        (exchange_id,) = load_into(w, [paused], cap)
        w.end_capture(cap)
    return exchange_id


def protocol_log(path: Path) -> tuple[dict[str, Any], int]:
    """Record the log at ``path``: what the clients got, and the paused stream's exchange id."""
    got = asyncio.run(record_protocols(path))
    add_broken_session(path)
    return got, add_paused_stream(path)
