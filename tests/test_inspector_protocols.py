"""The inspector's pages for MCP sessions and LLM streams, over a real log: MCP sessions
recorded with the official SDK (a session, one resumed on a GET after Last-Event-ID, a
stateless 2026-07-28 one), OpenAI and Anthropic streams recorded with their SDKs, and a
broken MCP session with the checker's findings saved. In process (Datasette's client, as
tests/test_inspector.py), then in headless Chromium (as tests/test_inspector_browser.py)."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import test_inspector_browser
import test_protocol_meanings
from aiohttp import web
from conftest import RecordFactory
from datasette.app import Datasette
from inspector_log import Served, page, rows
from markupsafe import Markup, escape
from protocol_logs import BROKEN_SESSION, HOSTILE, PAUSE_MS, PIECES
from protocol_logs import protocol_log as build_log
from test_inspector_browser import chromium, screenshot
from test_mcp_sdk import generation

from tasktape import inspector
from tasktape.eventlog import EventLog, LogWriter
from tasktape.inspector.app import create_datasette
from tasktape.inspector.axis import CHAR, WIDTH
from tasktape.inspector.display import row_number
from tasktape.inspector.metadata import QUERIES, TABLES, dashboards
from tasktape.inspector.session_page import load_session
from tasktape.inspector.session_timeline import MAX_REQUEST_LABEL
from tasktape.inspector.stream_page import load_stream

DB = "protocols"
ANSWER = "".join(PIECES)
browser = test_inspector_browser.browser  # the fixture: Chromium, or the test skipped


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], int]:
    """The log, what each client got, and the exchange id of the paused chat stream."""
    path = tmp_path_factory.mktemp("protocols") / f"{DB}.db"
    got, paused = build_log(path)
    return path, got, paused


@pytest.fixture
def log(recorded: tuple[Path, dict[str, Any], int]) -> Path:
    return recorded[0]


@pytest.fixture
def got(recorded: tuple[Path, dict[str, Any], int]) -> dict[str, Any]:
    return recorded[1]


@pytest.fixture
def ds(log: Path) -> Datasette:
    return create_datasette(log)


def exchanges(log: Path, **where: Any) -> list[dict[str, Any]]:
    with EventLog(log) as opened:
        return [x for x in opened.exchanges() if all(x[k] == v for k, v in where.items())]


def svg_of(html: str) -> str:
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', html, re.S)
    return svg


def section(html: str, heading: str) -> str:
    return html.split(f"<h2>{heading}</h2>", 1)[1].split("</section>", 1)[0]


def slow_call(log: Path, session_id: str) -> dict[str, Any]:
    (call,) = [
        x
        for x in exchanges(log, session_id=session_id, rpc_method="tools/call")
        if b"slow_count" in x["request_body"].encode()
    ]
    return call


# -- the MCP session page -----------------------------------------------------------------------


async def test_a_session_shows_each_tool_call_with_its_progress_and_result(
    ds: Datasette, log: Path, got: dict[str, Any]
) -> None:
    session = got["mcp1"]["session_id"]
    html = await page(ds, f"/{DB}/-/session/{session}")
    assert f"<title>MCP session {session} · {DB}</title>" in html
    assert "protocol 2025-11-25" in html and "server tasktape-mcp-peer" in html
    call = slow_call(log, session)
    calls = section(html, "Tool calls")
    # Each call: its tool, its arguments, its progress (progress/total and message) in order, its result.
    slow = calls.split(f'id="call-{call["id"]}"')[1].split("</article>")[0]
    assert "<code>slow_count</code>" in slow
    assert str(escape(json.dumps({"n": 3, "delay": 0.15}))) in slow
    progress = re.findall(
        r"<li><b>([\d/]+)</b> <span class=\"tt-at\">at [\d,.]+ ms</span>\s*<span>([^<]+)</span>", slow
    )
    assert progress == [(f"{i}/3", f"counted {i} of 3") for i in (1, 2, 3)]
    assert '<p class="tt-text">counted to 3</p>' in slow and re.search(r"took [\d,.]+ ms", slow)
    assert '<p class="tt-text">5</p>' in calls  # the add tool's result
    # The other requests, in time order, with what they came to.
    table = section(html, "Exchanges")
    shown = [int(i) for i in re.findall(r'<tr id="exchange-(\d+)"', table)]
    assert shown == [x["id"] for x in exchanges(log, session_id=session)]
    for operation in ("initialize", "notifications/initialized", "tools/list", "GET", "DELETE"):
        assert f"<td>{operation}" in table, operation
    assert (
        "tools: add, slow_count" in table
        and "ends the session" in table
        and "the server&#39;s stream" in table
    )
    # The time axis: a lane per tool call, its progress ticks and its result dot, and the others.
    svg = svg_of(html)
    lanes = re.findall(r'class="tt-lane-title">([^<]+)<', svg)
    tools = exchanges(log, session_id=session, rpc_method="tools/call")
    names = [f"#{x['id']} {json.loads(x['request_body'])['params']['name']}" for x in tools]
    assert lanes == [*names, "other requests"] and names[-1].endswith(" slow_count")
    ticks = re.findall(
        r'class="tt-progress"><title>progress (\d)/3 at [\d,.]+ ms \(#(\d+)\.\d+\): ([^<]+)<', svg
    )
    assert ticks == [(str(i), str(call["id"]), f"counted {i} of 3") for i in (1, 2, 3)]
    assert svg.count("<circle ") == 2 and "result at " in svg
    assert len(re.findall(r'class="tt-request-bar"', svg)) == 5  # initialize, initialized, GET, list, DELETE
    assert "none saved by tasktape check" in html


async def test_a_resumed_get_is_drawn_as_the_continuation_of_the_call_it_answers(
    ds: Datasette, log: Path, got: dict[str, Any]
) -> None:
    session = got["mcp1-resumed"]["session_id"]
    call = slow_call(log, session)
    (resumed,) = [
        x
        for x in exchanges(log, session_id=session, method="GET")
        if "last-event-id" in x["request_headers"].lower()
    ]
    # (named as the SDK spells it: the log keeps the names as sent)
    (last_event_id,) = [v for k, v in json.loads(resumed["request_headers"]) if k.lower() == "last-event-id"]
    with EventLog(log) as opened:
        answer = json.loads(opened.events(resumed["id"])[-1]["data"])
    assert answer["id"] == json.loads(call["request_body"])["id"]  # what ties the GET to the call
    html = await page(ds, f"/{DB}/-/session/{session}")
    svg = svg_of(html)
    lane = svg.split(f'class="tt-lane-title">#{call["id"]} slow_count<')[1].split("tt-lane-rule")[0]
    assert f"resumed on #{resumed['id']}" in lane
    assert f"<title>#{resumed['id']} GET resumed it after Last-Event-ID {last_event_id}</title>" in lane
    assert f'class="tt-resumed"><title>#{resumed["id"]} GET, resuming #{call["id"]}:' in lane
    # Its progress and result arrived on the GET, and are drawn in the call's lane all the same.
    assert len(re.findall(rf"\(#{resumed['id']}\.\d+\): counted \d of 3", lane)) == 3
    assert "result at " in lane and f"(#{resumed['id']}): counted to 3" in lane
    # The GET is not drawn again among the other requests; the table names its Last-Event-ID.
    others = svg.split(">other requests<")[1]
    assert f"<title>#{resumed['id']} " not in others
    row = html.split(f'<tr id="exchange-{resumed["id"]}"')[1].split("</tr>")[0]
    assert f"Last-Event-ID: {last_event_id}" in row and f"carrying the messages of #{call['id']}" in row
    note = html.split('class="tt-resumed-note"')[1].split("</p>")[0]
    assert f'href="#exchange-{resumed["id"]}">#{resumed["id"]} GET</a>' in note and last_event_id in note
    assert ">1</strong>\n    <small>tool calls answered on a GET stream" in html


async def test_a_stateless_session_is_its_captures_exchanges_without_a_session_id(
    ds: Datasette, log: Path
) -> None:
    generation("mcp2-stateless")  # skipped (failed in CI) when mcp 2.x is not installed
    (discover,) = exchanges(log, rpc_method="server/discover")
    assert discover["session_id"] is None
    session = f"capture-{discover['capture_id']}"
    mine = exchanges(log, capture_id=discover["capture_id"])
    html = await page(ds, f"/{DB}/-/session/{session}")
    assert ">stateless</span>" in html and "protocol 2026-07-28" in html
    shown = [int(i) for i in re.findall(r'<tr id="exchange-(\d+)"', html)]
    assert shown == [x["id"] for x in mine]
    # JSON answers (no stream) and the streamed slow call alike.
    (add,) = [x for x in mine if b'"add"' in x["request_body"].encode()]
    assert f"(the body of #{add['id']})" in html and '<p class="tt-text">5</p>' in html
    assert "counted 3 of 3" in html and '<p class="tt-text">counted to 3</p>' in html
    assert len(re.findall(r'class="tt-progress"', svg_of(html))) == 3
    # Another capture's number names no session.
    await page(ds, f"/{DB}/-/session/capture-{max(x['capture_id'] for x in exchanges(log)) + 1}", status=404)


async def test_a_session_shows_its_errors_and_the_findings_saved_about_it(ds: Datasette, log: Path) -> None:
    (call,) = exchanges(log, session_id=BROKEN_SESSION)
    with EventLog(log) as opened:
        saved = [
            tuple(r.values())
            for r in opened.db.query(
                "SELECT rule, seq, message FROM findings WHERE exchange_id = ?", [call["id"]]
            )
        ]
    assert saved == [("mcp-progress-rising", 1, "progress of token 7 went from 2 to 1")]
    html = await page(ds, f"/{DB}/-/session/{BROKEN_SESSION}")
    findings = section(html, "Findings")
    assert "<b>mcp-progress-rising</b>" in findings and "progress of token 7 went from 2 to 1" in findings
    assert f'href="/{DB}/events/{call["id"]},1">#{call["id"]}.1</a>' in findings
    assert 'class="tt-call tt-call-error"' in html and "error at " in html and "-32603: flaky broke" in html
    assert "halfway" in html and str(escape(HOSTILE)) in html and "<script>alert" not in html
    assert 'fill="#c62828" class="tt-dot"><title>error at ' in svg_of(html)
    assert html.count("tt-card tt-bad") == 2  # an error, a finding


# -- the LLM stream page ------------------------------------------------------------------------

STREAMS = {"chat": "chat.completions", "responses": "responses", "messages": "messages"}


@pytest.mark.parametrize("client", STREAMS)
async def test_a_stream_shows_what_the_sdk_assembled(
    ds: Datasette, log: Path, got: dict[str, Any], client: str
) -> None:
    x = exchanges(log, rpc_method=STREAMS[client])[0]  # (the paused copy of the chat stream comes later)
    assembled = got[client]
    html = await page(ds, f"/{DB}/-/stream/{x['id']}")
    title = "Anthropic" if client == "messages" else "OpenAI"
    assert f"<title>{title} stream {x['id']} · {DB}</title>" in html
    answer = html.split("<h2>Answer</h2>")[1].split("</article>")[0]
    assert assembled.answer == ANSWER and f'<p class="tt-text">{escape(ANSWER)}</p>' in answer
    usage = html.split("<h2>Model and usage</h2>")[1].split("</table>")[0]
    assert f"<th>model reported</th><td>{assembled.model}</td>" in usage
    assert f"<th>input tokens</th><td>{assembled.input_tokens}</td>" in usage
    assert f"<th>output tokens</th><td>{assembled.output_tokens}</td>" in usage
    assert f"<th>finish</th><td>{assembled.finish}</td>" in usage
    assert "Say hello" in html  # what was asked
    with EventLog(log) as opened:
        events = opened.events(x["id"])
    first = next(e for e in events if e["text"])
    ttft = re.search(r"first token after</span><strong>([\d,.]+) ms", html)
    assert ttft and ttft.group(1) == f"{first['offset_ns'] / 1e6:,.1f}"
    assert f"event #{first['seq']}, the first with text" in html
    # Every event a tick on the axis, the deltas marked as such; the finish and the end labelled.
    svg = svg_of(html)
    assert len(re.findall(r'class="tt-ev tt-ev-', svg)) == len(events)
    assert len(re.findall(r'class="tt-ev tt-ev-delta"', svg)) == len(PIECES)
    labels = re.findall(r'class="tt-mark-label"[^>]*>([^<]+)<', svg)
    assert any(label.startswith(assembled.finish) for label in labels), labels
    assert any(f"{assembled.input_tokens} in · {assembled.output_tokens} out" in label for label in labels)
    gaps = html.split('<div id="gaps">')[1].split("</div>")[0]
    assert f"over {len(PIECES) - 1} gaps" in gaps and len(re.findall(r"<li><b>", gaps)) == 3
    assert html.count('class="tt-gapbar"') == len(events) - 1


async def test_a_pause_mid_answer_is_the_longest_gap_and_where_it_was(
    ds: Datasette, recorded: tuple[Path, dict[str, Any], int]
) -> None:
    _, _, paused = recorded
    html = await page(ds, f"/{DB}/-/stream/{paused}")
    gaps = html.split('<div id="gaps">')[1].split("</div>")[0]
    longest = re.findall(r"<li><b>([\d,.]+) ms</b> before delta (\d+)", gaps)
    assert len(longest) == 3
    ms, number = longest[0]
    assert float(ms.replace(",", "")) >= PAUSE_MS and int(number) == PIECES.index("token") + 1
    assert "after <q>every </q>, before <q>token</q>" in gaps
    p50 = re.search(r"p50 <b>([\d,.]+) ms</b> · max <b>([\d,.]+) ms</b>", gaps)
    assert p50 and float(p50.group(1)) < PAUSE_MS / 4 and p50.group(2) == ms
    # Measured on the axis too: the only gap well above the stream's typical one.
    (label,) = re.findall(r'class="tt-gap-label"[^>]*>([^<]+)<', svg_of(html))
    assert label.endswith(" ms") and float(label.removesuffix(" ms").replace(",", "")) >= PAUSE_MS


async def test_an_error_that_ends_a_stream_is_shown(ds: Datasette, log: Path) -> None:
    (x,) = [x for x in exchanges(log, protocol="anthropic") if x["finish"] == "error"]
    html = await page(ds, f"/{DB}/-/stream/{x['id']}")
    assert 'class="tt-pill tt-finish-bad"' in html
    assert f'<p class="tt-text">{escape("".join(PIECES[:2]))}</p>' in html
    svg = svg_of(html)
    assert 'class="tt-cut"' in svg and ">overloaded_error: Overloaded<" in svg


CACHED = {"chat": 8, "messages": 2}  # the input tokens each whole answer read from the cache


def whole_answers() -> web.Application:
    """A chat completion and an Anthropic message, answered whole (not streamed), each with
    input tokens read from the cache."""
    chat = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 20,
            "completion_tokens": 3,
            "total_tokens": 23,
            "prompt_tokens_details": {"cached_tokens": CACHED["chat"]},
        },
    }
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 3, "cache_read_input_tokens": CACHED["messages"]},
    }

    async def completion(request: web.Request) -> web.Response:
        return web.json_response(chat)

    async def messages(request: web.Request) -> web.Response:
        return web.json_response(message)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_post("/v1/messages", messages)
    return app


async def test_an_answer_not_streamed_shows_its_cached_input_tokens(record: RecordFactory) -> None:
    """A chat completion and an Anthropic message asked for whole have no events to count
    their tokens: the stream page shows the cached input tokens as the summary counts them."""
    rec = await record(whole_answers())
    asked = [{"role": "user", "content": "Say hello"}]
    gpt = openai.AsyncOpenAI(base_url=f"{rec.url}/v1", api_key="sk-test", max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=rec.url, api_key="sk-ant-test", max_retries=0)
    async with gpt, claude:
        completion = await gpt.chat.completions.create(model="gpt-4o-mini", messages=asked)
        message = await claude.messages.create(model="claude-sonnet-4-5", max_tokens=16, messages=asked)
    assert completion.usage and completion.usage.prompt_tokens_details
    assert completion.usage.prompt_tokens_details.cached_tokens == CACHED["chat"]
    assert message.usage.cache_read_input_tokens == CACHED["messages"]
    with await rec.log() as recorded:
        answers = {x["rpc_method"]: x["id"] for x in recorded.exchanges()}
        assert [recorded.events(x) for x in answers.values()] == [[], []]
    ds = create_datasette(rec.db)
    for call, cached in (("chat.completions", CACHED["chat"]), ("messages", CACHED["messages"])):
        html = await page(ds, f"/{rec.db.stem}/-/stream/{answers[call]}")
        usage = section(html, "Model and usage")
        assert f"<tr><th>of which cached</th><td>{cached}</td></tr>" in usage, call


async def test_unknown_sessions_and_streams_and_other_protocols_are_404(ds: Datasette, log: Path) -> None:
    assert "no MCP session nope in protocols" in await page(ds, f"/{DB}/-/session/nope", status=404)
    assert "no exchange 99999 in protocols" in await page(ds, f"/{DB}/-/stream/99999", status=404)
    assert "no exchange abc in protocols" in await page(ds, f"/{DB}/-/stream/abc", status=404)
    assert "no exchange" in await page(ds, f"/{DB}/-/stream/{'9' * 25}", status=404)  # past SQLite's integers
    assert [row_number(n) for n in ("12", "²", "9" * 25, str(2**63 - 1))] == [12, None, None, 2**63 - 1]
    mcp = exchanges(log, rpc_method="tools/list")[0]
    html = await page(ds, f"/{DB}/-/stream/{mcp['id']}", status=404)
    where = f"/{DB}/-/session/{mcp['session_id']}"
    assert (
        f"exchange {mcp['id']} is not an OpenAI or Anthropic stream (its protocol: mcp)" in html
        and where in html
    )
    await page(ds, "/nope/-/session/x", status=404)
    await page(ds, "/nope/-/stream/1", status=404)


async def test_the_other_requests_labels_end_inside_the_timeline(tmp_path: Path) -> None:
    """A request near the end of the session has its name drawn back from the right edge
    (not cut off by it: "#9 DELET"), a long name cut with an ellipsis, whole in its tooltip."""
    headers = [("Content-Type", "application/json"), ("Mcp-Session-Id", "s1")]
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "r"}]}}
    long_name = "notifications/" + "very_long_method_name_" * 3
    started, ms = time.time_ns(), 1_000_000
    with LogWriter(tmp_path / "edge.db") as w:
        cap = w.begin_capture(source="test")
        x = w.begin_exchange(
            cap,
            method="POST",
            path="/mcp",
            request_headers=headers,
            request_body=json.dumps(call).encode(),
            started_ns=started,
        )
        w.response_head(
            x, status=200, headers=[("Content-Type", "application/json")], is_sse=False, ttfb_ns=1
        )
        w.chunk(x, 2 * ms, json.dumps(answer).encode())
        w.end_exchange(x, duration_ns=100 * ms)
        for at, method, body in [
            (99 * ms, "POST", {"jsonrpc": "2.0", "method": long_name}),
            (100 * ms, "DELETE", None),
        ]:
            x = w.begin_exchange(
                cap,
                method=method,
                path="/mcp",
                request_headers=headers,
                started_ns=started + at,
                request_body=json.dumps(body).encode() if body else None,
            )
            w.response_head(x, status=202, headers=[], is_sse=False, ttfb_ns=1)
            w.end_exchange(x, duration_ns=1)
    svg = svg_of(await page(create_datasette(tmp_path / "edge.db"), "/edge/-/session/s1"))
    labels = re.findall(
        r'<text x="([\d.]+)" [^>]*class="tt-request-label">(?:<title>([^<]*)</title>)?([^<]+)<', svg
    )
    assert [(title, label) for _, title, label in labels] == [
        (f"#2 {long_name}", f"#2 {long_name}"[: MAX_REQUEST_LABEL - 1] + "…"),
        ("", "#3 DELETE"),
    ]
    for x, _, label in labels:
        assert float(x) + len(label) * CHAR <= WIDTH, label


async def test_other_databases_are_left_alone(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (session_id TEXT, exchange_id INTEGER, protocol TEXT)")
        conn.execute("INSERT INTO t VALUES ('s1', 1, 'openai')")
    ds = Datasette([str(other)])
    html = await page(ds, "/other/t")
    assert "tt-session" not in html and "tt-stream" not in html
    await page(ds, "/other/-/session/s1", status=404)
    await page(ds, "/other/-/stream/1", status=404)


# -- links: the index, the canned queries, render_cell -----------------------------------------


async def test_the_index_and_the_canned_queries_list_sessions_and_streams(
    ds: Datasette, log: Path, got: dict[str, Any]
) -> None:
    index = await page(ds, "/")
    assert f"href='/{DB}/mcp_sessions'" in index and f"href='/{DB}/llm_streams'" in index
    sessions = {r["session_id"]: r for r in await rows(ds, f"/{DB}/mcp_sessions.json?_shape=objects")}
    expected = {got["mcp1"]["session_id"], got["mcp1-resumed"]["session_id"], BROKEN_SESSION}
    stateless = {f"capture-{x['capture_id']}" for x in exchanges(log, protocol="mcp", session_id=None)}
    assert set(sessions) == expected | stateless
    first = sessions[got["mcp1"]["session_id"]]
    assert (first["exchanges"], first["tool_calls"], first["tools"], first["errors"]) == (
        7,
        2,
        "add,slow_count",
        0,
    )
    assert (sessions[BROKEN_SESSION]["errors"], sessions[BROKEN_SESSION]["findings"]) == (1, 1)
    html = await page(ds, f"/{DB}/mcp_sessions")
    for session in sessions:
        assert f'<a class="tt-session" href="/{DB}/-/session/{session}">{session}</a>' in html
        await page(ds, f"/{DB}/-/session/{session}")  # every link leads to a page
    streams = await rows(ds, f"/{DB}/llm_streams.json?_shape=objects")
    llm = [x for x in exchanges(log) if x["protocol"] in ("openai", "anthropic")]
    assert [s["exchange_id"] for s in streams] == [x["id"] for x in llm]
    chat = next(s for s in streams if s["call"] == "chat.completions")
    assert (chat["model"], chat["input_tokens"], chat["output_tokens"], chat["finish"]) == (
        got["chat"].model,
        got["chat"].input_tokens,
        got["chat"].output_tokens,
        "stop",
    )
    assert 0 < chat["ttft_ms"] <= chat["duration_ms"] and chat["answer"] == ANSWER
    html = await page(ds, f"/{DB}/llm_streams")
    for s in streams:
        assert f'<a class="tt-stream" href="/{DB}/-/stream/{s["exchange_id"]}">{s["exchange_id"]}</a>' in html
    assert set(QUERIES) >= {"mcp_sessions", "llm_streams"}


async def test_render_cell_links_session_ids_and_exchange_ids_by_protocol(ds: Datasette, log: Path) -> None:
    summary = await page(ds, f"/{DB}/stream_summary?_size=max")
    assert TABLES["stream_summary"]["title"] in summary
    for description in TABLES["stream_summary"]["columns"].values():
        assert str(escape(description)) in summary, description
    for x in exchanges(log):
        if x["protocol"] in ("openai", "anthropic"):
            assert f'<a class="tt-stream" href="/{DB}/-/stream/{x["id"]}">{x["id"]}</a>' in summary
        else:
            session = x["session_id"] or f"capture-{x['capture_id']}"
            link = f'<a class="tt-session" href="/{DB}/-/session/{session}#exchange-{x["id"]}">{x["id"]}</a>'
            assert link in summary
    table = await page(ds, f"/{DB}/exchanges?session_id={BROKEN_SESSION}")
    assert f'<a class="tt-session" href="/{DB}/-/session/{BROKEN_SESSION}">{BROKEN_SESSION}</a>' in table

    def cell(value: Any, column: str, table: str | None, row: Any = None) -> Any:
        return inspector.render_cell(
            row=row or {}, value=value, column=column, table=table, database=DB, datasette=ds
        )

    assert cell("a/b c", "session_id", "exchanges") == Markup(
        f'<a class="tt-session" href="/{DB}/-/session/a%2Fb%20c">a/b c</a>'
    )
    assert cell(3, "exchange_id", "stream_summary", {"protocol": "anthropic"}) == Markup(
        f'<a class="tt-stream" href="/{DB}/-/stream/3">3</a>'
    )
    assert cell(3, "exchange_id", None, {"protocol": "a2a"}) == Markup(f'<a href="/{DB}/exchanges/3">3</a>')
    (call,) = exchanges(log, session_id=BROKEN_SESSION)
    link = cell(call["id"], "exchange_id", "stream_summary", {"protocol": "mcp"})
    assert callable(link)  # Datasette awaits it: the session is looked up
    href = f"/{DB}/-/session/{BROKEN_SESSION}#exchange-{call['id']}"
    assert await link() == Markup(f'<a class="tt-session" href="{href}">{call["id"]}</a>')
    assert cell(None, "session_id", "exchanges") is None


async def test_the_session_and_stream_pages_are_read_through_their_own_links(
    ds: Datasette, log: Path
) -> None:
    """What the pages link to is there: rows, events, the canned query they came from."""
    session = exchanges(log, protocol="mcp")[0]["session_id"]
    for path in (
        f"/{DB}/-/session/{session}",
        f"/{DB}/-/stream/{exchanges(log, protocol='openai')[0]['id']}",
    ):
        html = await page(ds, path)
        for href in sorted(set(re.findall(rf'href="(/{DB}/[^"#]+)', html))):
            await page(ds, href.replace("&amp;", "&"))


async def test_the_session_and_stream_pages_have_their_data_as_json_beside_them(
    ds: Datasette, log: Path
) -> None:
    session = exchanges(log, protocol="mcp")[0]["session_id"]
    stream = exchanges(log, protocol="openai")[0]["id"]
    for path, loaded in (
        (f"/{DB}/-/session/{session}", load_session(log, session)),
        (f"/{DB}/-/stream/{stream}", load_stream(log, stream)),
    ):
        response = await ds.client.get(f"{path}.json")
        assert response.status_code == 200, path
        assert loaded is not None and response.json() == json.loads(json.dumps(asdict(loaded), default=str))
    missing = await ds.client.get(f"/{DB}/-/stream/99999.json")
    assert missing.status_code == 404 and missing.json()["error"] == f"no exchange 99999 in {DB}"


# -- the dashboards -----------------------------------------------------------------------------


async def test_the_dashboard_covers_every_protocol(ds: Datasette, log: Path) -> None:
    config = dashboards(DB)["streams"]
    database = ds.get_database(DB)
    results = {}
    for slug, chart in config["charts"].items():
        result = await database.execute(chart["query"])
        encoding = chart["display"].get("encoding", {})
        fields = {e["field"] for e in encoding.values()} | (
            {chart["display"]["field"]} if chart["library"] == "metric" else set()
        )
        assert fields <= set(result.columns), slug
        results[slug] = [dict(r) for r in result.rows]
        # What reads A2A's task views says so in its title; the rest covers every protocol.
        if re.search(r"\btask_(summary|timeline|artifacts|answers)\b", chart["query"]):
            assert "A2A" in chart["title"], slug
    sessions = {x["session_id"] or f"capture-{x['capture_id']}" for x in exchanges(log, protocol="mcp")}
    assert results["sessions"] == [{"n": len(sessions)}]
    assert results["llm_streams"] == [
        {"n": len([x for x in exchanges(log) if x["protocol"] in ("openai", "anthropic")])}
    ]
    assert {r["protocol"] for r in results["ttfe"]} >= {"mcp", "openai", "anthropic"}
    assert {r["protocol"] for r in results["gaps"]} >= {"mcp", "openai", "anthropic"}
    assert {r["protocol"] for r in results["protocol_ttfe"]} == {"mcp", "openai", "anthropic"}
    tokens = {(r["model"], r["tokens_of"]): r["tokens"] for r in results["tokens"]}
    with EventLog(log) as opened:
        summary = opened.stream_summary()
    for model in {s["model"] for s in summary if s["model"]}:
        mine = [s for s in summary if s["model"] == model]
        assert tokens[model, "output"] == sum(s["output_tokens"] or 0 for s in mine), model
    assert config["title"] in await page(ds, "/-/dashboards/streams")


# -- in a browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(browser: Path, recorded: tuple[Path, dict[str, Any], int]) -> Iterator[str]:
    """A running ``tasktape inspect`` on the log."""
    inspector_process = Served("inspect", str(recorded[0]), "--port", "0")
    try:
        yield inspector_process.wait_for_url()
    finally:
        inspector_process.stop(signal.SIGTERM)


def console(tmp_path: Path, url: str) -> tuple[str, list[str]]:
    """The DOM Chromium built for ``url``, and what the page said on its console."""
    run = chromium(tmp_path, url, "--dump-dom", "--enable-logging=stderr", "--v=0")
    return run.stdout, [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


def test_the_session_and_stream_pages_in_a_browser(
    served: str, recorded: tuple[Path, dict[str, Any], int], got: dict[str, Any], tmp_path: Path
) -> None:
    paused = recorded[2]
    # The console check sees what a page says: a script error is caught.
    _, said = console(tmp_path, "data:text/html,<script>undefinedFunction()</script>")
    assert any("undefinedFunction" in line for line in said)

    session = got["mcp1-resumed"]["session_id"]
    url = f"{served}/{DB}/-/session/{session}"
    dom, said = console(tmp_path, url)
    assert said == []
    svg = svg_of(dom)
    assert re.findall(r'class="tt-lane-title">([^<]+)<', svg)[-1] == "other requests"
    assert len(re.findall(r'class="tt-lane-title"', svg)) == 3  # add, slow_count, the others
    assert len(re.findall(r'class="tt-progress"', svg)) == 3 and 'class="tt-resumed"' in svg
    assert "/-/static-plugins/tasktape/inspector.css" in dom and "counted to 3" in dom
    png = screenshot(tmp_path, url, "inspector-session.png", 1400)
    assert len(png) > 50_000  # a page drawn, not a blank one

    url = f"{served}/{DB}/-/stream/{paused}"
    dom, said = console(tmp_path, url)
    assert said == []
    svg = svg_of(dom)
    assert len(re.findall(r'class="tt-ev tt-ev-delta"', svg)) == len(PIECES)
    assert len(re.findall(r'class="tt-gap-label"', svg)) == 1 and ANSWER in dom
    png = screenshot(tmp_path, url, "inspector-stream.png", 1600)
    assert len(png) > 50_000


def test_a_request_answered_twice_shows_its_last_answer_as_the_summary_does(tmp_path: Path) -> None:
    """An MCP server that answers a request twice breaks mcp-one-response; the session
    page shows the last answer, as stream_summary does."""
    headers = [
        ("Content-Type", "application/json"),
        ("MCP-Protocol-Version", "2025-06-18"),
        ("Mcp-Session-Id", "s1"),
    ]
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "twice", "arguments": {}}}

    def answer(text: str) -> bytes:
        result = {"content": [{"type": "text", "text": text}], "isError": False}
        return (
            b"event: message\ndata: "
            + json.dumps({"jsonrpc": "2.0", "id": 1, "result": result}).encode()
            + b"\n\n"
        )

    with LogWriter(tmp_path / "mcp.db") as w:
        x = w.begin_exchange(
            w.begin_capture(source="test"),
            method="POST",
            path="/mcp",
            request_headers=headers,
            request_body=json.dumps(call).encode(),
        )
        w.response_head(
            x,
            status=200,
            headers=[("Content-Type", "text/event-stream"), ("Mcp-Session-Id", "s1")],
            is_sse=True,
            ttfb_ns=1,
        )
        w.chunk(x, 1_000_000, answer("one"))
        w.chunk(x, 2_000_000, answer("two"))
        w.end_exchange(x, duration_ns=3_000_000).result()
    page = load_session(tmp_path / "mcp.db", "s1")
    assert page is not None and [e.answer.text for e in page.exchanges if e.answer] == ["two"]
    with EventLog(tmp_path / "mcp.db") as log:
        assert [r["answer"] for r in log.stream_summary()] == ["two"]


# -- the server's requests in a tool call's story -----------------------------------------------

SESSION_HEADERS = [
    ("Content-Type", "application/json"),
    ("MCP-Protocol-Version", "2025-11-25"),
    ("Mcp-Session-Id", "s1"),
]
MS = 1_000_000


def sse(*messages: dict[str, Any]) -> bytes:
    """SSE events as the SDK sends them: each with an id, one JSON-RPC message each."""
    return b"".join(
        f"event: message\nid: e{i}-{id(m)}\ndata: {json.dumps(m)}\n\n".encode()
        for i, m in enumerate(messages)
    )


def rpc(rpc_id: Any, **fields: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, **fields}


def tool_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": False}


@contextmanager
def mcp_session(path: Path) -> Iterator[Callable[..., None]]:
    """Writes exchanges of session s1: ``exchange(at, method, body, answers, ends)``, times
    in ms since it started, ``answers`` (at, bytes) an SSE stream's chunks or a JSON body."""
    started = time.time_ns()
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")

        def exchange(
            at: int, method: str, body: dict[str, Any] | None, answers: list[tuple[int, bytes]], ends: int
        ) -> None:
            is_sse = method == "GET" or (bool(answers) and answers[0][1].startswith(b"event:"))
            x = w.begin_exchange(
                cap,
                method=method,
                path="/mcp",
                request_headers=SESSION_HEADERS,
                request_body=json.dumps(body).encode() if body else None,
                started_ns=started + at * MS,
            )
            kind = "text/event-stream" if is_sse else "application/json"
            status = 200 if is_sse or answers else 202
            w.response_head(x, status=status, headers=[("Content-Type", kind)], is_sse=is_sse, ttfb_ns=MS)
            for offset, data in answers:
                w.chunk(x, (offset - at) * MS, data)
            w.end_exchange(x, duration_ns=(ends - at) * MS).result()

        yield exchange


