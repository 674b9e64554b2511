"""What handing chunks to the log writer process costs the recording process, at the
rates agents stream tokens and at a busy recorder's: its CPU per chunk, over what pacing
the chunks alone costs, with the writer's adaptive gathering and with a fixed window."""

from __future__ import annotations

import contextlib
import itertools
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tasktape.eventlog import ProcessLogWriter, process_writer

from .harness import Section

RATES = (250, 2_000)  # chunks/s: 5 token-paced streams, and a busy recorder
SECONDS = 4.0  # per run
ROUNDS = 3  # every variant once per round, in turn
STREAMS = 5
NONE, ADAPTIVE, FIXED = (
    "pacing alone, no log",
    "log writer process (gathering 2-16 ms)",
    "fixed 2 ms gathering",
)


@contextlib.contextmanager
def _gathering(fixed: bool) -> Iterator[None]:
    saved = process_writer._MAX_GATHER
    if fixed:
        process_writer._MAX_GATHER = process_writer._GATHER
    try:
        yield
    finally:
        process_writer._MAX_GATHER = saved


def cpu_per_chunk(path: Path | None, rate: int, seconds: float, *, fixed: bool = False) -> float:
    """CPU µs of this process per chunk handed over at ``rate`` chunks/s among STREAMS
    streams (to no writer when ``path`` is None), the pacing itself included."""
    n = int(rate * seconds)
    # Every chunk a bytes object of its own, as from a socket (one object sent again and
    # again would be pickled once per batch and referred to after).
    chunks = [b"data: %08d" % i + b"x" * 184 + b"\n\n" for i in range(n)]
    with _gathering(fixed), contextlib.ExitStack() as stack:
        writer = stack.enter_context(ProcessLogWriter(path)) if path else None
        exchanges: list[int] = []
        if writer:
            capture = writer.begin_capture(source="benchmark")
            exchanges = [writer.begin_exchange(capture, method="POST", path="/s") for _ in range(STREAMS)]
            for ex in exchanges:
                writer.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
        cpu, start = time.process_time(), time.perf_counter()
        for i in range(n):
            if writer:
                writer.chunk(exchanges[i % STREAMS], i, chunks[i])
            delay = start + (i + 1) / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        used = time.process_time() - cpu
        for ex in exchanges:
            writer.end_exchange(ex, duration_ns=n)  # type: ignore[union-attr]
    return used / n * 1e6


def run(quick: bool) -> list[Section]:
    seconds, rounds = (1.0, 1) if quick else (SECONDS, ROUNDS)
    section = Section(
        "Handing chunks to the log writer process: CPU of the recording process per chunk, µs",
        ["path", *(f"{rate:,} chunks/s" for rate in RATES)],
    )
    samples: dict[str, dict[int, list[float]]] = {
        name: {r: [] for r in RATES} for name in (NONE, ADAPTIVE, FIXED)
    }
    with tempfile.TemporaryDirectory() as tmp:
        logs = (Path(tmp) / f"{n}.db" for n in itertools.count())  # a fresh log each run
        for rate in RATES:
            for round_ in range(rounds):
                for name in list(samples)[:: -1 if round_ % 2 else 1]:
                    path = None if name == NONE else next(logs)
                    samples[name][rate].append(cpu_per_chunk(path, rate, seconds, fixed=name == FIXED))
    floor = {rate: statistics.median(samples[NONE][rate]) for rate in RATES}
    for name, by_rate in samples.items():
        cells = []
        for rate in RATES:
            cost = statistics.median(by_rate[rate])
            cells.append(f"{cost:.1f}" if name == NONE else f"{cost:.1f} ({cost - floor[rate]:+.1f})")
        section.add(name, *cells)
    section.notes.append(
        f"User + system CPU of the process calling `chunk()`, all its threads, per chunk, while it hands "
        f"{STREAMS} streams' 200-byte chunks over at a steady rate for {seconds:.0f} s; the median of "
        f"{rounds} rounds. In brackets, over pacing alone (sleeping until each chunk is due). "
        "The writer's child process is not counted."
    )
    return [section]
