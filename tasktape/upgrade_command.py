"""``tasktape upgrade``: event logs of an older tasktape brought to this one's schema."""

from __future__ import annotations

from pathlib import Path

import click

from tasktape.errors import LogError
from tasktape.eventlog.file_kinds import FileKind, kind_of
from tasktape.eventlog.schema import SCHEMA_VERSION, schema_version, upgrade_log


@click.command("upgrade")
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say which logs an upgrade would change, and change none; exit 1 if any would be.",
)
def upgrade(logs: tuple[Path, ...], dry_run: bool) -> None:
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
            before, after = (schema_version(log), SCHEMA_VERSION) if dry_run else upgrade_log(log)
        except LogError as exc:
            click.echo(f"tasktape upgrade: {exc}", err=True)
            failed = True
            continue
        if before > after:
            click.echo(f"tasktape upgrade: {log} is of a newer tasktape (schema version {before})", err=True)
            failed = True
        elif before == after:
            click.echo(f"tasktape upgrade: {log}: already at schema version {after}")
        else:
            failed |= dry_run
            would = "would go" if dry_run else "went"
            click.echo(f"tasktape upgrade: {log}: schema version {before} {would} to {after}")
    if failed:
        raise SystemExit(1)