def asking_session(path: Path) -> None:
    """A session shaped like the Python SDK's: ask_llm's sampling request comes on the GET
    stream (the SDK sends it there when the tool names no request it serves), ask_user's
    elicitation on the call's own POST stream, after a log message; the client answers each
    with a POST; add asks nothing. Times in ms: GET 0-100, ask_llm 20-45 (sampling at 30,
    answered at 35), ask_user 50-60 (log at 52, elicitation at 53, answered at 56), add 70."""
    sampling = rpc(
        0,
        method="sampling/createMessage",
        params={"messages": [{"role": "user", "content": {"type": "text", "text": "Write about tea"}}]},
    )
    elicitation = rpc(1, method="elicitation/create", params={"mode": "form", "message": "Favourite colour?"})
    log = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "asking"}}
    llm = rpc(3, method="tools/call", params={"name": "ask_llm", "arguments": {"topic": "tea"}})
    user = rpc(4, method="tools/call", params={"name": "ask_user", "arguments": {}})
    add = rpc(5, method="tools/call", params={"name": "add", "arguments": {"a": 2, "b": 3}})
    sampled = rpc(
        0,
        result={
            "role": "assistant",
            "content": {"type": "text", "text": "tea is good"},
            "model": "claude-x",
            "stopReason": "endTurn",
        },
    )
    with mcp_session(path) as exchange:
        exchange(0, "GET", None, [(30, sse(sampling))], 100)  # 1
        exchange(20, "POST", llm, [(45, sse(rpc(3, result=tool_result("model said: tea is good"))))], 45)  # 2
        exchange(35, "POST", sampled, [], 36)  # 3
        answered = sse(rpc(4, result=tool_result("user accept: blue")))
        exchange(50, "POST", user, [(52, sse(log)), (53, sse(elicitation)), (59, answered)], 60)  # 4
        exchange(56, "POST", rpc(1, result={"action": "accept", "content": {"color": "blue"}}), [], 57)  # 5
        exchange(70, "POST", add, [(71, json.dumps(rpc(5, result=tool_result("5"))).encode())], 71)  # 6


