"""What the command line takes as input, and what it says of what it does not take: the
sources of check, diff, replay, export, import, merge, upgrade and inspect, as a user
gives them (files, folders, pipes, other programs' databases), and the exit statuses
they end with."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import sqlite_utils
from a2a_frames import sse, task
from click.testing import CliRunner, Result
from log_rows import left_empty

from tasktape.cli import main
from tasktape.eventlog import LogWriter
from tasktape.eventlog.schema import SCHEMA_VERSION, migrations
from tasktape.eventlog.writer_lock import release_writer_lock, take_writer_lock

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMPLETED = ROOT / "cassettes" / "completed.jsonl"


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [*map(str, args)])


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db)) as conn, conn:
        return conn.execute(sql).fetchall()


def doc_file(page: str, title: str) -> str:
    """A file a docs page shows (a fenced block with that title)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found = re.search(rf'```\w+ title="{re.escape(title)}"\n(.*?)^```', text, re.S | re.M)
    assert found, title
    return found.group(1)


@pytest.fixture
def broken_log(tmp_path: Path) -> Path:
    """The rule-breaking cassette docs/check.md shows, imported into a log."""
    cassette = tmp_path / "broken.jsonl"
    cassette.write_text(doc_file("check.md", "broken.jsonl"), encoding="utf-8")
    db = tmp_path / "b.db"
    assert run("import", cassette, "--db", db).exit_code == 0
    return db


def test_checking_one_protocol_keeps_the_findings_of_the_others(broken_log: Path) -> None:
    """A check of MCP alone replaces MCP's findings, not the A2A ones saved before."""
    first = run("check", broken_log)
    assert first.exit_code == 1, first.output
    a2a = query(broken_log, "SELECT rule, exchange_id, seq, message FROM findings ORDER BY id")
    assert len(a2a) == 9
    mcp = run("check", "--protocol", "mcp", broken_log)
    assert mcp.exit_code == 0, mcp.output
    assert f"Saved 0 findings into {broken_log}" in mcp.output
    assert query(broken_log, "SELECT rule, exchange_id, seq, message FROM findings ORDER BY id") == a2a
    # A check of A2A again replaces them (not adds to them).
    assert run("check", "--protocol", "a2a", broken_log).exit_code == 1
    assert query(broken_log, "SELECT rule, exchange_id, seq, message FROM findings ORDER BY id") == a2a


def test_a_stream_under_way_is_checked_as_cut_short_as_its_export_is(tmp_path: Path) -> None:
    """A stream its recorder is still writing has not broken the rule of how streams end:
    the check of the log says so as the check of its export does."""
    log, cassette = tmp_path / "live.db", tmp_path / "live.jsonl"
    writer = LogWriter(log)
    try:
        capture = writer.begin_capture(source="record", upstream="http://127.0.0.1:9")
        exchange = writer.begin_exchange(capture, method="POST", path="/message:stream")
        head = [("Content-Type", "text/event-stream")]
        writer.response_head(exchange, status=200, headers=head, is_sse=True, ttfb_ns=1_000_000)
        (event,) = sse([task("task.1", "ctx.1", "TASK_STATE_SUBMITTED")], ids="")
        writer.chunk(exchange, 2_000_000, event)
        writer.flush()
        checked = run("check", log)
        assert run("export", log, "-o", cassette).exit_code == 0
    finally:
        writer.close()
    assert checked.exit_code == 0, checked.output
    assert "stream-end" not in checked.output
    assert (
        "cut-short: broke off after 1 complete events, the task last SUBMITTED (log_closed: "
        in checked.output
    )
    assert "Checked 1 stream (1 exchange in all) of 1 task from 1 source: no rule broken." in checked.output
    assert "Saved 0 findings" in checked.output
    exported = run("check", "--no-save", cassette)
    assert exported.exit_code == 0, exported.output
    assert "no rule broken" in exported.output


