"""What a fleet's shippers and collectors agree on by name: the JetStream stream, its
subjects, and how its servers are written. Light to import: the recorder reads its
options with it, and loads NATS's client only when it ships."""

from __future__ import annotations

from tasktape.errors import UsageError

STREAM = "TASKTAPE"  # the JetStream stream, unless told otherwise
SUBJECTS = "tasktape"  # subjects: tasktape.<capture uid>.<table>
FETCH = 100  # messages a collector fetches (and commits together) at a time, unless told:
# up to 100,000 rows and 50 MiB (1,000 messages could be half a gigabyte, and drained 4x slower)


def parse_servers(url: str) -> list[str]:
    """``nats://HOST:PORT[,HOST:PORT...]`` as one URL per server."""
    if not url.startswith(("nats://", "tls://")):
        raise UsageError(f"{url!r} is not a NATS URL: nats://HOST:PORT[,HOST:PORT...]")
    scheme, _, rest = url.partition("://")
    hosts = [h.strip() for h in rest.split(",") if h.strip()]
    if not hosts:
        raise UsageError(f"{url!r} names no server: nats://HOST:PORT[,HOST:PORT...]")
    for host in hosts:
        _, colon, port = host.rsplit("@", 1)[-1].rpartition(":")  # (after any user:password@)
        if colon and not (port.isdigit() and 0 < int(port) <= 65535) and not host.endswith("]"):
            raise UsageError(f"{url!r}: {host!r} is not HOST:PORT with a port from 1 to 65535")
    return [f"{scheme}://{h}" for h in hosts]
