"""Timing and reporting helpers shared by the benchmarks."""

from __future__ import annotations

import contextlib
import os
import platform
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tasktape.event_loop import loop_factory


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Seconds taken by the fastest of ``repeat`` calls (the least disturbed run)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def pin(pid: int, cpus: set[int]) -> None:
    """Confine every thread of process ``pid`` to ``cpus``: ``os.sched_setaffinity(pid)`` moves
    only the thread whose id is ``pid``. Threads started later inherit it from the thread that
    starts them; one started by a thread not yet moved shows in the next listing, so the
    threads are listed again until no new one turns up."""
    moved: set[int] = set()
    while new := {int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()} - moved:
        for tid in new:
            with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
                os.sched_setaffinity(tid, cpus)
        moved |= new


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max of a list of samples."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered), p99, ordered[-1]


def middle_half(samples: list[float]) -> tuple[float, float]:
    """The first and third quartiles of samples (the lowest and the highest, for few)."""
    ordered = sorted(samples)
    if len(ordered) < 4:
        return ordered[0], ordered[-1]
    first, _, third = statistics.quantiles(ordered, n=4)
    return first, third


@dataclass
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: object) -> None:
        self.rows.append([_fmt(c) for c in cells])

    def markdown(self) -> str:
        lines = [
            f"### {self.title}",
            "",
            "| " + " | ".join(self.columns) + " |",
            "|" + "|".join("---" for _ in self.columns) + "|",
        ]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}" if value >= 1 else f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def machine() -> str:
    loop = "uvloop" if loop_factory("auto") else "asyncio"
    return (
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} ({sys.platform}); "
        f"tasktape's proxy (record, log off) forwards on {loop}; the bare pass-through, the agent, "
        "the clients and the replay server run on asyncio"
    )
