"""How the capture paths' throughput grows with concurrency (10 to 500 streams) and with
stream length, each path in its own process against the same upstream."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .harness import Section
from .proxy_bench import (
    BARE,
    CONTROL,
    EVENT_SIZE,
    Variant,
    cpu_seconds,
    logged_events,
    start_upstream,
    start_variants,
    throughput_run,
)

CONCURRENCY = (10, 50, 100, 500)  # streams at once, TOTAL events among them
TOTAL = 100_000
LENGTHS = (100, 1_000, 10_000)  # events per stream, STREAMS streams at once
STREAMS = 10
MIN_SECONDS = 0.5  # a shape is run again until it took this long: short runs are noise
ROUNDS = 5  # every path runs each shape once per round; rounds alternate the paths' order
WARM_UP = (2, 20)  # streams, events

# What the last run measured, for the chart: {path: {(streams, events): median events/s}};
# the median over rounds of each path's events/s over the bare pass-through's in the same
# round; and which (streams, events) shapes made each comparison.
RESULTS: dict[str, dict[tuple[int, int], float]] = {}
RATIOS: dict[str, dict[tuple[int, int], float]] = {}
SHAPES: dict[str, list[tuple[int, int]]] = {}
ROUND_RATIOS: dict[str, dict[tuple[int, int], list[float]]] = {}  # every round's, by shape
# CPU µs per event across each proxy's process tree, of its forwarding process and of its
# log writer (until the log caught up), and the tree's median paired ratio to bare:
# {path: {shape: (tree, forwarding, writer or None, ratio)}}.
CPU: dict[str, dict[tuple[int, int], tuple[float, float, float | None, float]]] = {}


def run(quick: bool) -> list[Section]:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 500 streams: 1,000+ sockets
    total = TOTAL // 10 if quick else TOTAL
    by_concurrency, by_length = shapes(quick)
    rounds = 2 if quick else ROUNDS
    RESULTS.clear()
    RATIOS.clear()
    ROUND_RATIOS.clear()
    CPU.clear()
    SHAPES.update(concurrency=by_concurrency, length=by_length)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        variants = start_variants(stack, tmp, start_upstream(stack), control=True)
        logged = warm_up(variants)
        for shape in dict.fromkeys(by_concurrency + by_length):
            rates, cpu = measure(variants, shape, rounds, logged)
            for name, samples in rates.items():
                RESULTS.setdefault(name, {})[shape] = statistics.median(samples)
                RATIOS.setdefault(name, {})[shape] = statistics.median(paired(samples, rates[BARE]))
                ROUND_RATIOS.setdefault(name, {})[shape] = paired(samples, rates[BARE])
            for name, used in cpu.items():
                tree = [c + w for c, w in used]
                cost = paired(tree, [c + w for c, w in cpu[BARE]])
                forwarding = statistics.median(c for c, _ in used)
                writer = statistics.median(w for _, w in used) if variants[name].db else None
                CPU.setdefault(name, {})[shape] = (
                    statistics.median(tree),
                    forwarding,
                    writer,
                    statistics.median(cost),
                )
    return [
        _section(
            f"Throughput by concurrency: {total:,} {EVENT_SIZE}-byte events among the streams",
            by_concurrency,
            lambda s: f"{s[0]} streams",
            rounds,
        ),
        _section(
            f"Throughput by stream length: {STREAMS} streams at once",
            by_length,
            lambda s: f"{s[1]:,} events",
            rounds,
        ),
        _cpu_section(list(dict.fromkeys(by_concurrency + by_length)), rounds),
    ]


def shapes(quick: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (streams, events per stream) shapes: by concurrency, and by stream length."""
    total = TOTAL // 10 if quick else TOTAL
    by_concurrency = [(n, total // n) for n in (CONCURRENCY[:2] if quick else CONCURRENCY)]
    by_length = [(STREAMS, n) for n in (LENGTHS[:2] if quick else LENGTHS)]
    return by_concurrency, by_length


def paired(samples: list[float], bare: list[float]) -> list[float]:
    """Each round's figure over the bare pass-through's in the same round."""
    return [value / base for value, base in zip(samples, bare, strict=True)]


def warm_up(variants: dict[str, Variant]) -> dict[str, int]:
    """Warm up connections and code paths; the events each path's log holds so far."""
    for v in variants.values():
        asyncio.run(throughput_run(v.url, *WARM_UP))
    return dict.fromkeys([name for name, v in variants.items() if v.db], WARM_UP[0] * WARM_UP[1])


def measure(
    variants: dict[str, Variant],
    shape: tuple[int, int],
    rounds: int,
    logged: dict[str, int],
    seconds: float = MIN_SECONDS,
    catch_up: bool = True,
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, float]]]]:
    """Every path's events/s at one (streams, events) shape, over at least ``seconds`` once
    per round; and the CPU µs per event of each proxy's forwarding process and of its log
    writer (until the log caught up). ``logged`` counts the events in each path's log, and
    is kept up to date. Without ``catch_up``, the next path runs while a log is still
    being written (the writer's CPU time then counts what it did meanwhile)."""
    rates: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name, v in variants.items() if v.pid}
    for round_ in range(rounds):
        # A slow spell of the machine hits every path of a round, in turn first and last.
        for name, v in list(variants.items())[:: -1 if round_ % 2 else 1]:
            before = process_cpu(v.pid)
            rate, done = asyncio.run(_sustained(v.url, *shape, seconds))
            spent = process_cpu(v.pid)[0] - before[0]  # before the log catches up
            rates[name].append(rate)
            if v.db:
                logged[name] += done
                if catch_up:  # first, not while the next path is measured
                    logged_events(v.db, logged[name])
            if v.pid:
                cpu[name].append((spent / done * 1e6, (process_cpu(v.pid)[1] - before[1]) / done * 1e6))
    return rates, cpu