def call_of(html: str, exchange_id: int) -> str:
    return html.split(f'id="call-{exchange_id}"', 1)[1].split("</article>", 1)[0]


def story(call: str) -> list[tuple[str, str, str]]:
    """A call's story as listed: (what, its text, where it came)."""
    return re.findall(
        r'<span class="tt-label">([a-z ]+)</span> <span class="tt-at">at [\d,.]+ ms</span>\s*'
        r'<span>([^<]*)</span>\s*<span class="tt-where"><a [^>]*>([#\d.]+)</a>',
        call,
    )


async def test_a_tool_calls_story_has_the_requests_the_server_sent_while_it_waited(tmp_path: Path) -> None:
    """A tool that asks the user (elicitation on its POST stream) or a model (sampling, on
    the session's GET stream) waits for the client: its story lists what the server asked,
    in order with its log messages, for this call (its own stream) or during it (another
    stream, while it waited), each linked to the client's answer and when it came."""
    asking_session(tmp_path / "asking.db")
    ds = create_datasette(tmp_path / "asking.db")
    html = await page(ds, "/asking/-/session/s1")
    llm, user = call_of(html, 2), call_of(html, 4)
    assert story(llm) == [("server request", "sampling/createMessage: Write about tea", "#1.0")]
    assert "during the call, on #1 GET</span>" in llm
    assert re.search(
        r'answered by <a href="#exchange-3">#3 POST</a>\s*<span class="tt-at">at 35.0 ms</span>', llm
    )
    # The client's answers read as what they say: the sampled message, the user's action.
    assert "(5.0 ms later, 202):" in llm and "<code>tea is good (claude-x, endTurn)</code>" in llm
    assert story(user) == [
        ("log", "info: asking", "#4.0"),
        ("server request", "elicitation/create: Favourite colour?", "#4.1"),
    ]
    assert ">for this call</span>" in user and '<a href="#exchange-5">#5 POST</a>' in user
    accepted = escape('accept: {"color": "blue"}')
    assert "(3.0 ms later, 202)" in user and f"<code>{accepted}</code>" in user
    assert "server request" not in call_of(html, 6) and '<p class="tt-text">5</p>' in call_of(html, 6)
    # The table names each answer for the request it answers; the timeline marks each request.
    table = section(html, "Exchanges")
    assert "<td>response to sampling/createMessage</td>" in table
    assert "<td>response to elicitation/create</td>" in table
    assert re.findall(r'<rect [^>]*class="tt-asked"><title>([^<]*)</title>', svg_of(html)) == [
        "sampling/createMessage: Write about tea at 30.0 ms (#1.0, during the call);"
        " answered by #3 at 35.0 ms",
        "elicitation/create: Favourite colour? at 53.0 ms (#4.1, for this call); answered by #5 at 56.0 ms",
    ]
    data = json.loads(await page(ds, "/asking/-/session/s1.json"))
    asked = {
        x["id"]: [(a["method"], a["tie"], a["reply"]["exchange_id"]) for a in x["asked"]]
        for x in data["exchanges"]
    }
    assert asked[2] == [("sampling/createMessage", "during the call", 3)]
    assert asked[4] == [("elicitation/create", "for this call", 5)] and asked[6] == []


