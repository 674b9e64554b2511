"""The task and MCP session pages of a big log: a task of thousands of deltas and a session
of more tool calls than its timeline draws. The pages stay small: the events table shows
the first and last events and links to Datasette's table for the rest, the timeline bins
the deltas, the session's timeline draws its first calls and says how many more there are."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from a2a_frames import artifact, sse, status, task
from datasette.app import Datasette
from inspector_log import page

from tasktape.eventlog import LogWriter
from tasktape.inspector import EVENT_ROWS, EVENT_TAIL
from tasktape.inspector.app import create_datasette
from tasktape.inspector.session_timeline import MAX_CALL_LANES
from tasktape.inspector.timeline import MAX_TICKS

DB = "big"
TASK = "task.big"
SESSION = "big-session"
DELTAS = 3 * MAX_TICKS  # more than the timeline draws one by one
CALLS = MAX_CALL_LANES + 12
MS = 1_000_000


def _task_stream(w: LogWriter, cap: int) -> None:
    """One stream of DELTAS answer deltas, a tenth of a millisecond apart."""
    frames = [task(TASK, "c"), status(TASK, "c", "TASK_STATE_WORKING")]
    frames += [artifact(TASK, "c", "a", f"t{i} ", append=i > 0) for i in range(DELTAS)]
    frames.append(status(TASK, "c", "TASK_STATE_COMPLETED"))
    x = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, data in enumerate(sse(frames), 1):
        w.chunk(x, n * MS // 10, data)
    w.end_exchange(x, duration_ns=(len(frames) + 1) * MS // 10)


def _tool_call(w: LogWriter, cap: int, k: int) -> None:
    body = {"jsonrpc": "2.0", "id": k, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    answer = {"jsonrpc": "2.0", "id": k, "result": {"content": [{"type": "text", "text": "r"}]}}
    headers = [("content-type", "application/json"), ("mcp-session-id", SESSION)]
    x = w.begin_exchange(
        cap, method="POST", path="/mcp", request_headers=headers, request_body=json.dumps(body).encode()
    )
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    w.chunk(x, 2 * MS, f"event: message\ndata: {json.dumps(answer)}\n\n".encode())
    w.end_exchange(x, duration_ns=3 * MS)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / f"{DB}.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        _task_stream(w, cap)
        for k in range(CALLS):
            _tool_call(w, cap, k)
        w.end_capture(cap)
    return path


@pytest.fixture
def ds(log: Path) -> Datasette:
    return create_datasette(log)


async def test_a_big_tasks_events_table_shows_its_first_and_last_events_and_links_the_rest(
    ds: Datasette,
) -> None:
    """Every event a row would be megabytes: the first and the last, and a link to page
    through all of them in Datasette's events table."""
    html = await page(ds, f"/{DB}/-/task/{TASK}")
    events = DELTAS + 3
    rows = re.findall(r'<tr class="tt-ev-[^"]*">\s*<td><a href="/big/events/1,(\d+)">', html)
    assert [int(seq) for seq in rows] == [*range(EVENT_ROWS), *range(events - EVENT_TAIL, events)]
    left_out = events - EVENT_ROWS - EVENT_TAIL
    assert f"{left_out:,} more events, left out here" in html
    link = re.search(r'page through every one of the task\'s events in\s*<a href="([^"]+)">events</a>', html)
    assert link and link.group(1) == f"/{DB}/events?task_id={TASK}"
    listing = (await ds.client.get(link.group(1).replace("/events?", "/events.json?"))).json()
    assert listing["filtered_table_rows_count"] == events
    assert len(html) < 1_000_000


async def test_a_big_tasks_timeline_draws_its_deltas_binned(ds: Datasette) -> None:
    """A tick per delta would be megabytes of SVG: a mark per few pixels instead, each
    counting its events, the counts adding up to every delta."""
    html = await page(ds, f"/{DB}/-/task/{TASK}")
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    counts = [int(n.replace(",", "")) for n in re.findall(r'class="tt-bin"><title>([\d,]+) events, ', svg)]
    assert sum(counts) == DELTAS and len(counts) < 400
    assert "answer" in svg and ">COMPLETED<" in svg
    assert len(svg) < 100_000


async def test_a_big_sessions_timeline_draws_its_first_calls_and_says_how_many_more(ds: Datasette) -> None:
    """A lane per call of thousands would be a drawing a hundred thousand pixels tall."""
    html = await page(ds, f"/{DB}/-/session/{SESSION}")
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    assert len(re.findall(r'class="tt-lane-title">#\d+ t<', svg)) == MAX_CALL_LANES
    height = float(re.search(r'viewBox="0 0 \d+ ([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    assert height < 100 * MAX_CALL_LANES
    assert f"The timeline draws the first {MAX_CALL_LANES} of {CALLS} tool calls" in html
    assert f'<a href="/{DB}/exchanges?session_id={SESSION}">exchanges</a>' in html
    assert len(re.findall(r'<article class="tt-call" id="call-', html)) == CALLS  # each listed
