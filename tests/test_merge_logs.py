"""``tasktape merge``: logs of several recorders in one, ids that do not collide, every
row kept byte for byte, idempotent, and a merged log replays and inspects as one log."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from a2a_frames import completed_run, sse, status, task
from click.testing import CliRunner
from conftest import RecordFactory, Serve
from log_rows import MS, SSE, arrival, copy_log, left_empty, rows_by_uid, union, write_log
from test_replay import message, recorded_demo, stream_exchange, timed_post

from tasktape.cli import main
from tasktape.errors import LogBusy, LogError, UsageError
from tasktape.eventlog import EventLog, LogWriter, open_db
from tasktape.eventlog.checker import report_log, save_findings
from tasktape.eventlog.merge import LOCAL_TABLES, MERGED_TABLES, MergeReport, merge_logs
from tasktape.eventlog.schema import migrations
from tasktape.replay import ReplayServer, load


def counts(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    found = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in (*MERGED_TABLES, "events_fts")}
    db.close()
    return found


def test_two_logs_merge_whole_under_new_ids(tmp_path: Path) -> None:
    a, b = write_log(tmp_path / "a.db", "a"), write_log(tmp_path / "b.db", "b")
    # Both recorders numbered their captures and exchanges from 1.
    assert rows_by_uid(a)["exchanges"] != rows_by_uid(b)["exchanges"]
    reports = merge_logs([a, b], tmp_path / "fleet.db")
    assert [(r.captures, r.exchanges) for r in reports] == [(1, 3), (1, 3)]
    fleet = tmp_path / "fleet.db"
    assert rows_by_uid(fleet) == union(rows_by_uid(a), rows_by_uid(b))
    db = open_db(fleet)
    assert [r[0] for r in db.execute("SELECT id FROM exchanges ORDER BY id")] == [1, 2, 3, 4, 5, 6]
    # Rows keep the order they arrived in (rowids: what "first seen" reads), each log's after the last's.
    assert arrival(fleet) == arrival(a) + arrival(b)
    # The views see both recorders' tasks; search finds the text of both.
    tasks = {r["task_id"]: r for r in db.query("SELECT * FROM task_summary")}
    assert set(tasks) == {"task.a", "task.b"}
    assert tasks["task.a"]["answer"] == tasks["task.b"]["answer"] != None  # noqa: E711
    hits = db.execute("SELECT count(*) FROM events_fts WHERE events_fts MATCH 'intermittent'").fetchone()[0]
    assert hits == 4  # a delta and its consolidation, in each log
    assert counts(fleet)["events_fts"] == counts(a)["events_fts"] + counts(b)["events_fts"]


def test_merging_again_adds_nothing(tmp_path: Path) -> None:
    a, b = write_log(tmp_path / "a.db", "a"), write_log(tmp_path / "b.db", "b")
    fleet = tmp_path / "fleet.db"
    merge_logs([a], fleet)
    held = counts(fleet)
    reports = merge_logs([a, a], fleet)
    assert [r.describe() for r in reports] == [f"{a}: nothing new"] * 2
    assert counts(fleet) == held
    merge_logs([b, a], fleet)
    assert rows_by_uid(fleet) == union(rows_by_uid(a), rows_by_uid(b))


def test_an_exchange_the_output_holds_ended_but_without_all_its_rows_gets_them(tmp_path: Path) -> None:
    """A log collected from a fleet may hold an exchange's end before its rows (messages
    come in any order), or without a row too big to ship: merging the recorder's own log
    into it adds what it lacks."""
    a, fleet = write_log(tmp_path / "a.db", "a"), tmp_path / "fleet.db"
    merge_logs([a], fleet)
    whole = counts(fleet)
    db = sqlite3.connect(fleet)
    with db:
        (exchange,) = db.execute("SELECT exchange_id FROM events GROUP BY exchange_id LIMIT 1").fetchone()
        db.execute("DELETE FROM events WHERE exchange_id = ? AND seq = 1", (exchange,))
        assert db.execute("SELECT outcome FROM exchanges WHERE id = ?", (exchange,)).fetchone()[0] is not None
    db.close()
    (report,) = merge_logs([a], fleet)
    assert (report.exchanges, report.continued, report.events) == (0, 0, 1)
    assert counts(fleet) == whole and rows_by_uid(fleet) == rows_by_uid(a)
    assert merge_logs([a], fleet)[0].describe().endswith("nothing new")


LIVE_CHUNKS = sse(completed_run("task.live", "ctx.live"), ids="e")


def recorded_in_halves(path: Path, between: Callable[[], None]) -> None:
    """A stream recorded into ``path``: its first three chunks, then ``between()`` (the
    log as far as it got, its writer holding it), then the rest and its end."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        for n, data in enumerate(LIVE_CHUNKS[:3]):
            w.chunk(ex, n * MS, data)
        w.flush()
        between()
        for n, data in enumerate(LIVE_CHUNKS[3:], 3):
            w.chunk(ex, n * MS, data)
        w.end_exchange(ex, duration_ns=20 * MS).result()
        w.end_capture(cap)