async def test_a_request_on_the_get_stream_is_for_the_call_whose_progress_token_it_names(
    tmp_path: Path,
) -> None:
    """Two calls wait at once. A server's request on the GET stream that names one's progress
    token in its _meta is that call's alone; one that names none is listed in both, as asked
    during them (nothing says which it serves)."""
    call = rpc(
        1, method="tools/call", params={"name": "a", "arguments": {}, "_meta": {"progressToken": "pa"}}
    )
    other = rpc(
        2, method="tools/call", params={"name": "b", "arguments": {}, "_meta": {"progressToken": "pb"}}
    )
    named = rpc(7, method="roots/list", params={"_meta": {"progressToken": "pb"}})
    unnamed = rpc(8, method="elicitation/create", params={"message": "Which one?"})
    with mcp_session(tmp_path / "two.db") as exchange:
        exchange(0, "GET", None, [(20, sse(named)), (30, sse(unnamed))], 100)  # 1
        exchange(10, "POST", call, [(50, sse(rpc(1, result=tool_result("a done"))))], 50)  # 2
        exchange(12, "POST", other, [(60, sse(rpc(2, result=tool_result("b done"))))], 60)  # 3
    html = await page(create_datasette(tmp_path / "two.db"), "/two/-/session/s1")
    a, b = call_of(html, 2), call_of(html, 3)
    assert story(a) == [("server request", "elicitation/create: Which one?", "#1.1")]
    assert story(b) == [
        ("server request", "roots/list", "#1.0"),
        ("server request", "elicitation/create: Which one?", "#1.1"),
    ]
    assert "for this call, on #1 GET</span>" in b and "during the call, on #1 GET</span>" in a
    assert b.count("No answer from the client was recorded.") == 2


