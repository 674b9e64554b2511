"""Free loopback ports for servers a test starts as separate processes.

A port handed out by binding port 0 comes from the kernel's ephemeral range, the same range
every outgoing connection on the machine takes its source port from: between our closing it
and the server binding it, another test's client can take it ("Address already in use"). These
come from below that range, at random so parallel workers rarely meet, and are checked free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 10000
_given: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_TOP = _ephemeral_start() - 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on, outside the ephemeral range, not given before."""
    for _ in range(1000):
        port = random.randint(_LOWEST, _TOP)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port found in {_LOWEST}-{_TOP}")


def free_ports(n: int) -> list[int]:
    """``n`` different free ports."""
    return [free_port() for _ in range(n)]
