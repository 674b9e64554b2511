"""Run the benchmarks and print a markdown report: ``python -m benchmarks [NAME...]``;
with ``--report FILE``, also write it, and the scaling chart beside it as a PNG."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from . import (
    chart,
    decoder,
    eventlog_bench,
    fleet_bench,
    handover,
    hold_bench,
    imports,
    instructions,
    pinned,
    protocols_bench,
    proxy_bench,
    replay_bench,
    resume_bench,
    scaling,
    startup,
)
from .harness import machine

SUITES = {
    "decoder": decoder.run,
    "log": eventlog_bench.run,
    "protocols": protocols_bench.run,
    "handover": handover.run,
    "proxy": proxy_bench.run,
    "resume": resume_bench.run,
    "hold": hold_bench.run,
    "startup": startup.run,
    "imports": imports.run,
    "replay": replay_bench.run,
    "scaling": scaling.run,
    "pinned": pinned.run,
    "fleet": fleet_bench.run,
    "instructions": instructions.run,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="*", choices=[[], *SUITES], help="suites to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    parser.add_argument(
        "--report", type=Path, help="also write the markdown report to this file (and FILE.png: the chart)"
    )
    args = parser.parse_args()
    parts = [f"## tasktape benchmarks\n\n{machine()}; {time.strftime('%Y-%m-%d')}"]
    for name in args.names or SUITES:
        for section in SUITES[name](args.quick):
            parts.append(section.markdown())
            print(parts[-1] + "\n", flush=True)
    if args.report:
        png = args.report.with_suffix(".png")
        if chart.draw(png):
            parts.insert(1, f"![Throughput by concurrency and by stream length]({png.name})")
        args.report.write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
