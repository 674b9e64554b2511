"""Full-text search over event text: the writer keeps the index current as it commits."""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from pathlib import Path

import sqlite_utils
from a2a_frames import completed_run, sse

from tasktape.eventlog import EventLog, LogWriter, ProcessLogWriter


def matches(log: EventLog, query: str) -> list[tuple[str, int]]:
    sql = (
        "SELECT e.text, e.seq FROM events_fts JOIN events e ON e.rowid = events_fts.rowid "
        "WHERE events_fts MATCH ? ORDER BY e.rowid"
    )
    return [(row["text"], row["seq"]) for row in log.db.query(sql, [query])]


def stream(writer: LogWriter | ProcessLogWriter, task: str) -> None:
    capture = writer.begin_capture(source="test")
    exchange = writer.begin_exchange(capture, method="POST", path="/message:stream")
    writer.response_head(exchange, status=200, headers=None, is_sse=True, ttfb_ns=1)
    for n, chunk in enumerate(sse(completed_run(task))):
        writer.chunk(exchange, n, chunk)
    writer.end_exchange(exchange, duration_ns=10)


def test_events_are_searchable_while_the_capture_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    for writer_class in (LogWriter, ProcessLogWriter):
        with writer_class(path) as writer:
            stream(writer, "task.1")
            writer.flush()
            with EventLog(path) as log:  # another reader, the writer still open
                found = matches(log, "asthma")
                assert [text for text, _ in found] == [
                    " intermittent asthma.",
                    "J45.909 — mild intermittent asthma.",
                ]
            # The index holds every committed event's text, and nothing else.
            with sqlite3.connect(path) as conn:
                conn.execute("INSERT INTO events_fts(events_fts) VALUES('integrity-check')")
        path.unlink()
        for suffix in ("-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)


def test_a_second_writer_indexes_only_what_is_new(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    for task in ("task.1", "task.2"):
        with LogWriter(path) as writer:
            stream(writer, task)
    with EventLog(path) as log:
        assert len(matches(log, "intermittent")) == 4  # two tasks, each delta and consolidation once
        texts = [row["text"] for row in log.db.query("SELECT text FROM events WHERE text IS NOT NULL")]
    with sqlite3.connect(path) as conn:  # raises if the index and the events disagree
        conn.execute("INSERT INTO events_fts(events_fts) VALUES('integrity-check')")
        # Every word of every event indexed once: none left out, none twice.
        conn.execute("CREATE VIRTUAL TABLE temp.words USING fts5vocab(main, events_fts, 'row')")
        indexed = dict(conn.execute("SELECT term, cnt FROM temp.words"))
    assert indexed == Counter(word.lower() for text in texts for word in re.findall(r"\w+", text))


def test_an_older_log_gets_its_text_indexed_on_upgrade(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with LogWriter(path) as writer:
        stream(writer, "task.1")
    db = sqlite_utils.Database(path)
    # Back to schema 3: what a log recorded before search existed looks like.
    db["events"].disable_fts()
    db.execute("DROP TABLE findings")
    db.execute("DELETE FROM _sqlite_migrations WHERE name = '0004_search_and_findings'")
    db.conn.commit()
    db.close()
    with LogWriter(path) as writer:  # a writer upgrades it
        stream(writer, "task.2")
    with EventLog(path) as log:
        assert len(matches(log, "asthma")) == 4
