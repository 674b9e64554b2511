"""How soon each proxy path is ready and how much memory it holds idle: from the command
to its ready line (or, for mitmdump, the first connection its port accepts), and the
resident memory of the forwarding process, and of its log writer process, once ready."""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from .harness import Section
from .proxy_bench import BARE, children, launches, process, start_upstream

ROUNDS = 3  # every path starts once per round


def run(quick: bool) -> list[Section]:
    rounds = 1 if quick else ROUNDS
    ready: dict[str, list[float]] = {}
    memory: dict[str, list[tuple[float, float | None]]] = {}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        upstream = start_upstream(stack)
        for round_ in range(rounds):
            folder = tmp / str(round_)
            folder.mkdir()
            for name, launch in launches(folder, upstream).items():
                start = time.perf_counter()
                with process(launch.args, launch.ready) as proc:
                    ready.setdefault(name, []).append(time.perf_counter() - start)
                    pid = children(proc.pid)[0] if launch.wrapped else proc.pid
                    writers = children(pid) if launch.db else []
                    writer = _rss_mib(writers[0]) if writers else None
                    memory.setdefault(name, []).append((_rss_mib(pid), writer))
    section = Section(
        "Proxy start-up and idle memory",
        ["path", "command to ready, s", "resident memory, MiB", "its log writer process, MiB"],
    )
    for name, times in ready.items():
        own = statistics.median(m for m, _ in memory[name])
        writers = [w for _, w in memory[name] if w is not None]
        section.add(
            name,
            statistics.median(times),
            f"{own:.0f} ({own / statistics.median(m for m, _ in memory[BARE]):.2f}x)",
            f"{statistics.median(writers):.0f}" if writers else "-",
        )
    section.notes.append(
        f"The median of {rounds} starts each; in brackets, the ratio to the bare pass-through's. "
        "The ready line comes once a process listens; mitmdump prints none, so its port is "
        "polled every 50 ms. tasktape mitm's figures are those of the mitmdump it runs. A "
        "recorder is ready once its log writer process is. The bare pass-through's process "
        "loads this benchmark's module, which imports tasktape's proxy."
    )
    return [section]


def _rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024
