"""An import stopped part-way (interrupted, killed) and run again: it finishes the capture
it left unfinished, and the log is as a clean import makes it; a file that held other
content then is not imported beside it unasked. Real `tasktape import` processes, stopped
while they write."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from a2a_frames import status, task
from log_rows import rows_in

from tasktape.eventlog import LogWriter

EXCHANGES = 6000
LOG_SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGINT": signal.SIGINT}


def cassette(path: Path, *, uids: bool, mark: str = "a") -> Path:
    """A cassette of ``EXCHANGES`` event streams (written in seconds), each with its start
    time, its uid when ``uids`` (as an export gives them), and ``mark`` in its events."""
    lines = [json.dumps({"tasktape_cassette": 2 if uids else 1, "created_at": "2026-11-30T11:00:00Z"})]
    for n in range(EXCHANGES):
        exchange: dict[str, Any] = {
            "request": {"method": "POST", "path": f"/stream/{n}"},
            "response": {"status": 200, "headers": [["Content-Type", "text/event-stream"]]},
            "started_at": f"2026-11-30T11:{n // 60 % 60:02d}:{n % 60:02d}.{n:06d}Z",
        }
        if uids:
            exchange["uid"] = str(uuid.UUID(int=n + 1))
        lines.append(json.dumps({"exchange": exchange}))
        for i in range(2):
            text = f"id: {i}\ndata: {json.dumps({'text': f'{mark} word {n} {i}'})}\n\n"
            lines.append(json.dumps({"chunk": {"offset_ms": i + 1, "text": text}}))
        lines.append(json.dumps({"end": {"duration_ms": 3, "outcome": "complete"}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tasktape", *args], check=False, capture_output=True, text=True, cwd=cwd
    )


def stopped_import(file: Path, db: Path, how: signal.Signals, *, cwd: Path | None = None) -> str:
    """``tasktape import file --db db`` stopped by ``how`` once a thousand exchanges are in
    the log, before it ends; what it said. With ``cwd``, run there, the file named from it."""
    named = str(file if cwd is None else file.relative_to(cwd))
    args = [sys.executable, "-m", "tasktape", "import", named, "--db", str(db)]
    # (SIGINT left as Python takes it: a child of a shell in the background may ignore it)
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True, restore_signals=True, cwd=cwd) as child:
        while rows_in(db, "exchanges") < 1000 and child.poll() is None:
            time.sleep(0.01)
        child.send_signal(how)
        said = child.stderr.read()
    assert child.returncode != 0, said  # stopped, not done
    return said


def unfinished(db: Path) -> tuple[int, str | None]:
    """How many exchanges a log holds, and when its one capture ended."""
    with contextlib.closing(sqlite3.connect(db)) as read:
        (ended,) = read.execute("SELECT ended_at FROM captures").fetchone()
        return read.execute("SELECT count(*) FROM exchanges").fetchone()[0], ended


def contents(db: Path) -> dict[str, list[tuple]]:
    """What a log holds, row for row, without what differs between two logs by nature (the
    time an import ended); its text index checked whole, and searched."""
    with contextlib.closing(sqlite3.connect(db)) as read:
        exchange_columns = [r[1] for r in read.execute("PRAGMA table_info(exchanges)")]
        event_columns = [r[1] for r in read.execute("PRAGMA table_info(events)")]
        read.execute("INSERT INTO events_fts (events_fts, rank) VALUES ('integrity-check', 1)")
        return {
            "captures": read.execute("SELECT id, uid, source, upstream, argv FROM captures").fetchall(),
            "exchanges": read.execute(
                f"SELECT {', '.join(exchange_columns)} FROM exchanges ORDER BY id"
            ).fetchall(),
            "chunks": read.execute("SELECT * FROM stored_chunks ORDER BY exchange_id, seq").fetchall(),
            "events": read.execute(
                f"SELECT rowid, {', '.join(event_columns)} FROM events ORDER BY exchange_id, seq"
            ).fetchall(),
            "found": read.execute(
                "SELECT rowid FROM events_fts WHERE events_fts MATCH 'word' ORDER BY rowid"
            ).fetchall(),
        }


@pytest.mark.parametrize(("how", "uids"), [("SIGKILL", False), ("SIGINT", False), ("SIGKILL", True)], ids=str)
def test_an_import_stopped_part_way_is_finished_by_running_it_again(
    tmp_path: Path, how: str, uids: bool
) -> None:
    """Stopped part-way, an import left its capture unfinished with part of the cassette,
    and run again it said the cassette was in the log already: the rest was missing for
    good. Run again, it finishes the capture: the log then holds what a clean import of the
    file makes, row for row, ids and uids alike."""
    file, db, clean = cassette(tmp_path / "big.jsonl", uids=uids), tmp_path / "log.db", tmp_path / "clean.db"
    stopped_import(file, db, LOG_SIGNALS[how])
    written, ended = unfinished(db)
    assert ended is None and 0 < written < EXCHANGES
    again = run("import", str(file), "--db", str(db))
    assert again.returncode == 0, again.stderr
    kept = again.stderr.split("was left unfinished (")[1].split(" of")[0]
    assert int(kept) in (written - 1, written)  # (the last one written again: it may be half)
    assert again.stderr == (
        f"tasktape import: {file}: capture 1 in {db} was left unfinished ({kept} of {EXCHANGES} exchanges):"
        " the rest added\n"
    )
    assert run("import", str(file), "--db", str(clean)).returncode == 0
    assert contents(db) == contents(clean)
    assert unfinished(db)[0] == EXCHANGES and unfinished(db)[1] is not None
    said = run("import", str(file), "--db", str(db)).stderr
    assert said == f"tasktape import: {file} is in {db} already (capture 1): nothing added\n"


def test_an_import_stopped_then_changed_is_not_imported_beside_it_unasked(tmp_path: Path) -> None:
    """Killed, then changed, a cassette was imported again whole beside the half capture of
    what it held before: twice the exchanges. It is refused, naming that capture, until
    --replace-unfinished replaces it with what the file holds now."""
    file, db, clean = cassette(tmp_path / "big.jsonl", uids=False), tmp_path / "log.db", tmp_path / "clean.db"
    stopped_import(file, db, signal.SIGKILL)
    written, _ = unfinished(db)
    cassette(file, uids=False, mark="b")
    refused = run("import", str(file), "--db", str(db))
    assert refused.returncode == 1
    assert refused.stderr == (
        f"Error: capture 1 in {db} ({written} exchanges) is an import of {file} left unfinished, when it"
        f" held other content than {file} holds now: nothing imported (--replace-unfinished replaces it"
        " with what the file holds now)\n"
    )
    assert unfinished(db) == (written, None)
    replaced = run("import", str(file), "--db", str(db), "--replace-unfinished")
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.stderr == f"tasktape import: {EXCHANGES} exchanges from {file} -> {db}\n"
    assert run("import", str(file), "--db", str(clean)).returncode == 0
    assert contents(db) == contents(clean)


def test_an_unfinished_import_is_not_taken_for_one_of_another_folders_file(tmp_path: Path) -> None:
    """A capture named its file as the import was given it (`big.jsonl`): a `big.jsonl` of
    other content in another folder, imported by that name from there, was refused as the
    file changed since (and --replace-unfinished took the other file's capture out). It is
    imported beside it, and the unfinished one is finished from its own folder."""
    first, second, db = tmp_path / "first", tmp_path / "second", tmp_path / "log.db"
    first.mkdir()
    second.mkdir()
    stopped_import(cassette(first / "big.jsonl", uids=False), db, signal.SIGKILL, cwd=first)
    written, _ = unfinished(db)
    cassette(second / "big.jsonl", uids=False, mark="b")
    other = run("import", "big.jsonl", "--db", str(db), cwd=second)
    assert other.returncode == 0, other.stderr
    assert other.stderr == f"tasktape import: {EXCHANGES} exchanges from big.jsonl -> {db}\n"
    finished = run("import", "big.jsonl", "--db", str(db), cwd=first)
    assert finished.returncode == 0, finished.stderr
    kept = int(finished.stderr.split("was left unfinished (")[1].split(" of")[0])
    assert kept in (written - 1, written), finished.stderr
    assert rows_in(db, "captures") == 2 and rows_in(db, "exchanges") == 2 * EXCHANGES


@pytest.mark.parametrize("argv", ["not json", '{"file": 1}', "[7]"])
def test_an_unfinished_capture_whose_argv_is_no_list_of_words_is_no_files(tmp_path: Path, argv: str) -> None:
    """An unfinished import capture whose argv another program wrote as something else than
    a list of words made every import into the log end in a traceback. It names no file:
    another cassette is imported beside it."""
    db = tmp_path / "log.db"
    assert run("import", str(cassette(tmp_path / "first.jsonl", uids=False)), "--db", str(db)).returncode == 0
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE captures SET ended_at = NULL, argv = ?", (argv,))
        conn.commit()
    other = cassette(tmp_path / "other.jsonl", uids=False, mark="b")
    said = run("import", str(other), "--db", str(db))
    assert said.returncode == 0, said.stderr
    assert said.stderr == f"tasktape import: {EXCHANGES} exchanges from {other} -> {db}\n"


def test_a_cassette_changed_as_it_is_written_leaves_nothing_of_it(tmp_path: Path) -> None:
    """A cassette changed in place as it was read again (its end, once its start was
    written) left a capture of what was read under the uid of what was checked, and the
    file run again was imported as a second copy beside it. What was written of it is
    taken out again: run again, it is imported once."""
    file, db = cassette(tmp_path / "big.jsonl", uids=False), tmp_path / "log.db"
    args = [sys.executable, "-m", "tasktape", "import", str(file), "--db", str(db)]
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True) as child:
        while rows_in(db, "exchanges") == 0 and child.poll() is None:
            time.sleep(0.01)
        with file.open("r+b") as changed:  # the last exchange's path, in place
            at = file.read_bytes().rindex(f"/stream/{EXCHANGES - 1}".encode())
            changed.seek(at)
            changed.write(b"/Stream")
        said = child.stderr.read()
    assert child.returncode == 1, said
    assert said == (
        f"Error: {file} changed after it was checked: not imported (what was written of it is taken"
        f" out of {db} again)\n"
    )
    assert rows_in(db, "captures") == 0 and rows_in(db, "exchanges") == 0
    again = run("import", str(file), "--db", str(db))
    assert again.stderr == f"tasktape import: {EXCHANGES} exchanges from {file} -> {db}\n"
    assert rows_in(db, "captures") == 1 and rows_in(db, "exchanges") == EXCHANGES


# A run of `tasktape` under a file size limit (as `ulimit -f` sets: a write past it fails,
# with EFBIG, for Python ignores SIGXFSZ): a disk that fills up.
LIMITED = (
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2); "
    "os.execv(sys.executable, [sys.executable, '-m', 'tasktape', *sys.argv[2:]])"
)


@pytest.mark.parametrize("uids", [False, True], ids=["derived uids", "uids"])
def test_an_import_that_fills_the_disk_is_finished_by_running_it_again(tmp_path: Path, uids: bool) -> None:
    """An import that filled the disk ended its capture all the same, said it imported the
    file, then that rows were lost "(Traffic is not affected)": run again with room, it said
    the file was in the log already, its exchanges held without their chunks or events. The
    capture is left unfinished, and run again the import finishes it: the log then holds
    what a clean import of the file makes, row for row."""
    file, db, clean = cassette(tmp_path / "big.jsonl", uids=uids), tmp_path / "log.db", tmp_path / "clean.db"
    limit = str(1024 * 1024)
    full = subprocess.run(
        [sys.executable, "-c", LIMITED, limit, "import", str(file), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert full.returncode == 1
    lost = rf"Error: \d+ rows could not be written to {re.escape(str(db))} \([^\n]+\): "
    lost += rf"{re.escape(str(file))} is in it in part, as capture 1, left unfinished; importing it again, "
    lost += "with room, finishes it\n"
    # The last line (a note that the newest rows are still in the -wal may come before it,
    # as the disk filled where the log folds them in).
    assert re.search(f"(^|\n){lost}$", full.stderr) and "Traffic" not in full.stderr, full.stderr
    written, ended = unfinished(db)
    assert ended is None and 0 < written < EXCHANGES
    again = run("import", str(file), "--db", str(db))
    assert again.returncode == 0, again.stderr
    assert re.fullmatch(
        rf"tasktape import: {re.escape(str(file))}: capture 1 in {re.escape(str(db))} was left unfinished"
        rf" \(\d+ of {EXCHANGES} exchanges\): the rest added\n",
        again.stderr,
    )
    assert run("import", str(file), "--db", str(clean)).returncode == 0
    assert contents(db) == contents(clean)


def a2a_cassette(path: Path, input_tokens: int) -> Path:
    """A cassette of one A2A stream whose closing statusUpdate's $usage counts
    ``input_tokens``."""
    usage = {"model": "m-1", "inputTokens": input_tokens, "outputTokens": 3}
    frames = [task("t1", "c1"), status("t1", "c1", "TASK_STATE_COMPLETED", usage)]
    exchange = {
        "request": {"method": "POST", "path": "/message:stream", "body": json.dumps({"message": {}})},
        "response": {"status": 200, "headers": [["Content-Type", "text/event-stream"]]},
        "started_at": "2026-11-30T11:00:00.000001Z",
    }
    lines = [json.dumps({"tasktape_cassette": 1}), json.dumps({"exchange": exchange})]
    for n, frame in enumerate(frames):
        lines.append(json.dumps({"chunk": {"offset_ms": n + 1, "text": f"data: {json.dumps(frame)}\n\n"}}))
    lines.append(json.dumps({"end": {"duration_ms": 3, "outcome": "complete"}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_token_count_past_64_bits_is_imported_as_none(tmp_path: Path) -> None:
    """A $usage count SQLite's INTEGER cannot hold once failed every import of the file
    (saying that importing it again, with room, would finish it): it is imported, the count
    none and the event's $usage as it was."""
    file, db = a2a_cassette(tmp_path / "big.jsonl", 10**30), tmp_path / "log.db"
    done = run("import", str(file), "--db", str(db))
    assert done.returncode == 0 and done.stderr == f"tasktape import: 1 exchange from {file} -> {db}\n"
    with contextlib.closing(sqlite3.connect(db)) as read:
        row = read.execute("SELECT outcome, model, input_tokens, output_tokens FROM exchanges").fetchone()
        (usage,) = read.execute("SELECT usage FROM events WHERE usage IS NOT NULL").fetchone()
    assert row == ("complete", "m-1", None, 3)
    assert json.loads(usage)["inputTokens"] == 10**30


def test_rows_sqlite_refuses_are_not_said_to_want_room(tmp_path: Path) -> None:
    """Rows lost for another reason than room (here a trigger of the log refuses them)
    stop the import as a full disk does, but room would not finish it: the import does not
    say it would."""
    file, db = cassette(tmp_path / "big.jsonl", uids=True), tmp_path / "log.db"
    with LogWriter(db):
        pass
    with contextlib.closing(sqlite3.connect(db)) as log:
        refuse = "SELECT RAISE(ABORT, 'refused')"
        log.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.seq > 0 BEGIN {refuse}; END")
    refused = run("import", str(file), "--db", str(db))
    assert refused.returncode == 1
    assert re.fullmatch(
        rf"Error: \d+ rows could not be written to {re.escape(str(db))} \([^\n]+\): "
        rf"{re.escape(str(file))} is in it in part, as capture 1, left unfinished\n",
        refused.stderr,
    ), refused.stderr
    assert "IntegrityError: refused" in refused.stderr
    with contextlib.closing(sqlite3.connect(db)) as read:  # (its row may be in a batch refused)
        assert read.execute("SELECT count(*) FROM captures WHERE ended_at IS NOT NULL").fetchone() == (0,)