mcp_peers, mcp_log = test_protocol_meanings.mcp_peers, test_protocol_meanings.mcp_log  # the fixtures


async def test_the_sdks_sampling_and_elicitation_are_in_their_calls_stories(
    mcp_log: tuple[Path, dict[str, Any]],
) -> None:
    """Recorded from the SDK: its sampling request comes on the GET stream while ask_llm
    waits, its elicitation on ask_user's POST stream; each is in its call's story, linked
    to the client's answer."""
    db, got = mcp_log
    assert got["ask_llm"]["text"] == "sampled: roses are red"
    with EventLog(db) as log:
        by_method: dict[str, list[dict[str, Any]]] = {}
        for x in log.exchanges():
            by_method.setdefault(x["rpc_method"], []).append(x)
    calls = {json.loads(x["request_body"])["params"]["name"]: x["id"] for x in by_method["tools/call"]}
    (get,), answers = by_method["GET"], [x["id"] for x in by_method["response"]]
    html = await page(create_datasette(db), f"/{db.stem}/-/session/{get['session_id']}")
    llm, user = call_of(html, calls["ask_llm"]), call_of(html, calls["ask_user"])
    ((what, text, where),) = story(llm)
    assert (what, text) == ("server request", "sampling/createMessage: a poem about sea")
    assert where.startswith(f"#{get['id']}.") and f"during the call, on #{get['id']} GET</span>" in llm
    assert f'<a href="#exchange-{answers[0]}">#{answers[0]} POST</a>' in llm
    ((what, text, where),) = story(user)
    assert (what, text) == ("server request", "elicitation/create: Favourite colour?")
    assert where.startswith(f"#{calls['ask_user']}.") and ">for this call</span>" in user
    assert f'<a href="#exchange-{answers[1]}">#{answers[1]} POST</a>' in user
    assert "server request" not in call_of(html, calls["chatty"])


