"""Run the benchmarks and print a markdown report: ``python -m benchmarks [NAME...]``;
with ``--report FILE``, also write it, and the scaling chart beside it as a PNG."""

from __future__ import annotations

import argparse
import sys
import time
import traceback
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


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    names = args.names or list(SUITES)
    if args.report and "scaling" in names and not chart.can_draw():
        print(f"{chart.MISSING}: the report will have no chart", file=sys.stderr, flush=True)
    parts = [f"## tasktape benchmarks\n\n{machine()}; {time.strftime('%Y-%m-%d')}"]
    failed = [name for name in names if not _run(name, args.quick, parts)]
    if args.report:
        _write(args.report, parts)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    # No choices=: Python 3.11's argparse checks an empty nargs="*" list against them.
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"suites to run (default: all): {', '.join(SUITES)}"
    )
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="also write the markdown report to this file (and FILE.png: the chart)",
    )
    args = parser.parse_args(argv)
    if unknown := [name for name in args.names if name not in SUITES]:
        unknown_names, choices = ", ".join(map(repr, unknown)), ", ".join(map(repr, SUITES))
        parser.error(f"argument NAME: invalid choice: {unknown_names} (choose from {choices})")
    # Checked before the suites run: a report that cannot be written would lose their results.
    if args.report and args.report.is_dir():
        parser.error(f"argument --report: {args.report} is a folder, not a file")
    if args.report and not args.report.parent.is_dir():
        parser.error(f"argument --report: no folder {args.report.parent} to write {args.report.name} in")
    return args


def _run(name: str, quick: bool, parts: list[str]) -> bool:
    """Run one suite, its sections printed and added to ``parts``; False if it failed, the
    failure printed and added instead, for the other suites' results to stand."""
    try:
        sections = SUITES[name](quick)
    except Exception as error:
        traceback.print_exc()
        parts.append(f"### The {name} suite failed\n\n`{type(error).__name__}: {error}`")
        print(parts[-1] + "\n", flush=True)
        return False
    for section in sections:
        parts.append(section.markdown())
        print(parts[-1] + "\n", flush=True)
    return True


def _write(report: Path, parts: list[str]) -> None:
    """The markdown first, then the chart beside it and, once drawn, its link in the markdown."""
    report.write_text("\n\n".join(parts) + "\n")
    if shown := chart.draw(report.with_suffix(".png")):
        parts.insert(1, shown)
        report.write_text("\n\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
