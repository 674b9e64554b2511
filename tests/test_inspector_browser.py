"""The inspector in a real browser: headless Chromium loads the task page and the charts
from a running `tasktape inspect`, and the DOM it built after running the page's scripts
is checked; the layout of the task, session and stream pages is measured in it, over its
DevTools protocol. Screenshots are kept in test-artifacts/ to look at."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from a2a_frames import sse, status, streamed, task
from inspector_log import Served, page, record_log, task_of
from test_inspector import DOT_IDS, one_task_each

from tasktape.eventlog import LogWriter
from tasktape.inspector.app import create_datasette
from tasktape.inspector.axis import ELLIPSIS, LEFT
from tasktape.inspector.metadata import dashboards

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
    "--hide-scrollbars",
]


@pytest.fixture(scope="module")
def browser() -> Path:
    if not CHROMIUM.exists():
        reason = (
            f"NO BROWSER: {CHROMIUM} is missing, so the inspector was NOT tested in a browser "
            "(apt-get install chromium fonts-dejavu-core)"
        )
        if os.environ.get("TASKTAPE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"{reason}; TASKTAPE_REQUIRE_BROWSER=1 requires it", pytrace=False)
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="module")
def served(browser: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A running inspector on a demo recording (at a fifth of the demo's pace: real gaps)."""
    log = record_log(tmp_path_factory.mktemp("browser") / "demo.db", pace=0.2)
    inspector = Served("inspect", str(log), "--port", "0")
    try:
        yield inspector.wait_for_url(), log
    finally:
        inspector.stop(signal.SIGTERM)


MS = 1_000_000
WINDOW = 1400  # px: the window the pages are measured in
# One unbroken word, as a signed link is (300 characters).
SIGNED_URL = "https://storage.example.com/reports/2026/summary.pdf?X-Amz-Signature=" + "0123456789abcdef" * 14
LONG_TOOL = "search_the_entire_knowledge_base_for_documents_matching"


def _a2a_task(w: LogWriter, capture: int) -> None:
    """A task asked about the long link, its answer citing it."""
    message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": f"Summarise {SIGNED_URL}"}]}
    x = w.begin_exchange(
        capture,
        method="POST",
        path="/message:stream",
        started_ns=time.time_ns(),
        request_body=json.dumps({"message": message}).encode(),
    )
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    frames = [
        task("t.url", "c", "TASK_STATE_SUBMITTED"),
        *streamed("t.url", "c", "a", ["The report is at ", SIGNED_URL, " ."]),
        status("t.url", "c", "TASK_STATE_COMPLETED"),
    ]
    for n, data in enumerate(sse(frames), 1):
        w.chunk(x, n * MS, data)
    w.end_exchange(x, duration_ns=10 * MS)


