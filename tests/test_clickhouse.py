"""Collecting a fleet into ClickHouse (tasktape collect --clickhouse) and pulling slices
back (tasktape pull): the embedded engine through chDB, with the same clickhouse-connect
client code that talks to a server (TASKTAPE_CLICKHOUSE_URL names one to test against too)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_runs import ship_once
from log_rows import shipped_rows, union, write_log
from nats_servers import NatsCluster
from processes import stop

from tasktape.fleet.clickhouse_sink import ClickHouseSink

SERVER = os.environ.get("TASKTAPE_CLICKHOUSE_URL")  # http://HOST:8123, for the opt-in run


def _tasktape(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the tests read its status
        [sys.executable, "-m", "tasktape", *args], capture_output=True, text=True, timeout=120
    )


async def _collect(nats_url: str, clickhouse: str, *extra: str) -> str:
    """A collector process for a few seconds (about one insert a second), stopped with
    Ctrl-C; what it printed."""
    collector = subprocess.Popen(
        [sys.executable, "-m", "tasktape", "collect", "--from", nats_url, "--clickhouse", clickhouse, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        await asyncio.sleep(5.0)
        collector.send_signal(signal.SIGINT)
        out, _ = collector.communicate(timeout=60)
    finally:
        if collector.poll() is None:
            collector.kill()
            collector.wait()
    assert collector.returncode == 0, out
    return out


@pytest.fixture(params=["chdb", "server"])
def clickhouse(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "server":
        if not SERVER:
            pytest.skip("TASKTAPE_CLICKHOUSE_URL names no ClickHouse server to test against")
        database = f"tasktape_test_{os.getpid()}_{abs(hash(tmp_path)) % 10**6}"
        return f"{SERVER.rstrip('/')}/{database}"
    return f"chdb://{tmp_path / 'clickhouse'}"


async def test_a_fleet_collected_into_clickhouse_pulls_back_byte_for_byte(
    nats_node: NatsCluster, tmp_path: Path, clickhouse: str
) -> None:
    logs = [write_log(tmp_path / f"{name}.db", name) for name in ("a", "b")]
    for log in logs:
        await ship_once(log, nats_node.url)
    said = await _collect(nats_node.url, clickhouse)
    assert "stopped: 34 rows from 10 messages" in said, said
    # The same rows again (a second consumer gets them all): ClickHouse holds each once.
    said = await _collect(nats_node.url, clickhouse, "--consumer", "again")
    assert "stopped: 34 rows" in said, said
    whole = tmp_path / "whole.db"
    result = _tasktape(
        "pull", "--clickhouse", clickhouse, "--since", "2000-01-01T00:00:00Z", "-o", str(whole)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"tasktape pull: 34 rows (34 new) -> {whole}\n"
    assert shipped_rows(whole) == union(*map(shipped_rows, logs))
    again = _tasktape("pull", "--clickhouse", clickhouse, "--since", "2000-01-01", "-o", str(whole))
    assert again.stdout == f"tasktape pull: 34 rows (0 new) -> {whole}\n"
    # One task's slice: its exchanges, and the reconnect its stream's resume names.
    one = tmp_path / "task-a.db"
    assert _tasktape("pull", "--clickhouse", clickhouse, "--task", "task.a", "-o", str(one)).returncode == 0
    assert shipped_rows(one) == shipped_rows(logs[0])
    with ClickHouseSink(clickhouse) as sink:
        q, db = sink.client.query, sink.database
        tasks = q(f"SELECT task_id, final_state, events FROM {db}.task_summary ORDER BY task_id").result_rows
        assert tasks == [("task.a", "TASK_STATE_WORKING", 11), ("task.b", "TASK_STATE_WORKING", 11)]
        assert q(f"SELECT count() FROM {db}.exchanges FINAL").result_rows == [(6,)]
        body = q(
            f"SELECT data FROM {db}.chunks WHERE exchange_uid = (SELECT uid FROM {db}.exchanges FINAL"
            " WHERE task_id = 'task.b' AND is_sse = 1) ORDER BY seq",
            column_formats={"data": "bytes"},
        ).result_rows
    with sqlite3.connect(logs[1]) as log:
        (x,) = log.execute("SELECT id FROM exchanges WHERE task_id = 'task.b' AND is_sse = 1").fetchone()
        chunks = log.execute("SELECT data FROM chunks WHERE exchange_id = ? ORDER BY seq", (x,))
        recorded = b"".join(bytes(d) for (d,) in chunks)
    assert b"".join(d for (d,) in body) == recorded


def test_pull_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path / 'empty'}"
    result = _tasktape("pull", "--clickhouse", url, "--task", "nope", "-o", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "nothing in chdb://" in result.stderr
    result = _tasktape("pull", "--clickhouse", "mysql://x", "--task", "a", "-o", str(tmp_path / "x.db"))
    assert result.returncode == 2 and "is not a ClickHouse URL" in result.stderr


@pytest.mark.parametrize(
    ("slice_", "said"),
    [
        (
            ["--task", "a", "--context", "b"],
            "choose one slice: a task, a context, or a time range (since and/or until)",
        ),
        (["--since", "yesterday"], "'yesterday' is not an ISO 8601 time (2026-12-01T09:00:00Z)"),
        (
            ["--since", "2026-02-01", "--until", "2026-01-01"],
            "until (2026-01-01T00:00:00+00:00) is not after since (2026-02-01T00:00:00+00:00):"
            " the range holds no time",
        ),
    ],
)
def test_a_slice_that_cannot_be_meant_is_bad_input(tmp_path: Path, slice_: list[str], said: str) -> None:
    """Refused with exit 1, as a failure, where every other command says bad input with 2;
    an --until before --since pulled nothing, as if nothing had been recorded then."""
    url = f"chdb://{tmp_path / 'empty'}"
    result = _tasktape("pull", "--clickhouse", url, *slice_, "-o", str(tmp_path / "x.db"))
    assert (result.returncode, result.stderr) == (2, f"Error: {said}\n")
    assert not (tmp_path / "empty").exists() and not (tmp_path / "x.db").exists()


async def test_times_past_2262_slice_as_they_say(nats_node: NatsCluster, tmp_path: Path) -> None:
    """--since 9999-01-01 pulled everything and --until 3000-01-01 nothing: their
    nanoseconds overflowed Int64."""
    await ship_once(write_log(tmp_path / "a.db", "a"), nats_node.url)
    store = f"chdb://{tmp_path / 'clickhouse'}"
    collected = _tasktape("collect", "--from", nats_node.url, "--clickhouse", store, "--until-idle", "1")
    assert "stopped: 17 rows" in collected.stdout, collected.stderr
    future = _tasktape("pull", "--clickhouse", store, "--since", "9999-01-01", "-o", str(tmp_path / "f.db"))
    assert (future.returncode, future.stderr) == (1, f"Error: nothing in {store} matches the slice chosen\n")
    until = tmp_path / "until.db"
    pulled = _tasktape("pull", "--clickhouse", store, "--until", "3000-01-01", "-o", str(until))
    assert pulled.stdout == f"tasktape pull: 17 rows (17 new) -> {until}\n", pulled.stderr


def test_a_store_a_collector_holds_is_said_to_be_held(tmp_path: Path) -> None:
    """Pulling from (or collecting into) the chDB store of a running collector was chDB's
    traceback: 'Unable to open the chdb engine'."""
    store = f"chdb://{tmp_path / 'clickhouse'}"
    with socket.socket() as s:  # a broker nothing answers for: the collector waits, holding the store
        s.bind(("127.0.0.1", 0))
        broker = f"nats://127.0.0.1:{s.getsockname()[1]}"
    collector = subprocess.Popen(
        [sys.executable, "-m", "tasktape", "collect", "--from", broker, "--clickhouse", store],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert collector.stdout is not None
        assert collector.stdout.readline().startswith("tasktape collect: collecting TASKTAPE")  # (opened)
        held = (
            f"Error: the ClickHouse store {store} is open in another process (a running tasktape collect?):"
            " one process at a time can open it, stop that one first\n"
        )
        pulled = _tasktape("pull", "--clickhouse", store, "--task", "t", "-o", str(tmp_path / "t.db"))
        assert (pulled.returncode, pulled.stderr) == (1, held)
        again = _tasktape("collect", "--from", broker, "--clickhouse", store, "--until-idle", "1")
        assert (again.returncode, again.stderr) == (1, held)
    finally:
        stop(collector)


def test_what_clickhouse_refuses_is_one_line(tmp_path: Path) -> None:
    """A query ClickHouse would not run (here, on tables of that name made by something
    else) was clickhouse-connect's traceback."""
    path = tmp_path / "clickhouse"
    tables = ["captures", "exchanges", "stored_chunks", "events", "resumes"]
    script = (
        "import sys, clickhouse_connect as cc; c = cc.get_client(dsn=f'chdb://{sys.argv[1]}');"
        " c.command('CREATE DATABASE tasktape');"
        " [c.command(f'CREATE TABLE tasktape.{t} (x String) ENGINE = MergeTree ORDER BY x')"
        " for t in sys.argv[2:]]"
    )
    made = subprocess.run(
        [sys.executable, "-c", script, str(path), *tables],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    pulled = _tasktape("pull", "--clickhouse", f"chdb://{path}", "--task", "t", "-o", str(tmp_path / "t.db"))
    assert pulled.returncode == 1 and "Traceback" not in pulled.stderr, pulled.stderr
    assert pulled.stderr.startswith(f"Error: ClickHouse at chdb://{path} refused: Code: "), pulled.stderr
    assert len(pulled.stderr.splitlines()) == 1, pulled.stderr


# The command in an install without tasktape[clickhouse]: clickhouse-connect cannot be imported.
_WITHOUT_THE_EXTRA = """
import sys
sys.modules["clickhouse_connect"] = None
from tasktape.cli import run
run()
"""


@pytest.mark.parametrize("url", ["chdb://ch", "http://127.0.0.1:9"])
@pytest.mark.parametrize("command", ["collect", "pull"])
def test_without_the_clickhouse_extra_it_says_how_to_install(tmp_path: Path, command: str, url: str) -> None:
    """Without clickhouse-connect, collect and pull crashed with its ModuleNotFoundError's
    traceback."""
    args = {
        "collect": ["--from", "nats://127.0.0.1:9", "--clickhouse", url, "--until-idle", "1"],
        "pull": ["--clickhouse", url, "--task", "x", "-o", str(tmp_path / "p.db")],
    }[command]
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_THE_EXTRA, command, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (
        1,
        "Error: ClickHouse needs an extra: pip install 'tasktape[clickhouse]'\n",
    )
    assert not (tmp_path / "ch").exists() and not (tmp_path / "p.db").exists()


@pytest.mark.parametrize("command", ["collect", "pull"])
def test_a_database_name_that_is_no_plain_name_is_refused(tmp_path: Path, command: str) -> None:
    """A database named with a '-' (http://HOST:8123/team-a) went into SQL as it was: the
    server's syntax error, as a traceback."""
    url = "http://127.0.0.1:9/team-a"
    args = {
        "collect": ["--from", "nats://127.0.0.1:9", "--clickhouse", url],
        "pull": ["--clickhouse", url, "--task", "t1", "--output", str(tmp_path / "p.db")],
    }[command]
    done = _tasktape(command, *args)
    assert done.returncode == 2, done.stderr  # (bad input, told before anything is reached)
    assert done.stderr.endswith(
        f"Error: Invalid value for '--clickhouse': {url}: 'team-a' cannot name the database: tasktape's"
        " takes letters, digits and '_', not a digit first (as tasktape, team_a)\n"
    )
