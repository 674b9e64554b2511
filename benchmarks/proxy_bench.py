"""The recording proxy side by side with a direct connection and a bare aiohttp
pass-through that records nothing, each in its own process, on loopback.

Workloads: one stream of 500 events 5 ms apart (added latency per event, time to first
event) and 50 concurrent streams of 2,000 200-byte events sent as fast as possible
(events/s, and the CPU seconds the proxy process used).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web

from .harness import Section, percentiles

EVENT_SIZE = 200
RUNS = 3


# -- the processes ---------------------------------------------------------------------------


def upstream_main(port: int) -> None:
    """An SSE agent: /stream?n=N&delay=S sends N events of EVENT_SIZE bytes, each stamped
    with the wall-clock time it was written."""

    async def stream(request: web.Request) -> web.StreamResponse:
        n, delay = int(request.query["n"]), float(request.query.get("delay", 0))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(n):
            stamp = f'"sent":{time.time_ns()},"n":{i}'
            head = f'data: {{"artifactUpdate":{{"taskId":"t","append":true,{stamp},"pad":"'
            tail = '"}}\n\n'
            await response.write((head + "x" * (EVENT_SIZE - len(head) - len(tail)) + tail).encode())
            if delay:
                await asyncio.sleep(delay)
        return response

    app = web.Application()
    app.router.add_post("/stream", stream)
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *_: print("ready", flush=True))


def passthrough_main(port: int, upstream: str) -> None:
    """The simplest streaming aiohttp reverse proxy: no recording at all."""

    async def forward(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        async with session.request(
            request.method, upstream + request.raw_path, data=body, headers=request.headers
        ) as upstream_response:
            response = web.StreamResponse(
                status=upstream_response.status, headers={"Content-Type": upstream_response.content_type}
            )
            await response.prepare(request)
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
            return response

    async def session(app: web.Application):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await app["session"].close()

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    web.run_app(app, host="127.0.0.1", port=port, print=lambda *_: print("ready", flush=True))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process(args: list[str], ready: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if re.search(ready, line):
                break
        else:
            raise RuntimeError(f"{args} did not start")
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU of a process (and of its live child processes)."""
    pids = [pid]
    if children:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    pids.append(int(stat.parent.name))
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def logged_events(db: Path, expected: int, timeout: float = 120.0) -> float:
    """Wait until the log holds ``expected`` events; return when (perf_counter)."""
    deadline = time.perf_counter() + timeout
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        while conn.execute("SELECT count(*) FROM events").fetchone()[0] < expected:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the log never reached {expected} events")
            time.sleep(0.01)
    return time.perf_counter()


# -- the client --------------------------------------------------------------------------------


async def latency_run(url: str, n: int) -> tuple[list[float], float]:
    """One paced stream: per-event delivery latency (ms) and time to first event (ms)."""
    latencies: list[float] = []
    buffer = b""
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        first = None
        async with session.post(f"{url}/stream?n={n}&delay=0.005", data=b"{}") as response:
            async for data in response.content.iter_any():
                now = time.time_ns()
                if first is None:
                    first = (time.perf_counter() - start) * 1000
                buffer += data
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    sent = json.loads(event[6:])["artifactUpdate"]["sent"]
                    latencies.append((now - sent) / 1e6)
    assert len(latencies) == n
    return latencies, first or 0.0