def _llm_stream(w: LogWriter, capture: int) -> int:
    """A chat completion asked about the long link, answering with it, cut off."""
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": SIGNED_URL}]}
    x = w.begin_exchange(
        capture,
        method="POST",
        path="/v1/chat/completions",
        request_body=json.dumps(body).encode(),
        request_headers={"content-type": "application/json"},
        started_ns=time.time_ns(),
    )
    w.response_head(x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, content in enumerate(["Here: ", SIGNED_URL, " and more"], 1):
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini"}
        chunk["choices"] = [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
        w.chunk(x, n * MS, f"data: {json.dumps(chunk)}\n\n".encode())
    w.end_exchange(x, duration_ns=5 * MS, outcome="upstream_disconnected")
    return x


def _mcp_session(w: LogWriter, capture: int) -> None:
    """An MCP session whose one call, to a tool of a long name, sends and gets the long link."""
    started = time.time_ns()
    for n, (message, reply) in enumerate(
        [
            (
                {"method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}}},
                {"result": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}}},
            ),
            (
                {"method": "tools/call", "params": {"name": LONG_TOOL, "arguments": {"query": SIGNED_URL}}},
                {"result": {"content": [{"type": "text", "text": SIGNED_URL}], "isError": False}},
            ),
        ]
    ):
        headers = {"content-type": "application/json", "mcp-protocol-version": "2025-06-18"}
        x = w.begin_exchange(
            capture,
            method="POST",
            path="/mcp",
            request_headers=headers | ({"mcp-session-id": "sess-1"} if n else {}),
            request_body=json.dumps({"jsonrpc": "2.0", "id": n, **message}).encode(),
            started_ns=started + n * 10 * MS,
        )
        head = {"content-type": "application/json", "mcp-session-id": "sess-1"}
        w.response_head(x, status=200, headers=head, is_sse=False, ttfb_ns=MS)
        w.chunk(x, 2 * MS, json.dumps({"jsonrpc": "2.0", "id": n, **reply}).encode())
        w.end_exchange(x, duration_ns=5 * MS)


@pytest.fixture(scope="module")
def long_words(browser: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The task, stream and session pages of a running inspector, each showing the long link."""
    log = tmp_path_factory.mktemp("long") / "long.db"
    with LogWriter(log) as w:
        capture = w.begin_capture(source="test")
        _a2a_task(w, capture)
        stream = _llm_stream(w, capture)
        _mcp_session(w, capture)
    inspector = Served("inspect", str(log), "--port", "0")
    try:
        url = inspector.wait_for_url()
        yield {
            "task": f"{url}/long/-/task/t.url",
            "stream": f"{url}/long/-/stream/{stream}",
            "session": f"{url}/long/-/session/sess-1",
        }
    finally:
        inspector.stop(signal.SIGTERM)


class DevTools:
    """A page of Chromium driven over the DevTools protocol's websocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.sent = 0
        self.events: list[str] = []  # the methods of the events seen since the last load

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.sent += 1
        await self.ws.send_json({"id": self.sent, "method": method, "params": params})
        while True:
            message = await self.ws.receive_json()
            if message.get("id") == self.sent:
                assert "error" not in message, message
                return message["result"]
            self.events.append(message.get("method", ""))

    async def load(self, url: str) -> None:
        self.events.clear()
        await self.call("Page.navigate", url=url)
        while "Page.loadEventFired" not in self.events:
            self.events.append((await self.ws.receive_json()).get("method", ""))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"]["value"]


async def _devtools_port(profile: Path) -> int:
    """The port Chromium listens on (--remote-debugging-port=0), from the file it writes."""
    active = profile / "DevToolsActivePort"
    while not (active.exists() and active.read_text().strip()):
        await asyncio.sleep(0.05)
    return int(active.read_text().split()[0])


async def evaluated(profile: Path, urls: list[str], expression: str) -> list[Any]:
    """``expression``'s value on each of ``urls`` once loaded, in headless Chromium with a
    window WINDOW px wide."""
    chromium = await asyncio.create_subprocess_exec(
        str(CHROMIUM),
        *FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        f"--window-size={WINDOW},900",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port = await asyncio.wait_for(_devtools_port(profile), 60)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as listed:
                (tab,) = [t for t in await listed.json() if t["type"] == "page"]
            async with http.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                devtools = DevTools(ws)
                await devtools.call("Page.enable")
                values = []
                for url in urls:
                    await asyncio.wait_for(devtools.load(url), 60)
                    values.append(await devtools.evaluate(expression))
                return values
    finally:
        if chromium.returncode is None:
            chromium.kill()
        await chromium.wait()


def chromium(tmp_path: Path, url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Chromium run once on ``url``, with a profile of its own."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    return subprocess.run(
        [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", *flags, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def screenshot(tmp_path: Path, url: str, name: str, height: int, *flags: str) -> bytes:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    path.unlink(missing_ok=True)
    chromium(tmp_path, url, f"--screenshot={path}", f"--window-size=1280,{height}", *flags)
    png = path.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    size = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert size == (1280, height)
    return png


def test_the_task_page_in_a_browser(served: tuple[str, Path], tmp_path: Path) -> None:
    url, log = served
    page = f"{url}/demo/-/task/{task_of(log, 'completed')}"
    dom = chromium(tmp_path, page, "--dump-dom").stdout
    (svg,) = re.findall(r'<svg class="tt-timeline".*?</svg>', dom, re.S)
    assert len(re.findall(r"<rect [^>]*fill=", svg)) >= 38  # the event marks and artifact bands
    assert len(re.findall(r"<circle ", svg)) == 3  # SUBMITTED, WORKING, COMPLETED
    pills = re.findall(r'class="tt-pill tt-s-(\w[\w-]*)"', dom)
    assert pills[:4] == ["completed", "submitted", "working", "completed"]  # heading, state changes
    assert "About What does J45.909 mean" in dom and 'class="tt-cite"' in dom
    assert "/-/static-plugins/tasktape/inspector.css" in dom
    png = screenshot(tmp_path, page, "inspector-task.png", 1500)
    assert len(png) > 50_000  # a page drawn, not a blank one


def test_the_charts_in_a_browser(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    page = f"{url}/-/dashboards/streams"
    # The charts are drawn by scripts (Vega-Lite, bundled): give them time to fetch and draw.
    dom = chromium(tmp_path, page, "--dump-dom", "--virtual-time-budget=10000").stdout
    charts = dashboards("demo")["streams"]["charts"]
    for slug, chart in charts.items():
        body = dom.split(f'id="chart-{slug}"', 1)[1].split('class="dashboard-card"', 1)[0]
        if chart["library"] == "vega-lite":
            assert re.search(r"<canvas|<svg", body), f"chart {slug} was not drawn"
        else:
            assert re.search(r"<p[^>]*>[\d.]+</p>", body), f"metric {slug} shows no figure"
    assert "Streams at a glance" in dom
    screenshot(tmp_path, page, "inspector-charts.png", 1100, "--virtual-time-budget=10000")


def test_a_task_named_dot_dot_opens_from_its_link_in_a_browser(browser: Path, tmp_path: Path) -> None:
    """Chromium resolves ``/-/task/..`` and ``/-/task/%2E%2E`` to ``/-/`` before it asks: the
    link the tasks listing gives the task ``..`` opens that task's page."""
    log = one_task_each(tmp_path / "dots.db", DOT_IDS)
    listing = asyncio.run(page(create_datasette(log), "/dots/task_summary"))
    (href,) = re.findall(r'<a class="tt-task" href="([^"]+)">\.\.</a>', listing)
    inspector = Served("inspect", str(log), "--port", "0")
    try:
        dom = chromium(tmp_path, inspector.wait_for_url() + href, "--dump-dom").stdout
    finally:
        inspector.stop(signal.SIGTERM)
    assert "<h1>Task <code>..</code></h1>" in dom


def test_a_log_named_as_markup_runs_no_script_in_a_browser(browser: Path, tmp_path: Path) -> None:
    """Datasette writes the served name unescaped into its foreign keys' links: a log named
    as it is below ran its handler on the events page, once the image failed to load."""
    log = one_task_each(
        tmp_path / "x\"><img src=x onerror=document.body.setAttribute('data-pwned',1)>.db", ["t"]
    )
    inspector = Served("inspect", str(log), "--port", "0")
    try:
        inspector.wait_for_url()
        (queries,) = re.findall(r"^  queries  (\S+)$", inspector.out, re.M)
        dom = chromium(tmp_path, f"{queries}/events", "--dump-dom", "--virtual-time-budget=3000").stdout
    finally:
        inspector.stop(signal.SIGTERM)
    (body,) = re.findall(r"<body[^>]*>", dom)
    assert 'data-pwned="1"' not in body and "/exchanges/1" in dom, body


async def test_a_long_unbroken_word_wraps_within_the_window(
    long_words: dict[str, str], tmp_path: Path
) -> None:
    """A 300-character link in the question, the answer, a tool's arguments and result, the
    events table: each page stays as wide as the window (it was 2,564 px wide, the
    stream's 21,043 px, the session's 16,192 px)."""
    expression = (
        "[document.documentElement.scrollWidth, window.innerWidth,"
        f" document.body.textContent.includes({json.dumps(SIGNED_URL)})]"
    )
    measured = await evaluated(tmp_path / "profile", list(long_words.values()), expression)
    for name, (width, window, shown) in zip(long_words, measured, strict=True):
        assert shown and window == WINDOW and width <= window, (name, width)


async def test_lane_labels_end_left_of_the_plot_in_a_browser(
    long_words: dict[str, str], tmp_path: Path
) -> None:
    """A long tool name, a long detail line: each cut with an ellipsis where the plot
    starts (they ran on to x=226 and 222, past LEFT=214)."""
    expression = """[...document.querySelectorAll(
        'svg.tt-timeline .tt-lane-title, svg.tt-timeline .tt-lane-detail')].map(
        (text) => [text.lastChild.textContent, text.getBBox().x + text.getBBox().width])"""
    urls = [long_words["stream"], long_words["session"]]
    stream, session = await evaluated(tmp_path / "profile", urls, expression)
    for shown, right in stream + session:
        assert right <= LEFT, (shown, right)
    cut = [shown for shown, _ in stream + session if shown.endswith(ELLIPSIS)]
    assert len(cut) == 2 and cut[0].startswith("openai · 200 · upstream") and LONG_TOOL[:12] in cut[1]
