"""A browser test drives the replay server through its control API: a page served from a
cassette arms "drop once", opens an EventSource, and after the automatic reconnect (with
Last-Event-ID) has seen every event exactly once. Real headless Chromium."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from conftest import Serve
from test_inspector_browser import CHROMIUM, FLAGS, browser  # noqa: F401 - the fixture

from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.replay import ReplayServer, load

MS = 1_000_000
PAGE = b"""<!doctype html><html><body><pre id="out">waiting</pre><script>
(async () => {
  await fetch("/_tasktape/faults", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({fault: "drop-after=3;times=1;path=/events"})});
  const seen = []; let opens = 0;
  const source = new EventSource("/events");
  source.onopen = () => { opens += 1; };
  source.onmessage = (e) => {
    seen.push(e.lastEventId + ":" + e.data);
    if (e.data === "last") {
      source.close();
      document.getElementById("out").textContent = "RESULT" + JSON.stringify({seen, opens}) + "END";
    }
  };
})();
</script></body></html>"""


def cassette(path: Path) -> Path:
    """The page, and a stream of 8 events with ids (the first sets a short retry)."""
    texts = [f"event {n}" for n in range(1, 8)] + ["last"]
    events = [
        f"id: {n}\n{'retry: 50' + chr(10) if n == 1 else ''}data: {text}\n\n".encode()
        for n, text in enumerate(texts, 1)
    ]
    write_cassette(
        path,
        [
            Recorded(
                method="GET",
                path="/page.html",
                status=200,
                response_headers=[("Content-Type", "text/html")],
                chunks=[(MS, PAGE)],
                outcome="complete",
            ),
            Recorded(
                method="GET",
                path="/events",
                status=200,
                response_headers=[("Content-Type", "text/event-stream"), ("Cache-Control", "no-store")],
                is_sse=True,
                chunks=[(n * 20 * MS, e) for n, e in enumerate(events, 1)],
                outcome="complete",
            ),
        ],
    )
    return path


@pytest.mark.usefixtures("browser")
async def test_an_eventsource_sees_every_event_once_after_a_drop(serve: Serve, tmp_path: Path) -> None:
    server = ReplayServer(load([cassette(tmp_path / "page.jsonl")]), speed=1.0)
    url = await serve(server.app)
    chromium = await asyncio.create_subprocess_exec(
        str(CHROMIUM),
        *FLAGS,
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        "--virtual-time-budget=10000",
        f"{url}/page.html",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        dom, _ = await asyncio.wait_for(chromium.communicate(), 120)
    finally:
        if chromium.returncode is None:
            chromium.kill()
            await chromium.wait()
    found = re.search(r"RESULT(.*)END", dom.decode())
    assert found, dom.decode()[-2000:]
    result = json.loads(found.group(1))
    assert result["seen"] == [f"{n}:event {n}" for n in range(1, 8)] + ["8:last"]
    assert result["opens"] == 2  # the drop, then the reconnect that resumed after event 3
    events = [s for s in server.report()["streams"] if s["path"] == "/events"]
    assert [s["reasons"] for s in events] == [["fault: drop-after=3"], ["resume: after event 3"]]
    assert server.armed[0].applied == 1
