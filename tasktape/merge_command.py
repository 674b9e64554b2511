"""``tasktape merge``: several event logs in one, without id collisions."""

from __future__ import annotations

from pathlib import Path

import click

from tasktape.errors import LogBusy, LogError, LogUnwritable
from tasktape.eventlog.file_kinds import FileKind, kind_of
from tasktape.eventlog.merge import merge_logs
from tasktape.eventlog.schema import named_kind

from .cassette_commands import folder_for
from .option_checks import bad_input, refuse_as_output


@click.command("merge")
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The log to merge them into (created if needed, its folder too; what it holds stays).",
)
def merge(logs: tuple[Path, ...], output: Path) -> None:
    """Merge event logs, one recorder's each, into one log to inspect and replay.

    Captures and exchanges are told apart by their uid (a UUIDv7), not their integer ids,
    which are local to each file: merged rows get the output's next ids. Merging is
    idempotent: a log merged again, or into an output that already holds it, adds nothing
    but what it gained since (the rest of exchanges still under way when it was merged
    before). A log still being recorded can be merged: what it held when its turn came.
    Exit status: 0 merged, 1 not (the output busy with another writer, or not written: a full
    disk), 2 bad input (a file no event log this tasktape reads, a log merged into itself).
    """
    for log in logs:
        kind = kind_of(log)
        if kind is FileKind.EMPTY:
            raise bad_input(f"{log} is empty: there is nothing to merge")
        if named_kind(log) in (FileKind.DATABASE, FileKind.OTHER):
            raise bad_input(f"{log} is {named_kind(log)}: there is nothing to merge")
        if kind is not FileKind.LOG:
            raise bad_input(
                f"{log} is {kind}, not an event log: tasktape import {log} --db {output} reads it into one"
            )
    folder_for(output)  # (first: a file where its folder is meant is said so)
    refuse_as_output(output, "merge")
    made = not output.exists()
    try:
        for report in merge_logs(logs, output):
            click.echo(f"tasktape merge: {report.describe()}", err=True)  # (stdout stays for data)
    except LogBusy as exc:  # another writer holds the output: a failure, not bad input
        raise click.ClickException(str(exc)) from None
    except LogError as exc:
        if made:  # (a log it made of what it read before a source failed: not one asked for)
            for path in (output, Path(f"{output}-wal"), Path(f"{output}-shm")):
                path.unlink(missing_ok=True)
        if isinstance(exc, LogUnwritable):  # (a full disk: a failure, not bad input)
            raise click.ClickException(str(exc)) from None
        raise bad_input(str(exc)) from None
