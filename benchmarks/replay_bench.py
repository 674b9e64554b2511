"""The replay server, run as ``tasktape replay`` in its own process: pacing error and
drift on a long stream at speed 1, events/s at speed 0 (one stream, and 50 at once), and
the time from the command to its first answer."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tasktape.eventlog import SSEDecoder
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded

from .harness import Section, percentiles
from .proxy_bench import free_port, process


def stream(n: int, gap_ms: float) -> Recorded:
    """A recorded token stream: n events of about 200 bytes, gap_ms apart, one per chunk."""
    chunks = []
    for i in range(n):
        frame = (
            f'id: {i}\ndata: {{"artifactUpdate":{{"taskId":"task.1","append":true,"artifact":'
            f'{{"artifactId":"art.1","parts":[{{"text":" token{i}"}}]}}}}}}\n\n'
        )
        chunks.append((round((i + 1) * gap_ms * 1e6), frame.encode()))
    return Recorded(
        method="POST",
        path="/message:stream",
        request_body=b'{"message": {}}',
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        ttfb_ns=1_000_000,
        chunks=chunks,
        duration_ns=chunks[-1][0],
        outcome="complete",
    )


async def arrivals(url: str) -> list[float]:
    """When each event arrived, in seconds after the request was sent."""
    decoder, times = SSEDecoder(keep_raw=False), []
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        async with session.post(f"{url}/message:stream", data=b'{"message": {}}') as response:
            async for data in response.content.iter_any():
                times += [time.perf_counter() - start] * len(decoder.feed(data))
    return times


async def rate(url: str, streams: int, n: int) -> float:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> int:
            decoder, count = SSEDecoder(keep_raw=False), 0
            async with session.post(f"{url}/message:stream", data=b'{"message": {}}') as response:
                async for data in response.content.iter_any():
                    count += len(decoder.feed(data))
            return count

        start = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
    assert counts == [n] * streams, counts
    return streams * n / (time.perf_counter() - start)


def replay_command(cassette: Path, port: int, speed: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tasktape",
        "replay",
        str(cassette),
        "--listen",
        f"127.0.0.1:{port}",
        "--speed",
        str(speed),
    ]


def replay(cassette: Path, port: int, speed: float):
    return process([*replay_command(cassette, port, speed), "--allow-repeats"], "exchanges? from")


def startup(cassette: Path) -> float:
    """Seconds from starting the command to its first answer."""
    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        replay_command(cassette, port, 0),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )

    async def first_answer() -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.post(
                        f"http://127.0.0.1:{port}/message:stream", data=b'{"message": {}}'
                    ) as r:
                        await r.read()
                        return
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.005)

    try:
        asyncio.run(asyncio.wait_for(first_answer(), 60))
        return time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait()


def run(quick: bool) -> list[Section]:
    n_paced, gap_ms = (2_000, 1.0) if quick else (10_000, 1.0)
    n_fast, streams, n_each = (20_000, 10, 2_000) if quick else (100_000, 50, 20_000)
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        paced = Path(tmp) / "paced.jsonl"
        write_cassette(paced, [stream(n_paced, gap_ms)])
        port = free_port()
        with replay(paced, port, 1.0):
            # The server's first answer pays for its cold start (code paths, the cassette's
            # pages): a warm-up request, so that pacing is measured on a served stream.
            asyncio.run(arrivals(f"http://127.0.0.1:{port}"))
            times = asyncio.run(arrivals(f"http://127.0.0.1:{port}"))
        recorded = [(i + 1) * gap_ms / 1000 for i in range(n_paced)]
        errors = [((t - times[0]) - (r - recorded[0])) * 1000 for t, r in zip(times, recorded, strict=True)]
        p50, p99, worst = percentiles([abs(e) for e in errors])
        pacing = Section(
            f"Replay pacing: one stream of {n_paced:,} events {gap_ms:g} ms apart, at speed 1",
            ["pacing error p50 ms", "p99 ms", "max ms", "drift at the last event ms", "first event late ms"],
        )
        pacing.add(p50, p99, worst, f"{errors[-1]:+.3f}", f"{(times[0] - recorded[0]) * 1000:+.3f}")
        pacing.notes.append(
            "Error: how far each event arrived from its recorded moment, both counted from the "
            "first event (the client is another process on loopback), on the second request to the "
            "server (the first warms it up). First event late: from the request sent to the first "
            "event received, over its recorded moment."
        )
        sections.append(pacing)

        fast = Path(tmp) / "fast.jsonl"
        write_cassette(fast, [stream(n_fast, 0.01)])
        each = Path(tmp) / "each.jsonl"
        write_cassette(each, [stream(n_each, 0.01)])
        speed = Section(
            "Replay at speed 0 (as fast as possible)", ["streams", "events per stream", "events/s"]
        )
        port = free_port()
        with replay(fast, port, 0.0):
            speed.add(
                1, n_fast, max(asyncio.run(rate(f"http://127.0.0.1:{port}", 1, n_fast)) for _ in range(3))
            )
        port = free_port()
        with replay(each, port, 0.0):
            speed.add(
                streams,
                n_each,
                max(asyncio.run(rate(f"http://127.0.0.1:{port}", streams, n_each)) for _ in range(2)),
            )
        sections.append(speed)

        started = Section("Replay start-up", ["from the command to its first answer, s"])
        started.add(min(startup(fast) for _ in range(3)))
        sections.append(started)
    return sections
