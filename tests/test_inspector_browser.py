"""The inspector in a real browser: headless Chromium loads the task page and the charts
from a running `tasktape inspect`, and the DOM it built after running the page's scripts
is checked. Screenshots are kept in test-artifacts/ to look at."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from inspector_log import Served, page, record_log, task_of
from test_inspector import DOT_IDS, one_task_each

from tasktape.inspector.app import create_datasette
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
