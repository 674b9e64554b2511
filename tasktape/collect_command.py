"""``tasktape collect``: a fleet's rows from NATS JetStream into one event log."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from tasktape.errors import LogError, UsageError
from tasktape.eventlog.sqlite_settings import stop_counting_memory
from tasktape.fleet.names import FETCH, STREAM, jetstream_name, parse_servers
from tasktape.fleet.names import shown as shown_servers
from tasktape.stop_signals import stop_signals

from .option_checks import Seconds, checked, clickhouse_url, refused_log


@click.command("collect")
@click.option(
    "--from",
    "source",
    required=True,
    metavar="nats://HOST:PORT[,HOST:PORT...]",
    help="The NATS JetStream cluster recorders ship to (tasktape record --ship).",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The event log to collect into (created if needed), to inspect and replay as any log.",
)
@click.option(
    "--clickhouse",
    metavar="URL",
    callback=checked(clickhouse_url),
    help="Or into ClickHouse: http://HOST:8123 for a server, chdb:///ABS/PATH or chdb://REL for the "
    "embedded engine (pip install 'tasktape[clickhouse]').",
)
@click.option(
    "--consumer",
    metavar="NAME",
    callback=checked(jetstream_name),
    help="The durable consumer: collectors of one name share its rows; each sink needs its own "
    "[default: the sink's own, made with it: a new sink gets the whole stream, and one collected "
    "into before takes up where it stopped].",
)
@click.option(
    "--stream",
    default=STREAM,
    show_default=True,
    metavar="NAME",
    callback=checked(jetstream_name),
    help="The JetStream stream.",
)
@click.option(
    "--ack-wait",
    type=Seconds(min=0.5),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long rows handed to a collector that died wait before they are handed out again.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=FETCH,
    show_default=True,
    metavar="N",
    help="Messages fetched, written in one transaction, then acknowledged, at a time.",
)
@click.option(
    "--until-idle",
    type=Seconds(min=0, min_open=True),
    metavar="SECONDS",
    help="Stop by itself once nothing has come for this long and nothing is left to hand out "
    "(collect what the stream holds, then exit) [default: until Ctrl-C].",
)
@click.option("--quiet", is_flag=True, help="Print only errors.")
def collect(
    source: str,
    db: Path | None,
    clickhouse: str | None,
    consumer: str | None,
    stream: str,
    ack_wait: float,
    batch: int,
    until_idle: float | None,
    quiet: bool,
) -> None:
    """Collect every row the recorders of a fleet ship into one event log, until Ctrl-C
    (or, with --until-idle, until nothing more comes).

    Each row is written once however often it arrives (a redelivery, a resend), keyed by
    the uid of its capture and exchange; the log's integer ids are its own. Rows are
    acknowledged once committed: a collector stopped or killed loses nothing, and the next
    one of its consumer takes up where it stopped. Into ClickHouse, about a second of rows
    goes into each insert.
    Exit status: 0 stopped (Ctrl-C, or idle with --until-idle), 1 not collecting (a broker or
    ClickHouse not reached or refusing, the log busy with another writer), 2 bad input
    (--db no event log; --from, --clickhouse, --stream or --consumer refused).
    """
    if (db is None) == (clickhouse is None):
        raise click.UsageError("collect into one sink: --db PATH or --clickhouse URL")
    try:
        servers = parse_servers(source)
    except UsageError as exc:
        raise click.BadParameter(str(exc), param_hint="--from") from None
    # Here: NATS's client and the sink load only for this command.
    from tasktape.errors import Unauthorized  # noqa: PLC0415
    from tasktape.fleet.clickhouse_sink import shown  # noqa: PLC0415
    from tasktape.fleet.collector import Collector, Sink  # noqa: PLC0415

    into = str(db) if db is not None else shown(str(clickhouse))

    def say(line: str) -> None:
        if not quiet or line.startswith("WARNING"):
            click.echo(f"tasktape collect: {line}", err=line.startswith("WARNING"))

    async def run(sink: Sink) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in stop_signals():
            loop.add_signal_handler(sig, stop.set)
        name = consumer or sink.consumer()
        collector = Collector(
            servers,
            sink,
            consumer=name,
            stream=stream,
            batch=batch,
            ack_wait=ack_wait,
            until_idle=until_idle,
            on_status=say,
        )
        say(f"collecting {stream} from {shown_servers(servers)} into {into} (consumer {name})")
        stats = await collector.run(stop)
        if stats.unreached is not None:
            raise UsageError(
                f"{stats.unreached}: with --until-idle, a broker that does not answer for "
                f"{until_idle:g} s is given up on"
            )
        say(f"stopped: {stats.rows:,} rows from {stats.messages:,} messages, {stats.written:,} new")

    if db is not None:
        stop_counting_memory()  # this process writes one log
    try:
        opened = open_sink(db, clickhouse)
    except LogError as exc:  # (--db no event log: bad input; held by a writer: not now)
        raise refused_log(exc) from None
    except UsageError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        with opened as sink:
            asyncio.run(run(sink))
    except Unauthorized as exc:  # as a wrong --from would be
        raise click.BadParameter(str(exc), param_hint="--from") from None
    except (LogError, UsageError) as exc:  # (rows it cannot take yet wait for a collector that can)
        raise click.ClickException(str(exc)) from None


def open_sink(db: Path | None, clickhouse: str | None) -> Any:
    """The sink asked for, opened (a context manager)."""
    if db is not None:
        from tasktape.fleet.sqlite_sink import SqliteSink  # noqa: PLC0415

        return SqliteSink(db)
    from tasktape.fleet.clickhouse_sink import ClickHouseSink  # noqa: PLC0415

    return ClickHouseSink(str(clickhouse))
