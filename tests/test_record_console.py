"""What `tasktape record` prints while it records: one line per exchange, with the traffic's
control characters escaped, the proxy's own failures and refusals even with --quiet, and
what the log could not keep."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
from aiohttp import web
from loopback import Running, answering, raw_upstream, running, serve, stop, upstream_app
from ports import free_port
from test_gateway_rejoin import breaking, read_all
from test_resume_gateway import REST_BODY

from tasktape.agent import create_agent_app


def plain_and_huge() -> web.Application:
    """An upstream answering /plain with a line and /huge with 3 MiB."""

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="hello\n")

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=os.urandom(3 * 1024 * 1024), content_type="application/octet-stream")

    async def rpc(request: web.Request) -> web.Response:
        return web.json_response({"jsonrpc": "2.0", "id": 1, "result": {}})

    async def gzipped_stream(request: web.Request) -> web.Response:
        body = gzip.compress(b"data: one\n\ndata: two\n\n")
        headers = {"Content-Type": "text/event-stream", "Content-Encoding": "gzip"}
        return web.Response(body=body, headers=headers)

    async def upload(request: web.Request) -> web.Response:
        return web.Response(text=f"{len(await request.read())}\n")

    app = web.Application()
    app.router.add_get("/plain", plain)
    app.router.add_get("/huge", huge)
    app.router.add_post("/jsonrpc", rpc)
    app.router.add_post("/upload", upload)
    app.router.add_get("/gz", gzipped_stream)
    return app


def recorder(upstream: str, db: Path, *args: str) -> AbstractAsyncContextManager[Running]:
    return running("record", "--listen", "127.0.0.1:0", "--upstream", upstream, "--db", str(db), *args)


async def get(url: str, headers: dict[str, str] | None = None) -> int:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        await r.read()
        return r.status


async def stopped(run: Running) -> tuple[int, list[str], str]:
    """Its exit status, the lines it printed on stdout after the first, and its stderr."""
    status = await stop(run, signal.SIGINT)
    return status, run.printed[1].splitlines(), run.printed[2]


async def test_control_characters_from_the_traffic_are_escaped(tmp_path: Path) -> None:
    """A JSON-RPC method could clear the terminal, set its title, or forge a line of its own."""
    methods = ["\x1b[2J\x1b]0;pwned-title\x07", "GetTask) 200  took 1.0 ms\nPOST /message:send (SendMessage"]
    async with serve(plain_and_huge()) as upstream, recorder(upstream, tmp_path / "log.db") as run:
        async with aiohttp.ClientSession() as session:
            for method in methods:
                body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
                headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}
                async with session.post(f"{run.url}/jsonrpc", data=body, headers=headers) as r:
                    assert r.status == 200
        status, lines, _ = await stopped(run)
    assert status == 0
    assert len(lines) == 2, lines
    assert "\x1b" not in "".join(lines) and "\x07" not in "".join(lines)
    assert lines[0].startswith("POST /jsonrpc (\\x1b[2J\\x1b]0;pwned-title\\x07) 200")
    assert lines[1].startswith("POST /jsonrpc (GetTask) 200  took 1.0 ms\\x0aPOST /message:send")


async def test_quiet_still_says_the_upstream_is_down(tmp_path: Path) -> None:
    """--quiet prints errors: an upstream that cannot be reached, at start and per request."""
    upstream = f"http://127.0.0.1:{free_port()}"
    async with recorder(upstream, tmp_path / "log.db", "--quiet") as run:
        assert await get(f"{run.url}/x") == 502
        status, lines, err = await stopped(run)
    assert status == 0
    assert f"the upstream {upstream} did not answer (Connection refused)" in err
    assert [line.partition("  took")[0] for line in lines] == ["GET /x 502"]
    # With why: the log's error, said where the operator looks.
    why = r"\[upstream_error: upstream \S+ failed before answering: ClientConnectorError: .*\]$"
    assert re.search(why, lines[0]), lines[0]


async def test_refused_requests_are_printed_even_with_quiet(tmp_path: Path) -> None:
    async with serve(plain_and_huge()) as upstream, recorder(upstream, tmp_path / "log.db", "--quiet") as run:
        assert await get(f"{run.url}/plain", {"Host": "evil.example"}) == 421
        upgrade = {"Upgrade": "websocket", "Connection": "Upgrade"}
        assert await get(f"{run.url}/ws", upgrade) == 501
        status, lines, _ = await stopped(run)
    assert status == 0
    assert lines[0].startswith("GET /plain 421  [refused: Host 'evil.example' is not a name")
    assert lines[1].startswith("GET /ws 501  [refused: a WebSocket upgrade")
    assert len(lines) == 2


async def test_exchanges_a_full_log_could_not_keep_say_so(tmp_path: Path) -> None:
    """Past --max-log-size, the line of an exchange says what of it is not in the log."""
    db = tmp_path / "log.db"
    async with (
        serve(plain_and_huge()) as upstream,
        recorder(upstream, db, "--max-log-size", "2000000") as run,
    ):
        lines = []
        for path in ("/plain", "/huge", "/plain"):  # each committed before the next
            assert await get(f"{run.url}{path}") == 200
            lines.append((await run.proc.stdout.readline()).decode())  # type: ignore[union-attr]
        status, _, err = await stopped(run)
    assert status == 3 and "rows could not be written" in err
    assert [re.sub(r"took [\d.]+ ms", "took", line.strip()) for line in lines] == [
        "GET /plain 200  took",
        "GET /huge 200  took  recorded without its body: the log is full",
        "GET /plain 200  took  not recorded: the log is full",
    ]


async def test_a_response_cut_at_max_body_says_so(tmp_path: Path) -> None:
    """The client gets all 3 MiB, the log only the first 1 MiB: the line says the log's copy is cut."""
    async with (
        serve(plain_and_huge()) as upstream,
        recorder(upstream, tmp_path / "log.db", "--max-body", str(1024 * 1024)) as run,
    ):
        lines = []
        for path in ("/plain", "/huge"):  # each printed before the next
            assert await get(f"{run.url}{path}") == 200
            lines.append((await run.proc.stdout.readline()).decode())  # type: ignore[union-attr]
        status, _, _ = await stopped(run)
    assert status == 0
    assert [re.sub(r"took [\d.]+ ms", "took", line.strip()) for line in lines] == [
        "GET /plain 200  took",
        "GET /huge 200  took  body cut at 1 MiB in the log",
    ]


