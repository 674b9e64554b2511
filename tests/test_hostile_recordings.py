"""Hostile upstreams, recorded through a real proxy and followed through check, the
inspector, export and import, and replay: whatever an upstream sends, each step says what
it found, and none of them fails or sends what was never recorded."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner, Result
from conftest import RecordFactory, Recording
from datasette.app import Datasette
from inspector_log import page

from tasktape.cli import main
from tasktape.eventlog import EventLog
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.checker import report_log
from tasktape.eventlog.recorded import read_log
from tasktape.inspector.app import create_datasette
from tasktape.replay.server import ReplayServer

MCP_HEADERS = {"MCP-Protocol-Version": "2025-11-25", "Content-Type": "application/json"}
SESSION = "s-hostile"


def tasktape(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def sse_app(*events: bytes, headers: dict[str, str] | None = None) -> web.Application:
    """An upstream answering every POST with these SSE events (each a data line's bytes)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
        await response.prepare(request)
        for n, data in enumerate(events):
            await response.write(b"id: e%d\ndata: %s\n\n" % (n, data))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


async def recorded(recording: Recording, path: str, body: bytes, headers: dict[str, str]) -> Path:
    """The log once the proxy has recorded one POST."""
    async with recording.session.post(recording.url + path, data=body, headers=headers) as response:
        await response.read()
    (await recording.log()).close()
    return recording.db


def mcp_call(rpc_id: object) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": {"name": "t"}}
    ).encode()


# -- JSON-RPC ids that are no string, number or null ----------------------------------------


async def test_an_mcp_id_that_is_an_object_is_a_finding_and_the_session_page_shows(
    record: RecordFactory,
) -> None:
    """JSON-RPC ids are strings, numbers or null: an object or array id answers no request.
    check says so (it once failed on the log with a traceback), and the session page draws."""
    upstream = sse_app(
        b'{"jsonrpc":"2.0","id":{"a":[1,2]},"result":{}}',
        b'{"jsonrpc":"2.0","id":[7],"result":{}}',
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":{"t":1},"progress":1}}',
        b'{"jsonrpc":"2.0","id":7,"result":{}}',
    )
    recording = await record(upstream)
    headers = {**MCP_HEADERS, "Mcp-Session-Id": SESSION}
    db = await recorded(recording, "/mcp", mcp_call(7), headers)
    # A request whose own id is an object: no answer can be matched to it.
    db2 = await recorded(await record(upstream), "/mcp", mcp_call({"x": 1}), headers)

    result = tasktape("check", db, db2)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 1, result.output
    assert (
        f'{db.name} exchange 1 event 0  mcp-one-response: id {{"a": [1, 2]}} is no string, number or null'
        in (result.output)
    )
    assert (
        f"{db.name} exchange 1 event 1  mcp-one-response: id [7] is no string, number or null"
        in result.output
    )
    assert (
        f'{db2.name} exchange 1  mcp-one-response: id {{"x": 1}} is no string, number or null'
        in result.output
    )
    with EventLog(db) as log:  # request 7 got its answer, once
        assert [f.message for f in report_log(log).findings if "request 7" in f.message] == []

    ds: Datasette = create_datasette(db)
    html = await page(ds, f"/{db.stem}/-/session/{SESSION}")
    assert "tools/call" in html


async def test_a_server_request_and_its_answer_with_a_boolean_id_are_findings(record: RecordFactory) -> None:
    """A server's request with the id ``true`` can be answered by no one (true is no
    JSON-RPC id), nor can a client's answer carrying it be matched: check says so of both."""
    upstream = sse_app(
        b'{"jsonrpc":"2.0","id":true,"method":"sampling/createMessage","params":{}}',
        b'{"jsonrpc":"2.0","id":7,"result":{}}',
    )
    recording = await record(upstream)
    headers = {**MCP_HEADERS, "Mcp-Session-Id": SESSION}
    await recorded(recording, "/mcp", mcp_call(7), headers)
    answer = json.dumps({"jsonrpc": "2.0", "id": True, "result": {}}).encode()
    db = await recorded(recording, "/mcp", answer, headers)

    result = tasktape("check", db)
    assert result.exit_code == 1, result.output
    findings = [line for line in result.output.splitlines() if "no string, number or null" in line]
    assert findings == [  # (the upstream answered the answer with its stream again)
        f"-  {db} exchange 1 event 0  mcp-one-response: id true is no string, number or null",
        f"-  {db} exchange 2  mcp-one-response: id true is no string, number or null",
        f"-  {db} exchange 2 event 0  mcp-one-response: id true is no string, number or null",
    ]


# -- the inspector's pages on hostile JSON -------------------------------------------------


