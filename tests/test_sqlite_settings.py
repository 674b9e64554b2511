"""SQLite's memory count stopped in a process of the log's own: only while nothing of
SQLite's is open, and the log written after it as before. Each case in a fresh
interpreter, since the setting is the process's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tasktape.eventlog import EventLog


def run(code: str, tmp_path: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_fresh_process_stops_counting_and_writes_its_log_as_before(tmp_path: Path) -> None:
    code = """
        import sqlite3
        from tasktape.eventlog import LogWriter
        from tasktape.eventlog.sqlite_settings import _library, stop_counting_memory

        print(stop_counting_memory())
        with LogWriter("log.db") as w:
            cap = w.begin_capture(source="test")
            ex = w.begin_exchange(cap, method="POST", path="/message:stream")
            w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
            for i in range(300):
                w.chunk(ex, i, f"id: {i}\\ndata: {{\\"n\\": {i}}}\\n\\n".encode())
            w.end_exchange(ex, duration_ns=1).result()
            print(_library().sqlite3_memory_used())  # a connection open, nothing counted
        print(stop_counting_memory())  # asked again: it does not count
    """
    assert run(code, tmp_path) == ["True", "0", "True"]
    with EventLog(tmp_path / "log.db") as log:
        rows = log.db.conn.execute("SELECT event_id, data FROM events ORDER BY seq").fetchall()
    assert rows == [(str(i), f'{{"n": {i}}}') for i in range(300)]


@pytest.mark.parametrize("holding", ["a connection", "a statement of a closed cursor's connection"])
def test_nothing_changes_while_sqlite_holds_anything(tmp_path: Path, holding: str) -> None:
    opened = (
        "conn = sqlite3.connect('other.db'); conn.execute('CREATE TABLE t (x)')"
        if holding == "a connection"
        else "conn = sqlite3.connect(':memory:'); cur = conn.execute('SELECT 1')"
    )
    code = f"""
        import sqlite3
        from tasktape.eventlog.sqlite_settings import _library, stop_counting_memory

        {opened}
        print(stop_counting_memory())
        print(_library().sqlite3_memory_used() > 0)  # still counted
        print(conn.execute("SELECT 2").fetchone()[0])
    """
    assert run(code, tmp_path) == ["False", "True", "2"]


def test_a_writer_process_which_stops_counting_records_as_before(tmp_path: Path) -> None:
    code = """
        from tasktape.eventlog import ProcessLogWriter

        w = ProcessLogWriter("log.db")
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="GET", path="/stream")
        w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
        w.chunk(ex, 1, b"data: one\\n\\ndata: two\\n\\n")
        print(w.end_exchange(ex, duration_ns=2).result().events)
        w.close()
    """
    assert run(code, tmp_path) == ["2"]
    with EventLog(tmp_path / "log.db") as log:
        assert [r[0] for r in log.db.conn.execute("SELECT data FROM events ORDER BY seq")] == ["one", "two"]