async def test_a_request_cut_at_max_body_says_so(tmp_path: Path) -> None:
    """The upstream gets every byte of an upload, the log only the first --max-body: the
    line says so, for a body read whole and for one streamed through alike."""

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"y" * 50_000

    async with (
        serve(plain_and_huge()) as upstream,
        recorder(upstream, tmp_path / "log.db", "--max-body", "16384") as run,
        aiohttp.ClientSession() as session,
    ):
        lines, received = [], []
        for body in (b"x" * 1000, b"x" * 40_000, chunked()):
            async with session.post(f"{run.url}/upload", data=body) as r:
                received.append(await r.text())
            lines.append((await run.proc.stdout.readline()).decode())  # type: ignore[union-attr]
        status, _, _ = await stopped(run)
    assert status == 0 and received == ["1000\n", "40000\n", "200000\n"]
    assert [re.sub(r"took [\d.]+ ms", "took", line.strip()) for line in lines] == [
        "POST /upload 200  took",
        "POST /upload 200  took  request body cut at 16 KiB in the log",
        "POST /upload 200  took  request body cut at 16 KiB in the log",
    ]


async def test_a_502_says_why_without_the_upstreams_bytes(tmp_path: Path) -> None:
    """aiohttp quotes the bytes it could not read, with a caret and the URL after them: the
    client's 502 and the log say what went wrong, not what the upstream sent."""
    db = tmp_path / "log.db"
    answer = b'id: 0\ndata: {"token": "sk-live-0123"}\n\n'
    async with raw_upstream(answering(answer)) as upstream, recorder(upstream, db) as run:
        async with aiohttp.ClientSession() as session, session.get(f"{run.url}/sse?key=k9") as r:
            body = await r.text()
        status, lines, _ = await stopped(run)
    assert status == 0 and r.status == 502
    with sqlite3.connect(db) as conn:
        (error,) = conn.execute("SELECT error FROM exchanges").fetchone()
    for said in (body, error):
        assert "sent bytes where no HTTP response starts" in said and "Bad status line" in said, said
        assert "sk-live" not in said and "id: 0" not in said and "key=k9" not in said, said
    (line,) = lines
    assert re.sub(r"took [\d.]+ ms", "took", line).startswith("GET /sse 502  took  [upstream_error: ")
    assert "Bad status line" in line and "sk-live" not in line and "id: 0" not in line, line


