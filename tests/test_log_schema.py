"""The public schema, WAL mode, and migrations (upgrade older logs, refuse newer ones)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from click.testing import CliRunner
from log_rows import left_empty
from loopback import running, serve, stop, upstream_app

from tasktape.cli import main
from tasktape.errors import LogError, SchemaTooNew
from tasktape.eventlog import SCHEMA_VERSION, EventLog, LogWriter, new_log, open_db
from tasktape.eventlog.schema import KNOWN, PAGE_SIZE, migrations

CASSETTES = Path(__file__).resolve().parent.parent / "cassettes"

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
        "tool_calls",
        "cached_input_tokens",
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


def _schema(path: Path) -> dict[str, object]:
    """Everything a log's schema is: its objects as SQLite lists them, the table kinds,
    the full-text index's settings, the migrations recorded, the version and page size."""
    with sqlite3.connect(path) as conn:
        schema = {
            "objects": sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master")),
            "tables": sorted(conn.execute("SELECT name, type, ncol, wr, strict FROM pragma_table_list")),
            "fts": sorted(conn.execute("SELECT * FROM events_fts_config")),
            "migrations": [m for (m,) in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY id")],
            "version": conn.execute("PRAGMA user_version").fetchone(),
            "page_size": conn.execute("PRAGMA page_size").fetchone(),
        }
    conn.close()
    return schema


def test_a_new_log_has_the_schema_its_migrations_build(tmp_path: Path) -> None:
    """A new log is made from new_log.sql, not by running the migrations: both make the
    same log, and the file is what the migrations write now."""
    migrated = sqlite_utils.Database(tmp_path / "migrated.db")
    migrated.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    migrations.apply(migrated)
    migrated.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    migrated.close()
    open_db(tmp_path / "new.db").close()
    assert _schema(tmp_path / "new.db") == _schema(tmp_path / "migrated.db")
    assert new_log.write(migrations, tmp_path / "new_log.sql") == new_log.NEW_LOG_SQL.read_text(), (
        "new_log.sql is out of date with the migrations: python -m tasktape.eventlog.schema"
    )


def test_a_new_log_is_written_and_read_like_a_migrated_one(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
        frame = {
            "artifactUpdate": {"taskId": "t1", "artifact": {"artifactId": "a", "parts": [{"text": "hello"}]}}
        }
        w.chunk(ex, 1, b"id: 1\ndata: " + json.dumps(frame).encode() + b"\n\n")
        w.end_exchange(ex, duration_ns=2).result()
    with EventLog(path) as log:
        assert [e["event_id"] for e in log.task_events("t1")] == ["1"]
        assert log.db.execute("SELECT rowid FROM events_fts WHERE events_fts MATCH 'hello'").fetchall() == [
            (1,)
        ]
        assert log.db.execute("SELECT count(*) FROM chunks").fetchone() == (1,)


def test_a_log_of_schema_20_reads_its_task_views_anew_once_upgraded(tmp_path: Path) -> None:
    """0021 makes the views anew: an artifact closed in one turn and replaced in the next
    reads as the second turn left it, and a keep-alive comment is no stream's first event."""
    new = tmp_path / "new.db"
    first = {"artifactId": "a", "parts": [{"text": "First version"}]}
    turns = [
        [{"artifactUpdate": {"taskId": "t", "artifact": first, "lastChunk": True}}],
        [{"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "a", "parts": [{"text": "Second"}]}}}],
    ]
    with LogWriter(new) as w:
        cap = w.begin_capture(source="test")
        for n, frames in enumerate([*turns, []]):
            ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=(n + 1) * 10**9)
            w.response_head(
                ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=1
            )
            for frame in frames:
                w.chunk(ex, 5, b"data: " + json.dumps(frame).encode() + b"\n\n")
            if not frames:
                w.chunk(ex, 5, b": keep-alive\n\n")
            w.end_exchange(ex, duration_ns=9)
    old = sqlite_utils.Database(tmp_path / "old.db")
    migrations.apply(old, stop_before="0021_task_views_of_what_was_sent")
    old.execute("PRAGMA user_version = 20")
    old.execute("ATTACH DATABASE ? AS new", [str(new)])
    for table in ("captures", "exchanges", "stored_chunks", "events"):
        old.execute(f"INSERT INTO main.{table} SELECT * FROM new.{table}")
    old.conn.commit()
    old.execute("DETACH DATABASE new")

    def views() -> tuple[object, ...]:
        text = old.execute("SELECT text FROM task_artifacts").fetchone()[0]
        return text, old.execute("SELECT ttfe_ms FROM stream_summary WHERE exchange_id = 3").fetchone()[0]

    assert views() == ("First version", 0.0)
    old.close()
    with LogWriter(tmp_path / "old.db"):  # a writer upgrades it
        pass
    old = sqlite_utils.Database(tmp_path / "old.db")
    assert views() == ("Second", None)
    old.close()


def _stream(w: LogWriter, cap: int, path: str, body: dict[str, object], events: list[bytes]) -> None:
    x = w.begin_exchange(
        cap,
        method="POST",
        path=path,
        request_headers=[("content-type", "application/json")],
        request_body=json.dumps(body).encode(),
    )
    w.response_head(x, status=200, headers=[("content-type", "text/event-stream")], is_sse=True, ttfb_ns=1)
    for data in events:
        w.chunk(x, 5, b"data: " + data.encode() + b"\n\n")
    w.end_exchange(x, duration_ns=9)


def _chat_chunk(*deltas: dict[str, str]) -> str:
    choices = [{"index": i, "delta": delta, "finish_reason": None} for i, delta in enumerate(deltas)]
    return json.dumps({"object": "chat.completion.chunk", "model": "gpt-x", "choices": choices})


def test_a_log_of_schema_21_reads_a2a_usage_and_openai_texts_anew_once_upgraded(tmp_path: Path) -> None:
    """0022 reads again what the readers read otherwise now: an A2A stream's $usage in
    camelCase (early schema 7 logs left its token counts empty) and an OpenAI chunk's
    reasoning and other choices' text beside choice 0's piece (its event held that alone)."""
    new = tmp_path / "new.db"
    usage = {"model": "m", "inputTokens": 100, "outputTokens": 20, "cachedInputTokens": 64}
    done = {"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED"}}}
    with LogWriter(new) as w:
        cap = w.begin_capture(source="test")
        _stream(w, cap, "/message:stream", {}, [json.dumps({"task": {"id": "t", "status": {}}})])
        done["statusUpdate"]["metadata"] = {"$usage": usage}
        _stream(w, cap, "/message:stream", {}, [json.dumps(done)])
        chat = {"model": "gpt-x", "n": 2, "stream": True, "messages": []}
        _stream(
            w,
            cap,
            "/v1/chat/completions",
            chat,
            [
                _chat_chunk({"reasoning_content": "pondering", "content": "The"}),
                _chat_chunk({"content": " answer"}, {"content": "Another"}),
            ],
        )
    old = sqlite_utils.Database(tmp_path / "old.db")
    migrations.apply(old, stop_before="0022_a2a_usage_openai_and_mcp_texts")
    old.execute("PRAGMA user_version = 21")
    old.execute("ATTACH DATABASE ? AS new", [str(new)])
    for table in ("captures", "exchanges", "stored_chunks", "events"):
        old.execute(f"INSERT INTO main.{table} SELECT * FROM new.{table}")
    # As their writers left them: no A2A token counts, an OpenAI event's text choice 0's piece.
    old.execute("UPDATE exchanges SET input_tokens = NULL, output_tokens = NULL")
    old.execute(
        "UPDATE events SET text = (CASE seq WHEN 0 THEN 'The' ELSE ' answer' END) WHERE exchange_id = 3"
    )
    old.execute("INSERT INTO events_fts (events_fts) VALUES ('rebuild')")
    old.conn.commit()
    old.execute("DETACH DATABASE new")

    def read() -> tuple[object, ...]:
        tokens = old.execute("SELECT input_tokens, output_tokens FROM stream_summary")
        texts = old.execute("SELECT text FROM events WHERE exchange_id = 3 ORDER BY seq")
        found = old.execute("SELECT rowid FROM events_fts WHERE events_fts MATCH 'pondering OR another'")
        return tokens.fetchall(), [t for (t,) in texts], len(found.fetchall())

    assert read() == ([(None, None)] * 3, ["The", " answer"], 0)
    old.close()
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path / "old.db")])
    assert f"schema version 21 went to {SCHEMA_VERSION}" in result.output, result.output
    old = sqlite_utils.Database(tmp_path / "old.db")
    # (the A2A stream without usage, and the OpenAI one without counts, have none)
    texts = ["pondering\nThe", " answer\nAnother"]
    assert read() == ([(None, None), (100, 20), (None, None)], texts, 2)
    old.close()


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