def empty_sqlite(path: Path) -> Path:
    """Another program's SQLite database that holds no table (yet)."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("DROP TABLE t")
        conn.commit()
    return path


def test_check_never_makes_a_log_of_another_database(tmp_path: Path) -> None:
    """Saving findings writes into a log; a database that is none is refused, unchanged."""
    app = empty_sqlite(tmp_path / "app.db")
    before = app.read_bytes()
    result = run("check", app)
    assert result.exit_code == 2, result.output
    assert "app.db is an empty SQLite database, not a tasktape event log" in result.output
    assert "Saved" not in result.output
    assert app.read_bytes() == before
    assert query(app, "SELECT name FROM sqlite_master") == []


def tasktape(
    *args: str | Path, stdin: bytes, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The command as a shell runs it, its standard input a pipe."""
    command = [sys.executable, "-m", "tasktape", *map(str, args)]
    done = subprocess.run(command, input=stdin, capture_output=True, cwd=cwd, timeout=timeout, check=False)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.mark.parametrize(
    "args",
    [
        ("check", "--no-save", "/dev/stdin"),
        ("diff", "/dev/stdin", COMPLETED),
        ("import", "/dev/stdin", "--db", "piped.db"),
    ],
    ids=["check", "diff", "import"],
)
def test_a_cassette_through_a_pipe_is_read(tmp_path: Path, args: tuple[str | Path, ...]) -> None:
    """A pipe can be read once: its kind and its content are told from the same bytes."""
    done = tasktape(*args, stdin=COMPLETED.read_bytes(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not JSON" not in done.stderr


@pytest.fixture
def completed_log(tmp_path: Path) -> Path:
    db = tmp_path / "completed.db"
    assert run("import", COMPLETED, "--db", db).exit_code == 0
    return db


def test_an_export_piped_into_an_import_holds_every_exchange(tmp_path: Path, completed_log: Path) -> None:
    exported = tasktape("export", completed_log, "-o", "-", stdin=b"", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    done = tasktape("import", "/dev/stdin", "--db", "p.db", stdin=exported.stdout.encode(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tasktape import: 2 exchanges from /dev/stdin -> p.db" in done.stdout + done.stderr


def test_a_log_through_a_pipe_is_refused_saying_why(tmp_path: Path, completed_log: Path) -> None:
    """SQLite reads a log from a file: a log given as a stream is named as such."""
    done = tasktape("check", "--no-save", "/dev/stdin", stdin=completed_log.read_bytes(), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "/dev/stdin is an event log given as a stream: SQLite reads a log from a file; give its path" in (
        done.stderr
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--db", "kept.db"], "--db is for mode record-missing; mode replay has no use for it"),
        (
            ["--mode", "passthrough", "--upstream", "http://127.0.0.1:9", "--db", "kept.db"],
            "--db is for mode record-missing; mode passthrough has no use for it",
        ),
        (
            ["--upstream", "http://127.0.0.1:9"],
            "--upstream is for mode record-missing or passthrough; mode replay has no use for it",
        ),
        (  # (in mode replay, the redaction options say what miss reports hide)
            ["--mode", "passthrough", "--upstream", "http://127.0.0.1:9", "--redact-json", "/key"],
            "--redact-json is for mode replay or record-missing; mode passthrough has no use for it",
        ),
    ],
)
def test_replay_refuses_an_option_its_mode_would_leave_unused(
    tmp_path: Path, args: list[str], message: str
) -> None:
    """Traffic believed recorded into --db, or redacted, would be neither: a usage error
    (before anything listens: a replay that started would not end by itself)."""
    done = tasktape(
        "replay", COMPLETED, "--listen", "127.0.0.1:0", *args, stdin=b"", cwd=tmp_path, timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "kept.db").exists()


def not_taken(folder: Path) -> dict[str, Path]:
    """Files no command takes as a log: empty, text, another program's database."""
    empty, text = left_empty(folder / "empty.db"), folder / "text.txt"
    text.write_text("hello\n")
    other = folder / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE notes (text)")
        conn.commit()
    return {"empty": empty, "text": text, "other": other}


@pytest.mark.parametrize("what", ["empty", "text", "other"])
@pytest.mark.parametrize(
    "command",
    [
        ["check", "--no-save", "{}"],
        ["diff", "{}", str(COMPLETED)],
        ["export", "{}", "-o", "{dir}/out.jsonl"],
        ["inspect", "{}", "--port", "0"],
        ["import", "{}", "--db", "{dir}/into.db"],
        ["merge", "{}", "-o", "{dir}/merged.db"],
        ["upgrade", "{}"],
        ["upgrade", "--dry-run", "{}"],
    ],
    ids=lambda c: " ".join(c[:2]).replace(" {}", ""),
)
def test_a_file_the_command_does_not_take_is_a_usage_error_everywhere(
    tmp_path: Path, command: list[str], what: str
) -> None:
    """The same bad input ends the same way whatever the command: exit status 2."""
    source = not_taken(tmp_path)[what]
    result = run(*(arg.replace("{}", str(source)).replace("{dir}", str(tmp_path)) for arg in command))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "into.db").exists() and not (tmp_path / "merged.db").exists()


def older_log(path: Path) -> Path:
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before="0004_search_and_findings")
    db.close()
    return path


def test_upgrade_dry_run_tells_would_upgrade_from_cannot(tmp_path: Path, completed_log: Path) -> None:
    """CI can gate on it: 0 current, 1 would be upgraded, 2 no log it can upgrade."""
    old, (text, other) = older_log(tmp_path / "old.db"), (tmp_path / "t.txt", tmp_path / "o.db")
    text.write_text("hello\n")
    not_taken(tmp_path)["other"].rename(other)
    assert run("upgrade", "--dry-run", completed_log).exit_code == 0
    would = run("upgrade", "--dry-run", completed_log, old)
    assert would.exit_code == 1, would.output
    assert "schema version 3 would go to" in would.output
    for bad in (text, other):
        result = run("upgrade", "--dry-run", completed_log, old, bad)
        assert result.exit_code == 2, result.output


def test_upgrade_of_a_current_log_being_written_says_it_is_current(completed_log: Path) -> None:
    """A log at this version needs no lock to be left as it is."""
    with LogWriter(completed_log):
        result = run("upgrade", completed_log)
    assert result.exit_code == 0, result.output
    assert f"tasktape upgrade: {completed_log}: already at schema version {SCHEMA_VERSION}" in result.output
    assert "being written" not in result.output


def test_upgrade_of_an_older_log_being_written_fails_not_as_bad_input(tmp_path: Path) -> None:
    """Another writer holding it is a failure of the moment (1), not bad input (2)."""
    old = older_log(tmp_path / "old.db")
    fd = take_writer_lock(old)
    try:
        result = run("upgrade", old)
    finally:
        release_writer_lock(fd)
    assert result.exit_code == 1, result.output
    assert "is being written by another tasktape writer" in result.output


# A writer of tasktape 0.1.0 (schema versions 5 and 6), as far as its lock goes: an exclusive
# flock on <log>-lock (made if missing), held until its standard input closes.
_WRITER_OF_0_1_0 = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize(
    "args",
    [("upgrade", "{log}"), ("import", str(COMPLETED), "--db", "{log}"), ("merge", "{other}", "-o", "{log}")],
    ids=lambda args: args[0],
)
def test_a_log_a_writer_of_0_1_0_still_writes_is_left_alone(tmp_path: Path, args: tuple[str, ...]) -> None:
    """tasktape 0.1.0 locked ``<log>-lock``, not the log: while a recorder of that version
    holds it, the log is neither upgraded nor written, as under a writer of this version."""
    old, other = older_log(tmp_path / "old.db"), tmp_path / "other.db"
    assert run("import", COMPLETED, "--db", other).exit_code == 0
    command = [arg.format(log=old, other=other) for arg in args]
    with subprocess.Popen(
        [sys.executable, "-c", _WRITER_OF_0_1_0, f"{old}-lock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        assert writer.stdout is not None and writer.stdout.readline() == "locked\n"
        result = run(*command)
        writer.communicate("")  # (its input closed: it ends, and its lock with it)
    assert result.exit_code == 1, result.output
    assert f"{old} is being written by another tasktape writer (of tasktape 0.1.0" in result.output
    assert len(query(old, "SELECT name FROM _sqlite_migrations")) == 3  # not upgraded
    # Its writer gone (its lock file left behind, as a killed one leaves it), the log is taken.
    assert run(*command).exit_code == 0
    assert query(old, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


def test_a_writer_makes_no_lock_file_of_0_1_0(tmp_path: Path) -> None:
    """The ``<log>-lock`` file is looked at only where a writer of tasktape 0.1.0 left one."""
    old = older_log(tmp_path / "old.db")
    assert run("upgrade", old).exit_code == 0
    with LogWriter(old):
        pass
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("old.db-")) == []


def test_import_and_merge_say_what_they_did_on_standard_error(tmp_path: Path) -> None:
    """Standard output stays for data (as export -o - writes there): status lines go to
    standard error, for import and merge as for export."""
    runner = CliRunner()
    imported = runner.invoke(main, ["import", str(COMPLETED), "--db", str(tmp_path / "a.db")])
    assert imported.exit_code == 0, imported.output
    assert (imported.stdout, imported.stderr) == (
        "",
        f"tasktape import: 2 exchanges from {COMPLETED} -> {tmp_path / 'a.db'}\n",
    )
    merged = runner.invoke(main, ["merge", str(tmp_path / "a.db"), "-o", str(tmp_path / "m.db")])
    assert merged.exit_code == 0, merged.output
    assert merged.stdout == "" and merged.stderr.startswith(
        f"tasktape merge: {tmp_path / 'a.db'}: added 1 capture"
    )


def test_a_source_given_twice_is_checked_once(tmp_path: Path) -> None:
    """Its findings were reported twice, and counted twice."""
    cassette = tmp_path / "broken.jsonl"
    cassette.write_text(doc_file("check.md", "broken.jsonl"), encoding="utf-8")
    once = run("check", "--no-save", cassette)
    twice = run("check", "--no-save", cassette, tmp_path / "." / "broken.jsonl", tmp_path)
    assert (once.exit_code, twice.exit_code) == (1, 1)
    assert twice.output == once.output
    assert "from 1 source: 9 findings." in twice.output


def test_a_file_is_named_for_what_it_is_when_it_is_neither_a_log_nor_a_cassette(tmp_path: Path) -> None:
    """Any SQLite file was called an event log (and a merge that fails suggested), any
    text a cassette."""
    files = not_taken(tmp_path)
    other, text = files["other"], files["text"]
    imported = run("import", other, "--db", tmp_path / "i.db")
    assert imported.exit_code == 2, imported.output
    assert imported.output == (
        f"Error: {other} is an SQLite database that is not a tasktape event log, nor a cassette: "
        "there is nothing to import\n"
    )
    upgraded = run("upgrade", text)
    assert upgraded.exit_code == 2
    assert upgraded.output == (
        f"tasktape upgrade: {text} is a file that is neither an event log nor a cassette: no log to upgrade\n"
    )
    for source in (other, text):
        merged = run("merge", source, "-o", tmp_path / "m.db")
        assert merged.exit_code == 2
        assert "tasktape import" not in merged.output and "there is nothing to merge" in merged.output


@pytest.mark.parametrize("command", ["export", "merge"])
def test_writing_into_a_folder_that_is_a_file_says_so(
    tmp_path: Path, completed_log: Path, command: str
) -> None:
    """merge said "its folder notes.txt does not exist"."""
    text = not_taken(tmp_path)["text"]
    result = run(command, completed_log, "-o", text / "x.db")
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: cannot write {text / 'x.db'}: {text} is a file, not a folder\n"


@pytest.mark.parametrize("command", ["check", "diff", "replay"])
def test_the_help_says_a_folder_holds_cassettes(command: str) -> None:
    """A folder of logs is refused: the help says what a folder given holds."""
    said = " ".join(run(command, "--help").output.split())
    assert "folders of cassettes" in said and "folders of them" not in said


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
@pytest.mark.parametrize(
    "args",
    [
        ("check", "--no-save", COMPLETED),
        ("diff", COMPLETED, COMPLETED),
        ("export", "completed.db", "-o", "-"),
    ],
    ids=["check", "diff", "export"],
)
def test_a_standard_output_that_cannot_be_written_is_said_in_one_line(
    tmp_path: Path, completed_log: Path, args: tuple[str | Path, ...]
) -> None:
    """Output to a full disk (/dev/full) was a traceback."""
    command = [sys.executable, "-m", "tasktape", *map(str, args)]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            command, stdout=full, stderr=subprocess.PIPE, cwd=tmp_path, timeout=120, check=False
        )
    assert done.returncode == 1
    assert done.stderr.decode() == "Error: cannot write standard output: No space left on device\n"


def test_a_command_started_without_a_standard_output_says_nothing_of_it() -> None:
    """Started with standard output closed (``>&-``), where Python has no sys.stdout, a
    command that writes nothing there ended in a traceback (flushing it)."""
    command = [sys.executable, "-m", "tasktape", "--version"]
    done = subprocess.run(
        command, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, b"")


def test_export_to_a_standard_output_closed_says_it_wrote_nothing(completed_log: Path) -> None:
    """``export -o -`` started with standard output closed (``>&-``) ended in a traceback."""
    command = [sys.executable, "-m", "tasktape", "export", str(completed_log), "-o", "-"]
    done = subprocess.run(
        command, stderr=subprocess.PIPE, preexec_fn=lambda: os.close(1), timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (1, b"Error: cannot write standard output: it is closed\n")


def test_a_reader_that_stops_reading_ends_it_silently(tmp_path: Path, completed_log: Path) -> None:
    """A closed pipe (``| head``) is no error to report: status 1, nothing said."""
    command = [sys.executable, "-m", "tasktape", "export", completed_log, "-o", "-"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read()
    assert proc.returncode == 1 and err == b""


def test_merge_into_a_name_too_long_says_so(tmp_path: Path, completed_log: Path) -> None:
    """Path.is_file raised on a name the system refuses: a traceback."""
    output = tmp_path / ("m" * 260 + ".db")
    result = run("merge", completed_log, "-o", output)
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: cannot open {output} as an event log (File name too long)\n"


@pytest.mark.parametrize("command", ["import", "merge"])
def test_a_log_that_is_no_file_is_refused(tmp_path: Path, completed_log: Path, command: str) -> None:
    """A pipe or a device (/dev/null) as the log: SQLite wrote its journal beside it
    (/dev/null-journal), and the log was nowhere."""
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    args = (
        ("import", COMPLETED, "--db", fifo) if command == "import" else ("merge", completed_log, "-o", fifo)
    )
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert f"cannot open {fifo} as an event log: it is a device or a pipe, not a file" in result.output
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("fifo.db-")]


@pytest.fixture
def mixed(tmp_path: Path, completed_log: Path) -> Path:
    """A folder of a cassette and an event log named as no log usually is."""
    folder = tmp_path / "mix"
    folder.mkdir()
    (folder / "completed.jsonl").write_bytes(COMPLETED.read_bytes())
    (folder / "kept").write_bytes(completed_log.read_bytes())
    return folder


@pytest.mark.parametrize("args", [("check", "--no-save", "{}"), ("diff", "{}", "{}")], ids=["check", "diff"])
def test_a_log_in_a_folder_is_named_as_left_out(mixed: Path, args: tuple[str, ...]) -> None:
    """A folder is read for its cassettes: a log in it was skipped without a word."""
    result = CliRunner().invoke(main, [a.format(mixed) for a in args])
    assert result.exit_code == 0, result.output
    command = args[0]
    warning = (
        f"tasktape {command}: WARNING: {mixed / 'kept'} is an event log: a folder is read for its cassettes; "
        "give a log by its path\n"
    )
    assert warning in result.stderr


@pytest.mark.parametrize("command", ["check", "diff", "replay"])
def test_a_folder_of_logs_alone_names_them(mixed: Path, command: str) -> None:
    (mixed / "completed.jsonl").unlink()
    result = run(command, mixed, *([mixed] if command == "diff" else []))
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert (
        f"{mixed}: a folder without cassettes (*.jsonl, in it or its subfolders); it holds an event log "
        in said
    )
    assert f"({mixed / 'kept'}), not read: give a log by its path" in said


# Ctrl-C landing while click loads, from the console script's own first line.
_INTERRUPTED_AS_IT_LOADS = """
import os, signal, sys
class Interrupting:
    def find_spec(self, name, path, target=None):
        if name == "click":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Interrupting())
from tasktape.cli import run
run()
"""


def test_ctrl_c_while_the_command_line_loads_ends_it_without_a_traceback() -> None:
    """Any command interrupted in its first tenth of a second printed the traceback of the
    module it was loading; it ends as a program stopped by Ctrl-C does (SIGINT, status 130 in
    a shell), saying nothing."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AS_IT_LOADS, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (-signal.SIGINT, "", "")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, tasktape.cli; print(sys.excepthook is sys.__excepthook__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout == "True\n"  # (once loaded, a program that imports it keeps its own)


def test_bad_input_names_a_file_as_a_console_line(tmp_path: Path) -> None:
    """A file given that the command does not take was named as it is: a control character
    in its name (ESC, BEL: a terminal's title) reached the terminal."""
    named = tmp_path / "notes\x1b]0;x\x07.txt"
    named.write_text("not a log, not a cassette\n")
    result = run("merge", named, "-o", tmp_path / "fleet.db")
    assert result.exit_code == 2
    assert result.output == (
        f"Error: {tmp_path}/notes\\x1b]0;x\\x07.txt is a file that is neither an event log nor a cassette:"
        " there is nothing to merge\n"
    )
