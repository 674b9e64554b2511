"""``tasktape pull``: a slice of a fleet's ClickHouse record into a local event log."""

from __future__ import annotations

from pathlib import Path

import click

from tasktape.errors import LogError, UsageError

from .option_checks import bad_input, checked, clickhouse_url, log_output, refused_log


@click.command("pull")
@click.option(
    "--clickhouse",
    required=True,
    metavar="URL",
    callback=checked(clickhouse_url),
    help="Where tasktape collect wrote: http://HOST:8123, chdb:///ABS/PATH or chdb://REL.",
)
@click.option("--task", metavar="ID", help="The exchanges of this task.")
@click.option("--context", metavar="ID", help="The exchanges of this context.")
@click.option(
    "--since", metavar="TIME", help="The exchanges started at or after this ISO 8601 time (UTC unless said)."
)
@click.option("--until", metavar="TIME", help="And before this one.")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    callback=log_output("pull"),
    help="The event log to write them into (created if needed).",
)
def pull(
    clickhouse: str, task: str | None, context: str | None, since: str | None, until: str | None, output: Path
) -> None:
    """Bring a slice of a fleet's ClickHouse record into a local log, for tasktape inspect and replay.

    The slice is one task's exchanges, one context's, or those started in a time range;
    each comes with its capture, chunks, events and resumes, byte for byte. Rows are keyed
    by uid, so pulling into a log that holds them already adds nothing.
    Exit status: 0 pulled, 1 not (ClickHouse not reached or refusing, its store open in
    another process, nothing matching the slice, the log busy with another writer), 2 bad
    input (no one slice, a time that is not ISO 8601, --clickhouse no ClickHouse URL, -o a
    file that is no event log).
    """
    # Here: clickhouse-connect loads only for this command.
    from tasktape.fleet.pull import Slice, parse_time, pull_slice  # noqa: PLC0415

    try:
        chosen = Slice(
            task=task,
            context=context,
            since=parse_time(since) if since else None,
            until=parse_time(until) if until else None,
        )
    except UsageError as exc:
        raise bad_input(str(exc)) from None
    try:
        applied = pull_slice(clickhouse, chosen, output)
    except LogError as exc:
        raise refused_log(exc) from None
    except UsageError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"tasktape pull: {applied.rows:,} rows ({applied.written:,} new) -> {output}")
