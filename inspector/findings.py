"""The findings ``tasktape check`` saved into the log's ``findings`` table, for the pages
that show them beside the exchanges they are about."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tasktape.eventlog import EventLog


@dataclass(frozen=True)
class SavedFinding:
    rule: str
    exchange_id: int | None
    seq: int | None  # the event's seq in its exchange; None: about the exchange as a whole
    message: str
    checked_at: str | None


def saved_findings(log: EventLog, exchange_ids: Sequence[int]) -> list[SavedFinding]:
    """What the last check saved about these exchanges, in the order of their events."""
    if not exchange_ids:
        return []
    marks = ",".join("?" * len(exchange_ids))
    rows = log.db.query(
        f"SELECT rule, exchange_id, seq, message, checked_at FROM findings WHERE exchange_id IN ({marks})"
        " ORDER BY exchange_id, coalesce(seq, -1), id",
        list(exchange_ids),
    )
    return [SavedFinding(**r) for r in rows]
