"""``tasktape agent``: the built-in demo agent, from the command line."""

from __future__ import annotations

import asyncio

import click

from .agent import create_agent_app
from .agent.tasks import KEPT_ENDED, check_pace
from .listen import (
    DEFAULT_AGENT_PORT,
    Exposure,
    HostPort,
    allow_host_option,
    answered_hosts,
    public_url,
    warn_if_exposed,
)
from .option_checks import checked
from .serving import serve_until_stopped


@click.command()
@click.option(
    "--listen",
    type=HostPort(),
    default=f"127.0.0.1:{DEFAULT_AGENT_PORT}",
    show_default=True,
    help="Address to listen on (HOST:PORT, or just PORT).",
)
@click.option(
    "--pace",
    type=float,
    callback=checked(check_pace),
    default=1.0,
    show_default=True,
    help="Scale every delay (think time, time per token): 0 streams as fast as possible.",
)
@click.option(
    "--public-url",
    metavar="URL",
    callback=public_url,
    help="Base URL its agent card lists (default: the one each request used).",
)
@click.option(
    "--keep-ended",
    type=click.IntRange(min=0),
    default=KEPT_ENDED,
    show_default=True,
    metavar="N",
    help="Ended tasks kept (GET /tasks/{id}, ListTasks, subscribes); beyond, the earliest "
    "to end are forgotten (TaskNotFound). Running and interrupted tasks are always kept.",
)
@allow_host_option()
def agent(
    listen: tuple[str, int], pace: float, public_url: str | None, keep_ended: int, allow_host: tuple[str, ...]
) -> None:
    """Run the built-in A2A v1.0 demo agent (REST and JSON-RPC bindings).

    Streams like the hosted API the A2A lifecycle document describes: SSE ids on every
    event, prefixed UUIDv7 ids, a task event first, intermediate thinking, the answer as
    token deltas closed by a lastChunk with citations, and $usage on the closing status.
    Words in the message choose how the task ends:

    \b
    input   INPUT_REQUIRED (send a message with the task id to resume)
    auth    AUTH_REQUIRED (REST shows FAILED)
    fail    FAILED, with a status message
    reject  REJECTED (REST shows FAILED)
    cancel  waits after its first words, for tasks/{id}:cancel
    long    400 token deltas
    drop    the connection drops mid-answer
    (none)  COMPLETED

    Exit status: 0 stopped (Ctrl-C), 1 it could not serve (a port in use), 2 bad input (an
    option's value, such as a negative --pace).
    """
    host, port = listen
    warn_if_exposed("tasktape agent", host, Exposure.AGENT)
    app = create_agent_app(
        pace=pace,
        public_url=public_url,
        kept_ended=keep_ended,
        allowed_hosts=answered_hosts(host, allow_host),
    )
    asyncio.run(
        serve_until_stopped(
            app,
            host,
            port,
            ready=lambda url: (
                f"tasktape agent: listening on {url} (REST at {url}, JSON-RPC at {url}/jsonrpc)"
            ),
            stopping="tasktape agent: stopping",
        )
    )
