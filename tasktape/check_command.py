"""``tasktape check``: recorded streams against their protocols' lifecycles."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tasktape.counted import counted
from tasktape.errors import LogBusy, LogError, TasktapeError
from tasktape.eventlog import EventLog
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.file_kinds import is_log
from tasktape.eventlog.protocols import ProtocolName
from tasktape.eventlog.schema import upgrade_log
from tasktape.replay import load
from tasktape.replay.source import cassettes_in

if TYPE_CHECKING:
    from tasktape.eventlog.checker import Finding, Report


def _each(paths: tuple[Path, ...]) -> Iterator[tuple[Path, str | None]]:
    """The sources given, each cassette of a folder one of its own (named by its path in
    the folder): two cassettes are two recordings, whatever folder holds them. A file given
    twice (by the same path or another to it, or in a folder given too) is checked once."""
    seen: set[Path] = set()
    for path, name in _given(paths):
        if path.resolve() not in seen:
            seen.add(path.resolve())
            yield path, name


def _given(paths: tuple[Path, ...]) -> Iterator[tuple[Path, str | None]]:
    for path in paths:
        if not path.is_dir():
            yield path, None
            continue
        try:
            members = cassettes_in(path, _warn)
        except TasktapeError as exc:
            raise click.BadParameter(str(exc), param_hint="SOURCE") from None
        yield from ((path / member, member.as_posix()) for member in members)


def _warn(message: str) -> None:
    click.echo(f"tasktape check: WARNING: {message}", err=True)


def _check_source(
    source: Path, save: bool, only: tuple[str, ...], name: str | None = None
) -> tuple[Report, int | None]:
    """The report on one source (a cassette of a folder: ``name``d by its path in it), and
    how many findings were saved into it (None: not a log)."""
    # Here, not at the top: the inspector package is Datasette's plugin, and importing it
    # costs every tasktape command its start-up time.
    from tasktape.eventlog.checker import report_log, report_recorded, save_findings  # noqa: PLC0415

    try:
        if name is not None:
            return report_recorded(read_cassette(source, name), only or None), None
        if not (source.is_file() and is_log(source)):
            return report_recorded(load([source]), only or None), None
        if save:  # upgraded as tasktape upgrade does; refuses what is no log: a check never makes one
            upgrade_log(source)
        with EventLog(source, readonly=not save) as log:
            report = report_log(log, None, only or None)
    except LogBusy as exc:  # (an older log a recorder still writes): as a save refused
        raise click.UsageError(
            f"{exc}: an older log is upgraded before findings are saved into it; check it again once "
            "that writer is done"
        ) from None
    except (OSError, TasktapeError) as exc:
        raise click.BadParameter(str(exc), param_hint="SOURCE") from None
    if not save:
        return report, None
    try:
        return report, save_findings(source, report.findings, exchange_ids=report.exchange_ids)
    except (LogError, sqlite3.Error) as exc:
        raise click.UsageError(f"{exc}; check it with --no-save to leave it as it is") from None


def _line(source: Path, finding: Finding) -> str:
    place = (
        f"{source.name} exchange {finding.exchange}" if finding.exchange_id is not None else finding.exchange
    )
    event = "" if finding.seq is None else f" event {finding.seq}"
    return f"{finding.task_id or '-'}  {place}{event}  {finding.rule}: {finding.message}"


@click.command()
@click.argument(
    "sources", nargs=-1, required=True, metavar="SOURCE...", type=click.Path(exists=True, path_type=Path)
)
@click.option("--json", "as_json", is_flag=True, help="Print the findings and the summary as JSON.")
@click.option("--no-save", is_flag=True, help="Leave event logs as they are (by default findings are saved).")
@click.option(
    "--protocol",
    "protocols",
    multiple=True,
    metavar="NAME",
    help="Check only this protocol's exchanges (a2a, mcp, openai, anthropic, a plug-in's); repeatable.",
)
def check(sources: tuple[Path, ...], as_json: bool, no_save: bool, protocols: tuple[str, ...]) -> None:
    """Check recorded streams against their protocols' lifecycles: logs, cassettes, folders of cassettes.

    Each exchange is checked by the rules of the protocol it speaks (exchanges of no
    known protocol are left alone). A2A: legal state transitions per task (across its
    exchanges), nothing after a terminal state, a stream that ran to its end closes on a
    terminal or interrupted state, append/lastChunk order and lastChunk text per
    artifact, no message on a COMPLETED statusUpdate, unique SSE ids, JSON-RPC ids that
    answer the request, frames that are JSON A2A frames. MCP: one response per request
    id in a session (a stream closed for resumption may be answered on the resumed GET),
    result xor error, progress rising. OpenAI: the end marker last and once, one finish
    per choice. Anthropic: content blocks opened and closed in order, message_stop last.
    A stream cut short is noted, not counted as broken. Findings about an event log are
    saved into its findings table (unless --no-save).
    Exit status: 0 clean, 1 some rule broken, 2 bad input.
    """
    from tasktape.eventlog.checker import all_rules, protocol_names  # noqa: PLC0415 - see _check_source

    unknown = sorted(set(protocols) - set(protocol_names()))
    if unknown:
        raise click.BadParameter(
            f"unknown protocol {', '.join(unknown)} (known: {', '.join(protocol_names())})",
            param_hint="--protocol",
        )
    rules = all_rules()
    results = [(path, *_check_source(path, not no_save, protocols, name)) for path, name in _each(sources)]
    findings = [(s, f) for s, report, _ in results for f in report.findings]
    cut_short = [(s, f) for s, report, _ in results for f in report.cut_short]
    by_rule = Counter(f.rule for _, f in findings)
    totals = {
        key: sum(getattr(report, key) for _, report, _ in results)
        for key in ("streams", "exchanges", "tasks", "reconnects")
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
                            "reconnects": r.reconnects,
                            "by_protocol": r.by_protocol,
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
                        "by_protocol": _by_protocol(results),
                        "by_rule": {n: by_rule[n] for n in rules},
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


def _by_protocol(results: list[tuple[Path, Report, int | None]]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for _, report, _ in results:
        counts.update(report.by_protocol)
    return dict(counts)


def _summary(
    results: list[tuple[Path, Report, int | None]], totals: dict[str, int], by_rule: Counter[str], cut: int
) -> None:
    from tasktape.eventlog.checker import all_rules, explain  # noqa: PLC0415 - see _check_source

    found = sum(by_rule.values())
    counts = _by_protocol(results)
    # An A2A-only check reads as it always has; a mix says how many of each.
    per = ", ".join(f"{name} {n}" for name, n in counts.items()) if set(counts) - {ProtocolName.A2A} else ""
    what = f"{counted(totals['streams'], 'stream')} ({counted(totals['exchanges'], 'exchange')} in all" + (
        f": {per})" if per else ")"
    )
    tasks = f" of {counted(totals['tasks'], 'task')}" if not counts or ProtocolName.A2A in counts else ""
    listed = found or cut  # (a blank line after the findings and notes, when there are any)
    click.echo(
        f"{chr(10) if listed else ''}Checked {what}{tasks} from {counted(len(results), 'source')}: "
        + (f"{counted(found, 'finding')}." if found else "no rule broken.")
    )
    if cut:
        click.echo(f"{counted(cut, 'stream')} cut short: checked up to the break, not counted as broken.")
    if totals["reconnects"]:
        click.echo(
            f"{counted(totals['reconnects'], 'reconnect')} the resume gateway answered from a stream it "
            "held: not checked on their own (the streams they resumed hold their events)."
        )
    broken = [name for name in all_rules() if by_rule[name]]
    width = max([18, *map(len, broken)])
    for name in broken:
        click.echo(f"  {name:<{width}} {by_rule[name]:>4}  {explain(name)}")
    for source, _, saved in results:
        if saved is not None:
            click.echo(f"Saved {counted(saved, 'finding')} into {source} (table findings).")
