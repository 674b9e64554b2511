"""Event logs for the tests of merging and of fleets: a recorder's log with every kind of
row, and the rows of a log keyed by what names them across logs."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlite_utils
from a2a_frames import completed_run, sse, status

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.checker import report_log, save_findings
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide
from tasktape.eventlog.schema import migrations

MS = 1_000_000
SSE = {"content-type": "text/event-stream"}


def rows_in(db: Path, table: str) -> int:
    """How many rows ``table`` of a log being written holds (0 before it exists)."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as read:
        try:
            return read.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        except sqlite3.OperationalError:  # its tables not made yet
            return 0


def left_empty(path: Path) -> Path:
    """An empty file made long since: no reader waits for a log to be made in it."""
    path.write_bytes(b"")
    an_hour_ago = time.time() - 3600
    os.utime(path, (an_hour_ago, an_hour_ago))
    return path


def write_log(path: Path, name: str) -> Path:
    """A recorder's log: a stream (one event a chunk, then two in one chunk, then one
    after the task ended, which the checker finds), a task answered without a stream, a
    client's resume, and the checker's findings."""
    task_id = f"task.{name}"
    frames = [*completed_run(task_id, f"ctx.{name}"), status(task_id, f"ctx.{name}", "TASK_STATE_WORKING")]
    chunks = sse(frames, ids=f"{name}.")
    chunks[2:4] = [chunks[2] + chunks[3]]
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record", upstream=f"http://{name}")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        for n, data in enumerate(chunks, 1):
            w.chunk(ex, n * MS, data)
        w.end_exchange(ex, duration_ns=20 * MS).result()
        get = w.begin_exchange(cap, method="GET", path=f"/tasks/{task_id}", started_ns=time.time_ns())
        w.response_head(
            get, status=200, headers={"content-type": "application/json"}, is_sse=False, ttfb_ns=MS
        )
        answer = {"id": task_id, "contextId": f"ctx.{name}", "status": {"state": "TASK_STATE_COMPLETED"}}
        w.chunk(get, MS, json.dumps(answer).encode())
        w.end_exchange(get, duration_ns=2 * MS)
        again = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.resume(
            Resume(
                ex,
                ResumeSide.CLIENT,
                ResumeOutcome.RESUMED,
                f"{name}.3",
                events_from_log=4,
                new_exchange_id=again,
            )
        )
        w.end_exchange(again, duration_ns=MS)
        w.end_capture(cap)
    with EventLog(path) as log:
        assert save_findings(path, report_log(log).findings) > 0
    return path


def copy_log(source: Path, copy: Path) -> None:
    """A copy of a log as it reads now (its WAL file's pages too)."""
    with contextlib.closing(sqlite3.connect(source)) as old, contextlib.closing(sqlite3.connect(copy)) as new:
        old.backup(new)


def rows_by_uid(path: Path) -> dict[str, Any]:
    """Every row of a log, every column, its capture and exchange named by uid (integer ids,
    local to a log, left out), in an order that does not depend on them."""
    db = sqlite3.connect(path)
    names = {
        "capture_id": dict(db.execute("SELECT id, uid FROM captures")),
        "exchange_id": dict(db.execute("SELECT id, uid FROM exchanges")),
    }
    names["new_exchange_id"] = names["exchange_id"]

    def rows(table: str) -> list[tuple[Any, ...]]:
        cursor = db.execute(f"SELECT * FROM {table}")
        columns = [d[0] for d in cursor.description]
        found = [
            tuple(
                names[c].get(v) if c in names else v for c, v in zip(columns, row, strict=True) if c != "id"
            )
            for row in cursor
        ]
        return sorted(found, key=repr)

    found = {
        table: rows(table) for table in ("captures", "exchanges", "chunks", "events", "findings", "resumes")
    }
    found["findings"] = sorted((row[1:] for row in found["findings"]), key=repr)  # without checked_at
    db.close()
    return found


def arrival(path: Path) -> list[tuple[str, int]]:
    """The log's events in the order they were written, by exchange uid and seq."""
    db = sqlite3.connect(path)
    found = db.execute(
        "SELECT x.uid, e.seq FROM events e JOIN exchanges x ON x.id = e.exchange_id ORDER BY e.rowid"
    )
    rows = found.fetchall()
    db.close()
    return rows


def union(*logs: dict[str, Any]) -> dict[str, Any]:
    return {table: sorted((row for log in logs for row in log[table]), key=repr) for table in logs[0]}


def shipped_rows(path: Path) -> dict[str, Any]:
    """What a recorder ships of its log: every row the writer commits (findings are the
    checker's, written into each log by tasktape check)."""
    return {table: rows for table, rows in rows_by_uid(path).items() if table != "findings"}


def before_migration(db: Path, old: Path, migration: str, *, column: str, summary_view: str) -> Path:
    """A copy of the log ``db`` at ``old`` as it was before ``migration`` added ``column`` to
    ``exchanges`` (and to ``stream_summary``, then ``summary_view``): opened for writing,
    the migration runs on it."""
    with sqlite3.connect(db) as conn:
        conn.execute("VACUUM INTO ?", (str(old),))
    with sqlite3.connect(old) as conn:
        conn.execute("DROP VIEW stream_summary")
        conn.execute(f"ALTER TABLE exchanges DROP COLUMN {column}")
        conn.execute(f"CREATE VIEW stream_summary AS {summary_view}")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = ?", (migration,))
    conn.close()
    return old


def older_log(path: Path, before: str = "0004_search_and_findings") -> Path:
    """A log as a tasktape of the schema before migration ``before`` left it (empty)."""
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before=before)
    db.close()
    return path
