"""What a log writer tells a tap after each commit: the chunks and the events it has just
committed, as the rows it built them, and whether it wrote other rows (for a shipper that
must not read them back, say). The writer calls a tap from the thread that commits; a tap
must never make it wait."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol


class CommitTap(Protocol):
    # Descriptors the tap writes to, which a writer in a child process must inherit (a
    # tap given to a ProcessLogWriter travels to the child pickled, before ``open``).
    fds: tuple[int, ...]

    def open(self, conn: sqlite3.Connection) -> None:
        """Start, with the writer's connection to the log (for the tap's own queries)."""

    def committed(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]], last: int) -> None:
        """``rows`` of ``table`` (values in the order of ``columns``, an exchange's id
        first) were committed, the last of them at rowid ``last``."""

    def changed(self) -> None:
        """The commit wrote rows of other tables too (captures, exchanges, resumes), before
        its chunks and events."""

    def close(self) -> None:
        """The writer is done."""