def _mcp_call(w: LogWriter, cap: int, session: str | None, answers: bytes) -> int:
    """A tools/call of ``session`` (None: stateless) answered on its POST stream."""
    headers = [("content-type", "application/json")] + ([("mcp-session-id", session)] if session else [])
    body = rpc(1, method="tools/call", params={"name": "t", "arguments": {}, "_meta": {"progressToken": "p"}})
    x = w.begin_exchange(
        cap, method="POST", path="/mcp", request_headers=headers, request_body=json.dumps(body).encode()
    )
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    w.chunk(x, MS, answers)
    w.end_exchange(x, duration_ns=2 * MS).result()
    return x


async def test_progress_past_what_a_number_holds_is_unknown_on_the_page_and_null_in_its_json(
    tmp_path: Path,
) -> None:
    """A progress of ``1e999`` or ``NaN`` reads as infinity or NaN: JSON has no word for
    them (JSON.parse refuses Python's ``Infinity``) and a page would say inf: unknown, null."""
    progress = [
        '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":1e999,"total":-1e999}}',
        '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"p","progress":NaN,"total":3}}',
    ]
    answer = json.dumps(rpc(1, result=tool_result("ok")))
    events = "".join(f"event: message\ndata: {data}\n\n" for data in [*progress, answer]).encode()
    with LogWriter(tmp_path / "numbers.db") as w:
        _mcp_call(w, w.begin_capture(source="test"), "s", events)
    ds = create_datasette(tmp_path / "numbers.db")
    response = await ds.client.get("/numbers/-/session/s.json")
    assert response.status_code == 200

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is no JSON")

    got = json.loads(response.text, parse_constant=refuse)
    assert [(p["progress"], p["total"]) for p in got["exchanges"][0]["progress"]] == [(None, None), (None, 3)]
    html = await page(ds, "/numbers/-/session/s")
    assert re.findall(r"<li><b>([^<]*)</b>", html) == ["?", "?/3"]
    assert not re.search(r"\b(inf|nan)\b", section(html, "Tool calls"), re.I)


