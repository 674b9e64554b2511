"""For the inspector's tests: a real log (the demo's scenarios recorded through the proxy,
plus one stream that breaks the task lifecycle, so the checker has findings to show), and
a ``tasktape`` process serving one."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from a2a_frames import USAGE, sse, status, streamed, task
from datasette.app import Datasette

from tasktape.demo import run_demo
from tasktape.eventlog import EventLog, LogWriter

URL = re.compile(r"tasktape inspect: .* on (http://127\.0\.0\.1:\d+)/")
BROKEN = "task.broken"  # completes, then streams on: after-terminal and transition findings
MS = 1_000_000


def record_log(path: Path, pace: float = 0.1) -> Path:
    """Record the demo into ``path`` at ``pace``, then append the broken stream."""
    asyncio.run(run_demo(path, pace))
    frames = [
        task(BROKEN, "ctx.broken", "TASK_STATE_SUBMITTED"),
        status(BROKEN, "ctx.broken", "TASK_STATE_WORKING"),
        *streamed(BROKEN, "ctx.broken", "art.broken", ["Too ", "late."]),
        status(BROKEN, "ctx.broken", "TASK_STATE_COMPLETED", usage=USAGE),
        status(BROKEN, "ctx.broken", "TASK_STATE_WORKING"),
    ]
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(
            ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS
        )
        for n, data in enumerate(sse(frames, ids="b"), 1):
            w.chunk(ex, n * 40 * MS, data)
        w.end_exchange(ex, duration_ns=(len(frames) + 1) * 40 * MS)
    return path


def task_of(path: Path, scenario: str) -> str:
    """The task id of a demo scenario, found by the text the client sent."""
    words = {
        "completed": "What does J45.909 mean?",
        "not streamed": "Summarise the last visit",
        "resumed": "What input do you need?",
        "canceled": "Cancel me halfway",
        "dropped": "Drop the line mid-answer",
    }[scenario]
    with EventLog(path) as log:
        (row,) = log.db.query(
            "SELECT task_id FROM exchanges WHERE binding = 'rest' AND request_body LIKE ? "
            "ORDER BY id LIMIT 1",
            [f"%{words}%"],
        )
    return row["task_id"]


class Served:
    """A ``tasktape`` process that serves something, and what it printed (read as it comes)."""

    def __init__(self, *args: str, cwd: Path | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tasktape", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for_url(self, timeout: float = 60) -> str:
        """Wait until the inspector says where it listens."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.reader.is_alive():
            found = URL.search(self.out)
            if found:
                return found.group(1)
            time.sleep(0.05)
        code, out, err = self.stop()
        raise AssertionError(f"no URL printed (exit {code}): {out}{err}")

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str, str]:
        """Send ``sig``; return the exit status, stdout and stderr."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.reader.join(5)
        assert self.process.stderr is not None
        return self.process.returncode, self.out, self.process.stderr.read()


def stream_of(path: Path, scenario: str) -> int:
    """The exchange id of a demo scenario's first stream: the demo runs its scenarios at
    once, so which request came in when depends on the machine's load."""
    task_id = task_of(path, scenario)
    with EventLog(path) as log:
        (row,) = log.db.query(
            "SELECT min(id) AS id FROM exchanges WHERE task_id = ? AND is_sse = 1", [task_id]
        )
    return row["id"]


async def page(ds: Datasette, path: str, status: int = 200) -> str:
    """A page of the inspector, checked for its status."""
    response = await ds.client.get(path)
    assert response.status_code == status, (path, response.text[:2000])
    return response.text


async def rows(ds: Datasette, path: str) -> list[dict[str, Any]]:
    """The rows of a Datasette JSON page."""
    response = await ds.client.get(path)
    assert response.status_code == 200, (path, response.text[:2000])
    return response.json()["rows"]
