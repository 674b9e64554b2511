"""How the capture paths' throughput grows with concurrency (10 to 500 streams) and with
stream length, each path in its own process against the same upstream."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .harness import Section
from .proxy_bench import EVENT_SIZE, free_port, process, start_variants, throughput_run

CONCURRENCY = (10, 50, 100, 500)  # streams at once, TOTAL events among them
TOTAL = 100_000
LENGTHS = (100, 1_000, 10_000)  # events per stream, STREAMS streams at once
STREAMS = 10
MIN_SECONDS = 0.5  # a shape is run again until it took this long: short runs are noise
BARE = "bare aiohttp pass-through"

# What the last run measured, for the chart: {path: {(streams, events): events/s}}, and
# which (streams, events) shapes made each comparison.
RESULTS: dict[str, dict[tuple[int, int], float]] = {}
SHAPES: dict[str, list[tuple[int, int]]] = {}


def run(quick: bool) -> list[Section]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 500 streams: 1,000+ sockets
    total = TOTAL // 10 if quick else TOTAL
    by_concurrency = [(n, total // n) for n in (CONCURRENCY[:2] if quick else CONCURRENCY)]
    by_length = [(STREAMS, n) for n in (LENGTHS[:2] if quick else LENGTHS)]
    RESULTS.clear()
    SHAPES.update(concurrency=by_concurrency, length=by_length)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        port = free_port()
        upstream = (
            "import sys; from benchmarks.proxy_bench import upstream_main; upstream_main(*sys.argv[1:])"
        )
        stack.enter_context(process([sys.executable, "-c", upstream, str(port)], "ready"))
        variants = start_variants(stack, tmp, f"http://127.0.0.1:{port}")
        for name, v in variants.items():
            asyncio.run(throughput_run(v.url, 2, 20))  # warm up connections and code paths
            RESULTS[name] = {}
        for shape in dict.fromkeys(by_concurrency + by_length):
            # Best of two, the paths interleaved: a slow spell of the machine hits them all.
            for _ in range(2):
                for name, v in variants.items():
                    rate = asyncio.run(_sustained(v.url, *shape))
                    RESULTS[name][shape] = max(rate, RESULTS[name].get(shape, 0.0))
    return [
        _section(
            f"Throughput by concurrency: {total:,} {EVENT_SIZE}-byte events among the streams",
            by_concurrency,
            lambda s: f"{s[0]} streams",
        ),
        _section(
            f"Throughput by stream length: {STREAMS} streams at once", by_length, lambda s: f"{s[1]:,} events"
        ),
    ]


async def _sustained(url: str, streams: int, events: int) -> float:
    """events/s over rounds of the shape lasting at least MIN_SECONDS in all."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < MIN_SECONDS or not done:
        await throughput_run(url, streams, events)
        done += streams * events
    return done / elapsed


def _section(title: str, shapes: list[tuple[int, int]], label: Callable[[tuple[int, int]], str]) -> Section:
    section = Section(title, ["path", *(label(s) for s in shapes)])
    bare = RESULTS[BARE]
    for name, rates in RESULTS.items():
        section.add(name, *(f"{rates[s]:,.0f} ({rates[s] / bare[s]:.2f}x)" for s in shapes))
    section.notes.append(
        "events/s the clients received (best of 2), and in brackets the ratio to the bare aiohttp "
        "pass-through that records nothing."
    )
    return section
