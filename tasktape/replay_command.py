"""``tasktape replay``: serve recordings as live HTTP."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from tasktape.errors import LogError, TasktapeError, UsageError
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.exchange_rows import ExchangeSummary, Kept
from tasktape.eventlog.file_kinds import is_log
from tasktape.eventlog.frames import at_log_end
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.process_writer import ProcessLogWriter
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import Redactor
from tasktape.proxy import RecordingProxy
from tasktape.proxy.recorder import upstream_url
from tasktape.replay import ReplayMode, ReplayServer, fidelity, load, settings
from tasktape.replay.faults import Faults
from tasktape.replay.kept import times
from tasktape.replay.matching import Shown
from tasktape.replay.modes import NOTHING_REPLAYED

from .counted import counted
from .listen import (
    DEFAULT_REPLAY_PORT,
    Exposure,
    HostPort,
    allow_host_option,
    answered_hosts,
    warn_if_exposed,
)
from .option_checks import checked, each_named
from .record import EXIT_LOG_FAILED
from .redaction_options import json_pointers, redaction_options
from .serving import bind, serve_until_stopped


@click.command()
@click.argument("sources", nargs=-1, metavar="[SOURCE]...", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--listen",
    type=HostPort(),
    default=f"127.0.0.1:{DEFAULT_REPLAY_PORT}",
    show_default=True,
    help="Address to listen on (HOST:PORT, or just PORT).",
)
@click.option(
    "--speed",
    type=float,
    default=1.0,
    show_default=True,
    callback=checked(settings.speed),
    help="Replay this many times faster than recorded; 0: as fast as possible.",
)
@click.option(
    "--add-ids",
    is_flag=True,
    help="Give events recorded without an SSE id a stable one, so clients can resume them.",
)
@click.option(
    "--mode",
    default="replay",
    show_default=True,
    callback=checked(ReplayMode.parse),
    metavar="[" + "|".join(ReplayMode) + "]",
    help="replay: a miss is an error; record-missing: misses go to --upstream and are recorded; "
    "passthrough: everything goes to --upstream.",
)
@click.option(
    "--upstream",
    metavar="URL",
    help="The agent, for record-missing and passthrough (refused in replay mode).",
)
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The log record-missing adds to (default: SOURCE, when it is one log); refused in other modes.",
)
@redaction_options(within="what record-missing records and what misses report")
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="SPEC",
    callback=each_named("a fault spec, e.g. drop-after=3 or stall=2:500"),
    help="Arm a fault: drop-after=N, cut-frame=N, reset-after=N, duplicate=N, skip=N, swap=N, corrupt=N, "
    "stall=N:MS, drip=BYTES_PER_S, status=S, delay-headers=MS, content-type=TYPE or no-final, scoped with "
    "times=K, every=K, p=P;seed=S, path=GLOB (repeatable: each spec counts on its own; per request, send "
    "the X-Tasktape-Fault header; while running, POST /_tasktape/faults).",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="POINTER",
    callback=json_pointers,
    help="A JSON pointer of the request body to leave out of matching (repeatable; * for any key).",
)
@click.option(
    "--match-header",
    "match_headers",
    multiple=True,
    metavar="NAME",
    callback=each_named("a header's name, e.g. X-Tenant"),
    help="A request header that must match too (repeatable; a value redacted in the recording matches any).",
)
@click.option(
    "--miss-status",
    type=int,
    callback=checked(settings.miss_status),
    help="The HTTP status of the answer to a request nothing recorded matches: an error status, 400 to 599 "
    "(default: 404; 400 for MCP, whose clients take a 404 for the end of their session); mode replay only: "
    "record-missing forwards a miss.",
)
@click.option(
    "--allow-repeats",
    is_flag=True,
    help="Once identical recordings are used up, answer with the last one again (agent cards always are).",
)
@allow_host_option()
def replay(
    sources: tuple[Path, ...],
    listen: tuple[str, int],
    speed: float,
    add_ids: bool,
    mode: ReplayMode,
    upstream: str | None,
    db: Path | None,
    redact_header: tuple[str, ...],
    redact_query: tuple[str, ...],
    redact_json: tuple[str, ...],
    faults: tuple[str, ...],
    ignore: tuple[str, ...],
    match_headers: tuple[str, ...],
    miss_status: int | None,
    allow_repeats: bool,
    allow_host: tuple[str, ...],
) -> None:
    """Answer requests with what SOURCE recorded: event logs, cassettes, or folders of cassettes
    (needed unless --mode passthrough, which replays nothing).

    Requests match on method, path, query and body (compared as JSON, ignoring what
    clients regenerate: messageId, timestamps, the JSON-RPC id; and redacted values),
    and on the headers named with --match-header.
    Identical requests are answered in recorded order. Streams are sent at their recorded
    pace (--speed), chunk by chunk, byte for byte; a Last-Event-ID header resumes one after
    that event; tasks/{id}:subscribe gets the task's recorded events. On exit, it says what
    was served, what missed or was refused, and which recordings were never used.
    Exit status: 0 stopped (Ctrl-C), 1 it could not serve (a port in use, the --db log busy
    with another writer), 2 bad input (a SOURCE no log or cassette, a bad --fault), 3
    record-missing forwarded exchanges the log could not keep (rows not written).
    """
    if not sources and mode is not ReplayMode.PASSTHROUGH:  # (passthrough replays nothing)
        raise click.UsageError(
            "Missing argument 'SOURCE...': the logs or cassettes to replay (needed unless --mode "
            "passthrough)."
        )
    if faults and mode is ReplayMode.PASSTHROUGH:
        raise click.BadParameter(NOTHING_REPLAYED, param_hint="--fault")
    # Usage errors (status 2), as tasktape check says of its sources.
    try:
        armed = [Faults.parse(spec) for spec in faults]
    except TasktapeError as exc:
        raise click.BadParameter(str(exc), param_hint="--fault") from None
    try:
        recorded = load(list(sources), _warn)
    except TasktapeError as exc:  # (what is wrong with a cassette names what it holds)
        raise click.BadParameter(shown(str(exc)), param_hint="SOURCE") from None
    writer = None
    if mode is not ReplayMode.REPLAY and not upstream:
        raise click.BadParameter(f"mode {mode.value} needs --upstream", param_hint="--upstream")
    redactor = Redactor(redact_header, redact_json, query=redact_query)
    under_way = cut_at_log_end(recorded, Shown.of(redactor))
    if upstream:
        try:
            upstream_url(upstream, redactor)
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="--upstream") from None
    _refuse_other_modes_options(click.get_current_context(), mode)
    host, port = listen
    sock = bind(host, port)  # before the log is opened: a port in use leaves it as it was
    if mode is ReplayMode.RECORD_MISSING:
        if db is None:
            logs = [s for s in sources if s.is_file() and is_log(s)]
            if len(sources) != 1 or not logs:
                raise click.BadParameter(
                    "record-missing needs --db (unless SOURCE is one log)", param_hint="--db"
                )
            db = logs[0]
        try:
            writer = ProcessLogWriter(db, redactor=redactor)
        except LogError as exc:
            raise click.ClickException(str(exc)) from None
    warn_if_exposed("tasktape replay", host, Exposure.RECORDER if writer is not None else Exposure.REPLAY)
    handler = logging.StreamHandler()
    handler.setFormatter(_ShownMessages("%(message)s"))
    logging.basicConfig(handlers=[handler])
    server = ReplayServer(
        recorded,
        speed=speed,
        mode=mode,
        upstream=upstream,
        writer=writer,
        log_path=db,
        add_ids=add_ids,
        faults=armed,
        miss_status=miss_status,
        ignore=ignore,
        match_headers=match_headers,
        allow_repeats=allow_repeats,
        allowed_hosts=answered_hosts(host, allow_host),
        redactor=redactor,
    )
    unrecorded = None if writer is None or server.proxy is None else _Unrecorded(server.proxy, writer, db)
    names = ", ".join(str(s) for s in sources)
    try:
        asyncio.run(
            serve_until_stopped(
                server.app,
                host,
                port,
                ready=lambda url: (
                    f"tasktape replay: on {url}, everything goes to {upstream} (mode {mode.value})"
                    if mode is ReplayMode.PASSTHROUGH
                    else f"tasktape replay: {counted(len(recorded), 'exchange')} from {names} on {url} "
                    f"(speed {speed:g}, mode {mode.value})"
                ),
                stopping="tasktape replay: stopping",
                sock=sock,
            )
        )
    finally:
        if writer is not None:
            writer.close()
    for line in report(server, under_way):
        click.echo(shown(line), err=True)
    if unrecorded is not None and unrecorded.stats.rows_lost:
        for line in unrecorded.said():
            click.echo(shown(line), err=True)
        sys.exit(EXIT_LOG_FAILED)


class _Unrecorded:
    """record-missing: the forwarded exchanges the log does not keep whole (rows it could
    not write), as the writer tells of each once it ends. One it holds nothing of is no
    recording to replay: it is not read back from the log."""

    def __init__(self, proxy: RecordingProxy, writer: ProcessLogWriter, db: Path | None) -> None:
        self.exchanges: list[ExchangeSummary] = []
        self.stats, self._db = writer.stats, db
        self._replay, proxy.on_exchange = proxy.on_exchange, self._told

    def _told(self, summary: ExchangeSummary) -> None:  # (on the writer's thread)
        if summary.kept is not None:
            self.exchanges.append(summary)
        if summary.kept is not Kept.NOTHING and self._replay is not None:
            self._replay(summary)

    def said(self) -> list[str]:
        """The exit summary's lines on what the log lost, as ``tasktape record`` says it."""
        stats = self.stats
        lost = f"{stats.rows_lost:,} rows could not be written to {self._db} ({stats.last_error})"
        if not self.exchanges:
            return [f"  {lost}"]
        were = "was" if len(self.exchanges) == 1 else "were"
        told = f"{counted(len(self.exchanges), 'forwarded exchange')} {were} not recorded whole"
        return [f"  {told}, {lost}:", *(f"    {x.method} {x.path}: {x.kept}" for x in self.exchanges)]


