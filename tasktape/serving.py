"""Serving an aiohttp application on loopback from the command line, until stopped
(``stop_signals``)."""

from __future__ import annotations

import asyncio
import gc
import socket
import sys
from collections.abc import Callable

import click
from aiohttp import web

from .cli import let_stdout_go
from .stop_signals import stop_signals

STOP_GRACE = 1.0  # seconds
BACKLOG = 128  # connections waiting to be answered (the server listens again, with its own)


def bind(host: str, port: int, *, or_any_port: bool = False) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port) and listening, or a clear error: a
    command binds before it opens anything else, so a port in use leaves nothing behind.
    Connections wait in its backlog until the server started on it answers them. With
    ``or_any_port``, a free port stands in for ``port`` if it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if port:  # a port left in TIME_WAIT by the last run is taken again, as create_server does
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Not for port 0: a socket that binds there with SO_REUSEADDR and does not listen yet
        # may be given a port another such socket holds.
        sock.bind((host, port))
        # Here, not once the server starts: with SO_REUSEADDR, two commands started at once
        # may both bind the port, and only listening tells the second it is taken.
        sock.listen(BACKLOG)
        return sock
    except OSError as exc:
        sock.close()
        if or_any_port and port:
            return bind(host, 0)
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def start_site(
    app: web.Application, host: str, port: int, sock: socket.socket | None = None
) -> tuple[web.AppRunner, str]:
    """Start ``app`` (a client that goes away cancels its handler) on ``sock``, or on a
    socket bound to ``host:port``; return the runner and the base URL it listens on."""
    sock = sock or bind(host, port)
    # On stop, exchanges in flight get a moment to finish, then are cancelled.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=STOP_GRACE)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{sock.getsockname()[1]}"


async def serve_until_stopped(
    app: web.Application,
    host: str,
    port: int,
    ready: Callable[[str], str],
    stopping: str,
    sock: socket.socket | None = None,
) -> None:
    """Serve until SIGINT, SIGTERM or SIGHUP (``stop_signals``); print ``ready(url)`` once
    listening."""
    runner, url = await start_site(app, host, port, sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in stop_signals():
        loop.add_signal_handler(sig, stop.set)
    # What start-up left (modules, classes, the application) lives until the end: out of
    # the collector's sight, full collections traverse only what serving allocates (in
    # tasktape record, 2% fewer instructions per event on streams of 100 events).
    gc.freeze()
    say_ready(ready(url))
    await stop.wait()
    click.echo(stopping, err=True)
    await _stop_serving(runner)


def say_ready(lines: str) -> None:
    """A server's listening lines, on standard output; where that cannot be written (closed
    before them, as `| true` or `>&-` does), on standard error, saying so: what a server
    prints is no part of what it serves, so it serves on (as `tasktape record` goes on once
    `| head -1` left)."""
    command = lines.partition(":")[0]  # (every ready line names its command first)
    if sys.stdout is None:  # (started with standard output closed: there is none to write)
        click.echo(lines, err=True)
        click.echo(f"{command}: there is no standard output: nothing is printed on it", err=True)
        return
    try:
        click.echo(lines)
    except OSError as exc:
        let_stdout_go()  # (what it prints later goes nowhere)
        why = "it was closed" if isinstance(exc, BrokenPipeError) else (exc.strerror or str(exc))
        click.echo(lines, err=True)
        click.echo(
            f"{command}: standard output cannot be written ({why}): nothing more is printed on it", err=True
        )


async def _stop_serving(runner: web.AppRunner) -> None:
    """Stop ``runner``'s server: exchanges in flight get ``STOP_GRACE`` to end, then are cut.
    (aiohttp alone gives them twice its shutdown timeout: it waits that long for them, asks
    them to end, which a handler writing an answer never hears, and waits as long again.)"""
    cleanup = asyncio.ensure_future(runner.cleanup())
    done, _ = await asyncio.wait({cleanup}, timeout=STOP_GRACE)
    if not done and runner.server is not None:
        for connection in runner.server.connections:
            if connection.transport is not None:
                connection.transport.abort()  # its handler is cancelled, as when its client leaves
    await cleanup
