"""Under load and faults, as real processes on loopback: `tasktape record` loses and reorders
nothing, keeps its memory bounded, survives upstreams and clients that fail at random and a
disk that fills, and `tasktape replay` serves hundreds of clients at once.

Default sizes keep this under a minute; ``--stress`` runs them at full size."""

from __future__ import annotations

import asyncio
import random
import resource
import socket
import sqlite3
import struct
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from loopback import running, serve, stop

from tasktape.eventlog import EventLog
from tasktape.eventlog.cassette import read_cassette

ROOT = Path(__file__).resolve().parent.parent


def frame(stream: int, n: int) -> bytes:
    """Event n of stream ``stream``: its place is in its id and its data, so loss or
    reordering shows."""
    append = str(n > 0).lower()
    data = (
        f'{{"artifactUpdate":{{"taskId":"task.{stream}","contextId":"ctx.{stream}","append":{append},'
        f'"artifact":{{"artifactId":"art.{stream}","parts":[{{"text":" token {stream}.{n}"}}]}}}}}}'
    )
    return f"id: {stream}.{n}\ndata: {data}\n\n".encode()


def expected(stream: int, events: int) -> bytes:
    return b"".join(frame(stream, n) for n in range(events))


@dataclass
class Plan:
    """What the upstream does with one stream: send ``events`` events, pausing ``stall``
    seconds before event ``stall_at``, then end as ``ending`` says after ``cut_at`` events."""

    events: int
    ending: str = "complete"  # complete, drop (close mid-event), reset (TCP RST)
    cut_at: int = 0
    stall_at: int = -1
    stall: float = 0.0
    sent: bytearray = field(default_factory=bytearray)


