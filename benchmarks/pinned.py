"""Throughput when tasktape record's log writer has a CPU of its own: the traffic (client,
agent and every proxy process) is confined to one CPU, the log writer process of every
recording path to another.

On shared CPUs (the scaling suite) the writer's work competes with the load generator for
the same two CPUs; here every path gets the same CPU for its traffic, as on a machine with a
core to spare for the log.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from pathlib import Path

from .harness import Section, middle_half, pin
from .proxy_bench import (
    BARE,
    CONTROL,
    RECORD,
    children,
    logged_events,
    start_upstream,
    start_variants,
)
from .scaling import measure, paired, process_cpu, warm_up
from .scaling import shapes as scaling_shapes

TITLE = "Throughput with the log writer on a CPU of its own"
# Many short turns: the machine's slow spells last seconds, so paths measured a tenth of a
# second apart see the same machine, and the paired ratios' spread narrows.
ROUNDS = 20
SECONDS = 0.1
CATCH_UP = 600.0  # seconds the log may take to hold a shape's events once its rounds end


def run(quick: bool) -> list[Section]:
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(allowed) < 2:
        section = Section(TITLE, ["path"])
        section.notes.append("Not measured: this needs two CPUs that this process may run on.")
        return [section]
    by_concurrency, by_length = scaling_shapes(quick)
    shapes = list(dict.fromkeys(by_concurrency + by_length))
    rounds = 2 if quick else ROUNDS
    traffic, writer_cpu = allowed[:2]
    rates: dict[str, dict[tuple[int, int], list[float]]] = {}
    writer: list[float] = []
    forwarding: list[float] = []
    with contextlib.ExitStack() as stack:
        # Every process started from here inherits the traffic's CPU; so does this client.
        pin(os.getpid(), {traffic})
        stack.callback(pin, os.getpid(), set(allowed))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        variants = start_variants(stack, tmp, start_upstream(stack), control=True, mitm=False)
        del variants["direct"]  # no proxy: nothing to compare on the traffic's CPU
        recording = {name: v for name, v in variants.items() if v.db and v.pid}
        for v in recording.values():
            for pid in children(v.pid):  # its log writer process
                pin(pid, {writer_cpu})
        record = variants[RECORD]
        logged = warm_up(variants)
        for shape in shapes:
            # The writers catch up on their CPU while the other paths run: every log is
            # waited for once the shape's rounds end, and what record's writer spent counted then.
            before = logged[RECORD], process_cpu(record.pid)[1]
            by_path, cpu = measure(variants, shape, rounds, logged, SECONDS, catch_up=False)
            for name, v in recording.items():
                logged_events(v.db, logged[name], timeout=CATCH_UP)
            writer.append((process_cpu(record.pid)[1] - before[1]) / (logged[RECORD] - before[0]) * 1e6)
            for name, samples in by_path.items():
                rates.setdefault(name, {})[shape] = samples
            forwarding += paired([c for c, _ in cpu[RECORD]], [c for c, _ in cpu[BARE]])
    section = Section(TITLE, ["path", *(f"{n} x {m:,}" for n, m in shapes)])
    ratios = {
        name: {s: paired(by_shape[s], rates[BARE][s]) for s in shapes} for name, by_shape in rates.items()
    }
    for name, by_shape in rates.items():
        section.add(name, *(_cell(by_shape[s], ratios[name][s], name == BARE) for s in shapes))
    spread = [ratio for s in shapes for ratio in ratios[CONTROL][s]]
    section.notes.append(
        f"events/s the clients received (streams x events per stream), the median of {rounds} rounds of "
        f"at least {SECONDS} s each; in brackets, the median of each round's ratio to the bare "
        "pass-through, then the middle half of those ratios (first to third quartile). The client, the "
        f"agent and each proxy process run on CPU {traffic}; the log writer processes of "
        f"{' and of '.join(recording)} on CPU {writer_cpu}, where they catch up while the other paths "
        "run; after each shape, every log held every event. The control's single rounds ranged "
        f"{min(spread):.2f}x-{max(spread):.2f}x of the bare pass-through."
    )
    section.notes.append(
        f"tasktape record's forwarding process used {min(forwarding):.2f}x-{max(forwarding):.2f}x the bare "
        f"pass-through's CPU per event (median {statistics.median(forwarding):.2f}x); its log writer, "
        f"{min(writer):.1f}-{max(writer):.1f} µs per event on its own CPU."
    )
    return [section]


def _cell(samples: list[float], ratios: list[float], bare: bool) -> str:
    if bare:
        return f"{statistics.median(samples):,.0f} (1.00x)"
    first, third = middle_half(ratios)
    return f"{statistics.median(samples):,.0f} ({statistics.median(ratios):.2f}x; {first:.2f}-{third:.2f})"
