"""`tasktape inspect` as a user runs it: a real process serving a real log, stopped by a signal;
and `tasktape demo --inspect`, which records a log and then serves it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
import sqlite_utils
from click.testing import CliRunner
from datasette.utils import tilde_decode
from inspector_log import Served, record_log, task_of
from log_rows import older_log

from tasktape.cli import main
from tasktape.demo import next_steps
from tasktape.eventlog import SCHEMA_VERSION, EventLog
from tasktape.eventlog.schema import KNOWN, migrations
from tasktape.eventlog.writer_lock import release_writer_lock, take_writer_lock


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_log(tmp_path_factory.mktemp("cli") / "session.db")


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served_process in started:  # those a failed test left running
        if served_process.process.poll() is None:
            served_process.stop(signal.SIGKILL)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_inspect_serves_the_log_and_stops_cleanly(log: Path, served: list[Served], sig: int) -> None:
    served.append(inspector := Served("inspect", str(log), "--port", "0"))
    url = inspector.wait_for_url()
    assert get(f"{url}/")[0] == 200
    status, html = get(f"{url}/session/task_summary")
    assert status == 200 and "Tasks" in html and "tt-pill" in html
    status, html = get(f"{url}/session/-/task/{task_of(log, 'completed')}")
    assert status == 200 and "What does J45.909 mean?" in html and 'class="tt-timeline"' in html
    assert get(f"{url}/session/-/task/task.unknown")[0] == 404
    assert get(f"{url}/-/dashboards/streams")[0] == 200
    assert get(f"{url}/session/mcp_sessions")[0] == 200 and get(f"{url}/session/llm_streams")[0] == 200
    code, out, err = inspector.stop(sig)
    assert code == 0, err
    assert f"tasks    {url}/session/task_summary" in out and f"charts   {url}/-/dashboards/streams" in out
    assert f"sessions {url}/session/mcp_sessions" in out and f"streams  {url}/session/llm_streams" in out
    assert "tasktape inspect: stopped" in err and "Traceback" not in err


def test_inspect_refuses_what_is_not_an_event_log(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, but long enough to look like a file header\n" * 20)
    other = tmp_path / "other.db"
    sqlite_utils.Database(other)["t"].insert({"a": 1})
    runner = CliRunner()
    result = runner.invoke(main, ["inspect", str(text)])
    assert result.exit_code == 2 and f"cannot open {text} as an event log" in result.output
    result = runner.invoke(main, ["inspect", str(other)])
    assert result.exit_code == 2 and "is an SQLite database but not a tasktape event log" in result.output
    result = runner.invoke(main, ["inspect", str(tmp_path / "missing.db")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_an_older_log_is_refused_with_how_to_upgrade_it(tmp_path: Path, served: list[Served]) -> None:
    old = older_log(tmp_path / "old.db")
    result = CliRunner().invoke(main, ["inspect", str(old)])
    assert result.exit_code == 2
    assert "older than this tasktape's" in result.output
    assert f"upgrade it in place with: tasktape upgrade {old}, or serve it upgraded:" in result.output
    assert f"tasktape inspect {old} --upgrade" in result.output
    served.append(inspector := Served("inspect", str(old), "--upgrade", "--port", "0"))
    url = inspector.wait_for_url()
    assert get(f"{url}/old/findings")[0] == 200
    code, _, err = inspector.stop()
    assert code == 0, err
    with sqlite3.connect(old) as conn:
        applied = [m.name for m in migrations.applied(sqlite_utils.Database(conn))]
        assert applied == KNOWN and len(applied) == SCHEMA_VERSION


def test_a_port_in_use_is_a_clear_error(log: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["inspect", str(log), "--port", str(port)])
    assert result.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in result.output


def test_the_demo_says_how_to_inspect_and_opens_the_inspector(tmp_path: Path, served: list[Served]) -> None:
    assert next_steps(Path("x.db"))[0].startswith("tasktape inspect x.db ")
    db = tmp_path / "demo.db"
    # The inspector's port may be taken (by another inspector): the demo then takes a free one.
    with socket.socket() as probe:
        busy = probe.connect_ex(("127.0.0.1", 7472)) == 0
    served.append(demo := Served("demo", "--db", str(db), "--pace", "0.1", "--inspect", cwd=tmp_path))
    url = demo.wait_for_url(timeout=120)
    assert busy or url == "http://127.0.0.1:7472"
    assert "All 12 scenarios recorded completely" in demo.out
    assert f"tasktape inspect {db}     # browse it" in demo.out
    with EventLog(db) as opened:
        task = opened.task_ids()[0]
    status, html = get(f"{url}/demo/-/task/{task}")
    assert status == 200 and task in html
    code, _, err = demo.stop()
    assert code == 0, err


def get_as(url: str, host: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_inspect_answers_only_loopback_host_names(log: Path, served: list[Served]) -> None:
    """A page re-pointing a name of its own at 127.0.0.1 (DNS rebinding) cannot read the log."""
    served.append(inspector := Served("inspect", str(log), "--port", "0", "--allow-host", "team.example"))
    url = inspector.wait_for_url()
    port = url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"team.example:{port}"):
        assert get_as(f"{url}/session/task_summary.json", host)[0] == 200, host
    status, body = get_as(f"{url}/session/task_summary.json", f"rebound.example:{port}")
    assert status == 421 and "--allow-host rebound.example" in body and "task." not in body
    assert inspector.stop(signal.SIGINT)[0] == 0


@pytest.mark.parametrize("name", ["r&d#1.db", "what?.db", "a%41 b.db"])
def test_a_log_whose_name_a_uri_reads_otherwise_is_served(
    log: Path, tmp_path: Path, served: list[Served], name: str
) -> None:
    """``#``, ``?`` and ``%`` in the log's name are the name's, not the URI's SQLite opens
    it by: the log itself is served, and no other file is made beside it."""
    named = Path(shutil.copy(log, tmp_path / name))
    served.append(inspector := Served("inspect", str(named), "--port", "0"))
    inspector.wait_for_url()
    (tasks,) = re.findall(r"^  tasks    (\S+)$", inspector.out, re.M)
    status, html = get(tasks)
    assert status == 200 and task_of(log, "completed") in html
    status, html = get(f"{tasks.rsplit('/', 1)[0]}/-/task/{task_of(log, 'completed')}")
    assert status == 200 and "What does J45.909 mean?" in html
    assert inspector.stop()[0] == 0
    assert {p.name for p in tmp_path.iterdir()} <= {name, f"{name}-wal", f"{name}-shm"}


HOSTILE = "x\"><img src=x onerror=document.body.setAttribute('data-pwned',1)>"


def test_a_log_whose_name_is_markup_is_served_under_a_safe_name(
    log: Path, tmp_path: Path, served: list[Served]
) -> None:
    """Datasette writes the served name unescaped into the href of a foreign key's link
    (events to exchanges): the file's name as it is would end the attribute and run its
    script. Its characters other than letters, digits, "_", "-", "." and space are served
    as "_", with a hash of the name; the startup line and the page title name the file."""
    named = Path(shutil.copy(log, tmp_path / f"{HOSTILE}.db"))
    served.append(inspector := Served("inspect", str(named), "--port", "0"))
    url = inspector.wait_for_url()
    assert inspector.out.startswith(f"tasktape inspect: {named} on {url}/")
    (queries,) = re.findall(r"^  queries  (\S+)$", inspector.out, re.M)
    served_as = tilde_decode(queries.rsplit("/", 1)[1])
    assert re.fullmatch(
        r"x___img src_x onerror_document.body.setAttribute__data-pwned__1___[0-9a-f]{8}", served_as
    )
    pages = {table: get(f"{queries}/{table}") for table in ("events", "exchanges")}
    assert all(status == 200 and "<img" not in html for status, html in pages.values())
    # (the foreign keys' links, as Datasette writes them)
    for table, linked in (("events", "exchanges"), ("exchanges", "captures")):
        assert re.search(rf'<a href="/{re.escape(served_as)}/{linked}/\d+">', pages[table][1]), table
    status, html = get(queries)
    assert status == 200 and "<h1>Event log x&#34;&gt;&lt;img src=x onerror=" in html
    assert inspector.stop()[0] == 0


def test_the_startup_line_names_the_log_as_a_console_line(
    log: Path, tmp_path: Path, served: list[Served]
) -> None:
    """The startup line printed the log's path as it is: a control character in its name
    (ESC, BEL: a terminal's title) reached the terminal."""
    named = Path(shutil.copy(log, tmp_path / "a\x1b]0;x\x07.db"))
    served.append(inspector := Served("inspect", str(named), "--port", "0"))
    url = inspector.wait_for_url()
    assert inspector.out.startswith(f"tasktape inspect: {tmp_path}/a\\x1b]0;x\\x07.db on {url}/")
    assert "\x1b" not in inspector.out
    assert inspector.stop()[0] == 0


def test_a_log_whose_path_is_not_utf8_is_refused_in_one_line(log: Path, tmp_path: Path) -> None:
    """A log whose name is no UTF-8 (byte 0xfe) was served, and every page of it answered
    500 (Datasette keeps a database's path as text, which UTF-8 cannot write). It is
    refused as bad input, in one line that names it escaped."""
    named = Path(shutil.copy(log, tmp_path / os.fsdecode(b"bad\xfe.db")))
    done = subprocess.run(
        [sys.executable, "-m", "tasktape", "inspect", "--port", "0", str(named)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"Error: cannot serve {tmp_path}/bad\\udcfe.db: its path is not UTF-8, which Datasette needs;"
        " rename it, or the folder it is in\n"
    )


def test_upgrade_while_another_writer_holds_the_log_is_refused(tmp_path: Path) -> None:
    """--upgrade upgrades as tasktape upgrade does, under the log's writer lock: a recorder
    still writing an older log is refused (exit 1), the log left as it was."""
    old = older_log(tmp_path / "old.db")
    fd = take_writer_lock(old)
    try:
        # (In a process of its own: a log it upgraded it would go on to serve.)
        done = subprocess.run(
            [sys.executable, "-m", "tasktape", "inspect", str(old), "--upgrade", "--port", "0"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        release_writer_lock(fd)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{old} is being written by another tasktape writer" in done.stderr
    with closing(sqlite3.connect(old)) as conn:
        assert [m.name for m in migrations.applied(sqlite_utils.Database(conn))] == KNOWN[:3]


def test_inspect_whose_output_is_closed_before_it_listens_says_where_and_serves_on(log: Path) -> None:
    """`tasktape inspect LOG | true`: its listening lines failed on the closed pipe and it
    exited 1, saying nothing, having served nothing. They go to standard error, saying why,
    and it serves on."""
    args = [sys.executable, "-m", "tasktape", "inspect", str(log), "--port", "0"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # (as `| true` does, before the inspector says anything)
        said = [proc.stderr.readline() for _ in range(7)]
        url = re.search(r"^tasktape inspect: \S+ on (http://\S+)/ \(Ctrl-C stops\)$", said[0])
        assert url, said
        assert get(f"{url[1]}/session/task_summary")[0] == 200
        proc.send_signal(signal.SIGINT)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert said[1] == f"  tasks    {url[1]}/session/task_summary\n"
    assert said[6] == (
        "tasktape inspect: standard output cannot be written (it was closed): nothing more is printed on it\n"
    )
    assert code == 0
