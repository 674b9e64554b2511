"""Collecting a fleet into ClickHouse (tasktape collect --clickhouse) and pulling slices
back (tasktape pull): the embedded engine through chDB, with the same clickhouse-connect
client code that talks to a server (TASKTAPE_CLICKHOUSE_URL names one to test against too)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fleet_runs import ship_once
from log_rows import shipped_rows, union, write_log
from nats_servers import NatsCluster

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
    result = _tasktape(
        "pull", "--clickhouse", url, "--task", "a", "--context", "b", "-o", str(tmp_path / "x.db")
    )
    assert result.returncode == 1 and "choose one slice" in result.stderr
    result = _tasktape("pull", "--clickhouse", "mysql://x", "--task", "a", "-o", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "is not a ClickHouse URL" in result.stderr
    result = _tasktape("pull", "--clickhouse", url, "--since", "yesterday", "-o", str(tmp_path / "x.db"))
    assert result.returncode == 1 and "is not an ISO 8601 time" in result.stderr
