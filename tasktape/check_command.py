"""``tasktape check``: recorded streams against their protocols' lifecycles."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tasktape.counted import counted
from tasktape.errors import LogBusy, LogError, TasktapeError
from tasktape.eventlog import EventLog
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.file_kinds import is_log
from tasktape.eventlog.protocols import ProtocolName
from tasktape.eventlog.schema import SCHEMA_VERSION, schema_version, upgrade_log
from tasktape.replay import load
from tasktape.replay.source import cassettes_in

if TYPE_CHECKING:
    from tasktape.eventlog.checker import Finding, Report


@dataclass(frozen=True)
class _Source:
    """A source as given: a file, or a cassette of a folder given."""

    path: Path  # a folder's cassette: the folder as given, then its path in the folder
    in_folder: bool = False


@dataclass(frozen=True)
class _Checked:
    """A source and the report on it."""

    source: _Source
    report: Report
    log: bool
    saved: int | None = None  # findings saved into the log; None: not a log, or --no-save


def _each(paths: tuple[Path, ...]) -> Iterator[_Source]:
    """The sources given, each cassette of a folder one of its own (named by the folder as
    given and its path in it): two cassettes are two recordings, whatever folder holds them,
    and two of one name in two folders are told apart. A file given twice (by the same path
    or another to it, or in a folder given too) is checked once."""
    seen: set[Path] = set()
    for source in _given(paths):
        if source.path.resolve() not in seen:
            seen.add(source.path.resolve())
            yield source


def _given(paths: tuple[Path, ...]) -> Iterator[_Source]:
    for path in paths:
        if not path.is_dir():
            yield _Source(path)
            continue
        try:
            members = cassettes_in(path, _warn)
        except TasktapeError as exc:
            raise click.BadParameter(str(exc), param_hint="SOURCE") from None
        yield from (_Source(path / member, in_folder=True) for member in members)


def _warn(message: str) -> None:
    click.echo(f"tasktape check: WARNING: {shown(message)}", err=True)


def _read(source: _Source, save: bool, only: tuple[str, ...]) -> _Checked | _Source:
    """The report on one source, read as it is; the source itself for a log to save
    findings into that is older than this tasktape: read once upgraded (see ``check``)."""
    # Here, not at the top: the inspector package is Datasette's plugin, and importing it
    # costs every tasktape command its start-up time.
    from tasktape.eventlog.checker import report_recorded  # noqa: PLC0415

    path = source.path
    try:
        if source.in_folder:  # (its exchanges' origins name it as the folder was given)
            return _Checked(
                source, report_recorded(read_cassette(path, path.as_posix()), only or None), log=False
            )
        if not (path.is_file() and is_log(path)):
            return _Checked(source, report_recorded(load([path]), only or None), log=False)
        # (refuses what is no log, or a damaged one: a check never makes one)
        if save and schema_version(path, whole=True) < SCHEMA_VERSION:
            return source
        return _of_log(source, only)
    except (OSError, TasktapeError) as exc:  # (what is wrong with a cassette names what it holds)
        raise click.BadParameter(shown(str(exc)), param_hint="SOURCE") from None


def _of_log(source: _Source, only: tuple[str, ...]) -> _Checked:
    """The report on a log of this tasktape's schema."""
    from tasktape.eventlog.checker import report_log  # noqa: PLC0415 - see _read

    with EventLog(source.path) as log:
        return _Checked(source, report_log(log, None, only or None), log=True)


def _upgraded(source: _Source, only: tuple[str, ...]) -> _Checked:
    """The report on an older log, upgraded first as tasktape upgrade does."""
    try:
        upgrade_log(source.path)
        return _of_log(source, only)
    except LogBusy as exc:  # (a recorder still writes it): as a save refused
        raise click.UsageError(
            f"{exc}: an older log is upgraded before findings are saved into it; check it again once "
            "that writer is done"
        ) from None
    except (OSError, TasktapeError) as exc:
        raise click.BadParameter(str(exc), param_hint="SOURCE") from None


