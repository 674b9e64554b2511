"""Reading an event log back: captures, exchanges, chunks and the events of a task.

Rows come back as dicts keyed by the public column names. Safe to use while a
writer is appending (WAL): each call sees the rows committed when it starts.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from tasktape.choices import listed
from tasktape.errors import LogClosed, UnknownEventId, UnknownExchange

from .a2a_terms import CARD_METHODS, CARD_PATHS
from .file_kinds import unreadable
from .listed import listed_ids
from .resumes import ResumeOutcome, ResumeSide
from .schema import ANSWERED_FROM_HELD, open_db

Row = dict[str, Any]
_T = TypeVar("_T")

# How a rejoin went when the agent's stream was followed again (a gap too: it went on).
FOLLOWED_AGAIN = (ResumeOutcome.REJOINED, ResumeOutcome.CAUGHT_UP, ResumeOutcome.GAP)

# (One statement: a stream's end and its last events were written together.)
_FINISHED_STREAM_EVENTS = """
SELECT e.seq, e.event_id, e.data, e.complete, e.offset_ns, e.event_type FROM events e
JOIN exchanges x ON x.id = e.exchange_id
WHERE e.exchange_id = ? AND x.is_sse AND x.outcome IS NOT NULL AND x.protocol IS NOT NULL
ORDER BY e.seq
"""

# Events of a task in time order across exchanges (a stream, then a resubscribe...).
_TASK_EVENTS = """
SELECT e.*, x.started_ns + e.offset_ns AS at_ns
FROM events e JOIN exchanges x ON x.id = e.exchange_id
WHERE e.task_id = ?
ORDER BY at_ns, e.exchange_id, e.seq
"""


class EventLog:
    """Read access to one log file (opened read-only unless ``readonly=False``)."""

    def __init__(self, path: str | Path, *, readonly: bool = True) -> None:
        self.path = Path(path)
        # Usable from any thread (a web handler's, ``asyncio.to_thread``), one call at a time.
        self.db = open_db(self.path, readonly=readonly, check_same_thread=False)
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self.db.close()
            self._closed = True

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        return self._read(lambda: list(self.db.query(sql, params)))

    def _tuples(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """As ``_rows``, each row a tuple: for many rows, no dict made of each."""
        return self._read(lambda: self.db.conn.execute(sql, params).fetchall())

    def _read(self, fetch: Callable[[], _T]) -> _T:
        with self._lock:  # (all read while it is held: the rows come from a cursor)
            if self._closed:
                raise LogClosed(f"{self.path}: this EventLog was closed; open the log again to read it")
            try:
                return fetch()
            except sqlite3.DatabaseError as exc:  # (a damaged log: the command says which)
                raise unreadable(self.path, exc) from None

    def captures(self) -> list[Row]:
        return self._rows("SELECT * FROM captures ORDER BY id")

    def exchanges(self, capture_id: int | None = None) -> list[Row]:
        """Exchanges in id order, all of them or those of one capture."""
        if capture_id is None:
            return self._rows("SELECT * FROM exchanges ORDER BY id")
        return self._rows("SELECT * FROM exchanges WHERE capture_id = ? ORDER BY id", (capture_id,))

    def exchange(self, exchange_id: int) -> Row:
        rows = self._rows("SELECT * FROM exchanges WHERE id = ?", (exchange_id,))
        if not rows:
            raise UnknownExchange(f"no exchange {exchange_id} in {self.path}")
        return rows[0]

    def _of(self, exchange_id: int, rows: list[Row]) -> list[Row]:
        """An exchange's rows; none of an exchange the log has not is an error, as
        ``exchange`` says it, not an empty body."""
        if not rows:
            self.exchange(exchange_id)
        return rows

    def chunks(self, exchange_id: int) -> list[Row]:
        rows = self._rows("SELECT * FROM chunks WHERE exchange_id = ? ORDER BY seq", (exchange_id,))
        return self._of(exchange_id, rows)

    def body(self, exchange_id: int) -> bytes:
        """The response body exactly as received: its chunks joined."""
        return b"".join(r["data"] for r in self.chunks(exchange_id))

    def events(self, exchange_id: int) -> list[Row]:
        rows = self._rows("SELECT * FROM events WHERE exchange_id = ? ORDER BY seq", (exchange_id,))
        return self._of(exchange_id, rows)

    def task_events(self, task_id: str) -> list[Row]:
        """Every event of a task, in time order across its exchanges."""
        return self._rows(_TASK_EVENTS, (task_id,))

    def task_events_after(self, task_id: str, event_id: str) -> list[Row]:
        """The task's events after the first one whose SSE id is ``event_id``: what a
        client resuming with ``Last-Event-ID: event_id`` has not seen yet. An event
        sent again with the same id (a resubscribe that overlaps) is returned once."""
        events = self.task_events(task_id)
        for i, event in enumerate(events):
            if event["event_id"] == event_id:
                seen = {e["event_id"] for e in events[: i + 1]}
                after = []
                for e in events[i + 1 :]:
                    if e["event_id"] is None or e["event_id"] not in seen:
                        seen.add(e["event_id"])
                        after.append(e)
                return after
        known = [e["event_id"] for e in events if e["event_id"] is not None]
        hint = f"its ids run from {known[0]!r} to {known[-1]!r}" if known else "it has no event ids"
        raise UnknownEventId(
            f"task {task_id!r} has no event with id {event_id!r} ({len(events)} events; {hint})"
        )

    def select(
        self,
        *,
        tasks: Iterable[str] = (),
        contexts: Iterable[str] = (),
        exchanges: Iterable[int] = (),
        with_cards: bool = True,
    ) -> list[int]:
        """Ids of the exchanges of these tasks and contexts (named by the exchange or by
        any of its events), and these exchanges; nothing named means all. With
        ``with_cards``, the last agent card read from the same host before the first of
        them comes too, so a client replaying them can start by reading it."""
        tasks, contexts = listed(tasks, "tasks"), listed(contexts, "contexts")
        chosen = set(listed_ids(exchanges, "exchanges"))
        if not (tasks or contexts or chosen):
            return [x["id"] for x in self.exchanges()]
        for column, values in (("task_id", tasks), ("context_id", contexts)):
            if values:
                marks = ",".join("?" * len(values))
                chosen |= {
                    r["id"]
                    for r in self._rows(
                        f"SELECT id FROM exchanges WHERE {column} IN ({marks}) UNION "
                        f"SELECT DISTINCT exchange_id FROM events WHERE {column} IN ({marks})",
                        (*values, *values),
                    )
                }
        if with_cards and chosen:
            chosen |= self._cards_before(chosen)
        return sorted(chosen)

    def _cards_before(self, chosen: set[int]) -> set[int]:
        """For each host the exchanges asked (a forward proxy's log holds several), the last
        card of each card path read from that host before the first of them."""
        first_of: dict[str | None, int] = {}
        marks = ",".join("?" * len(chosen))
        for x in self._rows(
            f"SELECT id, request_headers FROM exchanges WHERE id IN ({marks}) ORDER BY id", tuple(chosen)
        ):
            first_of.setdefault(_host(x["request_headers"]), x["id"])
        if not first_of:  # none of them is in the log
            return set()
        is_card = " OR ".join(["rpc_method = ?"] * len(CARD_METHODS) + ["path LIKE ?"] * len(CARD_PATHS))
        cards = self._rows(
            f"SELECT id, path, request_headers FROM exchanges WHERE id < ? AND ({is_card}) ORDER BY id DESC",
            (max(first_of.values()), *CARD_METHODS, *(f"%{p}" for p in CARD_PATHS)),
        )
        latest: dict[tuple[str | None, str], int] = {}
        for card in cards:
            host = _host(card["request_headers"])
            if card["id"] < first_of.get(host, 0):
                latest.setdefault((host, card["path"]), card["id"])
        return set(latest.values())

    def stream_summary(self, exchange_id: int | None = None) -> list[Row]:
        """Rows of the ``stream_summary`` view: every exchange of a known protocol, or one."""
        if exchange_id is None:
            return self._rows("SELECT * FROM stream_summary")
        return self._rows("SELECT * FROM stream_summary WHERE exchange_id = ?", (exchange_id,))

    def finished_stream_events(self, exchange_id: int) -> list[tuple[Any, ...]]:
        """A finished stream's events as the writer decoded them from the bytes its chunks
        hold: (seq, event_id, data, complete, offset_ns, event_type) each, in order. None of
        one under way (its chunks may end in part of an event not yet written), nor of one no
        protocol was known for when it was written (the chunks tell what it is)."""
        return self._tuples(_FINISHED_STREAM_EVENTS, (exchange_id,))

    def reconnects_answered(self) -> dict[int, int]:
        """The exchanges a resume gateway answered from a stream it held (reconnects), each
        with the exchange that opened the stream: a reconnect's holds a slice of that
        stream's events, which the stream's own exchange holds too (the log's task views
        leave them out alike: ``schema.SLICES``)."""
        marks = ", ".join("?" * len(ANSWERED_FROM_HELD))
        rows = self._rows(
            f"SELECT new_exchange_id, exchange_id FROM resumes WHERE side = ? AND outcome IN ({marks})"
            " AND new_exchange_id IS NOT NULL",
            (ResumeSide.CLIENT.value, *(o.value for o in ANSWERED_FROM_HELD)),
        )
        return {r["new_exchange_id"]: r["exchange_id"] for r in rows}

    def rejoins(self) -> dict[int, tuple[ResumeOutcome, int]]:
        """The agent streams a resume gateway followed again after they broke, each (by the
        exchange that opened it) with how its last such rejoin went and the exchange that
        carried it on: the subscribe's, or the answer it caught up from."""
        marks = ", ".join("?" * len(FOLLOWED_AGAIN))
        rows = self._rows(
            "SELECT exchange_id, outcome, new_exchange_id FROM resumes"
            f" WHERE side = ? AND outcome IN ({marks}) AND new_exchange_id IS NOT NULL ORDER BY id",
            (ResumeSide.UPSTREAM.value, *(o.value for o in FOLLOWED_AGAIN)),
        )
        return {r["exchange_id"]: (ResumeOutcome(r["outcome"]), r["new_exchange_id"]) for r in rows}

    def task_ids(self) -> list[str]:
        """Every task the log knows: from its events, and from answers that were not streamed."""
        return [
            r["task_id"]
            for r in self._rows(
                "SELECT task_id FROM events WHERE task_id IS NOT NULL UNION SELECT task_id FROM task_answers"
            )
        ]


def _host(request_headers: str | None) -> str | None:
    """The host a recorded request named (its ``Host`` header; an HTTP/2 request through
    mitmproxy has none, its ``:authority`` not being a header)."""
    for name, value in json.loads(request_headers or "[]"):
        if name.lower() == "host":
            return str(value).lower()
    return None