def test_a_log_still_recording_is_merged_as_far_as_it_got_then_continued(tmp_path: Path) -> None:
    path, fleet = tmp_path / "live.db", tmp_path / "fleet.db"
    chunks = LIVE_CHUNKS
    merged: list[MergeReport] = []
    recorded_in_halves(path, lambda: merged.extend(merge_logs([path], fleet)))  # while the writer holds it
    assert (merged[0].exchanges, merged[0].events) == (1, 3)
    (second,) = merge_logs([path], fleet)
    assert (second.exchanges, second.continued, second.events) == (0, 1, len(chunks) - 3)
    assert rows_by_uid(fleet) == rows_by_uid(path)
    with EventLog(fleet) as log:
        (x,) = log.exchanges()
        assert log.body(x["id"]) == b"".join(chunks) and x["outcome"] == "complete"
    (third,) = merge_logs([path], fleet)
    assert not third.added


def test_findings_checked_again_replace_the_merged_ones_and_not_the_other_way(tmp_path: Path) -> None:
    a, fleet = write_log(tmp_path / "a.db", "a"), tmp_path / "fleet.db"
    copy_log(a, tmp_path / "checked-before.db")
    merge_logs([a], fleet)
    before = rows_by_uid(fleet)["findings"]
    time.sleep(0.002)  # a later check
    with EventLog(a) as log:
        save_findings(a, report_log(log).findings)
    (report,) = merge_logs([a], fleet)
    assert report.findings == len(before) and rows_by_uid(fleet)["findings"] == before
    later = _checked_at(fleet)
    assert len(later) == 1 and later == _checked_at(a)  # the later check's alone
    (report,) = merge_logs([tmp_path / "checked-before.db"], fleet)
    assert report.findings == 0 and _checked_at(fleet) == later