# The options only some modes use, by parameter name: given with another mode, they would
# be left unused unnoticed (a log --db names never made, traffic never recorded, values
# never redacted, requests never matched). Redaction hides values from what misses report,
# and record-missing redacts what it records too; passthrough has neither (it records
# nothing, and nothing misses), and it matches and replays nothing. Only replay answers a
# miss itself: record-missing forwards it.
_REPLAYING = (ReplayMode.REPLAY, ReplayMode.RECORD_MISSING)
_MODES_OF = {
    "db": (ReplayMode.RECORD_MISSING,),
    "upstream": (ReplayMode.RECORD_MISSING, ReplayMode.PASSTHROUGH),
    "redact_header": _REPLAYING,
    "redact_query": _REPLAYING,
    "redact_json": _REPLAYING,
    "speed": _REPLAYING,
    "add_ids": _REPLAYING,
    "ignore": _REPLAYING,
    "match_headers": _REPLAYING,
    "allow_repeats": _REPLAYING,
    "miss_status": (ReplayMode.REPLAY,),
}


def _warn(message: str) -> None:
    click.echo(f"tasktape replay: WARNING: {shown(message)}", err=True)


class _ShownMessages(logging.Formatter):
    """The server's log lines name requests as clients sent them and exchanges as they were
    recorded: their messages as a console shows them (a traceback keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return shown(super().formatMessage(record))


def _refuse_other_modes_options(ctx: click.Context, mode: ReplayMode) -> None:
    """A usage error for an option given (on the command line, even with its default
    value) that ``mode`` has no use for, naming the modes that have."""
    for param in ctx.command.params:
        modes = _MODES_OF.get(param.name or "")
        if modes is None or mode in modes or _left_out(ctx, param.name or ""):
            continue
        option, needs = param.opts[0], " or ".join(m.value for m in modes)
        raise click.BadParameter(
            f"{option} is for mode {needs}; mode {mode.value} has no use for it", param_hint=option
        )


def _left_out(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT)


def cut_at_log_end(recorded: list[Recorded], requests: Shown) -> list[Recorded]:
    """The exchanges a log held no end of when it was read (a recorder still writes them, or
    was killed), cut short where the log stops, as every reader of a log takes them: they break
    off there, as a recording cut short does. Said as they load, as ``requests`` shows them."""
    under_way = at_log_end(recorded)
    for r in under_way:
        click.echo(
            shown(
                f"tasktape replay: {r.origin} ({requests.request_line(r)}) has no end in the log yet: "
                f"replayed as cut short there ({Outcome.LOG_CLOSED})"
            ),
            err=True,
        )
    return under_way


def report(server: ReplayServer, under_way: list[Recorded]) -> list[str]:
    """What was served, what missed, what was refused, which faults requests asked for
    were not made, which recordings were never used, and which the log held no end of;
    requests with no credential's value, as the misses show them."""
    stats = server.stats
    requests = server.recordings.shown
    lines = [
        f"tasktape replay: {stats.served:,} served, {stats.misses.total:,} missed"
        + (f", {stats.refusals.total:,} refused" if stats.refusals.total else "")
        + (f", {stats.forwarded:,} forwarded" if stats.forwarded else "")
    ]
    for miss, n in stats.misses.distinct():
        lines.append(f"  missed {miss.request}{times(n)}")
        lines += [
            f"    closest: {c['request']} ({c['recorded']}): {'; '.join(c['differs'])}" for c in miss.closest
        ]
    lines += [f"  {rest}" for rest in stats.misses.rest("request", "that missed otherwise")]
    lines += [f"  refused {refused}{times(n)}" for refused, n in stats.refusals.distinct()]
    lines += [f"  {rest}" for rest in stats.refusals.rest("request", "refused otherwise")]
    lines += [f"  {unapplied}{times(n)}" for unapplied, n in stats.not_applied.distinct()]
    lines += [f"  {rest}" for rest in stats.not_applied.rest("fault", "not applied otherwise")]
    unused = server.unused() if server.mode is not ReplayMode.PASSTHROUGH else []
    if unused:
        were = "was" if len(unused) == 1 else "were"
        lines.append(f"  {counted(len(unused), 'recorded exchange')} {were} never used:")
        lines += [f"    {requests.request_line(r)} ({r.origin})" for r in unused]
    if under_way:
        lines.append(
            f"  {counted(len(under_way), 'recorded exchange')} the log held no end of when it was read, "
            f"replayed cut short there ({Outcome.LOG_CLOSED}):"
        )
        lines += [f"    {requests.request_line(r)} ({r.origin})" for r in under_way]
    return lines + fidelity.summary(server.fidelity)
