"""``tasktape check``: recorded streams against the A2A task lifecycle."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tasktape.errors import LogError, TasktapeError
from tasktape.eventlog import EventLog
from tasktape.replay import load
from tasktape.replay.source import is_log

if TYPE_CHECKING:
    from tasktape.eventlog.checker import Finding, Report


def _check_source(source: Path, save: bool) -> tuple[Report, int | None]:
    """The report on one source, and how many findings were saved into it (None: not a log)."""
    # Here, not at the top: the inspector package is Datasette's plugin, and importing it
    # costs every tasktape command its start-up time.
    from tasktape.eventlog.checker import report_log, report_recorded, save_findings  # noqa: PLC0415

    try:
        if not (source.is_file() and is_log(source)):
            return report_recorded(load([source])), None
        with EventLog(source, readonly=not save) as log:
            ids = [x["id"] for x in log.exchanges()]
            report = report_log(log, ids)
    except (OSError, TasktapeError) as exc:
        raise click.BadParameter(str(exc), param_hint="SOURCE") from None
    if not save:
        return report, None
    try:
        return report, save_findings(source, report.findings, exchange_ids=ids)
    except (LogError, sqlite3.Error) as exc:
        raise click.UsageError(f"{exc}; check it with --no-save to leave it as it is") from None


def _line(source: Path, finding: Finding) -> str:
    place = (
        f"{source.name} exchange {finding.exchange}" if finding.exchange_id is not None else finding.exchange
    )
    event = "" if finding.seq is None else f" event {finding.seq}"
    return f"{finding.task_id or '-'}  {place}{event}  {finding.rule}: {finding.message}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@click.command()
@click.argument(
    "sources", nargs=-1, required=True, metavar="SOURCE...", type=click.Path(exists=True, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the summary as JSON.")
@click.option("--no-save", is_flag=True, help="Leave event logs as they are (by default findings are saved).")
def check(sources: tuple[Path, ...], as_json: bool, no_save: bool) -> None:
    """Check recorded streams against the A2A task lifecycle: event logs, cassettes, or folders of them.

    Rules: legal state transitions per task (across its exchanges), nothing after a
    terminal state, a stream that ran to its end closes on a terminal or interrupted
    state, append/lastChunk order and lastChunk text per artifact, no message on a
    COMPLETED statusUpdate, unique SSE ids, JSON-RPC ids that answer the request, and
    frames that are JSON A2A frames. A stream cut short is noted, not counted as broken.
    Findings about an event log are saved into its findings table (unless --no-save).
    Exit status: 0 clean, 1 some rule broken, 2 bad input.
    """
    from tasktape.eventlog.rules import RULES  # noqa: PLC0415 - see _check_source

    results = [(source, *_check_source(source, not no_save)) for source in sources]
    findings = [(s, f) for s, report, _ in results for f in report.findings]
    cut_short = [(s, f) for s, report, _ in results for f in report.cut_short]
    by_rule = Counter(f.rule for _, f in findings)
    totals = {
        key: sum(getattr(report, key) for _, report, _ in results)
        for key in ("streams", "exchanges", "tasks")
    }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "sources": [
                        {
                            "source": str(s),
                            "streams": r.streams,
                            "exchanges": r.exchanges,
                            "tasks": r.tasks,
                            "findings": len(r.findings),
                            "saved": saved,
                        }
                        for s, r, saved in results
                    ],
                    "findings": [_as_dict(s, f) for s, f in findings],
                    "cut_short": [_as_dict(s, f) for s, f in cut_short],
                    "summary": {
                        **totals,
                        "findings": len(findings),
                        "by_rule": {n: by_rule[n] for n in RULES},
                    },
                },
                indent=2,
            )
        )
    else:
        for source, finding in findings:
            click.echo(_line(source, finding))
        for source, note in cut_short:
            click.echo(_line(source, note))
        _summary(results, totals, by_rule, len(cut_short))
    if findings:
        raise SystemExit(1)


def _as_dict(source: Path, finding: Finding) -> dict[str, Any]:
    return {"source": str(source), **asdict(finding)}


def _summary(
    results: list[tuple[Path, Report, int | None]], totals: dict[str, int], by_rule: Counter[str], cut: int
) -> None:
    from tasktape.eventlog.rules import RULES, explain  # noqa: PLC0415 - see _check_source

    found = sum(by_rule.values())
    what = f"{_plural(totals['streams'], 'stream')} ({_plural(totals['exchanges'], 'exchange')} in all)"
    click.echo(
        f"\nChecked {what} of {_plural(totals['tasks'], 'task')} from {_plural(len(results), 'source')}: "
        + (f"{_plural(found, 'finding')}." if found else "no rule broken.")
    )
    if cut:
        click.echo(f"{_plural(cut, 'stream')} cut short: checked up to the break, not counted as broken.")
    for name in RULES:
        if by_rule[name]:
            click.echo(f"  {name:<18} {by_rule[name]:>4}  {explain(name)}")
    for source, _, saved in results:
        if saved is not None:
            click.echo(f"Saved {_plural(saved, 'finding')} into {source} (table findings).")
