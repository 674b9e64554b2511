"""The recording proxy side by side with a direct connection, a bare aiohttp pass-through
that records nothing, and itself with its log off, each in its own process, on loopback.

Workloads: one stream of 500 events 5 ms apart (added latency per event, time to first
event) and 50 concurrent streams of 2,000 200-byte events sent as fast as possible
(events/s, and the CPU seconds the proxy process used).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from tasktape.event_loop import loop_factory
from tasktape.eventlog.producer import NullWriter
from tasktape.proxy import RecordingProxy

from .harness import Section, percentiles

EVENT_SIZE = 200
BARE = "bare aiohttp pass-through"
UNRECORDED = "tasktape's proxy, log off"
CONTROL = "bare aiohttp pass-through, a second process"
RECORD = "tasktape record"
RESUMING = "tasktape record --resume"
# How a benchmark process starts: python -c BENCH.format("passthrough_main") ARGS...
BENCH = "import sys; from benchmarks.proxy_bench import {0}; {0}(*sys.argv[1:])"
RUNS = 5


# -- the processes ---------------------------------------------------------------------------


def upstream_main(port: int) -> None:
    """An SSE agent: /stream?n=N&delay=S sends N events of EVENT_SIZE bytes, each stamped
    with the wall-clock time it was written; with ``crlf=1`` its lines end in CRLF (as the
    a2a-sdk's do), with ``ids=1`` each event has an id (as ``tasktape agent``'s do)."""

    async def stream(request: web.Request) -> web.StreamResponse:
        n, delay = int(request.query["n"]), float(request.query.get("delay", 0))
        nl = "\r\n" if request.query.get("crlf") == "1" else "\n"
        ids = request.query.get("ids") == "1"
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(n):
            stamp = f'"sent":{time.time_ns()},"n":{i}'
            id_line = f"id: {i}{nl}" if ids else ""
            head = f'{id_line}data: {{"artifactUpdate":{{"taskId":"t","append":true,{stamp},"pad":"'
            tail = f'"}}}}{nl}{nl}'
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


def unrecorded_main(port: int, upstream: str) -> None:
    """tasktape record's proxy, on the event loop tasktape record runs on, with a writer that
    keeps nothing: what forwarding alone costs."""
    factory = loop_factory("auto")
    proxy = RecordingProxy(upstream, NullWriter())
    web.run_app(
        proxy.app,
        host="127.0.0.1",
        port=port,
        print=lambda *_: print("ready", flush=True),
        loop=factory() if factory else None,
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process(args: list[str], ready: str | int) -> Iterator[subprocess.Popen[str]]:
    """A process, ready once it prints a line matching ``ready`` or, for a port number,
    once that port accepts connections; stopped with SIGINT."""
    by_port = isinstance(ready, int)
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL if by_port else subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        if not (listening(ready, proc) if by_port else printed(str(ready), proc)):
            raise RuntimeError(f"{args} did not start")
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def printed(pattern: str, proc: subprocess.Popen[str], timeout: float = 20) -> bool:
    """Whether ``proc`` prints a line matching ``pattern`` within ``timeout`` (a line that
    never comes is waited for no longer: a blocking read would wait for ever)."""
    assert proc.stdout is not None
    stdout, found = proc.stdout, threading.Event()

    def read() -> None:  # (on a thread: it ends when the process does, stopped or not)
        for line in stdout:
            if re.search(pattern, line):
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    return found.wait(timeout)


def listening(port: int, proc: subprocess.Popen[str], timeout: float = 20) -> bool:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


def children(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def cpu_seconds(pid: int, *, with_children: bool = False) -> float:
    """User + system CPU of a process, to the nanosecond; with ``with_children``, of its
    live child processes too, and of the children they have waited for."""
    tree = [pid, *children(pid)] if with_children else [pid]
    return sum(_process_cpu(p) + (_waited_for_cpu(p) if with_children else 0.0) for p in tree)


_CPUCLOCK_SCHED = 2  # the kernel's nanosecond count of a CPU clock (clock_getcpuclockid's)


def _process_cpu(pid: int) -> float:
    """CPU seconds of every thread of a process, ended ones too, read from its CPU clock
    (/proc/PID/stat counts in 10 ms ticks; per-thread schedstat forgets threads that ended)."""
    with contextlib.suppress(OSError):
        return time.clock_gettime_ns(((~pid) << 3) | _CPUCLOCK_SCHED) / 1e9
    return 0.0


def _waited_for_cpu(pid: int) -> float:
    """CPU seconds of the child processes ``pid`` has waited for: kept in ticks only."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def tree_cpu(sample: dict[str, list[float]]) -> list[float]:
    """Each run's CPU seconds across a path's process tree: forwarding plus its log writer."""
    writer = sample.get("writer_cpu") or [0.0] * len(sample["cpu"])
    return [c + w for c, w in zip(sample["cpu"], writer, strict=True)]


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
                    # Its data line (a resuming recorder adds an id line after it).
                    data_line = next(line for line in event.split(b"\n") if line.startswith(b"data: "))
                    sent = json.loads(data_line[6:])["artifactUpdate"]["sent"]
                    latencies.append((now - sent) / 1e6)
    assert len(latencies) == n
    return latencies, first or 0.0


