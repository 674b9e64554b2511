"""``tasktape upgrade``: event logs of an older tasktape brought to this one's schema."""

from __future__ import annotations

from pathlib import Path

import click

from tasktape.errors import LogError
from tasktape.eventlog.file_kinds import FileKind, kind_of
from tasktape.eventlog.schema import upgrade_log


@click.command("upgrade")
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
def upgrade(logs: tuple[Path, ...]) -> None:
    """Upgrade event logs written by an older tasktape to this version's schema, in place.

    The commands that only read a log (replay, export, diff, check --no-save, inspect)
    refuse an older one and name this command; those that write one (record, import,
    merge, check) upgrade it themselves. Upgrading takes the log's writer lock: a recorder
    still writing it is refused. A log of a newer tasktape is refused too, unchanged.
    """
    failed = False
    for log in logs:
        kind = kind_of(log)
        if kind is not FileKind.LOG:
            click.echo(f"tasktape upgrade: {log} is {kind}, not an event log", err=True)
            failed = True
            continue
        try:
            before, after = upgrade_log(log)
        except LogError as exc:
            click.echo(f"tasktape upgrade: {exc}", err=True)
            failed = True
            continue
        done = (
            f"schema version {before} -> {after}" if before < after else f"already at schema version {after}"
        )
        click.echo(f"tasktape upgrade: {log}: {done}")
    if failed:
        raise SystemExit(1)