async def test_bytes_that_are_not_utf8_are_escaped(tmp_path: Path) -> None:
    """A Last-Event-ID with a Latin-1 byte reaches the console as a lone surrogate, which a
    terminal shows as mojibake and grep takes for binary: it is printed as its escape."""
    async with serve(upstream_app()) as upstream, recorder(upstream, tmp_path / "log.db", "--resume") as run:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{run.url}/message:stream", json={}) as r,
        ):
            await r.read()
        host, port = run.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = b"POST /message:stream HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: e1\xe9\r\n"
        writer.write(
            head + b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
        writer.close()
        status, lines, _ = await stopped(run)
    assert status == 0  # (and its output was read as UTF-8)
    resumes = [line for line in lines if line.startswith("resume: ")]
    assert resumes == [
        "resume: exchange 1: a client reconnected after e1\\udce9: refused "
        "(Last-Event-ID 'e1\\udce9' names no event of the stream held here)"
    ]


async def test_a_compressed_stream_not_held_for_resuming_says_so(tmp_path: Path) -> None:
    """With --resume, a stream the upstream compressed passes through as it came, and
    cannot be resumed: its line says so (it was said nowhere), as does the log."""
    db = tmp_path / "log.db"
    async with serve(plain_and_huge()) as upstream, recorder(upstream, db, "--resume") as run:
        assert await get(f"{run.url}/gz") == 200
        line = (await run.proc.stdout.readline()).decode()  # type: ignore[union-attr]
        status, _, _ = await stopped(run)
    said = (
        "not held for resuming: the upstream sent the stream with Content-Encoding gzip, "
        "which cannot be given ids or cut into events"
    )
    assert status == 0
    assert re.sub(r"[\d.]+ ms", "", line.strip()) == f"GET /gz 200  2 events, first after   took   [{said}]"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT outcome, error FROM exchanges").fetchall() == [("complete", said)]


async def test_quiet_says_how_a_broken_stream_it_said_went_on(tmp_path: Path) -> None:
    """--quiet --resume prints an agent stream that broke (a failure): the rejoin that
    carried it on is printed too, or the operator reads a loss where there was none."""
    async with serve(create_agent_app(pace=0.05)) as agent:
        front, _ = breaking(agent, after=6)
        async with (
            serve(front) as upstream,
            recorder(upstream, tmp_path / "log.db", "--resume", "--quiet") as run,
        ):
            assert "TASK_STATE_COMPLETED" in (await read_all(run.url, REST_BODY)).decode()
            await asyncio.sleep(0.3)  # (the stream's rows reach the console)
            status, lines, _ = await stopped(run)
    assert status == 0
    broke = [line for line in lines if "upstream_disconnected" in line]
    rejoined = [
        line for line in lines if line.startswith("resume: exchange 1: the agent's stream broke: rejoined")
    ]
    assert len(broke) == 1 and len(rejoined) == 1, lines
