"""``tasktape diff``: what changed between two recordings of the same scenarios."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import click

from tasktape.counted import counted
from tasktape.errors import TasktapeError, UsageError
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import Redactor
from tasktape.finite_json import finite_json
from tasktape.replay.diff import Aspect, Difference, Report, Tolerance, diff_recordings
from tasktape.replay.matching import MatchRules, Shown
from tasktape.replay.pairing import Run
from tasktape.replay.source import load

from .redaction_options import json_pointers

MS = 1e6
_TIMES = {Aspect.TTFE: "first event", Aspect.DURATION: "duration"}
DEFAULT = Tolerance()


def _load(path: Path, name: str) -> list[Recorded]:
    try:
        return load([path], _warn)
    except (OSError, sqlite3.Error, TasktapeError) as exc:  # (a cassette's error names what it holds)
        raise click.BadParameter(shown(str(exc)), param_hint=name) from None


def _warn(message: str) -> None:
    click.echo(f"tasktape diff: WARNING: {shown(message)}", err=True)


def _where(run: Run) -> str:
    """Where the compared exchange is; of a run, that it is the last of several."""
    origin = run.last.recorded.origin
    n = len(run.members)
    return origin if n == 1 else f"{origin} (last of {n} identical requests)"


def _head(run: Run, requests: Shown) -> str:
    first = run.first
    what = " ".join(filter(None, (first.protocol, first.operation)))
    return requests.request_line(first.recorded) + (f" ({what})" if what else "")


def _value(value: Any) -> str:
    if value is None or value in ("", []):
        return "(none)"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _kinds(runs: list[tuple[str, int]]) -> str:
    """Event kinds, a run of one kind as kind*count."""
    return " ".join(kind if n == 1 else f"{kind}*{n}" for kind, n in runs) or "(no events)"


def _time(a: int | None, b: int | None) -> str:
    shown = " -> ".join("(none)" if t is None else f"{t / MS:.1f} ms" for t in (a, b))
    if a and b is not None:
        shown += f" ({(b - a) / a:+.0%})"
    return shown


def _lines(d: Difference) -> list[str]:
    if d.aspect is Aspect.KINDS:
        return ["  kinds:", f"    A: {_kinds(d.a)}", f"    B: {_kinds(d.b)}"]
    if d.diff:
        return [f"  {d.aspect}:", *(f"    {line}" for line in d.diff)]
    if d.aspect in _TIMES:
        return [f"  {_TIMES[d.aspect]}: {_time(d.a, d.b)}"]
    label = f"usage.{d.field}" if d.field else str(d.aspect)
    return [f"  {label}: {_value(d.a)} -> {_value(d.b)}"]


def _human(report: Report, requests: Shown) -> None:
    # Requests, answers and deltas as recorded: shown as a console shows them.
    for p in report.pairs:
        if p.differences:
            click.echo(shown(f"{_head(p.a, requests)}  {_where(p.a)} ~ {_where(p.b)}"))
            for d in p.differences:
                for line in _lines(d):
                    click.echo(shown(line))
    for label, runs in (("A", report.only_a), ("B", report.only_b)):
        for run in runs:
            click.echo(shown(f"only in {label}: {_head(run, requests)}  {_where(run)}"))
    differ = sum(1 for p in report.pairs if p.differences)
    click.echo(
        ("\n" if report.differs else "")
        + f"{counted(len(report.pairs), 'pair')}, {differ} {'differs' if differ == 1 else 'differ'}, "
        f"{len(report.only_a)} only in A, {len(report.only_b)} only in B"
    )


def _side(run: Run, requests: Shown) -> dict[str, Any]:
    first = run.first
    return {
        "request": requests.request_line(first.recorded),
        "protocol": first.protocol,
        "operation": first.operation,
        "exchanges": [m.recorded.origin for m in run.members],
    }


def _difference(d: Difference) -> dict[str, Any]:
    a, b = d.a, d.b
    if d.aspect in _TIMES:
        a, b = (None if t is None else round(t / MS, 3) for t in (a, b))
    elif d.aspect is Aspect.KINDS:
        a, b = ([[kind, n] for kind, n in runs] for runs in (a, b))
    return {"aspect": str(d.aspect), "field": d.field, "a": a, "b": b, "diff": list(d.diff)}


def _json(report: Report, a: Path, b: Path, tolerance: Tolerance, requests: Shown) -> None:
    doc = {
        "a": str(a),
        "b": str(b),
        "time_tolerance": {"percent": tolerance.percent, "ms": tolerance.ms},
        "pairs": [
            {
                "a": _side(p.a, requests),
                "b": _side(p.b, requests),
                "differs": bool(p.differences),
                "differences": [_difference(d) for d in p.differences],
            }
            for p in report.pairs
        ],
        "only_in_a": [_side(run, requests) for run in report.only_a],
        "only_in_b": [_side(run, requests) for run in report.only_b],
        "summary": {
            "pairs": len(report.pairs),
            "differ": sum(1 for p in report.pairs if p.differences),
            "only_in_a": len(report.only_a),
            "only_in_b": len(report.only_b),
        },
    }
    click.echo(finite_json(doc))


@click.command()
@click.argument("a", metavar="A", type=click.Path(exists=True, path_type=Path))
@click.argument("b", metavar="B", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--time-tolerance",
    "tolerances",
    multiple=True,
    metavar="TOL",
    help="How far a time may move and not differ: a percentage of A's time (20%) or a duration "
    "(50ms, 0.5s); a time differs when it moved by more than both. Repeatable: the last "
    f"percentage and the last duration count. Default: {DEFAULT.percent:g}% and {DEFAULT.ms:g}ms.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="POINTER",
    callback=json_pointers,
    help="A JSON pointer of the request body to leave out of pairing, as replay's --ignore "
    "(repeatable; * for any key).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the pairs and their differences as JSON (a recorded number past a float's range, such as "
    '1e999, as the string "Infinity" or "-Infinity").',
)
def diff(a: Path, b: Path, tolerances: tuple[str, ...], ignore: tuple[str, ...], as_json: bool) -> None:
    """Show what changed between two recordings of the same scenarios (logs, cassettes, folders of cassettes).

    Exchanges pair by their request as replay matches it, in the order A's started: what
    clients make up afresh (message ids, timestamps, JSON-RPC ids) left out, and ids the
    agent made up (task, context, artifact, message and SSE event ids) compared by
    position, not value. Consecutive identical requests (a client polling) are one run,
    compared by its last answer, however many there were. Each pair is compared on its HTTP
    status, protocol, outcome, final state (an A2A task's, an LLM's finish reason), its
    sequence of event kinds (repeats collapsed: how many deltas carried an answer is no
    difference, the answer text is), its answer and streamed deltas (as unified diffs),
    the tools an LLM's answer called and with what, artifact names, usage and credits, and
    its time to first event and duration, within
    --time-tolerance. Exchanges in one recording alone are listed.
    Exit status: 0 nothing differs, 1 something does, 2 bad input.
    """
    try:
        tolerance = Tolerance.parse(tolerances)
    except UsageError as exc:
        raise click.BadParameter(str(exc), param_hint="--time-tolerance") from None
    recorded_a, recorded_b = _load(a, "A"), _load(b, "B")
    # (as replay's misses show them: the defaults' names, and what either holds redacted)
    requests = Shown.knowing(Redactor(), [*recorded_a, *recorded_b])
    report = diff_recordings(recorded_a, recorded_b, tolerance, MatchRules.of(ignore))
    if as_json:
        _json(report, a, b, tolerance, requests)
    else:
        _human(report, requests)
    if report.differs:
        raise SystemExit(1)
