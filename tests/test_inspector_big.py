"""The task, MCP session and LLM stream pages of a big log: a task and a stream of
thousands of deltas, a session of more tool calls than its timeline draws and one of more
than its page lists. The pages stay small: the events table shows the first and last events
and links to Datasette's table for the rest, the timelines bin the deltas, the session's
timeline draws its first calls and says how many more there are, and a bigger session's
page lists its first and last calls and exchanges."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from a2a_frames import artifact, sse, status, task
from datasette.app import Datasette
from inspector_log import page

from tasktape.eventlog import EventLog, LogWriter
from tasktape.inspector import ARTIFACT_CHARS, EVENT_ROWS, EVENT_TAIL, EXCHANGE_ROWS, EXCHANGE_TAIL
from tasktape.inspector.app import create_datasette
from tasktape.inspector.session_timeline import MAX_CALL_LANES
from tasktape.inspector.timeline import CATEGORY_COLOURS, MAX_TICKS

DB = "big"
TASK = "task.big"
SESSION = "big-session"
DELTAS = 3 * MAX_TICKS  # more than the timeline draws one by one
CALLS = MAX_CALL_LANES + 12
LISTED_ROWS, LISTED_TAIL = 200, 20  # the calls and exchanges a big session's page lists first and last
LISTED_SESSION = "listed-session"
LISTED_CALLS = LISTED_ROWS + LISTED_TAIL + 30  # more than its page lists
RESUMED_AFTER = LISTED_ROWS + 10  # the call the GET that resumes call 0 comes after: a GET left out
THINKING = MAX_TICKS  # a big stream's thinking deltas, then twice as many of its answer's
POLLED = "task.polled"
POLLS = MAX_TICKS + 100  # GetTask polls: more than a lane draws one by one
HUGE = "task.huge"
HUGE_CHARS = 300_000  # of its answer's first delta
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


def _answer(k: int) -> bytes:
    answer = {"jsonrpc": "2.0", "id": k, "result": {"content": [{"type": "text", "text": "r"}]}}
    return f"id: {k}\nevent: message\ndata: {json.dumps(answer)}\n\n".encode()


def _tool_call(w: LogWriter, cap: int, k: int, session: str = SESSION, *, answered: bool = True) -> None:
    """A tools/call answered on its POST stream (or, not ``answered``, a stream that ends first)."""
    body = {"jsonrpc": "2.0", "id": k, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    headers = [("content-type", "application/json"), ("mcp-session-id", session)]
    x = w.begin_exchange(
        cap, method="POST", path="/mcp", request_headers=headers, request_body=json.dumps(body).encode()
    )
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    if answered:
        w.chunk(x, 2 * MS, _answer(k))
    w.end_exchange(x, duration_ns=3 * MS)


def _resuming_get(w: LogWriter, cap: int, session: str, k: int) -> None:
    """A GET that resumes the session's stream and carries the answer to call ``k``."""
    headers = [("mcp-session-id", session), ("last-event-id", "0")]
    x = w.begin_exchange(cap, method="GET", path="/mcp", request_headers=headers)
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    w.chunk(x, 2 * MS, _answer(k))
    w.end_exchange(x, duration_ns=3 * MS)


def _listed_session(w: LogWriter, cap: int) -> None:
    """LISTED_CALLS tool calls, the first answered on a GET far down the session."""
    for k in range(LISTED_CALLS):
        _tool_call(w, cap, k, LISTED_SESSION, answered=k > 0)
        if k == RESUMED_AFTER:
            _resuming_get(w, cap, LISTED_SESSION, 0)