def upstream_app(plans: dict[int, Plan], gap: float) -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        n = int(request.query["n"])
        plan = plans[n]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(plan.events):
            if i == plan.stall_at:
                await asyncio.sleep(plan.stall)
            data = frame(n, i)
            if plan.ending != "complete" and i == plan.cut_at:
                data = data[: len(data) // 2]  # half an event, then gone
                await response.write(data)
                plan.sent += data
                _cut(request, reset=plan.ending == "reset")
                return response
            await response.write(data)
            plan.sent += data
            if gap:
                await asyncio.sleep(gap)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


def _cut(request: web.Request, *, reset: bool) -> None:
    transport = request.transport
    assert transport is not None
    if reset:  # SO_LINGER 0: the close sends RST, not FIN
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _more_files() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def record_args(upstream: str, db: Path) -> list[str]:
    return ["record", "--listen", "127.0.0.1:0", "--upstream", upstream, "--db", str(db), "--quiet"]


def limits(file_size: int | None = None) -> Callable[[], None]:
    """Run in the child before it starts: more files, and a disk that fills at ``file_size``."""

    def apply() -> None:
        _more_files()
        if file_size is not None:  # writes beyond it fail (EFBIG), as on a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return apply


def rss_kib(pid: int, field_name: str) -> int:
    """A process's resident memory (VmRSS now, VmHWM its peak), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field_name} for {pid}")


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def read_stream(session: aiohttp.ClientSession, url: str, n: int, vanish_after: int | None) -> bytes:
    """The bytes a client got; with ``vanish_after``, it goes away after that many bytes."""
    received = bytearray()
    try:
        async with session.post(f"{url}/message:stream?n={n}", json={}) as r:
            async for data in r.content.iter_any():
                received += data
                if vanish_after is not None and len(received) >= vanish_after:
                    r.close()  # the client vanishes mid-stream
                    break
    except aiohttp.ClientPayloadError:
        pass  # the upstream cut it: what arrived before is what counts
    return bytes(received)


async def test_500_concurrent_streams_lose_nothing_and_memory_stays_bounded(
    tmp_path: Path, stress: bool
) -> None:
    _more_files()
    streams, events = (500, 200) if stress else (200, 100)
    plans = {n: Plan(events) for n in range(streams)}
    db = tmp_path / "load.db"
    async with (
        serve(upstream_app(plans, gap=0.002)) as upstream,
        running(*record_args(upstream, db), preexec_fn=limits()) as run,
    ):
        (writer,) = children(run.proc.pid)
        idle = rss_kib(run.proc.pid, "VmRSS")
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            got = await asyncio.gather(*(read_stream(session, run.url, n, None) for n in range(streams)))
        peak, writer_peak = rss_kib(run.proc.pid, "VmHWM"), rss_kib(writer, "VmHWM")
        code = await stop(run)
    assert code == 0, run.printed
    for n, body in enumerate(got):
        assert body == expected(n, events), f"stream {n} reached its client changed"
    with EventLog(db) as log:
        exchanges = {int(x["query"].removeprefix("n=")): x for x in log.exchanges()}
        assert sorted(exchanges) == list(range(streams))
        for n, x in exchanges.items():
            assert x["outcome"] == "complete"
            assert log.body(x["id"]) == expected(n, events), f"stream {n} is not in the log as sent"
            ids = [
                row[0]
                for row in log.db.execute(
                    "SELECT event_id FROM events WHERE exchange_id = ? ORDER BY seq", [x["id"]]
                )
            ]
            assert ids == [f"{n}.{i}" for i in range(events)]
    per_stream = (peak - idle) / streams
    print(
        f"\n{streams} streams: proxy peak RSS {peak} KiB ({per_stream:.0f} KiB per open stream over "
        f"{idle} KiB idle); log writer peak {writer_peak} KiB"
    )
    # Bounded: nothing is buffered per stream beyond a chunk in flight.
    assert per_stream < 256, f"{per_stream:.0f} KiB of proxy memory per open stream"


async def test_random_upstream_and_client_failures(tmp_path: Path, stress: bool) -> None:
    rng = random.Random(2026)
    streams, events = (300, 60) if stress else (60, 40)
    plans: dict[int, Plan] = {}
    vanish: dict[int, int | None] = {}
    for n in range(streams):
        plan = Plan(
            events, ending=rng.choice(["complete", "complete", "drop", "reset"]), cut_at=rng.randrange(events)
        )
        if rng.random() < 0.3:
            plan.stall_at, plan.stall = rng.randrange(events), rng.uniform(0.05, 0.4)
        plans[n] = plan
        full = len(expected(n, events))
        vanish[n] = rng.randrange(1, full) if rng.random() < 0.25 else None
    db = tmp_path / "chaos.db"
    async with (
        serve(upstream_app(plans, gap=0.001)) as upstream,
        running(*record_args(upstream, db), preexec_fn=limits()) as run,
    ):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            got = await asyncio.gather(*(read_stream(session, run.url, n, vanish[n]) for n in range(streams)))
        code = await stop(run)
    assert code == 0, run.printed
    with EventLog(db) as log:
        exchanges = {int(x["query"].removeprefix("n=")): x for x in log.exchanges()}
        assert sorted(exchanges) == list(range(streams)), "every request is in the log"
        for n, plan in plans.items():
            x, body, sent = exchanges[n], log.body(exchanges[n]["id"]), bytes(plan.sent)
            # The client got exactly what the upstream sent (up to where it went away) ...
            assert sent.startswith(got[n]), f"stream {n}: the client got bytes the upstream never sent"
            # ... and the log holds what the upstream sent, as far as it was forwarded.
            assert sent.startswith(body) and body.startswith(got[n]), f"stream {n}: log and traffic differ"
            outcome = x["outcome"]
            if outcome == "client_disconnected":
                assert vanish[n] is not None, (n, x["error"])
            elif outcome == "complete":
                assert plan.ending == "complete" and body == sent, n
                assert vanish[n] is not None or got[n] == sent, n
            else:
                assert outcome == "upstream_disconnected" and plan.ending != "complete", (n, outcome)
                assert body == sent and (vanish[n] is not None or got[n] == sent), n


async def test_a_disk_that_fills_mid_capture(tmp_path: Path) -> None:
    # A short first stream is committed before the disk fills, so there is something to read.
    plans = {0: Plan(10), **{n: Plan(2000) for n in range(1, 4)}}
    db = tmp_path / "full.db"
    limit = 1_000_000  # the log's file may not grow past this: writes beyond it fail
    async with (
        serve(upstream_app(plans, gap=0)) as upstream,
        running(*record_args(upstream, db), preexec_fn=limits(file_size=limit)) as run,
    ):
        async with aiohttp.ClientSession() as session:
            got = [await read_stream(session, run.url, 0, None)]
            await committed(db, exchanges=1)
            got += [await read_stream(session, run.url, n, None) for n in range(1, 4)]
        code = await stop(run)
    # Forwarding never stopped; the failure is reported loudly, with the exit status.
    assert got == [expected(n, plans[n].events) for n in range(4)]
    assert code == 3 and "WRITING THE LOG FAILED" in run.printed[-1], run.printed
    with EventLog(db) as log:  # what was written stays readable
        assert log.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert log.exchanges()[0]["query"] == "n=0"


async def committed(db: Path, exchanges: int, timeout: float = 10.0) -> None:
    """Wait until the log holds ``exchanges`` finished exchanges, read as another process would."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                done = conn.execute("SELECT count(*) FROM exchanges WHERE outcome IS NOT NULL").fetchone()[0]
        except sqlite3.OperationalError:
            done = 0  # not created yet
        if done >= exchanges:
            return
        assert asyncio.get_running_loop().time() < deadline, f"{exchanges} exchanges never committed"
        await asyncio.sleep(0.02)


async def test_replay_serves_200_clients_at_once(stress: bool) -> None:
    _more_files()
    clients = 500 if stress else 200
    cassette = ROOT / "cassettes" / "long_stream.jsonl"
    (_card, stream) = read_cassette(cassette)
    body: Any = {"message": {"role": "ROLE_USER", "parts": [{"text": "A long answer, please"}]}}
    args = ["replay", str(cassette), "--listen", "127.0.0.1:0", "--allow-repeats"]
    async with running(*args, preexec_fn=limits()) as run:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def one() -> bytes:
                async with session.post(f"{run.url}/message:stream", json=body) as r:
                    assert r.status == 200
                    return await r.read()

            got = await asyncio.gather(*(one() for _ in range(clients)))
        code = await stop(run)
    assert code == 0, run.printed
    assert all(b == stream.body for b in got), "a client got other bytes than the recording"
    assert f"{clients} served" in "".join(run.printed)
