"""`tasktape demo` end to end, as a user runs it: a real process, a real log."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import Serve

from tasktape.agent import create_agent_app
from tasktape.demo import Run, check, scenarios
from tasktape.eventlog import EventLog, LogWriter


def demo(*args: str, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``tasktape demo ARGS`` run to its end in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "tasktape", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def test_the_demo_records_every_scenario_completely(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    result = demo("--db", str(db), "--pace", "0.2", timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "All 12 scenarios recorded completely" in out and f"The log: {db}" in out
    assert re.search(
        r"Replayed the completed REST stream from the log \(\d+ chunks\): byte-identical; each event "
        r"within [\d.]+ ms \(median\)",
        out,
    ), out
    for name in (
        "completed",
        "input required, then resumed",
        "canceled mid-stream",
        "dropped connection",
        "long token stream",
        "completed, not streamed",
    ):
        assert any(
            line.startswith(name + " ") and line.rstrip().endswith("ok") for line in out.splitlines()
        ), name
    # Nothing is left behind but the log: no lock file, no WAL.
    assert [p.name for p in tmp_path.iterdir()] == ["demo.db"]
    with EventLog(db) as log:
        # Every scenario's task, the one answered without a stream too.
        assert log.db.execute("SELECT count(*) FROM task_summary").fetchone()[0] == 12
        states = {r["final_state"] for r in log.db.query("SELECT final_state FROM task_summary")}
        assert states >= {
            "TASK_STATE_COMPLETED",
            "TASK_STATE_FAILED",
            "TASK_STATE_REJECTED",
            "TASK_STATE_AUTH_REQUIRED",
            "TASK_STATE_CANCELED",
        }
        outcomes = [x["outcome"] for x in log.exchanges()]
        assert outcomes.count("upstream_disconnected") == 1 and set(outcomes) <= {
            "complete",
            "upstream_disconnected",
        }


def test_the_demo_refuses_to_overwrite_a_file_as_bad_input(tmp_path: Path) -> None:
    """An existing --db (a log, a cassette) is bad input, exit 2, as its help says: it was 1."""
    db = tmp_path / "demo.db"
    db.write_bytes(b"")
    result = demo("--db", str(db), timeout=60)
    assert result.returncode == 2 and "exists already" in result.stderr
    assert db.read_bytes() == b""


@pytest.mark.parametrize("after", [0.4, 0.7, 1.0])
def test_ctrl_c_while_the_demo_starts_stops_it_quietly(tmp_path: Path, after: float) -> None:
    """Ctrl-C, which a terminal sends to the whole process group, in the demo's first second:
    the log writer process printed a KeyboardInterrupt traceback (a Ctrl-C among its imports)
    or a BrokenPipeError one (its ready message to a recorder gone), and the demo said its
    log writer "failed to start", exit 2 (bad input)."""
    started = subprocess.Popen(
        [sys.executable, "-m", "tasktape", "demo", "--db", str(tmp_path / "demo.db"), "--pace", "0.3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        time.sleep(after)
        os.killpg(started.pid, signal.SIGINT)
        _, said = started.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started.pid, signal.SIGKILL)
        started.wait()
    assert started.returncode in (1, -signal.SIGINT), said  # ("Aborted!", or stopped while it loaded)
    assert "Traceback" not in said and "failed to start" not in said, said


def test_a_default_name_taken_in_the_same_second_gets_a_suffix(tmp_path: Path) -> None:
    """Two demos started in the same second: the second takes -2, not the first one's log.
    The names of the coming minute are taken in advance, so that it is so whenever it starts."""
    now = time.time()
    taken = {time.strftime("tasktape-demo-%Y%m%d-%H%M%S.db", time.localtime(now + s)) for s in range(60)}
    for name in taken:
        (tmp_path / name).write_bytes(b"")
    result = demo("--pace", "0", timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"the log goes to (tasktape-demo-\d{8}-\d{6})-2\.db\n", result.stdout)
    assert found and f"{found.group(1)}.db" in taken, result.stdout
    assert "All 12 scenarios recorded completely" in result.stdout
    assert {p.name for p in tmp_path.iterdir()} == taken | {f"{found.group(1)}-2.db"}
    assert all((tmp_path / name).stat().st_size == 0 for name in taken)


@pytest.mark.parametrize("pace", ["nan", "inf", "-1"])
def test_a_pace_that_never_ends_a_delay_is_refused(tmp_path: Path, pace: str) -> None:
    """A NaN or infinite pace would make the agent's every task sleep forever."""
    result = demo("--pace", pace, "--db", "demo.db", timeout=30, cwd=tmp_path)
    refused = "the pace is 0 (as fast as possible) or a finite number above it"
    assert result.returncode == 2 and f"Invalid value for '--pace': {refused}, not " in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_recording_that_does_not_match_is_reported(tmp_path: Path) -> None:
    """A streamed scenario whose client failed, no stream got, was also said to miss "the
    non-streamed answer": only the scenario answered without a stream has one."""
    sent = Run("completed, not streamed", "rest", "COMPLETED", task_id="task.1", streamed=False)
    streamed = Run("completed", "rest", "COMPLETED", task_id="task.2", final_state="TASK_STATE_FAILED")
    db = tmp_path / "empty.db"
    LogWriter(db).close()
    with EventLog(db) as log:
        check([sent, streamed], log)
    assert sent.problems == [
        "the client saw None, expected COMPLETED",
        "the non-streamed answer is not in the log",
    ]
    assert streamed.problems == ["the client saw TASK_STATE_FAILED, expected COMPLETED"]


@pytest.mark.parametrize("pace", ["51", "1e308"])
def test_a_pace_the_client_would_not_wait_for_is_refused(tmp_path: Path, pace: str) -> None:
    """At --pace 1e308 every scenario waited out the client's 5 minutes, then failed."""
    result = demo("--pace", pace, "--db", "demo.db", timeout=30, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"Invalid value for '--pace': the demo's pace is at most 50, not {float(pace)!r}: its slowest "
        "scenario would take longer than the client waits for a call (300 s)"
    ) in " ".join(result.stderr.split())
    assert list(tmp_path.iterdir()) == []


def plan(session: aiohttp.ClientSession, url: str, name: str, pace: float) -> tuple[Run, Any]:
    (found,) = [(run, go) for run, go in scenarios(session, url, pace) if run.name == name]
    return found


async def test_a_stream_that_fails_before_its_cancel_leaves_nothing_behind(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """The canceled scenario waited 30 s for the answer whatever became of its stream, and
    left the stream's failure unread: "Task exception was never retrieved", a traceback."""
    agent = await serve(create_agent_app(pace=10))  # its answer starts seconds later
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5)) as session:
        run, go = plan(session, agent, "canceled mid-stream", 10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(go(), 10)
    gc.collect()  # (where an unread failure is told)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert run.problems == []  # the client's failure is told by the demo, once


async def test_the_dropped_task_is_waited_for_at_a_slow_pace(serve: Serve) -> None:
    """At --pace 20 the dropped connection's task ends 17 s after its stream is cut: polled
    for 15 s whatever the pace, the client saw it WORKING, and the demo failed."""
    agent = await serve(create_agent_app(pace=22))
    async with aiohttp.ClientSession() as session:
        run, go = plan(session, agent, "dropped connection", 22)
        await go()
    assert run.final_state == "TASK_STATE_COMPLETED"