async def test_a_lone_surrogate_and_json_nested_deep_are_shown_as_they_are(record: RecordFactory) -> None:
    """JSON may escape a lone surrogate, which no page can send as a character: the pages
    show it escaped. JSON nested past Python's recursion limit is shown as the text it is."""
    deep = b"[" * 100_000 + b"]" * 100_000
    recording = await record(sse_app(b'{"text":"\\ud800 caf\xc3\xa9"}', deep))
    db = await recorded(recording, "/", b'{"deep":' + deep + b"}", {"Content-Type": "application/json"})
    ds = create_datasette(db)
    for path in (f"/{db.stem}/events", f"/{db.stem}/exchanges", f"/{db.stem}/exchanges/1"):
        html = await page(ds, path)
        assert "</html>" in html, path
    events = await page(ds, f"/{db.stem}/events")
    assert "&#34;text&#34;: &#34;\\ud800 café&#34;" in events
    assert "[[[[[[[[" in await page(ds, f"/{db.stem}/exchanges")


# -- export and import: what a log holds, a cassette holds and gives back --------------------


@pytest.fixture
async def raw_upstream() -> AsyncIterator[str]:
    """An upstream writing its response's bytes as they are (what no web framework sends):
    a status of 999, a header value holding a control character."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line[15:]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
        )
        await reader.readexactly(length)
        status = b"999 Odd" if b"/odd-status" in head.split(b"\r\n", 1)[0] else b"200 OK"
        writer.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nX-Ctl: a\x01b\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()
    await server.wait_closed()


async def test_a_log_of_odd_status_and_headers_goes_through_export_and_import_whole(
    record: RecordFactory, raw_upstream: str, tmp_path: Path
) -> None:
    """HTTP/1.1 sends any three-digit status, and a parser reads a header value holding a
    control character (but CR, LF, NUL): the log keeps both, and so does its cassette, read
    back by import as it was written (replay leaves out the header it cannot send)."""
    recording = await record(raw_upstream)
    for path in ("/odd-status", "/"):
        async with recording.session.get(recording.url + path) as response:
            await response.read()
    (await recording.log()).close()
    held = [(r.status, r.response_headers) for r in read_log(recording.db)]
    assert [(status, ("X-Ctl", "a\x01b") in headers) for status, headers in held] == [
        (999, True),
        (200, True),
    ]

    cassette, again = tmp_path / "odd.jsonl", tmp_path / "again.db"
    exported = tasktape("export", recording.db, "-o", cassette)
    assert exported.exit_code == 0, exported.output
    assert [(r.status, r.response_headers) for r in read_cassette(cassette)] == held
    imported = tasktape("import", cassette, "--db", again)
    assert imported.exit_code == 0, imported.output
    assert [(r.status, r.response_headers) for r in read_log(again)] == held


# -- replay: a recording it cannot send as it came is said, and never sent corrupt ----------


def body_app(body: bytes, headers: dict[str, str]) -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, headers=headers)

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


async def replayed(db: Path, path: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
    """What a replay of the log answers a POST with: status, body and headers."""
    server = TestServer(ReplayServer(read_log(db), speed=0).app, host="127.0.0.1")
    await server.start_server()
    try:
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.post(server.make_url(path), data=body) as response,
        ):
            return response.status, await response.read(), dict(response.headers)
    finally:
        await server.close()


async def test_a_body_decoded_only_in_part_is_refused_not_sent_corrupt(
    record: RecordFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Past --max-decoded the log keeps the rest of a gzip body as it came: the decoded part
    and the compressed rest are no body a client can read, and the wire bytes are gone. The
    replay says so as it loads the log, and answers the request with its own error."""
    bomb = gzip.compress(b"\0" * 200_000)
    recording = await record(body_app(bomb, {"Content-Encoding": "gzip"}), max_decoded=10_000)
    db = await recorded(recording, "/bomb", b"{}", {"Content-Type": "application/json"})
    with caplog.at_level(logging.WARNING, "tasktape.replay"):
        status, body, headers = await replayed(db, "/bomb", b"{}")
    said = "the log holds its body decoded only in part and the rest as it came, still encoded"
    assert any(said in m and "answered with a 502 error" in m for m in caplog.messages), caplog.messages
    assert status == 502 and "Content-Encoding" not in headers
    message = json.loads(body)["error"]["message"]
    assert "POST /bomb" in message and "decodes to more than 10,000 bytes" in message
    assert said in message


async def test_a_body_cut_at_max_body_is_said_as_the_replay_loads_it(
    record: RecordFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A body over --max-body is kept cut: replayed cut, and the replay says so."""
    whole = json.dumps({"items": ["x" * 100] * 100}).encode()
    recording = await record(body_app(whole, {"Content-Type": "application/json"}), max_body=1_000)
    db = await recorded(recording, "/big", b"{}", {"Content-Type": "application/json"})
    with caplog.at_level(logging.WARNING, "tasktape.replay"):
        status, body, _ = await replayed(db, "/big", b"{}")
    assert (status, body) == (200, whole[:1_000])
    assert any(
        "POST /big" in m
        and "its body was cut when recorded (--max-body), 1,000 bytes kept: it is replayed cut" in m
        for m in caplog.messages
    ), caplog.messages
