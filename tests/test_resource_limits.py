"""`tasktape record` under a file size limit (``ulimit -f``), as a real process: a write
past the limit fails with EFBIG, which SQLite reports as a disk I/O error rather than as a
full disk, and the log must still keep an end for every exchange it holds."""

from __future__ import annotations

import asyncio
import json
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import aiohttp
from aiohttp import web
from loopback import running, serve, stop

# The log's file may not grow past this (an empty log takes about 540 KB): the short
# stream fits, the big one does not.
FILE_SIZE_LIMIT = 1_000_000
BIG_EVENTS = 80  # of 64 KiB each: 5 MiB
SMALL = b"".join(b'data: {"n": %d}\n\n' % n for n in range(10))


def file_size_limit(size: int) -> Callable[[], None]:
    """Run in the child before it starts: writes past ``size`` fail (EFBIG), as on a full disk."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def big_event(n: int) -> bytes:
    return b'data: {"n": %d, "x": "' % n + b"x" * 65536 + b'"}\n\n'


def streams(opened: asyncio.Event) -> web.Application:
    """An agent with a short stream, a big one, and one that stays open until the end."""

    async def answer(request: web.Request, frames: list[bytes], pause: float = 0) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n, frame in enumerate(frames):
            await response.write(frame)
            if n == 0:
                await asyncio.sleep(pause)
        return response

    async def small(request: web.Request) -> web.StreamResponse:
        return await answer(request, [SMALL])

    async def big(request: web.Request) -> web.StreamResponse:
        # Its row is committed before the rest fills the log.
        return await answer(request, [big_event(n) for n in range(BIG_EVENTS)], pause=0.3)

    async def open_stream(request: web.Request) -> web.StreamResponse:
        response = await answer(request, [b'data: {"open": true}\n\n'])
        opened.set()
        await asyncio.sleep(3600)  # until the recorder stops
        return response

    app = web.Application()
    app.router.add_post("/small", small)
    app.router.add_post("/big", big)
    app.router.add_post("/open", open_stream)
    return app


async def read(session: aiohttp.ClientSession, url: str) -> bytes:
    try:
        async with session.post(url, json={}) as r:
            return await r.read()
    except aiohttp.ClientPayloadError:
        return b""  # cut short when the recorder stopped: not what is checked


async def committed(db: Path, exchanges: int, timeout: float = 10.0) -> None:
    """Wait until the log holds ``exchanges`` finished exchanges, read as another process would."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                done = conn.execute("SELECT count(*) FROM exchanges WHERE outcome IS NOT NULL").fetchone()[0]
        except sqlite3.OperationalError:
            done = 0  # not made yet
        if done >= exchanges:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{db} holds fewer than {exchanges} finished exchanges")


async def test_a_file_size_limit_keeps_every_exchange_with_its_end(tmp_path: Path) -> None:
    """Past the limit the log takes nothing new, but what it holds is whole: each exchange
    has its outcome, and one whose bytes it lost says so."""
    db = tmp_path / "limited.db"
    opened = asyncio.Event()
    async with (
        serve(streams(opened)) as upstream,
        running(
            "record",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
            "--db",
            str(db),
            "--quiet",
            preexec_fn=file_size_limit(FILE_SIZE_LIMIT),
        ) as run,
        aiohttp.ClientSession() as session,
    ):
        assert await read(session, f"{run.url}/small") == SMALL
        await committed(db, exchanges=1)
        still_open = asyncio.create_task(read(session, f"{run.url}/open"))
        await asyncio.wait_for(opened.wait(), 10)
        await asyncio.sleep(0.3)  # its head and first event are committed
        big = await read(session, f"{run.url}/big")
        await asyncio.sleep(0.3)  # the log is full by now
        assert await read(session, f"{run.url}/small") == SMALL
        code = await stop(run)
        await still_open
    # Traffic went through whole; the writer process lived through the limit (SIGXFSZ
    # does not kill it) and the failure is loud.
    assert big == b"".join(big_event(n) for n in range(BIG_EVENTS))
    assert code == 3, run.printed
    assert "WRITING THE LOG FAILED" in run.printed[-1] and "gone" not in run.printed[-1], run.printed
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        rows = conn.execute(
            "SELECT path, outcome, response_body_truncated, error FROM exchanges ORDER BY id"
        ).fetchall()
        orphans = conn.execute(
            "SELECT count(*) FROM events WHERE exchange_id NOT IN (SELECT id FROM exchanges)"
        ).fetchone()[0]
    assert rows and rows[0][:2] == ("/small", "complete"), rows
    assert [row for row in rows if row[1] is None] == [], "an exchange in the log without its end"
    assert orphans == 0
    (big_row,) = [row for row in rows if row[0] == "/big"]  # kept without its bytes, saying so
    assert big_row[1:3] == ("complete", 1) and "the log is full" in big_row[3], rows


# A library user's writer, in a process of its own under the limit: each chunk committed
# alone, so that the log fills a few pages at a time and no big batch leaves room behind.
_SMALL_BATCHES = """
import json, sys
from tasktape.eventlog import LogWriter
w = LogWriter(sys.argv[1], on_error=lambda exc, rows: None)
exchanges = [w.begin_exchange(w.begin_capture(source="test"), method="POST", path=f"/{n}") for n in range(20)]
for n, ex in enumerate(exchanges):
    w.response_head(ex, status=200, headers=None, is_sse=False, ttfb_ns=n + 1)
w.flush()
for i in range(300):
    w.chunk(exchanges[i % 20], i, bytes([i % 256]) * 3000)
    w.flush()
ended = [w.end_exchange(ex, duration_ns=500).result(timeout=30) for ex in exchanges[:10]]
w.close()
print(json.dumps({"lost": w.stats.rows_lost, "kept": [s.kept for s in ended]}))
"""


def test_a_file_size_limit_reached_a_little_at_a_time_leaves_every_end(tmp_path: Path) -> None:
    """The room a failed big batch leaves is not there: the ends of the exchanges under way
    still fit, over what the -wal file held."""
    db = tmp_path / "small.db"
    result = subprocess.run(
        [sys.executable, "-c", _SMALL_BATCHES, str(db)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        preexec_fn=file_size_limit(700_000),
    )
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said["lost"] > 0 and set(said["kept"]) == {"recorded without its body"}, said
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        outcomes = conn.execute("SELECT outcome, count(*) FROM exchanges GROUP BY outcome").fetchall()
        notes = conn.execute("SELECT DISTINCT error FROM exchanges").fetchall()
    assert sorted(outcomes) == [("complete", 10), ("log_closed", 10)], outcomes
    assert all("the log is full" in error for (error,) in notes), notes