def _saved(checked: _Checked) -> _Checked:
    """The log's findings saved into it, in place of those of the exchanges checked before."""
    from tasktape.eventlog.checker import save_findings  # noqa: PLC0415 - see _read

    report = checked.report
    try:
        saved = save_findings(checked.source.path, report.findings, exchange_ids=report.exchange_ids)
    except (LogError, sqlite3.Error) as exc:
        raise click.UsageError(f"{exc}; check it with --no-save to leave it as it is") from None
    return replace(checked, saved=saved)


def _line(checked: _Checked, finding: Finding) -> str:
    """A finding, its source named as given: two files of one name in two folders are told
    apart (a folder's cassette by the folder as given and its path in it). Its task id and
    message come from the recording: shown as a console shows them."""
    source = checked.source
    if finding.exchange_id is not None:
        place = f"{source.path} exchange {finding.exchange}"
    elif not source.in_folder:  # (its exchanges' origins name the file alone, then the line)
        place = f"{source.path}{finding.exchange.removeprefix(source.path.name)}"
    else:
        place = finding.exchange
    event = "" if finding.seq is None else f" event {finding.seq}"
    return shown(f"{finding.task_id or '-'}  {place}{event}  {finding.rule}: {finding.message}")


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
    from tasktape.eventlog.checker import all_rules, protocol_names  # noqa: PLC0415 - see _read

    unknown = sorted(set(protocols) - set(protocol_names()))
    if unknown:
        raise click.BadParameter(
            f"unknown protocol {', '.join(unknown)} (known: {', '.join(protocol_names())})",
            param_hint="--protocol",
        )
    rules = all_rules()
    save = not no_save
    # Every source read, bad input refused, before any log is upgraded; every older log
    # upgraded (a busy one refused) before findings are saved into any.
    read = [_read(source, save, protocols) for source in _each(sources)]
    checked = [each if isinstance(each, _Checked) else _upgraded(each, protocols) for each in read]
    results = [_saved(each) if save and each.log else each for each in checked]
    findings = [(c, f) for c in results for f in c.report.findings]
    cut_short = [(c, f) for c in results for f in c.report.cut_short]
    by_rule = Counter(f.rule for _, f in findings)
    totals = {
        key: sum(getattr(c.report, key) for c in results)
        for key in ("streams", "exchanges", "tasks", "reconnects")
    }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "sources": [
                        {
                            "source": str(c.source.path),
                            "streams": c.report.streams,
                            "exchanges": c.report.exchanges,
                            "tasks": c.report.tasks,
                            "reconnects": c.report.reconnects,
                            "by_protocol": c.report.by_protocol,
                            "findings": len(c.report.findings),
                            "saved": c.saved,
                        }
                        for c in results
                    ],
                    "findings": [_as_dict(c, f) for c, f in findings],
                    "cut_short": [_as_dict(c, f) for c, f in cut_short],
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
        for each, finding in findings:
            click.echo(_line(each, finding))
        for each, note in cut_short:
            click.echo(_line(each, note))
        _summary(results, totals, by_rule, len(cut_short))
    if findings:
        raise SystemExit(1)


def _as_dict(checked: _Checked, finding: Finding) -> dict[str, Any]:
    return {"source": str(checked.source.path), **asdict(finding)}


def _by_protocol(results: list[_Checked]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for checked in results:
        counts.update(checked.report.by_protocol)
    return dict(counts)


def _summary(results: list[_Checked], totals: dict[str, int], by_rule: Counter[str], cut: int) -> None:
    from tasktape.eventlog.checker import all_rules, explain  # noqa: PLC0415 - see _read

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
    for checked in results:
        if checked.saved is not None:
            click.echo(
                f"Saved {counted(checked.saved, 'finding')} into {checked.source.path} (table findings)."
            )