async def test_a_session_id_spelt_as_a_captures_stateless_session_is_named_alike_everywhere(
    tmp_path: Path,
) -> None:
    """A session whose id is ``capture-1`` takes the name capture 1's stateless exchanges
    would have: the sessions query, its page and the links to its exchanges all mean the
    session; the stateless exchange (no page of its own then) links to its row."""
    answer = sse(rpc(1, result=tool_result("ok")))
    with LogWriter(tmp_path / "named.db") as w:
        cap = w.begin_capture(source="test")
        stateless = _mcp_call(w, cap, None, answer)
        named = [_mcp_call(w, cap, f"capture-{cap}", answer) for _ in range(2)]
    ds = create_datasette(tmp_path / "named.db")
    sessions = await rows(ds, "/named/mcp_sessions.json?_shape=objects")
    assert sorted((s["session_id"] or "", s["exchanges"]) for s in sessions) == [
        ("", 1),
        (f"capture-{cap}", 2),
    ]
    got = (await ds.client.get(f"/named/-/session/capture-{cap}.json")).json()
    assert [x["id"] for x in got["exchanges"]] == named and got["capture_id"] is None
    html = await page(ds, "/named/stream_summary?_sort=exchange_id")
    links = re.findall(r'<a class="tt-session" href="([^"]+)">(\d+)</a>', html)
    assert {int(i): href for href, i in links} == {
        stateless: f"/named/exchanges/{stateless}",
        **{x: f"/named/-/session/capture-{cap}#exchange-{x}" for x in named},
    }


