"""Listening addresses: the documented default ports, HOST:PORT parsing, and a loud
warning when told to listen beyond loopback."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from enum import StrEnum
from typing import TypeVar

import click

from tasktape.proxy.hosts import allowed_hosts
from tasktape.proxy.recorder import http_url

from .option_checks import checked

F = TypeVar("F", bound=Callable[..., object])

DEFAULT_RECORD_PORT = 7470
DEFAULT_REPLAY_PORT = 7471
DEFAULT_INSPECT_PORT = 7472
DEFAULT_AGENT_PORT = 7473


def _public_url(value: str) -> str:
    """An absolute http(s) URL (it goes into agent cards as the URL clients are to use)."""
    http_url(value, "the public URL")
    return value


public_url = checked(_public_url)  # the click callback of --public-url


class HostPort(click.ParamType):
    """``HOST:PORT``, ``[IPv6]:PORT`` or just ``PORT`` (on 127.0.0.1); port 0 picks a free one.

    A bare IPv6 address is refused, not read as a host: ``::1:8080`` is itself an address,
    so its last group could as well be a port."""

    name = "HOST:PORT"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value  # type: ignore[return-value]
        text = str(value)
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = "127.0.0.1", text
        elif ":" in host or host.startswith("["):
            host = self._bracketed(host, text, param, ctx)
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            self.fail(f"{text!r} is not HOST:PORT with a port from 0 to 65535", param, ctx)
        return host or "127.0.0.1", int(port)

    def _bracketed(
        self, host: str, text: str, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        """The IPv6 address inside ``[...]``; anything else with colons is refused."""
        inner = host.removeprefix("[").removesuffix("]")
        if f"[{inner}]" != host or not _is_ipv6(inner):
            self.fail(
                f"{text!r} is not HOST:PORT: write an IPv6 address in brackets, then its port, as [::1]:PORT",
                param,
                ctx,
            )
        return inner


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def allow_host_option() -> Callable[[F], F]:
    """``--allow-host NAME``: a Host name a server bound to loopback answers besides
    localhost, 127.0.0.1 and [::1] (repeatable)."""
    return click.option(
        "--allow-host",
        "allow_host",
        multiple=True,
        metavar="NAME",
        help="Also answer requests for this Host name (repeatable). Listening on loopback, "
        "only localhost, 127.0.0.1 and [::1] are answered, so that a web page cannot reach "
        "it under a name of its own (DNS rebinding); beyond loopback, every name is.",
    )


def answered_hosts(host: str, extra: tuple[str, ...]) -> frozenset[str] | None:
    """The Host names a server listening on ``host`` answers; None: all of them."""
    return allowed_hosts(extra) if is_loopback(host) else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Exposure(StrEnum):
    """What a server listening beyond loopback gives anyone who can reach it."""

    RECORDER = "anyone who can reach it can use it, and what they send is recorded"
    REPLAY = "anyone who can reach it can use it, and be answered what the recordings hold"
    # It keeps every task in memory, and ListTasks shows them to any client.
    AGENT = (
        "anyone who can reach it can use it, and read every task sent to it, messages "
        "included (GET /tasks lists them all); it records nothing"
    )
    INSPECTOR = "anyone who can reach it can read the whole log"


def warn_if_exposed(command: str, host: str, exposure: Exposure = Exposure.RECORDER) -> None:
    """A loud warning, saying what ``exposure`` gives away, if ``host`` is not loopback."""
    if not is_loopback(host):
        click.secho(
            f"WARNING: {command} is listening on {host}, beyond this machine's loopback: {exposure}.",
            fg="red",
            bold=True,
            err=True,
        )