def _chat_chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-x", "choices": [choice]}
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _openai_stream(w: LogWriter, cap: int, thinking: int, answer: int) -> int:
    """A chat completion streaming ``thinking`` deltas of reasoning, then ``answer`` of
    content, a tenth of a millisecond apart, then its finish and [DONE]."""
    body = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "count"}]}
    frames = [_chat_chunk({"reasoning_content": f"r{i} "}) for i in range(thinking)]
    frames += [_chat_chunk({"content": f"w{i} "}) for i in range(answer)]
    frames += [_chat_chunk({}, "stop"), b"data: [DONE]\n\n"]
    x = w.begin_exchange(
        cap,
        method="POST",
        path="/v1/chat/completions",
        request_headers=[("content-type", "application/json")],
        request_body=json.dumps(body).encode(),
    )
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, data in enumerate(frames, 1):
        w.chunk(x, n * MS // 10, data)
    w.end_exchange(x, duration_ns=(len(frames) + 1) * MS // 10)
    return x


def _polled_task(w: LogWriter, cap: int) -> None:
    """A short stream, then POLLS GetTask polls a millisecond apart."""
    started = time.time_ns()
    x = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=started)
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, data in enumerate(sse([task(POLLED, "c"), status(POLLED, "c", "TASK_STATE_WORKING")]), 1):
        w.chunk(x, n * MS, data)
    w.end_exchange(x, duration_ns=3 * MS)
    for i in range(POLLS):
        state = "TASK_STATE_COMPLETED" if i == POLLS - 1 else "TASK_STATE_WORKING"
        body = {"id": POLLED, "contextId": "c", "status": {"state": state}}
        g = w.begin_exchange(cap, method="GET", path=f"/tasks/{POLLED}", started_ns=started + (i + 5) * MS)
        w.response_head(g, status=200, headers={"content-type": "application/json"}, is_sse=False, ttfb_ns=MS)
        w.chunk(g, MS, json.dumps(body).encode())
        w.end_exchange(g, duration_ns=MS)


def _huge_answer(w: LogWriter, cap: int) -> None:
    """A task whose answer is one delta of HUGE_CHARS characters, then a short one."""
    frames = [
        task(HUGE, "c"),
        artifact(HUGE, "c", "a", "X" * HUGE_CHARS),
        artifact(HUGE, "c", "a", "y", append=True),
    ]
    frames.append(status(HUGE, "c", "TASK_STATE_COMPLETED"))
    x = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, data in enumerate(sse(frames), 1):
        w.chunk(x, n * MS, data)
    w.end_exchange(x, duration_ns=(len(frames) + 1) * MS)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / f"{DB}.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        _task_stream(w, cap)
        _polled_task(w, cap)
        _huge_answer(w, cap)
        for k in range(CALLS):
            _tool_call(w, cap, k)
        _listed_session(w, cap)
        _openai_stream(w, cap, THINKING, 2 * THINKING)
        _openai_stream(w, cap, 1, 1)
        w.end_capture(cap)
    return path


def _stream_ids(log: Path) -> tuple[int, int]:
    """The big OpenAI stream's exchange id, and the small one's."""
    with EventLog(log) as db:
        big, small = (
            r["id"] for r in db.db.query("SELECT id FROM exchanges WHERE protocol = 'openai' ORDER BY id")
        )
    return big, small


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
    assert len(re.findall(r'<tr id="exchange-', html)) == CALLS
    assert "left out here" not in html


async def test_a_big_sessions_page_lists_its_first_and_last_calls_and_exchanges(ds: Datasette) -> None:
    """A call and a row per exchange of thousands would be megabytes: the first and the
    last of each, how many are left out, and links to Datasette's exchanges table filtered
    to the session (and to its tool calls) to page through them all."""
    html = await page(ds, f"/{DB}/-/session/{LISTED_SESSION}")
    calls = [int(i) for i in re.findall(r'<article class="tt-call[^"]*" id="call-(\d+)"', html)]
    rows = [int(i) for i in re.findall(r'<tr id="exchange-(\d+)"', html)]
    assert len(calls) == len(rows) == LISTED_ROWS + LISTED_TAIL
    assert calls[:LISTED_ROWS] == rows[:LISTED_ROWS]  # no GET among the first exchanges
    left_out = LISTED_CALLS - LISTED_ROWS - LISTED_TAIL
    assert f"{left_out} more tool calls, left out here" in html
    assert f"{left_out + 1} more exchanges, left out here" in html  # and the GET
    exchanges = f"/{DB}/exchanges?session_id={LISTED_SESSION}"
    assert f'<a href="{exchanges}&amp;rpc_method=tools%2Fcall">exchanges</a>' in html
    for link, count in (
        (f"{exchanges}&rpc_method=tools%2Fcall", LISTED_CALLS),
        (exchanges, LISTED_CALLS + 1),
    ):
        listing = (await ds.client.get(link.replace("/exchanges?", "/exchanges.json?"))).json()
        assert listing["filtered_table_rows_count"] == count
    assert f"The timeline draws the first {MAX_CALL_LANES} of {LISTED_CALLS} tool calls" in html
    # The first call was answered on a GET the page leaves out: its link goes to the GET's row.
    resumed = re.search(r'the client resumed on\s*<a href="([^"]+)">#(\d+) GET</a>', html)
    assert resumed and resumed.group(1) == f"/{DB}/exchanges/{resumed.group(2)}"
    assert len(html) < 400_000


async def test_a_task_polled_thousands_of_times_lists_its_first_and_last_exchanges(ds: Datasette) -> None:
    """A row per GetTask poll, and a bar per poll in the timeline, would make megabytes: the
    first and the last exchanges, a link to the rest in Datasette's exchanges table, and
    the polls drawn as a mark per few pixels, each counting its polls."""
    html = await page(ds, f"/{DB}/-/task/{POLLED}")
    exchanges = re.search(r'<section class="tt-section" id="exchanges">.*?</section>', html, re.S)
    assert exchanges
    listed = re.findall(r'<tr>\s*<td><a href="/big/exchanges/(\d+)">', exchanges.group(0))
    assert len(listed) == EXCHANGE_ROWS + EXCHANGE_TAIL
    left_out = POLLS + 1 - EXCHANGE_ROWS - EXCHANGE_TAIL
    assert f"{left_out:,} more exchanges, left out here" in html
    link = re.search(r'every one of the task\'s exchanges in\s*<a href="([^"]+)">exchanges</a>', html)
    assert link and link.group(1) == f"/{DB}/exchanges?task_id={POLLED}"
    listing = (await ds.client.get(link.group(1).replace("/exchanges?", "/exchanges.json?"))).json()
    assert listing["filtered_table_rows_count"] == POLLS + 1
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    counts = [
        int(n.replace(",", ""))
        for n in re.findall(r'class="tt-request tt-bin"><title>([\d,]+) requests, ', svg)
    ]
    assert sum(counts) == POLLS and len(counts) < 400
    assert f"{POLLS:,} GetTask" not in svg and "GetTask" in svg
    assert len(html) < 300_000


async def test_a_huge_event_is_cut_on_the_task_page_and_whole_on_its_row_and_in_the_json(
    ds: Datasette, log: Path
) -> None:
    """A delta of megabytes shown whole in the answer and in its event's row would make the
    page megabytes: the events table cuts it where Datasette cuts a cell, linking its row;
    the answer shows its start, saying how long it is and where the whole text is."""
    html = await page(ds, f"/{DB}/-/task/{HUGE}")
    assert len(html) < 100_000
    with EventLog(log) as db:
        (x,) = db.db.query("SELECT id FROM exchanges WHERE task_id = ?", [HUGE])
    row = f"/{DB}/events/{x['id']},1"
    assert f'<a class="tt-more" href="{row}">… ({HUGE_CHARS:,} chars)</a>' in html
    assert f"{HUGE_CHARS + 1:,} characters in all" in html
    (json_url,) = re.findall(r'the whole text is in <a href="([^"]+)">the page\'s JSON</a>', html)
    assert json_url == f"/{DB}/-/task/{HUGE}.json"
    (answer,) = (await ds.client.get(json_url)).json()["artifacts"]
    assert answer["text"] == "X" * HUGE_CHARS + "y"
    assert "X" * ARTIFACT_CHARS in html and "X" * (ARTIFACT_CHARS + 1) not in html
    assert "X" * HUGE_CHARS in await page(ds, row)


async def test_a_link_to_an_exchange_a_big_sessions_page_leaves_out_goes_to_its_row(
    ds: Datasette, log: Path
) -> None:
    """An MCP exchange id links to its row on its session's page: one the page leaves out
    would land at the page's top, so it links to its own row instead."""
    with EventLog(log) as db:
        ids = [
            r["id"]
            for r in db.db.query(
                "SELECT id FROM exchanges WHERE session_id = ? ORDER BY started_ns, id", [LISTED_SESSION]
            )
        ]
    html = await page(ds, f"/{DB}/stream_summary?protocol=mcp&_size=max&_sort=exchange_id")
    links = {int(i): href for href, i in re.findall(r'<a class="tt-session" href="([^"]+)">(\d+)</a>', html)}
    session = await page(ds, f"/{DB}/-/session/{LISTED_SESSION}")
    for at in (0, LISTED_ROWS - 1, len(ids) - LISTED_TAIL, len(ids) - 1):
        assert links[ids[at]] == f"/{DB}/-/session/{LISTED_SESSION}#exchange-{ids[at]}"
        assert f'<tr id="exchange-{ids[at]}"' in session
    for at in (LISTED_ROWS, len(ids) - LISTED_TAIL - 1):
        assert links[ids[at]] == f"/{DB}/exchanges/{ids[at]}"
        assert f'<tr id="exchange-{ids[at]}"' not in session


async def test_a_big_streams_timeline_draws_its_events_binned(ds: Datasette, log: Path) -> None:
    """A tick per delta of a long stream would be megabytes of SVG: a mark per few pixels,
    each counting its events (the counts adding up to every event), the thinking's apart."""
    big, _ = _stream_ids(log)
    html = await page(ds, f"/{DB}/-/stream/{big}")
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    counts = [int(n.replace(",", "")) for n in re.findall(r'class="tt-bin"><title>([\d,]+) events, ', svg)]
    assert sum(counts) == 3 * THINKING + 2 and len(counts) < 400  # the deltas, the finish, [DONE]
    assert not re.search(r'class="tt-ev ', svg)
    thinking = re.findall(
        rf'fill="{CATEGORY_COLOURS["thinking"]}" class="tt-bin"><title>[^<]* thinking<', svg
    )
    assert thinking and ">stop<" in svg
    assert len(svg) < 100_000


async def test_a_streams_thinking_is_drawn_apart_from_its_answer(ds: Datasette, log: Path) -> None:
    """A short stream keeps a tick per event, its thinking delta in the thinking colour
    the task page draws thinking in, named in the legend."""
    _, small = _stream_ids(log)
    html = await page(ds, f"/{DB}/-/stream/{small}")
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    ticks = re.findall(r'fill="(#[0-9a-f]+)" class="tt-ev tt-ev-(\w+)"><title>#(\d+) ', svg)
    assert [(kind, int(seq)) for _, kind, seq in ticks] == [
        ("thinking", 0),
        ("delta", 1),
        ("finish", 2),
        ("done", 3),
    ]
    assert ticks[0][0] == CATEGORY_COLOURS["thinking"] != ticks[1][0]
    assert "tt-bin" not in svg
    assert f'style="background: {CATEGORY_COLOURS["thinking"]}"></i>thinking delta</span>' in html


async def test_a_task_pages_findings_are_those_of_its_log_as_it_is_now(tmp_path: Path) -> None:
    """Checking a big task takes seconds, so its page reuses its findings while the log
    stays as it was; once the recorder writes more of the stream (the same exchange), the
    page shows the findings of the stream as it is now."""
    path, live = tmp_path / "live.db", "task.live"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        x = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
        frames = [task(live, "c"), status(live, "c", "TASK_STATE_WORKING")]
        frames += [artifact(live, "c", "a", f"t{i} ", append=i > 0) for i in range(DELTAS)]
        frames += [status(live, "c", "TASK_STATE_COMPLETED"), status(live, "c", "TASK_STATE_WORKING")]
        pieces = sse(frames)
        for n, data in enumerate(pieces[:-2], 1):
            w.chunk(x, n * MS // 10, data)
        w.flush()
        ds = create_datasette(path)
        for _ in range(2):
            html = await page(ds, f"/live/-/task/{live}")
            assert "the lifecycle checks pass" in html and "is not a legal transition" not in html
        for n, data in enumerate(pieces[-2:], len(pieces) - 1):
            w.chunk(x, n * MS // 10, data)
        w.end_exchange(x, duration_ns=(len(pieces) + 1) * MS // 10)
        w.flush()
        html = await page(ds, f"/live/-/task/{live}")
    assert "COMPLETED -&gt; WORKING is not a legal transition" in html, html[:3000]
