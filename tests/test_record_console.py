"""What `tasktape record` prints while it records: one line per exchange, with the traffic's
control characters escaped, the proxy's own failures and refusals even with --quiet, and
what the log could not keep."""

from __future__ import annotations

import json
import os
import re
import signal
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
from aiohttp import web
from loopback import Running, running, serve, stop
from ports import free_port


def plain_and_huge() -> web.Application:
    """An upstream answering /plain with a line and /huge with 3 MiB."""

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="hello\n")

    async def huge(request: web.Request) -> web.Response:
        return web.Response(body=os.urandom(3 * 1024 * 1024), content_type="application/octet-stream")

    async def rpc(request: web.Request) -> web.Response:
        return web.json_response({"jsonrpc": "2.0", "id": 1, "result": {}})

    app = web.Application()
    app.router.add_get("/plain", plain)
    app.router.add_get("/huge", huge)
    app.router.add_post("/jsonrpc", rpc)
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
    assert lines[0].endswith("[upstream_error]")


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
