"""``tasktape inspect``: Datasette over an event log, with tasktape's metadata and plugin."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

import click

from tasktape.errors import LogBusy, LogError, SchemaTooOld
from tasktape.eventlog import EventLog
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.schema import upgrade_log
from tasktape.proxy.hosts import AsgiHostGuard

from .listen import DEFAULT_INSPECT_PORT, Exposure, allow_host_option, answered_hosts, warn_if_exposed
from .option_checks import bad_input
from .serving import STOP_GRACE, bind, say_ready
from .stop_signals import stop_signals


def open_check(path: Path, *, upgrade: bool = False) -> None:
    """Refuse what is not an event log (or one this tasktape cannot read), saying how to
    upgrade an older one; with ``upgrade``, upgrade it in place first, as ``tasktape
    upgrade`` does (under its writer lock: refused while a recorder writes it)."""
    try:
        if upgrade:
            upgrade_log(path)
        EventLog(path).close()
    except LogBusy as exc:  # (--upgrade while a recorder writes it): a failure, not bad input
        raise click.ClickException(str(exc)) from None
    except LogError as exc:
        hint = ""
        if isinstance(exc, SchemaTooOld):
            hint = f", or serve it upgraded: tasktape inspect {shlex.quote(str(path))} --upgrade"
        raise bad_input(f"{exc}{hint}") from None


def serve_inspector(
    path: Path, host: str, port: int, *, or_any_port: bool = False, allow_host: tuple[str, ...] = ()
) -> None:
    """Serve Datasette over the log at ``path`` until stopped (``stop_signals``); print
    where once it answers. With ``or_any_port``, a free port stands in for ``port`` if it
    is taken."""
    # Datasette takes over half a second to import: only the commands that serve it pay.
    from tasktape.inspector.app import create_datasette, log_name, serve  # noqa: PLC0415

    _check_servable(path)
    ds = create_datasette(path)
    sock = bind(host, port, or_any_port=or_any_port)
    named_host = f"[{host}]" if ":" in host else host
    url = f"http://{named_host}:{sock.getsockname()[1]}"
    name = log_name(ds)
    warn_if_exposed("tasktape inspect", host, Exposure.INSPECTOR)

    def ready() -> None:
        lines = [
            f"tasktape inspect: {shown(str(path))} on {url}/ (Ctrl-C stops)",
            f"  tasks    {url}{ds.urls.table(name, 'task_summary')}",
            f"  sessions {url}{ds.urls.query(name, 'mcp_sessions')}",
            f"  streams  {url}{ds.urls.query(name, 'llm_streams')}",
            f"  charts   {url}{ds.urls.path('-/dashboards/streams')}",
            f"  queries  {url}{ds.urls.database(name)}",
        ]
        say_ready("\n".join(lines))

    allowed = answered_hosts(host, allow_host)

    def wrap(app: Any) -> Any:
        return app if allowed is None else AsgiHostGuard(app, allowed, "tasktape inspect")

    asyncio.run(serve(ds, sock, ready, STOP_GRACE, stop_signals(), wrap))
    click.echo("tasktape inspect: stopped", err=True)


def _check_servable(path: Path) -> None:
    """Refuse, as bad input, a log whose path is not UTF-8 (a byte no name decodes): Datasette
    keeps each database's path as text, and would fail every page on it."""
    try:
        str(path.resolve()).encode()
    except UnicodeEncodeError:
        raise bad_input(
            f"cannot serve {shown(str(path))}: its path is not UTF-8, which Datasette needs; "
            "rename it, or the folder it is in"
        ) from None


def _named_host(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """An address to listen on, named: an empty one would be every interface, unsaid (and
    the printed URLs would have no host)."""
    if not value.strip():
        raise click.BadParameter(
            "an address is needed: 127.0.0.1 (this machine alone, the default), ::1, or 0.0.0.0 "
            "for every interface"
        )
    return value


@click.command()
@click.argument("log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_INSPECT_PORT,
    show_default=True,
    help="Port to listen on (0: a free one).",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, callback=_named_host, help="Address to listen on."
)
@click.option(
    "--upgrade",
    is_flag=True,
    help="Upgrade a log written by an older tasktape to this one's schema first (writes to it).",
)
@allow_host_option()
def inspect(log: Path, port: int, host: str, upgrade: bool, allow_host: tuple[str, ...]) -> None:
    """Browse the event log LOG in Datasette, read-only: tasks, sessions, streams, charts, search.

    Every table and view is described, faceted and searchable; a task id opens the task's
    page (its events on a time axis with their gaps, state changes, the answer and the
    intermediate thinking reassembled, citations, usage and credits, and the lifecycle
    checker's findings); an MCP session id opens the session's page (its tool calls on a
    time axis with their progress and results); an OpenAI or Anthropic stream opens its
    page (answer, model, usage, time to first token, gaps). Canned queries: a task's
    timeline, tasks by final state, the slowest time to first event, MCP sessions, LLM
    streams, and a search of event text. Charts over every protocol. Safe while a recorder
    is still writing LOG: new rows show up as they are committed.
    Exit status: 0 stopped, 1 it could not serve (a port in use, --upgrade of a log another
    writer holds), 2 bad input (LOG no event log this tasktape reads).
    """
    open_check(log, upgrade=upgrade)
    serve_inspector(log, host, port, allow_host=allow_host)