async def throughput_run(url: str, streams: int, n: int) -> float:
    """Concurrent streams as fast as they go: events/s received in all."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> int:
            size = 0
            async with session.post(f"{url}/stream?n={n}", data=b"{}") as response:
                async for data in response.content.iter_any():
                    size += len(data)
            return size // EVENT_SIZE

        start = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.perf_counter() - start
    assert sum(counts) == streams * n, counts
    return sum(counts) / elapsed


def run(quick: bool) -> list[Section]:
    n_latency, streams, n_events = (200, 10, 500) if quick else (500, 50, 2000)
    up_port = free_port()
    python = sys.executable
    bench = "import sys; from benchmarks.proxy_bench import {}; {}(*sys.argv[1:])"
    with (
        tempfile.TemporaryDirectory() as tmp,
        process([python, "-c", bench.format("upstream_main", "upstream_main"), str(up_port)], "ready"),
    ):
        upstream = f"http://127.0.0.1:{up_port}"
        pass_port, rec_port = free_port(), free_port()
        variants = {"direct": (None, upstream)}
        results: dict[str, dict[str, float]] = {}
        with (
            process(
                [
                    python,
                    "-c",
                    bench.format("passthrough_main", "passthrough_main"),
                    str(pass_port),
                    upstream,
                ],
                "ready",
            ) as passthrough,
            process(
                [
                    python,
                    "-m",
                    "tasktape",
                    "record",
                    "--upstream",
                    upstream,
                    "--listen",
                    f"127.0.0.1:{rec_port}",
                    "--db",
                    str(Path(tmp) / "bench.db"),
                    "--quiet",
                ],
                "listening on",
            ) as recorder,
        ):
            variants["bare aiohttp pass-through"] = (passthrough, f"http://127.0.0.1:{pass_port}")
            variants["tasktape record"] = (recorder, f"http://127.0.0.1:{rec_port}")
            db = Path(tmp) / "bench.db"
            samples: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
            for name, (_, url) in variants.items():
                asyncio.run(latency_run(url, 20))  # warm up connections and code paths
                latencies, first = asyncio.run(latency_run(url, n_latency))
                samples[name] |= {"latency": latencies, "first": [first]}
            logged = 20 + n_latency
            logged_events(db, logged)
            # Rounds interleave the variants, so a slow spell of the machine hits them all.
            for _ in range(RUNS):
                for name, (proc, url) in variants.items():
                    cpu0 = cpu_seconds(proc.pid) if proc else 0.0
                    all0 = cpu_seconds(proc.pid, children=True) if proc else 0.0
                    start = time.perf_counter()
                    rate = asyncio.run(throughput_run(url, streams, n_events))
                    sample = {"rate": rate}
                    if proc:
                        sample["cpu"] = cpu_seconds(proc.pid) - cpu0
                    if name == "tasktape record":
                        # Forwarding may run ahead of the log: also time the log catching up.
                        logged += streams * n_events
                        sample["recorded"] = streams * n_events / (logged_events(db, logged) - start)
                        sample["writer_cpu"] = cpu_seconds(proc.pid, children=True) - all0 - sample["cpu"]
                    for key, value in sample.items():
                        samples[name].setdefault(key, []).append(value)
        for name, sample in samples.items():
            p50, p99, _ = percentiles(sample["latency"])
            median = {key: statistics.median(values) for key, values in sample.items() if key != "latency"}
            results[name] = {"p50": p50, "p99": p99, "cpu": 0.0, "writer_cpu": 0.0, "recorded": 0.0, **median}
    base, bare = results["direct"], results["bare aiohttp pass-through"]
    latency = Section(
        f"Proxy: one stream of {n_latency} events 5 ms apart",
        ["path", "latency p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "time to first event ms"],
    )
    rate = Section(
        f"Proxy: {streams} concurrent streams of {n_events:,} {EVENT_SIZE}-byte events",
        [
            "path",
            "events/s",
            "vs direct",
            "vs bare pass-through",
            "proxy CPU s",
            "log writer CPU s",
            "all in the log, events/s",
        ],
    )
    for name, r in results.items():
        latency.add(name, r["p50"], r["p99"], r["p50"] - base["p50"], r["p99"] - base["p99"], r["first"])
        rate.add(
            name,
            r["rate"],
            f"{r['rate'] / base['rate']:.2f}x",
            f"{r['rate'] / bare['rate']:.2f}x",
            r["cpu"] if name != "direct" else "-",
            r["writer_cpu"] or "-",
            r["recorded"] or "-",
        )
    rec, bare_added = results["tasktape record"], bare["p50"] - base["p50"]
    latency.notes.append(
        f"Added p50 latency of tasktape record: {rec['p50'] - base['p50']:.3f} ms "
        f"({(rec['p50'] - base['p50']) / bare_added:.2f}x the bare pass-through's {bare_added:.3f} ms)."
        if bare_added > 0
        else "The bare pass-through added no measurable latency."
    )
    rate.notes.append(
        f"Medians of {RUNS} runs. events/s is what the clients received; CPU seconds are per run (the "
        "log writer is tasktape's child process, at a lower priority); the last column counts until "
        "every event is committed to the log."
    )
    return [latency, rate]