# A process that opens the log named by each line it reads ("rw PATH" to write, "ro PATH"
# to read), and answers each with "ok" or the error it got.
_OPENER = """
import sys
from tasktape.errors import LogError
from tasktape.eventlog import open_db
for line in sys.stdin:
    mode, path = line.rstrip("\\n").split(" ", 1)
    try:
        open_db(path, readonly=mode == "ro").close()
        print("ok", flush=True)
    except LogError as exc:
        print(exc, flush=True)
"""


@contextmanager
def _openers(modes: list[str], cwd: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes started beforehand (imports done), so that they open a log at once."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=cwd
        )
        for _ in modes
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _open_at_once(procs: list[subprocess.Popen[str]], modes: list[str], path: Path) -> list[str]:
    for proc, mode in zip(procs, modes, strict=True):
        assert proc.stdin is not None
        proc.stdin.write(f"{mode} {path}\n")
        proc.stdin.flush()
    return [proc.stdout.readline().strip() for proc in procs if proc.stdout is not None]


def test_processes_opening_a_new_log_at_once_all_open_it(tmp_path: Path) -> None:
    """Writers (recorders, collectors) and readers (inspect) opening a log made meanwhile:
    one writer makes it, in one step, the others wait for it; none finds half a log and
    calls it another program's database, or finds it locked."""
    modes = ["rw", "rw", "rw", "ro"]
    with _openers(modes, tmp_path) as procs:
        for trial in range(12):
            log = tmp_path / f"log{trial}.db"
            log.touch()  # as a recorder's writer lock makes it, before the log is made in it
            assert _open_at_once(procs, modes, log) == ["ok"] * len(modes), trial
            assert _applied(log) == KNOWN


