"""Counts read from the traffic (token counts) as the log's INTEGER columns can hold them."""

from __future__ import annotations

from typing import Any

# SQLite's INTEGER is a signed 64-bit integer: the sqlite3 module refuses a larger Python
# int (OverflowError), and with it the whole batch of rows it is in.
_INT64 = range(-(2**63), 2**63)


def stored_count(value: Any) -> int | None:
    """``value`` as the log keeps a count: an integer SQLite can store (JSON's true and
    false are no counts), else None."""
    return value if type(value) is int and value in _INT64 else None
