"""`tasktape check` as a user runs it: on a log recorded from the demo agent, on a log of
an agent that breaks the rules, and on every sample cassette."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from a2a_frames import artifact, completed_run, sse, status, task
from aiohttp import web
from click.testing import CliRunner, Result
from conftest import RecordFactory
from log_rows import older_log

from tasktape.cli import main
from tasktape.demo import run_demo
from tasktape.errors import UsageError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import read_cassette, write_cassette
from tasktape.eventlog.checker import all_rules, check_log
from tasktape.eventlog.schema import KNOWN
from tasktape.eventlog.writer_lock import release_writer_lock, take_writer_lock

CASSETTES = sorted((Path(__file__).resolve().parent.parent / "cassettes").glob("*.jsonl"))


def check(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["check", *map(str, args)])


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db)) as conn, conn:
        return conn.execute(sql).fetchall()


def saved(db: Path) -> list[tuple[Any, ...]]:
    return query(db, "SELECT rule, task_id, exchange_id, seq, message FROM findings ORDER BY id")


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every demo scenario, recorded once through the proxy (a fast pace)."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    runs, *_ = asyncio.run(run_demo(db, 0.02))
    assert [r.problems for r in runs if r.problems] == []
    return db


@pytest.fixture
def demo_log(demo_db: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(demo_db, tmp_path / "demo.db"))


def test_the_demo_agent_keeps_every_rule(demo_log: Path) -> None:
    result = check(demo_log)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # The dropped connection is noted, and does not fail the check.
    (cut,) = [line for line in lines if "cut-short" in line]
    assert re.fullmatch(
        rf"task\.\S+  {re.escape(str(demo_log))} exchange \d+ event 8  "
        r"cut-short: broke off after 8 complete events, "
        r"the task last WORKING \(upstream_disconnected: the upstream dropped mid-response: .*\); "
        r"how it ends is unknown",
        cut,
    ), cut
    assert re.search(
        r"^Checked 12 streams \(\d+ exchanges in all\) of 12 tasks from 1 source: no rule broken\.\n"
        r"1 stream cut short: checked up to the break, not counted as broken\.\n"
        rf"Saved 0 findings into {re.escape(str(demo_log))} \(table findings\)\.$",
        result.output,
        re.M,
    ), result.output
    assert saved(demo_log) == []


def test_json(demo_log: Path) -> None:
    result = check(demo_log, "--json", "--no-save")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["findings"] == []
    (cut,) = doc["cut_short"]
    [(dropped,)] = query(demo_log, "SELECT id FROM exchanges WHERE outcome = 'upstream_disconnected'")
    assert cut["rule"] == "cut-short" and cut["exchange_id"] == dropped and cut["exchange"] == str(dropped)
    assert cut["source"] == str(demo_log) and cut["seq"] == 8 and cut["task_id"].startswith("task.")
    (source,) = doc["sources"]
    assert source["streams"] == 12 and source["tasks"] == 12 and source["findings"] == 0
    assert source["saved"] is None  # --no-save
    summary = doc["summary"]
    assert summary["streams"] == 12 and summary["findings"] == 0
    assert summary["by_rule"] == dict.fromkeys(all_rules(), 0)


def rule_breaking_agent() -> web.Application:
    """Answers with a COMPLETED status that carries the answer, then says more."""
    t, c = "task.bad", "ctx.bad"
    done = status(t, c, "TASK_STATE_COMPLETED")
    done["statusUpdate"]["status"]["message"] = {"role": "ROLE_AGENT", "parts": [{"text": "the answer"}]}
    frames = [
        task(t, c, "TASK_STATE_SUBMITTED"),
        *completed_run(t, c)[1:-1],
        done,
        artifact(t, c, "art.x", "p.s."),
    ]

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in sse(frames, ids="e"):
            await response.write(event)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


async def recorded_rule_breaker(record: RecordFactory) -> Path:
    rec = await record(rule_breaking_agent())
    async with rec.session.post(f"{rec.url}/message:stream", json={"message": {"parts": []}}) as r:
        await r.read()
    (await rec.log()).close()
    return rec.db


async def test_a_broken_rule_fails_the_check_and_is_saved_into_the_log(record: RecordFactory) -> None:
    db = await recorded_rule_breaker(record)
    result = check(db)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[:2] == [
        f"task.bad  {db} exchange 1 event 9  completed-message: the COMPLETED statusUpdate carries "
        "status.message (v1.0 sends none)",
        f"task.bad  {db} exchange 1 event 10  after-terminal: an artifactUpdate after the task ended "
        "COMPLETED at event 9",
    ]
    assert "Checked 1 stream (1 exchange in all) of 1 task from 1 source: 2 findings." in result.output
    assert re.search(
        r"^  completed-message +1  A v1.0 COMPLETED statusUpdate carries no message", result.output, re.M
    )
    assert re.search(r"^  after-terminal +1  Once a task reaches a terminal state", result.output, re.M)
    assert saved(db) == [
        (
            "completed-message",
            "task.bad",
            1,
            9,
            "the COMPLETED statusUpdate carries status.message (v1.0 sends none)",
        ),
        ("after-terminal", "task.bad", 1, 10, "an artifactUpdate after the task ended COMPLETED at event 9"),
    ]
    # Checking again replaces what was saved, and the inspector's events line up by seq.
    assert check(db).exit_code == 1 and len(saved(db)) == 2
    kinds = query(
        db, "SELECT e.kind, e.state FROM findings f JOIN events e USING (exchange_id, seq) ORDER BY f.id"
    )
    assert kinds == [("statusUpdate", "TASK_STATE_COMPLETED"), ("artifactUpdate", None)]


def test_a_clean_check_clears_old_findings_and_no_save_leaves_them(demo_log: Path) -> None:
    query(demo_log, "INSERT INTO findings (rule, exchange_id, message) VALUES ('frame', 1, 'stale')")
    assert check(demo_log, "--no-save").exit_code == 0 and len(saved(demo_log)) == 1
    assert check(demo_log).exit_code == 0 and saved(demo_log) == []


async def test_json_lists_the_findings(record: RecordFactory) -> None:
    db = await recorded_rule_breaker(record)
    result = check(db, "--json", "--no-save")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert [(f["rule"], f["exchange"], f["exchange_id"], f["seq"]) for f in doc["findings"]] == [
        ("completed-message", "1", 1, 9),
        ("after-terminal", "1", 1, 10),
    ]
    assert doc["summary"]["by_rule"] == {
        **dict.fromkeys(all_rules(), 0),
        "completed-message": 1,
        "after-terminal": 1,
    }
    assert saved(db) == []


@pytest.mark.parametrize("cassette", CASSETTES, ids=[c.name for c in CASSETTES])
def test_every_sample_cassette_passes(cassette: Path) -> None:
    result = check(cassette, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["findings"] == []
    assert doc["sources"][0]["saved"] is None  # a cassette is never written to
    cut = [(c["exchange"], c["seq"]) for c in doc["cut_short"]]
    assert cut == ([("dropped_connection.jsonl:5", 8)] if cassette.name == "dropped_connection.jsonl" else [])


def test_a_folder_of_cassettes(tmp_path: Path) -> None:
    """Each cassette of a folder is a source of its own, named by its path in the folder:
    two recordings of one task (a cassette copied into two tests' folders) were checked as
    one stream of events, and broke the lifecycle."""
    result = check(CASSETTES[0].parent)
    assert result.exit_code == 0, result.output
    assert "dropped_connection.jsonl:5 event 8  cut-short: broke off after 8 complete events" in result.output
    assert f"from {len(CASSETTES)} sources: no rule broken.\n1 stream cut short" in result.output
    for folder in ("test_a", "test_b"):
        (tmp_path / folder).mkdir()
        shutil.copy(CASSETTES[0].parent / "completed.jsonl", tmp_path / folder / "completed.jsonl")
    result = check(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [s["source"] for s in doc["sources"]] == [
        str(tmp_path / "test_a" / "completed.jsonl"),
        str(tmp_path / "test_b" / "completed.jsonl"),
    ]
    assert doc["findings"] == []


def not_a_cassette(folder: Path) -> Path:
    (folder / "notes.txt").write_text("hello")
    return folder / "notes.txt"


def another_database(folder: Path) -> Path:
    query(folder / "other.db", "CREATE TABLE t (x)")
    return folder / "other.db"


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda folder: folder / "missing.db", "does not exist"),
        (not_a_cassette, "notes.txt:1: not JSON"),
        (another_database, "an SQLite database but not a tasktape event log"),
    ],
    ids=["missing", "not a cassette", "another database"],
)
def test_bad_input_is_a_usage_error(tmp_path: Path, make: Callable[[Path], Path], error: str) -> None:
    result = check(make(tmp_path))
    assert result.exit_code == 2 and error in result.output, result.output


def test_a_bad_source_is_refused_before_any_log_is_written(demo_log: Path, tmp_path: Path) -> None:
    """Every source is read before any log is written: a bad one given last leaves the
    findings of the first where they were and the older log at its schema."""
    query(demo_log, "INSERT INTO findings (rule, exchange_id, message) VALUES ('frame', 1, 'stale')")
    old = older_log(tmp_path / "old.db")
    result = check(demo_log, old, not_a_cassette(tmp_path))
    assert result.exit_code == 2 and "notes.txt:1: not JSON" in result.output, result.output
    assert saved(demo_log) == [("frame", None, 1, None, "stale")]
    assert [name for (name,) in query(old, "SELECT name FROM _sqlite_migrations")] == KNOWN[:3]
    # An older log another writer holds is refused before findings go into any log.
    fd = take_writer_lock(old)
    try:
        result = check(demo_log, old)
    finally:
        release_writer_lock(fd)
    assert result.exit_code == 2 and "check it again once that writer is done" in result.output
    assert saved(demo_log) == [("frame", None, 1, None, "stale")]


def after_terminal(path: Path, task_id: str = "task.bad") -> Path:
    """A cassette of a task that streams on after it completed: one finding, at event 10."""
    frames = [*completed_run(task_id, "ctx.bad"), artifact(task_id, "ctx.bad", "art.x", "p.s.")]
    request = {"method": "POST", "path": "/message:stream", "headers": [["A2A-Version", "1.0"]]}
    head = {"status": 200, "headers": [["Content-Type", "text/event-stream"]]}
    lines: list[dict[str, Any]] = [
        {"tasktape_cassette": 1},
        {"exchange": {"request": request, "response": head}},
    ]
    lines += [{"event": {"offset_ms": n, "data": json.dumps(f)}} for n, f in enumerate(frames, 1)]
    lines.append({"end": {"duration_ms": len(frames) + 1}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_sources_of_one_name_in_two_folders_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finding names its source as it was given: by its file's name alone, two
    cassettes (or logs) of one name in two folders read as one."""
    monkeypatch.chdir(tmp_path)
    for folder in ("f1", "f2"):
        after_terminal(Path(folder, "broken.jsonl"))
        imported = CliRunner().invoke(main, ["import", f"{folder}/broken.jsonl", "--db", f"{folder}/run.db"])
        assert imported.exit_code == 0, imported.output
    result = check("f1/broken.jsonl", "f2/broken.jsonl", "f1/run.db", "f2/run.db", "--no-save")
    assert result.exit_code == 1, result.output
    places = [line.split("  ")[1] for line in result.output.splitlines() if line.startswith("task.bad")]
    assert places == [
        "f1/broken.jsonl:2 event 10",
        "f2/broken.jsonl:2 event 10",
        "f1/run.db exchange 1 event 10",
        "f2/run.db exchange 1 event 10",
    ]


def test_cassettes_of_one_name_in_two_folders_given_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two folders given, each holding a cassette of one name: both findings read
    "broken.jsonl:2 event 10", and --json gave them one exchange. A folder's cassette is
    named by the folder as given, then its path in the folder."""
    monkeypatch.chdir(tmp_path)
    for cassette in ("f1/broken.jsonl", "f2/broken.jsonl", "f2/deep/broken.jsonl"):
        after_terminal(Path(cassette))
    result = check("f1", "./f2/")
    assert result.exit_code == 1, result.output
    places = [line.split("  ")[1] for line in result.output.splitlines() if line.startswith("task.bad")]
    assert places == [
        "f1/broken.jsonl:2 event 10",
        "f2/broken.jsonl:2 event 10",
        "f2/deep/broken.jsonl:2 event 10",
    ]
    doc = json.loads(check("f1", "f2", "--json").output)
    assert [(f["source"], f["exchange"]) for f in doc["findings"]] == [
        ("f1/broken.jsonl", "f1/broken.jsonl:2"),
        ("f2/broken.jsonl", "f2/broken.jsonl:2"),
        ("f2/deep/broken.jsonl", "f2/deep/broken.jsonl:2"),
    ]


def test_a_task_id_is_printed_with_its_control_characters_escaped(tmp_path: Path) -> None:
    """A task id is the agent's: printed raw, its ESC, BEL or NUL would set the terminal's
    title or clear it where the finding is said (color=True: printed as to a terminal)."""
    task_id = "task\x1b]0;TITLE\x07\x1b[2J\x00.bad"
    cassette = after_terminal(tmp_path / "broken.jsonl", task_id)
    result = CliRunner().invoke(main, ["check", str(cassette)], color=True)
    assert result.exit_code == 1, result.output
    assert result.output.startswith(
        f"task\\x1b]0;TITLE\\x07\\x1b[2J\\x00.bad  {cassette}:2 event 10  after-terminal: "
    ), result.output
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", result.output), result.output


def test_protocol_selects_whose_rules_run(tmp_path: Path) -> None:
    from test_protocols import MCP_BREAKS  # noqa: PLC0415 - a hand-made broken MCP session

    mixed = tmp_path / "mixed.jsonl"
    a2a = Path(__file__).resolve().parent.parent / "cassettes" / "completed.jsonl"
    write_cassette(mixed, [*read_cassette(a2a), *MCP_BREAKS["mcp-result-xor-error"]])
    everything = check(mixed, "--no-save")
    assert everything.exit_code == 1 and "mcp-result-xor-error" in everything.output
    assert "(2 exchanges in all: a2a 1, mcp 1)" in everything.output
    assert check(mixed, "--no-save", "--protocol", "a2a").exit_code == 0
    only_mcp = check(mixed, "--no-save", "--protocol", "mcp", "--json")
    assert only_mcp.exit_code == 1
    doc = json.loads(only_mcp.output)
    assert doc["summary"]["by_protocol"] == {"mcp": 1}
    assert {f["rule"] for f in doc["findings"]} == {"mcp-result-xor-error"}
    unknown = check(mixed, "--protocol", "grpc")
    assert unknown.exit_code == 2 and "unknown protocol grpc" in unknown.output


def test_protocols_given_as_one_string_are_refused(tmp_path: Path) -> None:
    """From Python, ``protocols="a2a"`` would be read letter by letter ("unknown protocol
    2, a"): a single string is refused with what to write instead."""
    with LogWriter(tmp_path / "log.db"):
        pass
    with EventLog(tmp_path / "log.db") as log, pytest.raises(UsageError) as refused:
        check_log(log, protocols="a2a")
    assert str(refused.value) == "protocols is a list of names, not one string: write ['a2a']"
    with EventLog(tmp_path / "log.db") as log:
        assert check_log(log, protocols=["a2a"]) == []


def test_saving_into_an_older_log_another_writer_holds_is_refused(tmp_path: Path) -> None:
    """Saving findings upgrades an older log first, as tasktape upgrade does, under its
    writer lock: a recorder still writing it is refused, the log left as it was."""
    old = older_log(tmp_path / "old.db")
    fd = take_writer_lock(old)
    try:
        result = check(old)
    finally:
        release_writer_lock(fd)
    assert result.exit_code == 2, result.output
    assert f"{old} is being written by another tasktape writer" in result.output
    assert "check it again once that writer is done" in result.output
    assert [name for (name,) in query(old, "SELECT name FROM _sqlite_migrations")] == KNOWN[:3]
    result = check(old)  # the writer gone: upgraded, then checked
    assert result.exit_code == 0, result.output
    assert [name for (name,) in query(old, "SELECT name FROM _sqlite_migrations")] == KNOWN