def test_processes_opening_an_older_log_at_once_upgrade_it_once(tmp_path: Path) -> None:
    """Writers opening an older log at once: one upgrades it, in one step, the others wait
    and find it upgraded (none runs a migration again, or finds the log locked)."""
    modes = ["rw", "rw", "rw"]
    with _openers(modes, tmp_path) as procs:
        for trial in range(4):
            log = tmp_path / f"old{trial}.db"
            db = sqlite_utils.Database(log)
            db.enable_wal()
            migrations.apply(db, stop_before="0004_search_and_findings")
            db.close()
            assert _open_at_once(procs, modes, log) == ["ok"] * len(modes), trial
            assert _applied(log) == KNOWN


def test_another_programs_database_opened_at_once_is_still_refused(tmp_path: Path) -> None:
    """Waiting for a log being made does not make one of another program's database, even
    one with sqlite-utils' table of migrations: each opener refuses it, and it is left as it was."""
    notes, migrated = tmp_path / "notes.db", tmp_path / "migrated.db"
    with sqlite3.connect(notes) as conn:
        conn.execute("CREATE TABLE notes (text)")
    conn.close()
    other = sqlite_utils.Database(migrated)
    other_migrations = sqlite_utils.migrations.Migrations("another_app")
    other_migrations(name="0001")(lambda db: db["notes"].create({"text": str}))
    other_migrations.apply(other)
    other.close()
    modes = ["rw", "rw", "ro"]
    with _openers(modes, tmp_path) as procs:
        for db in (notes, migrated):
            before = db.read_bytes()
            said = _open_at_once(procs, modes, db)
            assert said == [f"{db} is an SQLite database but not a tasktape event log"] * len(modes)
            assert db.read_bytes() == before


