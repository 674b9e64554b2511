"""What a fleet's shippers and collectors agree on by name: the JetStream stream, its
subjects, what may name a stream or consumer, and how its servers are written. Light to
import: the recorder reads its options with it, and loads NATS's client only when it ships."""

from __future__ import annotations

import hashlib
import re

from tasktape.errors import UsageError
from tasktape.eventlog.redact import hide_credentials

STREAM = "TASKTAPE"  # the JetStream stream, unless told otherwise
SUBJECTS = "tasktape"  # subjects: tasktape.<capture uid>.<table>
FETCH = 100  # messages a collector fetches (and commits together) at a time, unless told:
# up to 100,000 rows and 50 MiB (1,000 messages could be half a gigabyte, and drained 4x slower)

# What a stream or consumer name may not hold, besides whitespace: the servers keep it as a
# file name and in subjects, and NATS's own client refuses these (deep in a run, not at start).
_NOT_IN_NAMES = ".*>/\\"
MAX_NAME = 255  # bytes (UTF-8) in a stream's or consumer's name: the servers refuse longer ones


def parse_servers(url: str) -> list[str]:
    """``nats://HOST:PORT[,HOST:PORT...]`` as one URL per server. A usage error quotes
    them without the user and password they may carry."""
    if not url.startswith(("nats://", "tls://")):
        raise UsageError(f"{_quoted(url)!r} is not a NATS URL: nats://HOST:PORT[,HOST:PORT...]")
    scheme, _, rest = url.partition("://")
    hosts = [h.strip() for h in rest.split(",") if h.strip()]
    if not hosts:
        raise UsageError(f"{url!r} names no server: nats://HOST:PORT[,HOST:PORT...]")
    servers = [f"{scheme}://{h}" for h in hosts]
    for host in hosts:
        address = host.rsplit("@", 1)[-1]  # (after any user:password@)
        _, colon, port = address.rpartition(":")
        if colon and not (port.isdigit() and 0 < int(port) <= 65535) and not host.endswith("]"):
            raise UsageError(f"{shown(servers)!r}: {address!r} is not HOST:PORT with a port from 1 to 65535")
    return servers


def _quoted(url: str) -> str:
    """A URL that is no NATS URL as a usage error quotes it: without user and password, also
    when no scheme comes before them (``alice:pw@host:4222``)."""
    return hide_credentials(url) if "://" in url else url.rpartition("@")[2]


def shown(servers: list[str]) -> str:
    """``servers`` as said to the user: without the user and password a URL may carry."""
    return hide_credentials(",".join(servers))


def jetstream_name(name: str) -> str:
    """``name``, if it can name a JetStream stream or consumer; else a UsageError saying what can."""
    if not name or any(c.isspace() or c in _NOT_IN_NAMES for c in name):
        raise UsageError(
            f"{name!r} cannot name a JetStream stream or consumer: a name is one or more characters, "
            "none of them whitespace, '.', '*', '>', '/' or '\\' (as TASKTAPE, fleet-eu_1)"
        )
    if len(name.encode()) > MAX_NAME:
        raise UsageError(
            f"{name[:20]!r}... cannot name a JetStream stream or consumer: it is {len(name.encode())}"
            f" bytes long, and NATS takes at most {MAX_NAME}"
        )
    return name


def own_consumer(kind: str, label: str, identity: str) -> str:
    """The durable consumer of one sink: its kind and a label to read, and a digest of what
    tells it from every other sink (``identity``)."""
    readable = re.sub(r"[^A-Za-z0-9_-]", "_", label)[:40]
    return f"{kind}-{readable}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