async def throughput_run(url: str, streams: int, n: int, *, delay: float = 0, ids: bool = False) -> float:
    """Concurrent streams (as fast as they go, or ``delay`` seconds between events; with
    ``ids``, each event with an id of the agent's): events/s received in all."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> int:
            # Events, counted by the blank lines that end them (a resuming recorder adds an
            # id line to each, so their size is not the upstream's).
            events, tail = 0, b""
            target = f"{url}/stream?n={n}&delay={delay}&ids={int(ids)}"
            async with session.post(target, data=b"{}") as response:
                async for data in response.content.iter_any():
                    events += (tail + data).count(b"\n\n")
                    tail = data[-1:]
            return events

        start = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.perf_counter() - start
    assert sum(counts) == streams * n, counts
    return sum(counts) / elapsed


@dataclass
class Variant:
    url: str
    pid: int | None = None  # the forwarding process, for its CPU
    db: Path | None = None  # its event log, written by a child process (its log writer)


@dataclass
class Launch:
    """How one path's process starts: ready once it prints ``ready`` or, for a port
    number, once that port accepts connections."""

    args: list[str]
    ready: str | int
    port: int
    db: Path | None = None
    wrapped: bool = False  # the command starts the proxy as its child (tasktape mitm)


def launches(tmp: Path, upstream: str, *, control: bool = False, mitm: bool = True) -> dict[str, Launch]:
    """Every proxy path to the upstream (without ``mitm``, none of mitmdump's); with
    ``control``, a second bare pass-through too, whose ratio to the first is the
    measurement's own spread."""
    python = sys.executable
    paths = {}
    for name, main in (
        (BARE, "passthrough_main"),
        (CONTROL, "passthrough_main"),
        (UNRECORDED, "unrecorded_main"),
    ):
        if name != CONTROL or control:
            port = free_port()
            paths[name] = Launch([python, "-c", BENCH.format(main), str(port), upstream], "ready", port)
    port, db = free_port(), tmp / "record.db"
    args = ["record", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(db), "--quiet"]
    paths[RECORD] = Launch([python, "-m", "tasktape", *args], "listening on", port, db)
    # The resume gateway, on streams that never drop: what holding them costs.
    port, db = free_port(), tmp / "resume.db"
    args = ["record", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(db), "--quiet"]
    paths[RESUMING] = Launch([python, "-m", "tasktape", *args, "--resume"], "listening on", port, db)
    if not mitm or importlib.util.find_spec("mitmproxy") is None:
        return paths
    mitmdump = str(Path(python).with_name("mitmdump"))

    def mode(port: int) -> list[str]:
        return ["--mode", f"reverse:{upstream}@{port}", "-q", "--set", f"confdir={tmp / 'mitmproxy'}"]

    port = free_port()
    args = [mitmdump, *mode(port), "--set", "stream_large_bodies=1"]
    paths["mitmdump, streaming"] = Launch(args, port, port)
    port, tee = free_port(), Path(__file__).with_name("mitm_naive_tee.py")
    args = [mitmdump, "-s", str(tee), "--set", f"naive_tee_db={tmp / 'naive.db'}", *mode(port)]
    paths["mitmdump, streaming + naive SQLite tee"] = Launch(args, port, port)
    port, db = free_port(), tmp / "mitm.db"
    args = [python, "-m", "tasktape", "mitm", "--db", str(db), "--", *mode(port)]
    paths["tasktape mitm"] = Launch(args, port, port, db, wrapped=True)
    return paths


def start_variants(
    stack: contextlib.ExitStack, tmp: Path, upstream: str, *, control: bool = False, mitm: bool = True
) -> dict[str, Variant]:
    """Every path to the upstream, each proxy in its own process (see ``launches``)."""
    variants = {"direct": Variant(upstream)}
    for name, launch in launches(tmp, upstream, control=control, mitm=mitm).items():
        pid = stack.enter_context(process(launch.args, launch.ready)).pid
        if launch.wrapped:
            (pid,) = children(pid)  # the proxy itself, under the command
        variants[name] = Variant(f"http://127.0.0.1:{launch.port}", pid, launch.db)
    return variants


def start_upstream(stack: contextlib.ExitStack) -> str:
    """The benchmark agent (``upstream_main``) in its own process, until ``stack`` closes; its URL."""
    port = free_port()
    stack.enter_context(process([sys.executable, "-c", BENCH.format("upstream_main"), str(port)], "ready"))
    return f"http://127.0.0.1:{port}"


def run(quick: bool) -> list[Section]:
    n_latency, streams, n_events = (200, 10, 500) if quick else (500, 50, 2000)
    results: dict[str, dict[str, float]] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        variants = start_variants(stack, tmp, start_upstream(stack))
        samples: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
        for name, v in variants.items():
            asyncio.run(latency_run(v.url, 20))  # warm up connections and code paths
            latencies, first = asyncio.run(latency_run(v.url, n_latency))
            samples[name] |= {"latency": latencies, "first": [first]}
        logged = {name: 20 + n_latency for name, v in variants.items() if v.db}
        for name, count in logged.items():
            logged_events(variants[name].db, count)  # type: ignore[arg-type]
        # Rounds interleave the variants, so a slow spell of the machine hits them all.
        for _ in range(RUNS):
            for name, v in variants.items():
                cpu0 = cpu_seconds(v.pid) if v.pid else 0.0
                all0 = cpu_seconds(v.pid, with_children=True) if v.pid else 0.0
                start = time.perf_counter()
                rate = asyncio.run(throughput_run(v.url, streams, n_events))
                sample = {"rate": rate}
                if v.pid:
                    sample["cpu"] = cpu_seconds(v.pid) - cpu0
                if v.db and v.pid:
                    # Forwarding may run ahead of the log: also time the log catching up.
                    logged[name] += streams * n_events
                    sample["recorded"] = streams * n_events / (logged_events(v.db, logged[name]) - start)
                    sample["writer_cpu"] = cpu_seconds(v.pid, with_children=True) - all0 - sample["cpu"]
                for key, value in sample.items():
                    samples[name].setdefault(key, []).append(value)
        for name, sample in samples.items():
            p50, p99, _ = percentiles(sample["latency"])
            median = {key: statistics.median(values) for key, values in sample.items() if key != "latency"}
            results[name] = {"p50": p50, "p99": p99, "cpu": 0.0, "writer_cpu": 0.0, "recorded": 0.0, **median}
    events = streams * n_events
    tree = {name: tree_cpu(sample) for name, sample in samples.items() if "cpu" in sample}
    for name, used in tree.items():
        results[name]["tree_us"] = statistics.median(used) / events * 1e6
        results[name]["tree_ratio"] = statistics.median(u / b for u, b in zip(used, tree[BARE], strict=True))
    base, bare = results["direct"], results[BARE]
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
            "CPU µs/event, process tree",
            "vs bare pass-through",
            "of it, log writer µs",
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
            f"{r['tree_us']:.2f}" if "tree_us" in r else "-",
            f"{r['tree_ratio']:.2f}x" if "tree_ratio" in r else "-",
            f"{r['writer_cpu'] / events * 1e6:.2f}" if r["writer_cpu"] else "-",
            r["recorded"] or "-",
        )
    rec, bare_added = results[RECORD], bare["p50"] - base["p50"]
    latency.notes.append(
        f"Added p50 latency of tasktape record: {rec['p50'] - base['p50']:.3f} ms "
        f"({(rec['p50'] - base['p50']) / bare_added:.2f}x the bare pass-through's {bare_added:.3f} ms)."
        if bare_added > 0
        else "The bare pass-through added no measurable latency."
    )
    rate.notes.append(
        f"Medians of {RUNS} runs. events/s is what the clients received. CPU is user + system time of "
        "the proxy's process and its child processes (tasktape's log writer, at a lower priority) until "
        "every event is committed to the log, per event; its ratio is the median of each run's to the "
        "bare pass-through's in the same round. The last column counts until every event is in the log."
    )
    if "tasktape mitm" not in results:
        rate.notes.append(
            "mitmproxy is not installed, so its rows are left out: pip install 'tasktape[mitm]'."
        )
        return [latency, rate]
    mitm, plain = results["tasktape mitm"], results["mitmdump, streaming"]
    naive = results["mitmdump, streaming + naive SQLite tee"]
    latency.notes.append(
        f"Added p50 latency of tasktape mitm over streaming mitmdump: {mitm['p50'] - plain['p50']:.3f} ms; "
        f"of the naive SQLite tee: {naive['p50'] - plain['p50']:.3f} ms."
    )
    rate.notes.append(
        f"Against streaming mitmdump (`--set stream_large_bodies=1`), tasktape mitm forwards "
        f"{mitm['rate'] / plain['rate']:.2f}x its events/s with {mitm['cpu'] / plain['cpu']:.2f}x its CPU in "
        f"mitmdump's process and {mitm['tree_us'] / plain['tree_us']:.2f}x across the process tree; a naive "
        f"tee committing each chunk to SQLite on mitmproxy's event loop, "
        f"{naive['rate'] / plain['rate']:.2f}x with {naive['tree_us'] / plain['tree_us']:.2f}x."
    )
    return [latency, rate]
