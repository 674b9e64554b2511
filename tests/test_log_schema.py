"""The public schema, WAL mode, and migrations (upgrade older logs, refuse newer ones)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from tasktape.errors import LogError, SchemaTooNew
from tasktape.eventlog import SCHEMA_VERSION, EventLog, LogWriter, open_db
from tasktape.eventlog.schema import migrations

CONTRACT = {
    "captures": ["id", "started_at", "ended_at", "source", "upstream", "tool_version", "argv", "uid"],
    "exchanges": [
        "id",
        "capture_id",
        "started_at",
        "started_ns",
        "method",
        "path",
        "query",
        "request_headers",
        "request_body",
        "status",
        "response_headers",
        "response_body",
        "is_sse",
        "binding",
        "rpc_method",
        "task_id",
        "context_id",
        "ttfb_ns",
        "duration_ns",
        "outcome",
        "error",
        "request_body_truncated",
        "response_body_truncated",
        "body_encoding",
        "request_body_encoding",
        "protocol",
        "session_id",
        "model",
        "answer",
        "input_tokens",
        "output_tokens",
        "finish",
        "uid",
    ],
    "chunks": ["exchange_id", "seq", "offset_ns", "data"],
    "events": [
        "exchange_id",
        "seq",
        "offset_ns",
        "event_id",
        "last_event_id",
        "event_type",
        "data",
        "retry",
        "complete",
        "kind",
        "task_id",
        "context_id",
        "state",
        "artifact_id",
        "artifact_type",
        "append",
        "last_chunk",
        "text",
        "usage",
        "parse_error",
        "chunk_seq",
        "chunk_crlf",
        "chunk_events",
    ],
}


def test_new_log_has_the_public_schema(tmp_path: Path) -> None:
    db = open_db(tmp_path / "log.db")
    for table, columns in CONTRACT.items():
        assert [c.name for c in db[table].columns] == columns
    assert db["stored_chunks"].pks == ["exchange_id", "seq"] and db["events"].pks == ["exchange_id", "seq"]
    assert [c.name for c in db["stored_chunks"].columns] == CONTRACT["chunks"]
    indexes = {tuple(i.columns) for t in ("events", "exchanges") for i in db[t].indexes}
    assert {("task_id", "event_id"), ("context_id",), ("task_id",), ("capture_id",)} <= indexes
    assert {("protocol",), ("session_id",)} <= indexes
    for table in ("captures", "exchanges"):
        assert [(i.columns, i.unique) for i in db[table].indexes if i.name == f"{table}_uid"] == [
            (["uid"], 1)
        ]
    assert {fk.column: fk.other_table for fk in db["events"].foreign_keys} == {"exchange_id": "exchanges"}
    assert {fk.column: fk.other_table for fk in db["exchanges"].foreign_keys} == {"capture_id": "captures"}
    assert set(db.view_names()) == {
        "chunks",
        "task_answers",
        "task_timeline",
        "task_artifacts",
        "task_summary",
        "exchange_metrics",
        "stream_summary",
    }
    assert [c.name for c in db["findings"].columns] == [
        "id",
        "checked_at",
        "rule",
        "task_id",
        "exchange_id",
        "seq",
        "message",
    ]
    assert db["events"].detect_fts() == "events_fts"
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_lookups_by_task_and_context_use_their_partial_indexes(tmp_path: Path) -> None:
    db = open_db(tmp_path / "log.db")
    partial = {
        name: sql
        for name, sql in db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
        if name in ("events_task_event", "events_context")
    }
    assert partial == {
        "events_task_event": "CREATE INDEX events_task_event ON events (task_id, event_id)"
        " WHERE task_id IS NOT NULL",
        "events_context": "CREATE INDEX events_context ON events (context_id) WHERE context_id IS NOT NULL",
    }
    for query, index in (
        ("SELECT * FROM events WHERE task_id = ?", "events_task_event"),
        ("SELECT * FROM events WHERE task_id = ? AND event_id = ?", "events_task_event"),
        ("SELECT * FROM events WHERE context_id = ?", "events_context"),
        ("SELECT * FROM task_timeline WHERE task_id = ?", "events_task_event"),
    ):
        plan = " ".join(
            row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {query}", ["x", "y"][: query.count("?")])
        )
        assert f"USING INDEX {index}" in plan, (query, plan)


def test_an_older_log_is_upgraded_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before="0002_views")  # what the first release wrote
    db["captures"].insert({"id": 1, "source": "old"})
    db.close()
    with pytest.raises(LogError, match="schema version 1, older than"):
        EventLog(path)  # read-only cannot upgrade, and says so
    with LogWriter(path):
        pass
    with EventLog(path) as log:
        assert log.captures()[0]["source"] == "old"
        assert "task_summary" in log.db.view_names()


def test_a_newer_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    open_db(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
            " VALUES ('tasktape', '0099_future', 'x')"
        )
    with pytest.raises(SchemaTooNew, match=r"newer tasktape .*0099_future.*upgrade tasktape"):
        open_db(path)
    with pytest.raises(SchemaTooNew):
        LogWriter(path)


def test_what_is_not_a_log_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (x)")
    with pytest.raises(LogError, match="not a tasktape event log"):
        open_db(other)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LogError, match="cannot open"):
        open_db(garbage)
    with pytest.raises(LogError, match="cannot open"):
        EventLog(tmp_path / "missing.db")
