"""``tasktape merge``: several event logs in one, without id collisions."""

from __future__ import annotations

from pathlib import Path

import click

from tasktape.errors import LogError
from tasktape.eventlog.file_kinds import FileKind, kind_of
from tasktape.eventlog.merge import merge_logs


@click.command("merge")
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The log to merge them into (created if needed; what it holds stays).",
)
def merge(logs: tuple[Path, ...], output: Path) -> None:
    """Merge event logs, one recorder's each, into one log to inspect and replay.

    Captures and exchanges are told apart by their uid (a UUIDv7), not their integer ids,
    which are local to each file: merged rows get the output's next ids. Merging is
    idempotent: a log merged again, or into an output that already holds it, adds nothing
    but what it gained since (the rest of exchanges still under way when it was merged
    before). A log still being recorded can be merged: what it held when its turn came.
    """
    for log in logs:
        kind = kind_of(log)
        if kind is FileKind.EMPTY:
            raise click.ClickException(f"{log} is empty: there is nothing to merge")
        if kind is not FileKind.LOG:
            raise click.ClickException(
                f"{log} is {kind}, not an event log: tasktape import {log} --db {output} reads it into one"
            )
    if output.is_file() and kind_of(output) not in (FileKind.LOG, FileKind.EMPTY):
        raise click.ClickException(f"{output} is {kind_of(output)}: merge writes an event log, not over it")
    try:
        for report in merge_logs(logs, output):
            click.echo(f"tasktape merge: {report.describe()}")
    except LogError as exc:
        raise click.ClickException(str(exc)) from None