async def test_an_llm_stream_and_an_mcp_stream_still_coming_are_said_to_be_open(tmp_path: Path) -> None:
    """Their exchanges have no end in the log yet: the stream page says the stream is still
    coming, the session page that its GET is open."""
    path = tmp_path / "coming.db"
    delta = {"object": "chat.completion.chunk", "model": "gpt-4o-mini", "choices": [{"index": 0}]}
    deltas = [{"content": "Hi"}, {"content": " there"}]
    asked = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        llm = w.begin_exchange(
            cap, method="POST", path="/v1/chat/completions", request_body=json.dumps(asked).encode()
        )
        w.response_head(
            llm, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS
        )
        for n, d in enumerate(deltas, 1):
            chunk = {**delta, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
            w.chunk(llm, n * 100 * MS, f"data: {json.dumps(chunk)}\n\n".encode())
        get = w.begin_exchange(cap, method="GET", path="/mcp", request_headers=SESSION_HEADERS)
        w.response_head(
            get, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=MS
        )
        w.flush()
        ds = create_datasette(path)
        stream = await page(ds, f"/coming/-/stream/{llm}")
        assert "still streaming: the log holds no end of it yet" in stream
        assert "<small>still streaming: 200 ms so far</small>" in stream
        session = await page(ds, "/coming/-/session/s1")
        row = session.split(f'<tr id="exchange-{get}"')[1].split("</tr>")[0]
        assert '<td class="tt-num">still open</td>' in row and "<td>still streaming</td>" in row
        w.end_exchange(llm, duration_ns=400 * MS)
        w.end_exchange(get, duration_ns=500 * MS)
    stream = await page(ds, f"/coming/-/stream/{llm}")
    assert "still streaming" not in stream
    assert re.search(r"whole stream</span><strong>400 ms</strong>\s*</div>", stream)
    session = await page(ds, "/coming/-/session/s1")
    assert "still open" not in session and "still streaming" not in session
