"""A fleet's rows into one SQLite event log, to inspect and replay as any log.

Every write is keyed by what names a row across logs, so a message applied twice (a
redelivery after a collector died before it acknowledged) changes nothing: captures and
exchanges by uid (an exchange's later version replaces an earlier one, never the other
way), chunks and events by exchange and seq, resumes by stream, time, side and outcome.
Messages may arrive in any order (collectors sharing a consumer each get some): a row whose
capture or exchange has not arrived yet gets a placeholder row that its own message fills.

Integer ids are the sink's own, numbered by SQLite inside each transaction, so several
collectors may write one sink side by side; a recorder may not write it meanwhile.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasktape.errors import LogBusy
from tasktape.eventlog.resumes import SAME_RESUME
from tasktape.eventlog.schema import INDEX_TEXT, INDEXED_THROUGH, migrations, open_db
from tasktape.eventlog.writer_lock import release_writer_lock, take_writer_lock

from .names import own_consumer
from .wire import LOCAL_COLUMNS, UID_COLUMNS, Rows, Table, refuse_unknown


@dataclass
class Applied:
    """What one batch of messages changed in the sink."""

    messages: int = 0
    rows: int = 0  # rows the messages held
    written: int = 0  # rows added or brought up to date (the rest were there already)


def _made_at(path: Path) -> str:
    """When the file became a log (made or upgraded now if need be)."""
    db = open_db(path)
    try:
        return migrations.applied(db)[0].applied_at
    finally:
        db.close()


class SqliteSink:
    """The event log at ``path`` (made if missing) as a fleet's sink."""

    gather = 0.0  # what one fetch brings goes into one transaction
    nan_nulls = True  # bound as NaN, SQLite stores NULL
    # A value SQLite cannot bind or a constraint refuses: the message's, not the log's
    # (which is busy, full or broken: OperationalError, and the collector stops).
    refuses: tuple[type[Exception], ...] = (
        sqlite3.ProgrammingError,
        sqlite3.IntegrityError,
        sqlite3.DataError,
        sqlite3.InterfaceError,
        OverflowError,
    )
    # The log's lock held past SQLite's busy timeout by another process (a tasktape check
    # saving its findings, a sqlite-utils write): waited out, the messages unacknowledged.
    waits: tuple[type[Exception], ...] = (LogBusy,)

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0) -> None:
        """``busy_timeout``: seconds SQLite waits for a lock another process holds before
        the sink says it ``waits`` for it."""
        self.path = Path(path)
        # Held first: a log in a folder that does not exist, or a device, is refused as
        # every writer refuses it, before SQLite makes anything of it.
        self._lock = take_writer_lock(self.path, shared=True)
        try:
            self._made_at = _made_at(self.path)
        except BaseException:
            release_writer_lock(self._lock)
            raise
        self._conn = sqlite3.connect(self.path, isolation_level=None)
        self._conn.execute(f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}")
        self._columns = {t: {row[1] for row in self._conn.execute(f"PRAGMA table_info({t})")} for t in Table}
        self._ids: dict[tuple[str, str], int] = {}  # (table, uid) -> the sink's id

    def consumer(self) -> str:
        """The durable consumer this log is collected through unless told: its own, named
        after where it is and when it was made. A collector started again on it takes up
        where it stopped; another log, or one made again under the same name, starts from
        the stream's first message (its rows would be lost to a consumer that had them)."""
        return own_consumer("sqlite", self.path.stem, f"{self.path.resolve()}\n{self._made_at}")

    def close(self) -> None:
        self._conn.close()
        release_writer_lock(self._lock)

    def __enter__(self) -> SqliteSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply(self, messages: Sequence[Rows]) -> Applied:
        """Write the messages' rows in one transaction: all of them, or none."""
        applied = Applied(messages=len(messages))
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                raise
            raise LogBusy(f"the log's lock: another process writes {self.path}") from None
        try:
            (indexed,) = conn.execute(INDEXED_THROUGH).fetchone()
            for message in messages:
                applied.rows += len(message.rows)
                applied.written += self._apply(message)
            conn.execute(INDEX_TEXT, (indexed,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            self._ids.clear()  # placeholders made in the transaction are gone
            raise
        return applied

    def _apply(self, m: Rows) -> int:
        refuse_unknown(m, {UID_COLUMNS.get(c, c) for c in self._columns[m.table]}, str(self.path))
        if m.table is Table.CAPTURES:
            return self._captures(m)
        if m.table is Table.EXCHANGES:
            return self._exchanges(m)
        if m.table is Table.RESUMES:
            return self._resumes(m)
        return self._exchange_rows(m)

    def _captures(self, m: Rows) -> int:
        # A capture changes once, when it ends (its ended_at, NULL until then); a
        # placeholder is filled in.
        cols = list(m.columns)
        sets = ", ".join(f"{c} = coalesce(captures.{c}, excluded.{c})" for c in cols if c != "uid")
        return self._many(
            f"INSERT INTO captures ({', '.join(cols)}) VALUES ({_marks(cols)})"
            f" ON CONFLICT(uid) DO UPDATE SET {sets} WHERE captures.started_at IS NULL"
            " OR (captures.ended_at IS NULL AND excluded.ended_at IS NOT NULL)",
            m.rows,
        )

    def _exchanges(self, m: Rows) -> int:
        # An exchange is written under way, then again once it ended: a version under way
        # never replaces an ended one.
        cols = ["capture_id" if c == "capture_uid" else c for c in m.columns]
        at = cols.index("capture_id")
        capture = self._id(Table.CAPTURES, m.capture, m.capture)
        rows = [(*row[:at], capture, *row[at + 1 :]) for row in m.rows]
        kept = [c for c in cols if c != "uid"]
        news = ", ".join(f"excluded.{c}" for c in kept)
        return self._many(
            f"INSERT INTO exchanges ({', '.join(cols)}) VALUES ({_marks(cols)})"
            f" ON CONFLICT(uid) DO UPDATE SET ({', '.join(kept)}) = ({news})"
            " WHERE exchanges.outcome IS NULL",
            rows,
        )

    def _exchange_rows(self, m: Rows) -> int:
        cols = ["exchange_id", *m.columns[1:]]
        rows = [(self._id(Table.EXCHANGES, row[0], m.capture), *row[1:]) for row in m.rows]
        return self._many(
            f"INSERT OR IGNORE INTO {m.table} ({', '.join(cols)}) VALUES ({_marks(cols)})", rows
        )

    def _resumes(self, m: Rows) -> int:
        cols = [LOCAL_COLUMNS.get(c, c) for c in m.columns]
        first, new = cols.index("exchange_id"), cols.index("new_exchange_id")
        same = " AND ".join(f"{c} IS ?" for c in SAME_RESUME)
        written = 0
        for row in m.rows:
            values = list(row)
            values[first] = self._id(Table.EXCHANGES, row[first], m.capture)
            if row[new] is not None:
                values[new] = self._id(Table.EXCHANGES, row[new], m.capture)
            if self._conn.execute(
                f"SELECT 1 FROM resumes WHERE {same}", [values[cols.index(c)] for c in SAME_RESUME]
            ).fetchone():
                continue
            self._conn.execute(f"INSERT INTO resumes ({', '.join(cols)}) VALUES ({_marks(cols)})", values)
            written += 1
        return written

    def _id(self, table: Table, uid: str, capture: str) -> int:
        """The sink's id of the capture or exchange ``uid``; a placeholder row when it has
        not arrived yet (an exchange's placeholder in its capture ``capture``)."""
        known = self._ids.get((table, uid))
        if known is not None:
            return known
        found = self._conn.execute(f"SELECT id FROM {table} WHERE uid = ?", (uid,)).fetchone()
        if found is None:
            if table is Table.CAPTURES:
                found = self._conn.execute(
                    "INSERT INTO captures (uid) VALUES (?) RETURNING id", (uid,)
                ).fetchone()
            else:
                parent = self._id(Table.CAPTURES, capture, capture)
                found = self._conn.execute(
                    "INSERT INTO exchanges (uid, capture_id) VALUES (?, ?) RETURNING id", (uid, parent)
                ).fetchone()
        self._ids[(table, uid)] = found[0]
        return int(found[0])

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> int:
        before = self._conn.total_changes
        self._conn.executemany(sql, rows)
        return self._conn.total_changes - before


def _marks(cols: Sequence[str]) -> str:
    return ", ".join("?" * len(cols))