def test_tasktape_upgrade_brings_an_older_log_to_this_version(tmp_path: Path) -> None:
    """The commands that only read a log refuse an older one and name the command that
    upgrades it; it upgrades each log given, once, and refuses what it cannot."""
    old = tmp_path / "old.db"
    db = sqlite_utils.Database(old)
    migrations.apply(db, stop_before="0004_search_and_findings")
    db.close()
    runner = CliRunner()
    result = runner.invoke(main, ["export", str(old), "-o", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 2 and f"upgrade it in place with: tasktape upgrade {old}" in result.output
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    result = runner.invoke(main, ["upgrade", "--dry-run", str(old)])
    assert result.exit_code == 1
    assert f"tasktape upgrade: {old}: schema version 3 would go to {SCHEMA_VERSION}" in result.stdout
    assert _applied(old) == KNOWN[:3]
    result = runner.invoke(main, ["upgrade", str(old), str(text)])
    assert result.exit_code == 2  # one file could not be upgraded
    assert f"tasktape upgrade: {old}: schema version 3 went to {SCHEMA_VERSION}" in result.stdout
    assert f"{text} is a file that is neither an event log nor a cassette: no log to upgrade" in result.stderr
    assert _applied(old) == KNOWN
    for args in (["upgrade", str(old)], ["upgrade", "--dry-run", str(old)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0 and f"already at schema version {SCHEMA_VERSION}" in result.output
    with LogWriter(old):  # being written, and current: nothing to do, so no lock needed
        result = runner.invoke(main, ["upgrade", str(old)])
    assert result.exit_code == 0 and f"already at schema version {SCHEMA_VERSION}" in result.output
    # Another application's database, an empty one: no log, with or without --dry-run, and
    # left as they were (an empty one was made a log).
    other, empty = tmp_path / "other.db", tmp_path / "empty.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (text)")
    conn.close()
    with sqlite3.connect(empty) as conn:  # a database file, of no table
        conn.execute("CREATE TABLE t (x)")
        conn.execute("DROP TABLE t")
    conn.close()
    for db, said in ((other, "an SQLite database but not"), (empty, "an empty SQLite database, not")):
        before = db.read_bytes()
        for args in (["upgrade", str(db)], ["upgrade", "--dry-run", str(db)]):
            result = runner.invoke(main, args)
            assert result.exit_code == 2 and "a tasktape event log" in result.stderr, result.output
            assert said in result.stderr and db.read_bytes() == before


def _applied(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        applied = [m for (m,) in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY id")]
    conn.close()
    return applied


def _log_of_cassettes(path: Path) -> Path:
    """A finished log (no -wal beside it) of two sample cassettes."""
    for name in ("canceled.jsonl", "auth_required.jsonl"):
        result = CliRunner().invoke(main, ["import", str(CASSETTES / name), "--db", str(path)])
        assert result.exit_code == 0, result.output
    return path


def _run(args: list[str], *, as_nobody: bool = False) -> tuple[int, str]:
    """``tasktape ARGS``'s exit status and output. ``as_nobody`` (as root, who writes in any
    folder): in a child process that has become nobody first, having loaded all it needs."""
    if not as_nobody:
        return _invoke(args)
    code, output = _as_user(NOBODY, lambda: _invoke(args))
    return code, output


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def _as_user(uid: int, call: Callable[[], Any]) -> Any:
    """What ``call`` returns (as JSON), called in a child process that has become the user
    ``uid`` (and its group) first: as root alone."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its answer through the pipe, then gone without pytest's exit
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            answer = call()
            with os.fdopen(write, "w") as out:
                json.dump(answer, out)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    return json.loads(said)


NOBODY = 65534
# What reads a log, each run on the log in a read-only folder ({log}; {out}: a folder the
# user can write).
READERS = {
    "check": ["check", "--no-save", "{log}"],
    "export": ["export", "{log}", "-o", "{out}/x.jsonl"],
    "diff": ["diff", "{log}", "{log}"],
    "upgrade": ["upgrade", "--dry-run", "{log}"],
    "merge": ["merge", "{log}", "-o", "{out}/merged.db"],
}


@contextmanager
def _read_only_folder(*files: Path) -> Iterator[Path]:
    """A folder that holds copies of ``files``, made read-only with them (SQLite cannot make
    a ``-shm`` file there), beside ``out``, a folder the user (nobody, as root) can write."""
    top = Path(tempfile.mkdtemp())  # (not under pytest's, which only root can enter)
    top.chmod(0o755)
    (top / "out").mkdir()
    (top / "out").chmod(0o777)
    folder = top / "ro"
    folder.mkdir()
    for path in files:
        shutil.copy(path, folder / path.name)
        (folder / path.name).chmod(0o444)
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)
        shutil.rmtree(top)


def _reader_args(command: str, log: Path) -> list[str]:
    out = log.parent.parent / "out"
    return [arg.format(log=log, out=out) for arg in READERS[command]]


@pytest.mark.parametrize("command", READERS)
def test_a_finished_log_in_a_read_only_folder_is_read(tmp_path: Path, command: str) -> None:
    """A finished log where nothing can write (a read-only folder or mount, an archive's):
    SQLite cannot open it read-only there, so it is read as immutable."""
    root = os.geteuid() == 0
    log = _log_of_cassettes(tmp_path / "log.db")
    _run(_reader_args(command, log))  # (as root: what it loads is loaded before it is nobody)
    with _read_only_folder(log) as folder:
        code, output = _run(_reader_args(command, folder / "log.db"), as_nobody=root)
        assert sorted(p.name for p in folder.iterdir()) == ["log.db"]
        merged = folder.parent / "out" / "merged.db"
        if command == "merge":
            assert _applied(merged) == KNOWN
    assert "cannot open" not in output and "not a tasktape event log" not in output, output
    assert code in (0, 1) if command == "check" else code == 0, output  # (check: the rules' findings)


def test_a_finished_log_in_a_read_only_folder_is_read_through_a_symlink(tmp_path: Path) -> None:
    """A link to it from a folder the user can write: SQLite follows it, so where it cannot
    make its -shm file is beside the log, not the link (it said "attempt to write a readonly
    database")."""
    log = _log_of_cassettes(tmp_path / "log.db")
    _run(_reader_args("export", log))
    with _read_only_folder(log) as folder:
        link = folder.parent / "out" / "link.db"
        link.symlink_to(folder / "log.db")
        code, output = _run(
            ["export", str(link), "-o", str(link.parent / "x.jsonl")], as_nobody=os.geteuid() == 0
        )
    assert code == 0 and "cannot open" not in output, output


def test_a_log_with_its_write_ahead_log_in_a_read_only_folder_is_refused_naming_it(tmp_path: Path) -> None:
    """Its -wal file holds rows SQLite reads only with a -shm file it cannot make there:
    the error says so, and where."""
    log = _log_of_cassettes(tmp_path / "log.db")
    _run(_reader_args("export", log))
    with closing(sqlite3.connect(log)) as conn:  # a writer still at it: a -wal beside the log
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        with conn:
            conn.execute("DELETE FROM findings")
        with _read_only_folder(log, tmp_path / "log.db-wal") as folder:
            code, output = _run(_reader_args("export", folder / "log.db"), as_nobody=os.geteuid() == 0)
    assert code == 2, output
    assert f"its folder {folder} is read-only" in output and "log.db-wal" in output, output


def test_a_log_another_may_still_write_in_a_folder_read_only_to_this_user_is_refused(tmp_path: Path) -> None:
    """Read as immutable, a log its owner's writer still changes reads stale rows, then as
    damaged: where another may write it (its file writable), the error says what to do."""
    log = _log_of_cassettes(tmp_path / "log.db")
    _run(_reader_args("export", log))
    with _read_only_folder(log) as folder:
        (folder / "log.db").chmod(0o644)  # (its owner may write it, and a writer of theirs)
        code, output = _run(_reader_args("export", folder / "log.db"), as_nobody=os.geteuid() == 0)
    assert code == 2, output
    assert f"which it cannot make in {folder} (read-only for this user)" in output, output
    assert "may still be written by another" in output and "chmod a-w" in output, output


OWNER = 4242  # a user of no name, who owns the log


def _older_log_in_wal_mode(path: Path) -> None:
    db = sqlite_utils.Database(path)
    db.enable_wal()
    migrations.apply(db, stop_before="0004_search_and_findings")
    db.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs two users, which only root can be in turn")
def test_side_files_another_user_left_are_named_when_they_stop_an_upgrade(tmp_path: Path) -> None:
    """A read of the log as another user (upgrade --dry-run) leaves its -wal and -shm
    files, theirs and read-only to its owner, whose upgrade SQLite then refuses as "attempt
    to write a readonly database": the error names them and whose they are."""
    warm = tmp_path / "warm.db"  # (what each command loads is loaded before a child becomes a user)
    _older_log_in_wal_mode(warm)
    _run(["upgrade", "--dry-run", str(warm)])
    _run(["upgrade", str(warm)])
    top = Path(tempfile.mkdtemp())  # (not under pytest's, which only root can enter)
    top.chmod(0o1777)  # as /tmp is: anyone makes files in it
    log = top / "old.db"
    try:
        _as_user(OWNER, lambda: _older_log_in_wal_mode(log))
        assert _run(["upgrade", "--dry-run", str(log)], as_nobody=True)[0] == 1
        sides = [Path(f"{log}-wal"), Path(f"{log}-shm")]
        assert [side.stat().st_uid for side in sides] == [NOBODY, NOBODY]
        code, output = _as_user(OWNER, lambda: _invoke(["upgrade", str(log)]))
    finally:
        shutil.rmtree(top)
    assert code == 2, output
    assert "attempt to write a readonly database" in output, output
    assert f"its side files {sides[0]}, {sides[1]} belong to" in output and "(uid 65534)" in output, output


def _damaged(log: Path) -> Path:
    """``log`` with the root page of its events overwritten: it opens, its events fail."""
    with closing(sqlite3.connect(log)) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'events'").fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    with log.open("r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\xff" * size)
    return log


@pytest.mark.parametrize(
    "args",
    [
        ["check", "{log}"],
        ["check", "--no-save", "{log}"],
        ["export", "{log}", "-o", "{dir}/x.jsonl"],
        ["merge", "{log}", "-o", "{dir}/merged.db"],
        ["upgrade", "{log}"],
        ["upgrade", "--dry-run", "{log}"],
    ],
    ids=lambda args: " ".join(a for a in args if "{" not in a),
)
def test_a_damaged_log_is_said_to_be_so(tmp_path: Path, args: list[str]) -> None:
    """Pages overwritten: one line naming the file, exit status 2 (bad input), never a
    traceback nor "already at schema version"."""
    log = _damaged(_log_of_cassettes(tmp_path / "log.db"))
    result = CliRunner().invoke(main, [arg.format(log=log, dir=tmp_path) for arg in args])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert f"{log}" in result.output and "(the log is damaged)" in result.output, result.output
    assert "already at schema version" not in result.output
    assert not (tmp_path / "merged.db").exists()  # (merge made a log of nothing: none is left)


async def test_a_recorder_says_it_upgrades_an_older_log_before_it_does(tmp_path: Path) -> None:
    """Upgrading a big older log takes seconds, in which the recorder answers nothing yet:
    it says so first (and on a log of this version, nothing)."""
    old = tmp_path / "old.db"
    db = sqlite_utils.Database(old)
    migrations.apply(db, stop_before="0004_search_and_findings")
    db.close()
    said: list[str] = []
    async with serve(upstream_app()) as upstream:
        for _ in range(2):
            args = ["record", "--listen", "127.0.0.1:0", "--upstream", upstream, "--db", str(old)]
            async with running(*args) as run:
                assert await stop(run, signal.SIGINT) == 0
            said.append(run.printed[-1])  # (standard error)
    assert f"tasktape record: upgrading {old} from schema 3 to {SCHEMA_VERSION}…\n" in said[0], said[0]
    assert "upgrading" not in said[1], said[1]
    assert _applied(old) == KNOWN


def test_a_reader_waits_for_a_log_its_writer_is_slow_to_make(tmp_path: Path) -> None:
    """A file a writer made two seconds ago, the log made in it only now (a loaded machine):
    the reader reads the log, not "is empty" (it gave up a second after the file was made)."""
    log = tmp_path / "log.db"
    log.touch()
    two_seconds_ago = time.time() - 2
    os.utime(log, (two_seconds_ago, two_seconds_ago))
    writer = threading.Timer(0.3, lambda: open_db(log).close())
    writer.start()
    try:
        with EventLog(log) as read:
            assert read.exchanges() == []
    finally:
        writer.join()
    assert _applied(log) == KNOWN


def test_a_file_left_empty_is_refused_without_waiting_for_a_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader waits for an empty file a writer has just made to become a log; a file left
    empty long since is none being made: refused at once (`export empty.db` took a second)."""
    monkeypatch.setattr("tasktape.eventlog.schema.EMPTY_WAIT_S", 30.0)
    empty = left_empty(tmp_path / "empty.db")
    started = time.monotonic()
    with pytest.raises(LogError, match=r"empty\.db is empty: not an event log"):
        EventLog(empty)
    assert time.monotonic() - started < 10  # (not the 30 s a log being made is waited for)
