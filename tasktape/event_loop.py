"""Which asyncio event loop ``tasktape record`` forwards on: uvloop where it is installed,
plain asyncio otherwise or when asked (``--event-loop``, ``TASKTAPE_EVENT_LOOP``).

uvloop spends less CPU on each socket read and write, which is most of what forwarding
does. The replay server stays on plain asyncio: libuv rounds timers to milliseconds, and
replay paces events more finely than that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import click

CHOICES = ("auto", "uvloop", "asyncio")
ENVVAR = "TASKTAPE_EVENT_LOOP"


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop named by ``choice`` (None: asyncio's own)."""
    if choice not in CHOICES:
        raise click.BadParameter(f"{choice!r} is not one of {', '.join(CHOICES)}", param_hint="--event-loop")
    if choice == "asyncio":
        return None
    try:
        import uvloop  # noqa: PLC0415 - optional: not built for every platform
    except ImportError:
        if choice == "uvloop":
            raise click.BadParameter(
                "uvloop is not installed (python -m pip install uvloop)", param_hint="--event-loop"
            ) from None
        return None
    return uvloop.new_event_loop


def event_loop_option() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--event-loop``, given to the command as the loop's factory: a loop that cannot run
    here is refused before the command starts anything."""
    return click.option(
        "--event-loop",
        "loop_factory",
        type=click.Choice(CHOICES),
        default="auto",
        show_default=True,
        envvar=ENVVAR,
        show_envvar=True,
        callback=lambda _ctx, _param, choice: loop_factory(choice),
        help="The event loop to forward on: auto is uvloop where it is installed, else asyncio.",
    )