def _checked_at(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    found = {at for (at,) in db.execute("SELECT checked_at FROM findings")}
    db.close()
    return found


def test_a_log_from_before_uids_merges_through_a_copy_it_leaves_alone(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    write_log(tmp_path / "new.db", "a")
    copy_log(tmp_path / "new.db", old)
    db = sqlite3.connect(old)
    # Back to schema 10: without uids and their migration.
    db.execute("DROP INDEX captures_uid")
    db.execute("DROP INDEX exchanges_uid")
    db.execute("ALTER TABLE captures DROP COLUMN uid")
    db.execute("ALTER TABLE exchanges DROP COLUMN uid")
    db.execute("DELETE FROM _sqlite_migrations WHERE name = '0011_uids'")
    db.commit()
    db.close()
    image = old.read_bytes()
    fleet = tmp_path / "fleet.db"
    (first,) = merge_logs([old], fleet)
    assert first.exchanges == 3
    assert old.read_bytes() == image  # not upgraded in place
    (second,) = merge_logs([old], fleet)
    assert not second.added  # its copies' uids are the same each time
    untouched = sqlite_utils.Database(sqlite3.connect(f"{old.resolve().as_uri()}?mode=ro", uri=True))
    assert "0011_uids" not in {m.name for m in migrations.applied(untouched)}


def test_what_cannot_be_merged_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    a, fleet = write_log(tmp_path / "a.db", "a"), tmp_path / "fleet.db"
    merge_logs([a], fleet)
    held = counts(fleet)
    with pytest.raises(LogError, match="cannot be merged into itself"):
        merge_logs([a, fleet], fleet)
    (tmp_path / "not.db").write_bytes(b"not a database at all, not even close" * 200)
    with pytest.raises(LogError, match=r"not\.db"):
        merge_logs([a, tmp_path / "not.db"], fleet)
    with pytest.raises(LogError, match="no such log"):
        merge_logs([tmp_path / "missing.db"], fleet)
    assert counts(fleet) == held
    with LogWriter(fleet), pytest.raises(LogBusy):
        merge_logs([a], fleet)


def big_log(path: Path) -> Path:
    """A log of one exchange whose body takes a few MiB (random bytes, which take as much room)."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record", upstream="http://big")
        ex = w.begin_exchange(cap, method="GET", path="/big", started_ns=time.time_ns())
        binary = {"content-type": "application/octet-stream"}
        w.response_head(ex, status=200, headers=binary, is_sse=False, ttfb_ns=MS)
        for n in range(1, 41):
            w.chunk(ex, n * MS, os.urandom(64 * 1024))
        w.end_exchange(ex, duration_ns=50 * MS)
        w.end_capture(cap)
    return path


def test_a_merge_that_fills_the_disk_says_so_and_leaves_the_output_as_it_was(tmp_path: Path) -> None:
    """The disk full (here a file size limit, as `ulimit -f` sets: writes past it fail), the
    COMMIT failed and SQLite rolled the merge back itself; the merge's own ROLLBACK then
    failed too, and the command ended in a traceback ("cannot rollback - no transaction is
    active"). A failure, not bad input: exit 1."""
    source, fleet = big_log(tmp_path / "big.db"), write_log(tmp_path / "fleet.db", "a")
    held, new = counts(fleet), tmp_path / "new.db"
    limit = fleet.stat().st_size + 512 * 1024
    # (Python ignores SIGXFSZ: a write past the limit fails, with EFBIG.)
    limited = "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2); "
    limited += "os.execv(sys.executable, [sys.executable, '-m', 'tasktape', *sys.argv[2:]])"
    for output in (fleet, new):
        done = subprocess.run(
            [sys.executable, "-c", limited, str(limit), "merge", str(source), "-o", str(output)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        said = f"Error: cannot write {re.escape(str(output))}: [^\n]+\n"
        assert done.returncode == 1 and re.fullmatch(said, done.stderr), done.stderr
    assert counts(fleet) == held and not new.exists()
    # A limit so low the new output's schema does not fit: as full a disk (it said "cannot
    # open ... as an event log", exit 2, as if the output were no log).
    done = subprocess.run(
        [sys.executable, "-c", limited, str(64 * 1024), "merge", str(source), "-o", str(new)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stderr.startswith(f"Error: cannot write {new}: "), done.stderr
    assert not new.exists()


def test_merge_knows_every_table_a_log_holds_rows_in(tmp_path: Path) -> None:
    db = open_db(tmp_path / "log.db")
    tables = {t for t in db.table_names() if not t.startswith(("events_fts", "_sqlite"))}
    assert tables == {*MERGED_TABLES, *LOCAL_TABLES}


def test_the_command_says_what_each_log_added(tmp_path: Path) -> None:
    a, b = write_log(tmp_path / "a.db", "a"), write_log(tmp_path / "b.db", "b")
    fleet = tmp_path / "fleet.db"
    runner = CliRunner()
    result = runner.invoke(main, ["merge", str(a), str(b), "-o", str(fleet)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    added = "added 1 capture, 3 exchanges, 11 chunks, 11 events, 2 findings, 1 resume"
    assert lines == [f"tasktape merge: {a}: {added}", f"tasktape merge: {b}: {added}"]
    result = runner.invoke(main, ["merge", str(a), "-o", str(fleet)])
    assert result.output == f"tasktape merge: {a}: nothing new\n"
    result = runner.invoke(main, ["merge", str(fleet), "-o", str(fleet)])
    assert result.exit_code == 2 and "cannot be merged into itself" in result.output


async def test_a_merged_fleet_replays_each_recorders_stream_byte_for_byte(
    record: RecordFactory, serve: Serve, tmp_path: Path
) -> None:
    # Two recorders, each in front of its own agent, answering different questions.
    db_a, (result_a,) = await recorded_demo(record, serve, ("What does J45.909 mean?", "rest"), pace=0.02)
    db_b, (result_b,) = await recorded_demo(record, serve, ("What input do you need?", "jsonrpc"), pace=0.02)
    fleet = tmp_path / "fleet.db"
    merge_logs([db_a, db_b], fleet)
    url = await serve(ReplayServer(load([fleet]), speed=0).app)
    body, _, status_code = await timed_post(f"{url}/message:stream", message("What does J45.909 mean?"))
    assert status_code == 200 and body == result_a.raw
    assert stream_exchange(fleet, result_b.task_id).body == result_b.raw
    with EventLog(fleet) as log:
        tasks = {r["task_id"] for r in log.db.query("SELECT task_id FROM task_summary")}
    assert tasks == {result_a.task_id, result_b.task_id}


def test_the_command_points_files_of_another_kind_to_import(tmp_path: Path) -> None:
    a, fleet = write_log(tmp_path / "a.db", "a"), tmp_path / "fleet.db"
    cassette, empty = tmp_path / "c.jsonl", tmp_path / "empty.db"
    cassette.write_text('{"tasktape_cassette": 1}\n')
    left_empty(empty)
    runner = CliRunner()
    result = runner.invoke(main, ["merge", str(a), str(cassette), "-o", str(fleet)])
    assert result.exit_code == 2 and f"tasktape import {cassette} --db {fleet}" in result.output
    result = runner.invoke(main, ["merge", str(empty), "-o", str(fleet)])
    assert result.exit_code == 2 and "is empty" in result.output
    result = runner.invoke(main, ["merge", str(a), "-o", str(cassette)])
    assert result.exit_code == 2 and "is a cassette: merge writes an event log" in result.output
    assert not fleet.exists() and cassette.read_text() == '{"tasktape_cassette": 1}\n'


def test_an_earlier_copy_merged_after_a_later_one_sets_nothing_back(tmp_path: Path) -> None:
    """Copies of a log being recorded, merged newest first: the older one, which holds the
    exchange begun but not yet answered, wiped its status, headers and time to first byte,
    keeping the event it had no place for, and was said to have continued it."""
    path, early, late, fleet = (tmp_path / name for name in ("live.db", "early.db", "late.db", "fleet.db"))
    chunks = sse(completed_run("task.live", "ctx.live"), ids="e")
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.flush()
        copy_log(path, early)
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.chunk(ex, MS, chunks[0])
        w.flush()
        copy_log(path, late)
        w.end_exchange(ex, duration_ns=20 * MS).result()
    merge_logs([late], fleet)
    held = rows_by_uid(fleet)
    (report,) = merge_logs([early], fleet)
    assert report.describe() == f"{early}: nothing new"
    assert rows_by_uid(fleet) == held
    with EventLog(fleet) as log:
        (x,) = log.exchanges()
        assert (x["status"], x["ttfb_ns"], x["outcome"]) == (200, MS, None)
        assert x["response_headers"] and log.body(x["id"]) == chunks[0]


def test_a_capture_ended_since_is_said_to_be(tmp_path: Path) -> None:
    """Merged again after its recorder stopped, a log brought the end of its capture, and
    the command said "nothing new"."""
    path, fleet = tmp_path / "live.db", tmp_path / "fleet.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record")
        w.flush()
        merge_logs([path], fleet)
        w.end_capture(cap)
    result = CliRunner().invoke(main, ["merge", str(path), "-o", str(fleet)])
    assert result.exit_code == 0, result.output
    assert result.output == f"tasktape merge: {path}: added 1 capture ended\n"
    with EventLog(fleet) as log:
        assert log.captures()[0]["ended_at"] is not None


def test_a_text_file_as_the_output_is_named_for_what_it_is(tmp_path: Path) -> None:
    """Text that is no cassette was called one."""
    a, notes = write_log(tmp_path / "a.db", "a"), tmp_path / "notes.txt"
    notes.write_text("hello\n")
    result = CliRunner().invoke(main, ["merge", str(a), "-o", str(notes)])
    assert result.exit_code == 2
    assert f"{notes} is a file that is neither an event log nor a cassette: merge writes" in result.output
    assert notes.read_text() == "hello\n"


@pytest.mark.parametrize("one", ["a.db", Path("a.db")])
def test_one_path_where_a_list_is_meant_is_refused_saying_so(tmp_path: Path, one: str | Path) -> None:
    """A string's letters were taken for logs ("a: no such log")."""
    with pytest.raises(UsageError, match=r"not one string: write \['a\.db'\]"):
        merge_logs(one, tmp_path / "fleet.db")  # type: ignore[arg-type]
    assert not (tmp_path / "fleet.db").exists()


def a2a_stream(
    started_at: str, message: dict[str, Any], frames: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A streamed A2A exchange as a cassette holds it, begun at ``started_at``."""
    body = json.dumps({"message": {"role": "ROLE_USER", **message}})
    request = {"method": "POST", "path": "/message:stream", "headers": [["A2A-Version", "1.0"]], "body": body}
    head = {"status": 200, "headers": [["Content-Type", "text/event-stream"]]}
    lines: list[dict[str, Any]] = [
        {"exchange": {"request": request, "response": head, "started_at": started_at}}
    ]
    lines += [{"chunk": {"offset_ms": 10 * n, "text": e.decode()}} for n, e in enumerate(sse(frames), 1)]
    lines.append({"end": {"duration_ms": 10 * len(frames) + 5}})
    return lines


def follow_up_session(ids: str) -> list[list[dict[str, Any]]]:
    """A task's first message, then its follow-up 5 s later; the agent's ids made up of ``ids``."""
    t, c = f"task.{ids}", f"ctx.{ids}"
    first = [task(t, c, "TASK_STATE_SUBMITTED"), status(t, c, "TASK_STATE_INPUT_REQUIRED")]
    more = [status(t, c, "TASK_STATE_WORKING"), status(t, c, "TASK_STATE_COMPLETED")]
    return [
        a2a_stream("2026-12-01T10:00:00Z", {"messageId": "m1", "parts": [{"text": "hi"}]}, first),
        a2a_stream(
            "2026-12-01T10:00:05Z", {"messageId": "m2", "taskId": t, "parts": [{"text": "more"}]}, more
        ),
    ]


def written(path: Path, *exchanges: list[dict[str, Any]]) -> Path:
    lines = [{"tasktape_cassette": 2}, *(line for exchange in exchanges for line in exchange)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_merged_log_diffs_in_the_order_its_exchanges_started(tmp_path: Path) -> None:
    """Two recorders caught parts of one session, one the task's first message, the other
    its follow-up: merged follow-up first, the log numbers the follow-up first. It still
    pairs with its own in another run of the session, read with that run's task id once
    the message it follows has paired, whichever side of the diff the log is."""
    first, more = follow_up_session("0192f4c8-aa01")
    runner = CliRunner()
    for name, exchange in (("more", more), ("first", first)):
        cassette = written(tmp_path / f"{name}.jsonl", exchange)
        imported = runner.invoke(main, ["import", str(cassette), "--db", str(tmp_path / f"{name}.db")])
        assert imported.exit_code == 0, imported.output
    fleet = tmp_path / "fleet.db"
    merged = runner.invoke(
        main, ["merge", str(tmp_path / "more.db"), str(tmp_path / "first.db"), "-o", str(fleet)]
    )
    assert merged.exit_code == 0, merged.output
    again = written(tmp_path / "again.jsonl", *follow_up_session("7c41d2e9-bb02"))
    for a, b in ((fleet, again), (again, fleet)):
        result = runner.invoke(main, ["diff", str(a), str(b)])
        assert (result.exit_code, result.output) == (0, "2 pairs, 0 differ, 0 only in A, 0 only in B\n")


def test_a_copy_imported_from_a_mid_recording_export_is_continued_by_the_finished_log(
    tmp_path: Path,
) -> None:
    """Exported mid-way, the stream is log_closed with no duration: merging the finished
    log into its import added the chunks but left it closed, with no end."""
    path, cassette, copy = tmp_path / "live.db", tmp_path / "mid.jsonl", tmp_path / "copy.db"
    chunks = LIVE_CHUNKS

    def export() -> None:
        assert CliRunner().invoke(main, ["export", str(path), "-o", str(cassette)]).exit_code == 0

    recorded_in_halves(path, export)
    assert CliRunner().invoke(main, ["import", str(cassette), "--db", str(copy)]).exit_code == 0
    (report,) = merge_logs([path], copy)
    assert (report.exchanges, report.continued) == (0, 1)
    with EventLog(copy) as log:
        (x,) = log.exchanges()
        assert (x["outcome"], x["duration_ns"], x["error"]) == ("complete", 20 * MS, None)
        assert log.body(x["id"]) == b"".join(chunks)
    assert not merge_logs([path], copy)[0].added


def test_an_exchange_of_the_same_uid_whose_rows_differ_is_kept_as_the_output_holds_it(tmp_path: Path) -> None:
    """A cassette with a chunk deleted by hand, imported, keeps the exchange's uid: merging
    the log it was exported from appended the source's last chunk again (a second COMPLETED
    event, findings neither log had), and said nothing of it."""
    path, cassette, copy = tmp_path / "live.db", tmp_path / "edited.jsonl", tmp_path / "copy.db"
    recorded_in_halves(path, lambda: None)
    runner = CliRunner()
    assert runner.invoke(main, ["export", str(path), "--no-cards", "-o", str(cassette)]).exit_code == 0
    lines = cassette.read_text().splitlines(keepends=True)
    second = [n for n, line in enumerate(lines) if line.startswith('{"chunk"')][1]  # WORKING
    cassette.write_text("".join(lines[:second] + lines[second + 1 :]))
    assert runner.invoke(main, ["import", str(cassette), "--db", str(copy)]).exit_code == 0
    held = {t: rows for t, rows in rows_by_uid(copy).items() if t != "captures"}
    result = runner.invoke(main, ["merge", str(path), "-o", str(copy)])
    assert result.exit_code == 0, result.output
    assert result.output == (
        f"tasktape merge: {path}: added 1 capture;"  # (the recording's: the import made its own)
        f" uid conflict: exchange 1 kept as {copy} holds it; {path} exchange 1 differs\n"
    )
    assert {t: rows for t, rows in rows_by_uid(copy).items() if t != "captures"} == held
    with EventLog(copy) as log:
        (x,) = log.exchanges()
        assert log.body(x["id"]) == b"".join(LIVE_CHUNKS[:1] + LIVE_CHUNKS[2:])
    (again,) = merge_logs([path], copy)
    assert (again.added, again.conflicts) == (False, [(1, 1)])


def test_a_copy_imported_redacted_keeps_its_request_redacted_when_continued(tmp_path: Path) -> None:
    """Continuing an import's exchange took every column from the source: the values the
    import had redacted came back in clear."""
    path, cassette, copy = tmp_path / "live.db", tmp_path / "mid.jsonl", tmp_path / "copy.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(
            cap,
            method="POST",
            path="/message:stream",
            request_headers=[("Content-Type", "application/json"), ("X-Team-Token", "tok-123")],
            request_body=b'{"secret": "s3cr3t", "q": "hi"}',
            started_ns=time.time_ns(),
        )
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.chunk(ex, MS, b"id: 1\ndata: {}\n\n")
        w.flush()
        assert CliRunner().invoke(main, ["export", str(path), "-o", str(cassette)]).exit_code == 0
        w.chunk(ex, 2 * MS, b"id: 2\ndata: {}\n\n")
        w.end_exchange(ex, duration_ns=3 * MS).result()
    redacting = ["--redact-json", "/secret", "--redact-header", "X-Team-Token"]
    assert CliRunner().invoke(main, ["import", str(cassette), "--db", str(copy), *redacting]).exit_code == 0
    (report,) = merge_logs([path], copy)
    assert report.continued == 1
    with EventLog(copy) as log:
        (x,) = log.exchanges()
    assert x["outcome"] == "complete"
    assert ["X-Team-Token", "[REDACTED]"] in json.loads(x["request_headers"])
    assert json.loads(x["request_body"]) == {"secret": "[REDACTED]", "q": "hi"}


def test_a_finding_naming_another_exchange_names_it_as_the_output_numbers_it(tmp_path: Path) -> None:
    """A copied finding's exchange_id was the output's, but its message named the exchange
    it points to by the source's id ("COMPLETED (in exchange 1 event 2) -> SUBMITTED"):
    in the output, another recorder's exchange."""
    t, c = "task.0192f4c8-cc03", "ctx.0192f4c8-cc03"
    run = [task(t, c, "TASK_STATE_SUBMITTED")]
    run += [status(t, c, "TASK_STATE_WORKING"), status(t, c, "TASK_STATE_COMPLETED")]
    said = {"messageId": "m1", "parts": [{"text": "hi"}]}
    again = a2a_stream("2026-12-01T10:00:05Z", {**said, "messageId": "m2"}, run)
    cassette = written(tmp_path / "twice.jsonl", a2a_stream("2026-12-01T10:00:00Z", said, run), again)
    source, fleet = tmp_path / "twice.db", write_log(tmp_path / "fleet.db", "a")
    imported = CliRunner().invoke(main, ["import", str(cassette), "--db", str(source)])
    assert imported.exit_code == 0, imported.output
    with EventLog(source) as log:
        assert save_findings(source, report_log(log).findings) == 1
    ((_, before),) = _findings(source, 1)
    assert before.startswith("COMPLETED (in exchange 1 event 2) -> SUBMITTED")
    (report,) = merge_logs([source], fleet)
    assert report.findings == 1
    with EventLog(fleet) as log:
        first, second = (x["id"] for x in log.exchanges() if x["uid"] in _uids(source))
        # As a check of the output says it.
        (found,) = (f for f in report_log(log).findings if f.exchange_id == second)
    renamed = before.replace("exchange 1 ", f"exchange {first} ")
    assert first != 1 and _findings(fleet, first) == [(second, renamed)] == [(second, found.message)]


def _findings(path: Path, first: int) -> list[tuple[int, str]]:
    """The exchange and message of each finding about exchange ``first`` and after."""
    db = sqlite3.connect(path)
    found = db.execute("SELECT exchange_id, message FROM findings WHERE exchange_id >= ?", [first]).fetchall()
    db.close()
    return found


def _uids(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    found = {uid for (uid,) in db.execute("SELECT uid FROM exchanges")}
    db.close()
    return found


def test_an_output_under_a_file_is_said_to_be(tmp_path: Path) -> None:
    """A file where the output's folder was meant was said to be a folder that does not exist."""
    a, notes = write_log(tmp_path / "a.db", "a"), tmp_path / "notes.txt"
    notes.write_text("hello\n")
    for output in (notes / "m.db", notes / "sub" / "m.db"):
        with pytest.raises(LogError) as refused:
            merge_logs([a], output)
        assert str(refused.value) == f"cannot write {output}: {notes} is a file, not a folder"
    with pytest.raises(LogError, match=r"its folder \S+missing does not exist"):
        merge_logs([a], tmp_path / "missing" / "m.db")
    assert notes.read_text() == "hello\n"