async def _sustained(url: str, streams: int, events: int, seconds: float) -> tuple[float, int]:
    """events/s over rounds of the shape lasting at least ``seconds`` in all, and the events."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or not done:
        await throughput_run(url, streams, events)
        done += streams * events
    return done / elapsed, done


def process_cpu(pid: int | None) -> tuple[float, float]:
    """CPU seconds of a forwarding process, and of its child processes (its log writer)."""
    if pid is None:
        return 0.0, 0.0
    own = cpu_seconds(pid)
    return own, cpu_seconds(pid, with_children=True) - own


def _cpu_section(shapes: list[tuple[int, int]], rounds: int) -> Section:
    section = Section(
        "CPU per event across the process tree, µs (streams x events per stream)",
        ["path", *(f"{n} x {m:,}" for n, m in shapes)],
    )
    for name, by_shape in CPU.items():
        cells = []
        for shape in shapes:
            tree, forwarding, writer, ratio = by_shape[shape]
            split = "" if writer is None else f" = {forwarding:.1f} + {writer:.1f}"
            cells.append(f"{tree:.1f} ({ratio:.2f}x){split}")
        section.add(name, *cells)
    section.notes.append(
        f"User + system CPU of each proxy's process and its child processes over the throughput runs "
        f"above, per event, the median of {rounds} rounds, counted until the log had caught up; in "
        "brackets, the median of each round's ratio to the bare pass-through's. \"= F + W\": the µs per "
        "event of the forwarding process and of its log writer process. A proxy with a CPU of its own "
        "forwards at most one event per F µs, so the ratio of F is the inverse of its capacity's."
    )
    return section


def _section(
    title: str, shapes: list[tuple[int, int]], label: Callable[[tuple[int, int]], str], rounds: int
) -> Section:
    section = Section(title, ["path", *(label(s) for s in shapes)])
    for name, rates in RESULTS.items():
        section.add(name, *(f"{rates[s]:,.0f} ({RATIOS[name][s]:.2f}x)" for s in shapes))
    section.notes.append(
        f"events/s the clients received, the median of {rounds} rounds; in brackets, the median of each "
        "round's ratio to the bare aiohttp pass-through that records nothing. Before the next path "
        "runs, a recording path's log catches up, so its writing is charged to no other path."
    )
    if CONTROL in ROUND_RATIOS:
        spread = [ratio for shape in shapes for ratio in ROUND_RATIOS[CONTROL][shape]]
        section.notes.append(
            f'"{CONTROL}" runs the same program as the bare pass-through: its single rounds ranged '
            f"{min(spread):.2f}x-{max(spread):.2f}x of it, which is the measurement's own spread on "
            "this machine."
        )
    return section
