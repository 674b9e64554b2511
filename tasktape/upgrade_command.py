"""``tasktape upgrade``: event logs of an older tasktape brought to this one's schema."""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path

import click

from tasktape.errors import LogBusy, LogError
from tasktape.eventlog.file_kinds import FileKind, kind_of
from tasktape.eventlog.schema import SCHEMA_VERSION, named_kind, schema_version, upgrade_log


class Status(IntEnum):
    """The exit status, the highest of the logs'."""

    CURRENT = 0  # at this version (or upgraded to it)
    CHANGES = 1  # --dry-run: would be upgraded; else: could not be now (another writer holds it)
    CANNOT = 2  # no log this tasktape can upgrade (another kind of file, a newer tasktape's)


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
    still writing an older log is refused (one at this version is left as it is). A log of
    a newer tasktape is refused too, unchanged.
    Exit status: 0 every log at this version; 1 some log would be upgraded (--dry-run), or
    could not be now (another writer holds it); 2 some file no log this tasktape can
    upgrade (another kind of file, a newer tasktape's log).
    """
    worst = max(_upgrade_one(log, dry_run) for log in logs)
    if worst:
        raise SystemExit(worst)


def _upgrade_one(log: Path, dry_run: bool) -> Status:
    kind = kind_of(log)
    if kind is not FileKind.LOG:
        click.echo(f"tasktape upgrade: {log} is {named_kind(log)}: no log to upgrade", err=True)
        return Status.CANNOT
    try:
        before, after = (schema_version(log, whole=True), SCHEMA_VERSION) if dry_run else upgrade_log(log)
    except LogBusy as exc:
        click.echo(f"tasktape upgrade: {exc}", err=True)
        return Status.CHANGES
    except LogError as exc:
        click.echo(f"tasktape upgrade: {exc}", err=True)
        return Status.CANNOT
    if before > after:
        click.echo(f"tasktape upgrade: {log} is of a newer tasktape (schema version {before})", err=True)
        return Status.CANNOT
    if before == after:
        click.echo(f"tasktape upgrade: {log}: already at schema version {after}")
        return Status.CURRENT
    would = "would go" if dry_run else "went"
    click.echo(f"tasktape upgrade: {log}: schema version {before} {would} to {after}")
    return Status.CHANGES if dry_run else Status.CURRENT
