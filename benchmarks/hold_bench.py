"""What ``tasktape record --resume`` costs on streams that never drop, side by side with
``tasktape record`` in one run: events/s, delivery latency, and the CPU of the whole process
tree (the forwarding process and its log writer, until every event is in the log) per event.

The agent (``proxy_bench.upstream_main``) streams 200-byte events in the shapes agents write them: as the
a2a-sdk does (CRLF line ends, no ids), as ``tasktape agent`` does (LF, an id on each) and LF
without ids; each as fast as the clients read them, and paced 5 ms apart. Rounds interleave
the recorders, so a slow spell of the machine hits each; a second ``tasktape record``, the
control, shows how far two runs of the same recorder differ: a cost of --resume is
measurable where its ratio to ``tasktape record`` leaves the control's.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .harness import Section, middle_half, percentiles
from .proxy_bench import cpu_seconds, free_port, logged_events, process, start_upstream

EVENT_SIZE = 200
RUNS, QUICK_RUNS = 5, 1
RECORD, CONTROL, RESUMING = "tasktape record", "tasktape record (control)", "tasktape record --resume"


@dataclass(frozen=True)
class Shape:
    name: str
    crlf: bool
    ids: bool

    @property
    def query(self) -> str:
        return f"crlf={int(self.crlf)}&ids={int(self.ids)}"

    @property
    def blank(self) -> bytes:
        return b"\r\n\r\n" if self.crlf else b"\n\n"


SHAPES = (
    Shape("a2a-sdk (CRLF, no ids)", crlf=True, ids=False),
    Shape("tasktape agent (LF, ids)", crlf=False, ids=True),
    Shape("LF, no ids", crlf=False, ids=False),
)


async def streams_run(
    url: str, shape: Shape, streams: int, n: int, delay: float
) -> tuple[float, list[float]]:
    """Concurrent streams: events/s received in all, and each event's delivery latency (ms)."""
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> int:
            events, buffer = 0, b""
            target = f"{url}/stream?n={n}&delay={delay}&{shape.query}"
            async with session.post(target, data=b"{}") as response:
                async for data in response.content.iter_any():
                    now = time.time_ns()
                    *whole, buffer = (buffer + data).split(shape.blank)
                    events += len(whole)
                    if delay:
                        for event in whole:
                            at = event.index(b'"sent":') + 7
                            latencies.append((now - int(event[at : event.index(b",", at)])) / 1e6)
            return events

        start = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.perf_counter() - start
    assert sum(counts) == streams * n, counts
    return sum(counts) / elapsed, latencies


@dataclass
class Recorder:
    url: str
    pid: int
    db: Path
    logged: int = 0


def run(quick: bool) -> list[Section]:
    flat, paced = ((10, 2_000), (10, 200)) if quick else ((50, 2_000), (50, 200))
    runs = QUICK_RUNS if quick else RUNS
    python = sys.executable
    samples: dict[tuple[str, str, str], list[tuple[float, float, float, list[float]]]] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        upstream = start_upstream(stack)
        recorders = {}
        for name, extra in ((RECORD, []), (CONTROL, []), (RESUMING, ["--resume"])):
            port, db = free_port(), tmp / f"{len(recorders)}.db"
            args = ["record", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(db)]
            command = [python, "-m", "tasktape", *args, "--quiet", *extra]
            pid = stack.enter_context(process(command, "listening on")).pid
            recorders[name] = Recorder(f"http://127.0.0.1:{port}", pid, db)
        workloads = [("as fast as read", *flat, 0.0), ("5 ms apart", *paced, 0.005)]
        for r in recorders.values():  # warm up connections and code paths
            asyncio.run(streams_run(r.url, SHAPES[0], 2, 50, 0.0))
            r.logged += 100
            logged_events(r.db, r.logged)
        for _ in range(runs):
            for shape in SHAPES:
                for pace, streams, n, delay in workloads:
                    for name, r in recorders.items():
                        forwarding0, tree0 = cpu_seconds(r.pid), cpu_seconds(r.pid, with_children=True)
                        rate, latencies = asyncio.run(streams_run(r.url, shape, streams, n, delay))
                        r.logged += streams * n
                        logged_events(r.db, r.logged)
                        per = 1e6 / (streams * n)
                        forwarding = (cpu_seconds(r.pid) - forwarding0) * per
                        tree = (cpu_seconds(r.pid, with_children=True) - tree0) * per
                        samples.setdefault((shape.name, pace, name), []).append(
                            (rate, tree, forwarding, latencies)
                        )
    section = Section(
        "Resume gateway: what --resume costs on streams that never drop",
        [
            "stream",
            "events",
            "path",
            "events/s",
            "CPU µs per event (whole tree)",
            "vs record (middle half of the rounds)",
            "of which forwarding",
            "delivery p50 ms",
        ],
    )
    spans: dict[str, list[tuple[float, float]]] = {CONTROL: [], RESUMING: []}
    for shape in SHAPES:
        for pace, streams, n, _ in workloads:
            base = samples[(shape.name, pace, RECORD)]
            for name in recorders:
                runs_ = samples[(shape.name, pace, name)]
                rate = statistics.median(s[0] for s in runs_)
                cpu = statistics.median(s[1] for s in runs_)
                forwarding = statistics.median(s[2] for s in runs_)
                latencies = [x for s in runs_ for x in s[3]]
                p50 = f"{percentiles(latencies)[0]:.3f}" if latencies else "-"
                # Each round's CPU against record's in the same round: a slow spell hits both.
                ratios = sorted(s[1] / b[1] for s, b in zip(runs_, base, strict=True))
                ratio = f"{statistics.median(ratios):.2f}x"
                if name != RECORD:
                    low, high = middle_half(ratios)
                    spans[name].append((low, high))
                    ratio += f" ({low:.2f}x-{high:.2f}x)"
                events = f"{streams} x {n:,}, {pace}"
                section.add(shape.name, events, name, rate, cpu, ratio, forwarding, p50)
    section.notes.append(
        f"Medians of {runs} rounds; each round runs every recorder on every shape, in turn. CPU counts "
        "the recorder's process and its log writer, from the first request until every event is "
        "committed to the log. The control is a second `tasktape record`: its ratios to the first "
        "are the spread of the measurement itself. The middle halves of the rounds' ratios: "
        f"--resume {_hull(spans[RESUMING])}, the control {_hull(spans[CONTROL])}."
    )
    return [section]


def _hull(spans: list[tuple[float, float]]) -> str:
    return f"{min(s[0] for s in spans):.2f}x-{max(s[1] for s in spans):.2f}x"
