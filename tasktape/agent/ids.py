"""Prefixed UUIDv7 identifiers (``task.0192f4c8-...``), as the hosted A2A API issues them."""

from __future__ import annotations

import os
import time
import uuid


def uuid7() -> uuid.UUID:
    """A version 7 UUID: 48 bits of Unix milliseconds, then random bits (RFC 9562)."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & (2**48 - 1)) << 80 | rand & (2**80 - 1)
    value = value & ~(0xF << 76) | 0x7 << 76  # version
    value = value & ~(0x3 << 62) | 0x2 << 62  # variant
    return uuid.UUID(int=value)


def new_id(prefix: str) -> str:
    """``new_id("task")`` -> ``"task.0192f4c8-..."``."""
    return f"{prefix}.{uuid7()}"
