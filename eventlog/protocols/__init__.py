"""The protocols tasktape understands, and the registry that finds the one an exchange
speaks.

Built in: A2A v1.0 (and 0.3), MCP Streamable HTTP, OpenAI (Chat Completions and the
Responses API) and Anthropic Messages, one module each. A package adds a protocol by
naming a :class:`~tasktape.eventlog.protocols.base.Protocol` subclass under the entry
point group ``tasktape.protocols`` (docs/protocols.md shows one). Plug-ins are asked
before the built-in protocols, so one can claim traffic a built-in one would.
"""

from __future__ import annotations

import functools
import logging
from enum import StrEnum
from importlib import import_module
from importlib.metadata import entry_points

from .base import Protocol, Request, RequestInfo, StreamReader, Summary
from .guard import Guarded

log = logging.getLogger("tasktape")

ENTRY_POINT_GROUP = "tasktape.protocols"


class ProtocolName(StrEnum):
    """The built-in protocols, as ``exchanges.protocol`` names them."""

    A2A = "a2a"
    MCP = "mcp"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"


# Module and class of each built-in protocol, in the order they are asked.
_BUILT_IN = {
    ProtocolName.A2A: (".a2a", "A2A"),
    ProtocolName.MCP: (".mcp", "MCP"),
    ProtocolName.ANTHROPIC: (".anthropic", "Anthropic"),
    ProtocolName.OPENAI: (".openai", "OpenAI"),
}


@functools.cache
def protocols() -> tuple[Protocol, ...]:
    """Every protocol known here: the plug-ins installed, then the built-in ones."""
    found: list[Protocol] = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
            protocol = loaded() if isinstance(loaded, type) else loaded
            if not isinstance(protocol, Protocol):
                log.warning("tasktape: the protocol plug-in %s is not a Protocol; it is left out", point.name)
                continue
            found.append(Guarded(protocol))  # one without a name or kinds fails here
        except Exception as exc:  # a broken plug-in must not stop recording
            log.warning(
                "tasktape: the protocol plug-in %s (%s) does not load: %s", point.name, point.value, exc
            )
    for module, cls in _BUILT_IN.values():
        found.append(getattr(import_module(module, __name__), cls)())
    names = [p.name for p in found]
    if len(set(names)) != len(names):
        log.warning("tasktape: more than one protocol is named %s; the first is used", names)
    return tuple(found)


def by_name(name: str | None) -> Protocol | None:
    """The protocol of that name (``exchanges.protocol``), if it is known here."""
    return next((p for p in protocols() if p.name == name), None) if name else None


def recognise(request: Request) -> Protocol | None:
    """The protocol that claims this request, if any."""
    return next((p for p in protocols() if p.claims(request)), None)


def recognise_stream(data: str, event_type: str | None) -> Protocol | None:
    """The protocol that claims a stream by its first event, when none claimed its request."""
    return next((p for p in protocols() if p.claims_stream(data, event_type)), None)


def recognise_exchange(request: Request, response: tuple[str, str | None] | None) -> Protocol | None:
    """The protocol of an exchange: the one that claims its request, else the one that
    claims its ``response`` (the first event's data and type, or a whole body and None)."""
    protocol = recognise(request)
    if protocol is None and response is not None:
        protocol = recognise_stream(*response)
    return protocol


__all__ = [
    "ENTRY_POINT_GROUP",
    "Protocol",
    "ProtocolName",
    "Request",
    "RequestInfo",
    "StreamReader",
    "Summary",
    "by_name",
    "protocols",
    "recognise",
    "recognise_exchange",
    "recognise_stream",
]
