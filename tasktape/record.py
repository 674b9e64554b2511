"""``tasktape record``: the recording reverse proxy, from the command line."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource
from yarl import URL

from tasktape.errors import LogError, UsageError
from tasktape.eventlog.a2a_terms import short_state
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.content_coding import MAX_DECODED
from tasktape.eventlog.exchange_rows import MAX_BODY, ExchangeSummary
from tasktape.eventlog.file_kinds import is_log
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.process_writer import ProcessLogWriter
from tasktape.eventlog.protocols import by_name
from tasktape.eventlog.redact import Redactor
from tasktape.eventlog.resumes import Resume, ResumeSide
from tasktape.fleet.names import STREAM, jetstream_name, parse_servers
from tasktape.proxy import RecordingProxy
from tasktape.proxy.live import HOLD_BYTES
from tasktape.proxy.recorder import Refusal, points_at, shown_url, upstream_url
from tasktape.proxy.resume_options import UnknownResume

from .cli import let_stdout_go
from .counted import counted
from .event_loop import event_loop_option
from .listen import (
    DEFAULT_RECORD_PORT,
    HostPort,
    allow_host_option,
    answered_hosts,
    public_url,
    warn_if_exposed,
)
from .option_checks import Seconds, checked, refused_log
from .redaction_options import redaction_options
from .serving import bind, serve_until_stopped

if TYPE_CHECKING:
    from tasktape.fleet.hints import HintSender
    from tasktape.fleet.ship_process import ShipperProcess

# Exit status when traffic flowed but some of it could not be written to the log.
EXIT_LOG_FAILED = 3


@click.command()
@click.option("--upstream", required=True, metavar="URL", help="Base URL of the agent to forward to.")
@click.option(
    "--listen",
    type=HostPort(),
    default=f"127.0.0.1:{DEFAULT_RECORD_PORT}",
    show_default=True,
    help="Address to listen on (HOST:PORT, or just PORT).",
)
@click.option(
    "--db", default="captures.db", show_default=True, type=click.Path(dir_okay=False), help="The event log."
)
@redaction_options()
@click.option(
    "--public-url",
    metavar="URL",
    callback=public_url,
    help="The proxy's URL as clients see it, written into agent cards "
    "(default: the scheme and Host of each card request).",
)
@click.option("--no-rewrite-card", is_flag=True, help="Serve agent cards exactly as the upstream sends them.")
@click.option(
    "--max-body",
    type=click.IntRange(min=0),
    default=MAX_BODY,
    show_default=True,
    metavar="BYTES",
    help="Keep at most this much of a request body or of a response body that is not an event stream.",
)
@click.option(
    "--max-decoded",
    type=click.IntRange(min=0),
    default=MAX_DECODED,
    show_default=True,
    metavar="BYTES",
    help="Decode at most this much of an exchange's compressed (Content-Encoding) bodies for the "
    "log; what is past it is kept as it came, and the exchange says so. Traffic is never changed.",
)
@click.option(
    "--max-log-size",
    type=click.IntRange(min=1),
    metavar="BYTES",
    help="Keep the log within this size, at least what an empty log takes (about 540 KB): once "
    "full, it takes nothing new (exchanges under way get their ends, without their bytes); "
    "traffic keeps flowing, and the lost rows are reported (and make the exit status 3).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Make the agent's SSE streams resumable: every event gets an id (the agent's, or one of "
    "the recorder's), a client that drops does not end the agent's stream, and a reconnect with "
    "Last-Event-ID is answered here, after that event, without reaching the agent.",
)
@click.option(
    "--hold",
    type=Seconds(min=0),
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="With --resume: how long a stream nobody follows is still read from the agent.",
)
@click.option(
    "--hold-bytes",
    type=click.IntRange(min=0),
    default=HOLD_BYTES,
    show_default=True,
    metavar="BYTES",
    help="With --resume: how many bytes of streams that ended (or were read back from the log, "
    "asleep) are still held for clients that come back (within --hold); past that, the earliest "
    "to end are let go first.",
)
@click.option(
    "--rejoin-for",
    type=Seconds(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="With --resume: how long an agent stream that broke before its task ended is "
    "subscribed to again (at once, then with backoff) before its clients' streams end as it did.",
)
@click.option(
    "--resume-unknown",
    type=click.Choice([c.value for c in UnknownResume]),
    default=UnknownResume.REFUSE.value,
    show_default=True,
    help="With --resume: what a reconnect whose Last-Event-ID names no event of the stream held "
    "for it gets: refuse (a 400 naming the ids held) or forward (it goes to the agent).",
)
@click.option(
    "--ship",
    metavar="nats://HOST:PORT[,HOST:PORT...]",
    help="Also ship every row committed to the log to this NATS JetStream cluster (see tasktape "
    "collect); rows wait in the log while it is away.",
)
@click.option(
    "--ship-stream",
    default=STREAM,
    show_default=True,
    metavar="NAME",
    callback=checked(jetstream_name),
    help="With --ship: the JetStream stream (made if missing, a replica per server up to three).",
)
@click.option(
    "--ship-drain",
    type=Seconds(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="With --ship: how long stopping waits for rows still to be shipped (the rest go out "
    "the next time the log is shipped).",
)
@allow_host_option()
@event_loop_option()
@click.option(
    "--quiet",
    is_flag=True,
    help="Print only the listening address and errors (refused requests, 502s from the upstream).",
)
def record(
    upstream: str,
    listen: tuple[str, int],
    db: str,
    redact_header: tuple[str, ...],
    redact_query: tuple[str, ...],
    redact_json: tuple[str, ...],
    public_url: str | None,
    no_rewrite_card: bool,
    max_body: int,
    max_decoded: int,
    max_log_size: int | None,
    resume: bool,
    hold: float,
    hold_bytes: int,
    rejoin_for: float,
    resume_unknown: str,
    ship: str | None,
    ship_stream: str,
    ship_drain: float,
    allow_host: tuple[str, ...],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
    quiet: bool,
) -> None:
    """Forward everything to the agent at --upstream and record it into the event log.

    Point your client (A2A, MCP, an LLM SDK) at the address printed when ready, and
    change nothing else:
    responses stream through unchanged, chunk by chunk, while every request, chunk and
    SSE event lands in the log. Stop with Ctrl-C (or SIGTERM, or SIGHUP when the terminal
    closes), even before it listens: the log is flushed and the exit status is 0, or 3 if
    anything could not be written to the log. It is 1 when it could not start (the port in
    use, the log held by another writer), 2 on bad input (an option's value, a --db that is
    no event log, or in a folder that does not exist). Standard output closed (`| head -1`
    to learn the address), exchanges are no longer printed; the recording goes on.
    """
    _Console.gone = False  # (a recorder run before in this process may have lost its own)
    redactor = Redactor(headers=redact_header, json_pointers=redact_json, query=redact_query)
    with _Started() as started:
        _only_with("--resume", resume, ("hold", "hold_bytes", "rejoin_for", "resume_unknown"))
        _only_with("--ship", ship, ("ship_stream", "ship_drain"))
        host, port = listen
        warn_if_exposed("tasktape record", host)
        # Nothing is written until the recorder can listen: a bad --upstream or a port in use
        # leaves no log file, and no empty capture in an existing one.
        try:
            url = upstream_url(upstream, redactor)
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="--upstream") from None
        try:
            servers = ship and parse_servers(ship)
        except UsageError as exc:
            raise click.BadParameter(str(exc), param_hint="--ship") from None
        sock = bind(host, port)
        address = sock.getsockname()
        if points_at(url, address):
            sock.close()
            raise click.BadParameter(
                f"{shown_url(upstream, redactor)} is this recorder's own address ({host}:{address[1]}): "
                "it would forward every request to itself",
                param_hint="--upstream",
            )
        # Shipping: the writer hands what it commits to the shipper over a pipe, already encoded.
        hints = os.pipe() if servers else None
        _say_if_upgrading(db)
        try:
            started.writer = writer = ProcessLogWriter(
                db,
                redactor=redactor,
                max_body=max_body,
                max_decoded=max_decoded,
                max_bytes=max_log_size,
                tap=hints and _hint_sender(hints[1]),
            )
        except (LogError, UsageError) as exc:
            for fd in hints or ():
                os.close(fd)
            if isinstance(exc, LogError):
                raise refused_log(exc) from None
            # The one bound the writer checks itself: --max-log-size below what an empty log
            # takes (the writer process knows how much; this one does not load the schema).
            raise click.BadParameter(str(exc), param_hint="--max-log-size") from None
        if servers:
            started.shipper = _start_shipper(db, servers, ship_stream, ship_drain, hints and hints[0])
        for fd in hints or ():  # the children hold their ends
            os.close(fd)
        proxy = RecordingProxy(  # --upstream was checked above
            upstream,
            writer,
            public_url=public_url,
            rewrite_cards=not no_rewrite_card,
            max_request_body=max_body,
            allowed_hosts=answered_hosts(host, allow_host),
            on_exchange=_print_failed if quiet else _print_exchange,
            on_refusal=_print_refusal,
            hold=hold if resume else None,
            hold_bytes=hold_bytes,
            rejoin_for=rejoin_for,
            resume_unknown=resume_unknown,
            on_resume=_print_rejoin if quiet else _print_resume,
            credential_headers=redactor.headers,
        )
        # On a thread of its own: an upstream that drops connections silently would hold the
        # start up for the probe's whole timeout.
        threading.Thread(target=_say_if_down, args=(proxy.upstream,), daemon=True).start()
        _serve(proxy, host, sock, db, loop_factory)
    writer = started.writer
    if writer is not None and writer.stats.rows_lost:
        stats = writer.stats
        click.echo(
            f"tasktape record: {stats.rows_lost} rows could not be written to {db} "
            f"({stats.failed_batches} failed batches; last error: {stats.last_error})",
            err=True,
        )
        sys.exit(EXIT_LOG_FAILED)


class _Started:
    """What a recorder started, stopped however its start or its run ends: a Ctrl-C before
    it listens stops it as one after does (from then on, stop_signals stop it)."""

    def __init__(self) -> None:
        self.writer: ProcessLogWriter | None = None
        self.shipper: ShipperProcess | None = None

    def __enter__(self) -> _Started:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: object, tb: object) -> bool:
        if self.writer is not None:
            self.writer.close()
        if self.shipper is not None:
            self.shipper.close()  # after the writer: every row is committed, to be shipped
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            click.echo("tasktape record: stopped before it was listening", err=True)
            return True
        return False


def _serve(
    proxy: RecordingProxy,
    host: str,
    sock: socket.socket,
    db: str,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None,
) -> None:
    """Serve ``proxy`` on ``sock`` until stopped."""
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(
            serve_until_stopped(
                proxy.app,
                host,
                sock.getsockname()[1],
                ready=lambda url: f"tasktape record: listening on {url} -> {proxy.upstream} (log: {db})",
                stopping="tasktape record: stopping; flushing the log",
                sock=sock,
            )
        )


def _say_if_upgrading(db: str) -> None:
    """Say so before the writer upgrades an older log: on a big one that takes seconds,
    in which the recorder answers nothing yet."""
    path = Path(db)
    try:
        if not (path.is_file() and is_log(path)):
            return
        # Only for a log that exists: a recorder on a new one does without sqlite-utils.
        from tasktape.eventlog.schema import SCHEMA_VERSION, schema_version  # noqa: PLC0415

        version = schema_version(path)
    except (OSError, LogError):
        return  # (the writer says what is wrong with it)
    if version < SCHEMA_VERSION:
        click.echo(f"tasktape record: upgrading {db} from schema {version} to {SCHEMA_VERSION}…", err=True)


def _only_with(flag: str, given: object, names: tuple[str, ...]) -> None:
    """Options that act only with ``flag``: given without it, they would do nothing, silently."""
    if given:
        return
    ctx = click.get_current_context()
    for name in names:
        if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT:
            raise click.UsageError(f"--{name.replace('_', '-')} acts only with {flag}, which is not given")


def _hint_sender(fd: int) -> HintSender:
    # Here, not at the top: the shipping format loads only for a recorder that ships.
    from tasktape.fleet.hints import HintSender  # noqa: PLC0415

    return HintSender(fd)


def _start_shipper(
    db: str, servers: list[str], stream: str, drain: float, hints_fd: int | None
) -> ShipperProcess:
    # Here, not at the top: NATS's client loads only for a recorder that ships.
    from tasktape.fleet.ship_process import ShipperProcess  # noqa: PLC0415

    prefix = "tasktape record: "
    return ShipperProcess(db, servers, stream=stream, drain=drain, prefix=prefix, hints_fd=hints_fd)


# How an exchange ends when the upstream failed its client (a 502 for an upstream that
# cannot be reached, times out or breaks; an answer it broke off): said with its reason,
# even with --quiet.
_FAILED = frozenset({Outcome.UPSTREAM_ERROR, Outcome.UPSTREAM_DISCONNECTED})


def describe_exchange(s: ExchangeSummary) -> str:
    """One line per finished exchange: request, status, task, final state, events, times."""
    # A request whose path does not say what it asks (JSON-RPC's): its operation does.
    protocol = by_name(s.protocol)
    unsaid = protocol is not None and not protocol.path_names_operation(s.binding)
    operation = f" ({s.rpc_method})" if unsaid and s.rpc_method and s.rpc_method != s.method else ""
    parts = [f"{s.method} {s.path}{operation} {s.status or '-'}"]
    if s.task_id:
        parts.append(f"task {s.task_id}")
    if s.final_state:
        parts.append(short_state(s.final_state))
    if s.is_sse:
        ttfe = "-" if s.first_event_ns is None else f"{s.first_event_ns / 1e6:.1f} ms"
        parts.append(f"{s.events} events, first after {ttfe}")
    if s.duration_ns is not None:
        parts.append(f"took {s.duration_ns / 1e6:.1f} ms")
    if s.outcome in _FAILED and s.error:  # why the client got a 502, or its answer broke off
        parts.append(f"[{s.outcome}: {s.error}]")
    elif s.outcome != Outcome.COMPLETE:
        parts.append(f"[{s.outcome}]")
    elif s.error:  # what the recorder did otherwise than asked (a header left out, a stream not held)
        parts.append(f"[{s.error}]")
    if s.kept is not None:  # what of it a full (or failing) log could not keep
        parts.append(f"{s.kept}: {s.lost}")
    else:  # --max-body: the peers got it all, the log does not have it
        cuts = [
            f"{name} cut at {_size(at)}"
            for name, at in (("request body", s.request_cut_at), ("body", s.body_cut_at))
            if at is not None
        ]
        if cuts:
            parts.append(f"{' and '.join(cuts)} in the log")
    return shown("  ".join(parts))


def _size(n: int) -> str:
    """Bytes as --max-body is usually given: ``16 MiB``, ``64 KiB``, else ``1000 bytes``."""
    for unit, name in ((2**20, "MiB"), (2**10, "KiB")):
        if n and n % unit == 0:
            return f"{n // unit} {name}"
    return counted(n, "byte")


class _Console:
    """Standard output, where the recorder says what it records, while it can be written.
    Once it cannot (its reader stopped reading, as `| head -1` does once it has the
    address; a full disk), the recorder goes on without it, saying so once on standard
    error: what it prints is no part of the recording, nor of its exit status."""

    gone = False

    @classmethod
    def echo(cls, line: str) -> None:
        if cls.gone:
            return
        try:
            click.echo(line)
        except OSError as exc:
            cls.gone = True
            let_stdout_go()  # (what it still holds goes nowhere, at exit too)
            why = "it was closed" if isinstance(exc, BrokenPipeError) else (exc.strerror or str(exc))
            click.echo(
                f"tasktape record: standard output cannot be written ({why}): exchanges are no longer "
                "printed; the recording goes on",
                err=True,
            )


def _print_exchange(summary: ExchangeSummary) -> None:
    _Console.echo(describe_exchange(summary))
    _print_undecoded(summary)


def _print_failed(summary: ExchangeSummary) -> None:
    """--quiet: only the exchanges the proxy failed, and bodies the log could not decode."""
    if summary.outcome in _FAILED:
        _Console.echo(describe_exchange(summary))
    _print_undecoded(summary)


def _print_rejoin(resume: Resume) -> None:
    """--quiet: how an agent stream that broke (a failure it prints) went on: the break
    said alone would read as a loss where the rejoin lost nothing."""
    if resume.side is ResumeSide.UPSTREAM:
        _print_resume(resume)


def _print_refusal(refusal: Refusal) -> None:
    """A request answered here and not forwarded: said even with --quiet."""
    r = refusal
    _Console.echo(shown(f"{r.method} {r.path} {r.status}  [refused: {r.reason}]"))


def _say_if_down(upstream: URL) -> None:
    """The upstream does not take connections now: the recorder starts anyway (the agent
    may come up later), and says so once, even with --quiet."""
    try:
        socket.create_connection((upstream.host, upstream.port), timeout=_PROBE_TIMEOUT).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        click.echo(
            f"tasktape record: WARNING: the upstream {upstream} did not answer ({why}); "
            "requests get a 502 until it does",
            err=True,
        )


_PROBE_TIMEOUT = 2.0  # seconds the start waits to see the upstream take a connection


def _print_resume(resume: Resume) -> None:
    _Console.echo(f"resume: {shown(resume.describe())}")


def _print_undecoded(summary: ExchangeSummary) -> None:
    """Said even with --quiet: the log holds bytes it could not decode (a compression bomb,
    a broken or unknown Content-Encoding), which search and replay matching cannot read."""
    if (note := summary.undecoded_note("--max-decoded")) is not None:
        click.echo(shown(f"tasktape record: WARNING: {note}"), err=True)
