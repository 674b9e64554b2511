"""The resume gateway with a browser for its client: headless Chromium loads a page (served
by the agent, through the gateway, so that the page and the streams share an origin) whose
script follows a task's stream and drops it.

- A fetch() reader (which can send Last-Event-ID itself) drops at seeded byte counts, mid-
  event too, and comes back with the last id it saw: the same request again, or
  ``tasks/{id}:subscribe`` (``SubscribeToTask`` on JSON-RPC), on both bindings.
- An ``EventSource`` (which can only GET) follows ``tasks/{id}:subscribe``; the cutter
  between the browser and the gateway breaks its connection at seeded byte counts, and the
  browser reconnects by itself, with Last-Event-ID.

Both check what the browser got against the agent's stream in the log, as
test_gateway_invariants does for httpx-sse.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import RecordFactory
from cutter import Cut, Cutter, Relayed
from test_gateway_invariants import (
    BINDINGS,
    HOLD,
    REJOIN_FOR,
    Leg,
    Peer,
    Received,
    check,
    seed_of,
    split,
    truth,
)
from test_inspector_browser import CHROMIUM, FLAGS, browser  # noqa: F401 - the fixture

from tasktape.agent import create_agent_app
from tasktape.agent.app import STORE

PAGE = """<!doctype html><html><body><script>
const params = new URLSearchParams(location.search);
const show = (result) => fetch("/report", {method: "POST", body: JSON.stringify(result)});
const message = {messageId: "m1", role: "ROLE_USER", parts: [{text: "What does J45.909 mean?"}]};
const concat = (a, b) => {
  const c = new Uint8Array(a.length + b.length);
  c.set(a);
  c.set(b, a.length);
  return c;
};
// Offsets just past each complete event (the agent's line ends are LFs; data is one line of JSON).
const eventEnds = (bytes) => {
  const ends = [];
  for (let i = 1; i < bytes.length; i++) if (bytes[i] === 10 && bytes[i - 1] === 10) ends.push(i + 1);
  return ends;
};
const frameOf = (text) => JSON.parse(/^data: (.*)$/m.exec(text)[1]);

async function fetchReader() {
  const binding = params.get("binding");
  const drops = params.get("drops").split(",").map(Number);
  const legs = [];
  let lastId = null, taskId = null;
  for (let n = 0; n < 30; n++) {
    const budget = n < drops.length ? drops[n] : -1;
    const how = n === 0 ? "start" : (n % 2 ? "again" : "subscribe");
    const headers = {"A2A-Version": "1.0"};
    if (lastId) headers["Last-Event-ID"] = lastId;
    let method = "POST", url = "/message:stream", body = null, rpcId = null;
    if (binding === "rest") {
      if (how === "subscribe") { method = "GET"; url = `/tasks/${taskId}:subscribe`; }
      else body = JSON.stringify({message});
    } else {
      url = "/jsonrpc";
      rpcId = n === 0 ? 1 : (how === "subscribe" ? `s${n}` : `r${n}`);
      body = JSON.stringify(how === "subscribe"
        ? {jsonrpc: "2.0", id: rpcId, method: "SubscribeToTask", params: {id: taskId}}
        : {jsonrpc: "2.0", id: rpcId, method: "SendStreamingMessage", params: {message}});
    }
    if (body) headers["Content-Type"] = "application/json";
    const rpcMethod = body && binding !== "rest" ? " " + JSON.parse(body).method : "";
    const leg = {request: `${method} ${url}${rpcMethod}`, lastEventId: lastId, rpcId, drop: budget,
                 status: null, end: "", events: []};
    legs.push(leg);
    const controller = new AbortController();
    let bytes = new Uint8Array(0);
    try {
      const signal = controller.signal;
      const response = await fetch(url, {method, headers, body, signal, cache: "no-store"});
      leg.status = response.status;
      const reader = response.body.getReader();
      let cutAt = null;
      while (true) {
        const {done, value} = await reader.read();
        if (done) { leg.end = "complete"; break; }
        bytes = concat(bytes, value);
        if (budget >= 0 && cutAt === null) {
          if (n > 0) cutAt = budget;
          else { const ends = eventEnds(bytes); if (ends.length) cutAt = ends[0] + budget; }
        }
        if (cutAt !== null && bytes.length > cutAt) {
          bytes = bytes.slice(0, cutAt);
          controller.abort();
          leg.end = `dropped: after ${cutAt} bytes`;
          break;
        }
      }
    } catch (e) {
      leg.end = "broken: " + e;
    }
    let start = 0;
    for (const end of eventEnds(bytes)) {
      leg.events.push(new TextDecoder().decode(bytes.slice(start, end)));
      start = end;
    }
    if (leg.events.length) {
      lastId = /^id: (.*)$/m.exec(leg.events[leg.events.length - 1])[1];
      if (!taskId) { const frame = frameOf(leg.events[0]); taskId = (frame.result || frame).task.id; }
    }
    if (leg.end === "complete" || leg.status !== 200 || !lastId) break;
  }
  show({legs, taskId});
}

async function eventSource(closeAtEnd) {
  // Start the task, and let go of its stream after its first event.
  const controller = new AbortController();
  const response = await fetch("/message:stream", {method: "POST", signal: controller.signal,
    headers: {"A2A-Version": "1.0", "Content-Type": "application/json"}, body: JSON.stringify({message})});
  const reader = response.body.getReader();
  let bytes = new Uint8Array(0);
  while (!eventEnds(bytes).length) {
    const {done, value} = await reader.read();
    if (done) break;
    bytes = concat(bytes, value);
  }
  controller.abort();
  const taskId = frameOf(new TextDecoder().decode(bytes.slice(0, eventEnds(bytes)[0]))).task.id;
  const seen = [];
  let opens = 0, errors = 0, ended = false, errorsAfterEnd = 0;
  const source = new EventSource(`/tasks/${taskId}:subscribe`);
  source.onopen = () => { opens += 1; };
  source.onerror = () => {
    errors += 1;
    if (!ended) return;
    // Left open past its end, the browser comes back with the last id: told the stream
    // ended, it closes; else it would keep coming back.
    if (source.readyState === EventSource.CLOSED) show({taskId, seen, opens, errors, closed: true});
    else if (++errorsAfterEnd > 2) { source.close(); show({taskId, seen, opens, errors, closed: false}); }
  };
  source.onmessage = (e) => {
    seen.push({id: e.lastEventId, data: e.data});
    const frame = JSON.parse(e.data);
    const body = frame.statusUpdate || frame.task;
    if (body && body.status.state === "TASK_STATE_COMPLETED") {
      ended = true;
      if (closeAtEnd) {
        source.close();
        show({taskId, seen, opens, errors});
      }
    }
  };
}

const mode = params.get("mode");
(mode === "fetch" ? fetchReader() : eventSource(mode !== "es-open")).catch((e) => show({error: String(e)}));
</script></body></html>"""


@dataclass
class Agent:
    """tasktape agent, serving the page and taking its report too."""

    app: web.Application
    seen: list[str]  # the requests that reached it ("POST /jsonrpc SendStreamingMessage")
    reported: asyncio.Future[Any]  # what the page reported once its script was done


def agent_app(pace: float) -> Agent:
    app = create_agent_app(pace=pace)
    agent = Agent(app, [], asyncio.get_running_loop().create_future())

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def report(request: web.Request) -> web.Response:
        if not agent.reported.done():
            agent.reported.set_result(await request.json())
        return web.Response(text="thanks")

    async def count(request: web.Request, _response: web.StreamResponse) -> None:
        body = await request.read() if request.body_exists else b""
        method = re.search(rb'"method":\s*"(\w+)"', body)
        agent.seen.append(
            f"{request.method} {request.path}" + (f" {method.group(1).decode()}" if method else "")
        )

    app.router.add_get("/page.html", page)
    app.router.add_post("/report", report)
    app.on_response_prepare.append(count)
    return agent


async def in_chromium(agent: Agent, url: str, profile: Path) -> dict[str, Any]:
    """What the page reported once its script was done. (In real time: under
    --virtual-time-budget, a fetch() reader's stream may never be seen to end.)"""
    chromium = await asyncio.create_subprocess_exec(
        str(CHROMIUM),
        *FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",  # keeps the browser running until it is stopped
        url,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        result = await asyncio.wait_for(asyncio.shield(agent.reported), 90)
    finally:
        if chromium.returncode is None:
            chromium.kill()
        await chromium.wait()
    assert "error" not in result, result
    return result


@pytest.mark.usefixtures("browser")
@pytest.mark.parametrize("n", range(2))
@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_fetch_reader_that_drops_gets_every_event_once(
    record: RecordFactory, tmp_path: Path, binding: str, n: int
) -> None:
    seed = seed_of(7, 2 * BINDINGS.index(binding) + n)
    rng = random.Random(seed)
    drops = [rng.randint(0, 4000)] + [rng.randint(0, 4000) for _ in range(rng.randint(1, 3))]
    host = agent_app(pace=0.3)
    rec = await record(host.app, hold=HOLD, rejoin_for=REJOIN_FOR)
    agent = Peer("tasktape", rec.upstream, "/jsonrpc", "What does J45.909 mean?", host.app[STORE])
    drops_arg = ",".join(map(str, drops))
    result = await in_chromium(
        host, f"{rec.url}/page.html?mode=fetch&binding={binding}&drops={drops_arg}", tmp_path / "profile"
    )
    received = Received(seed, binding, task_id=result["taskId"])
    for leg in result["legs"]:
        events = [split(text.encode())[0][0] for text in leg["events"]]
        received.legs.append(
            Leg(
                leg["request"],
                leg["lastEventId"],
                leg["rpcId"],
                str(leg["drop"]),
                leg["status"],
                b"",
                events,
                leg["end"],
            )
        )
    received.ended = "complete" if received.legs[-1].end == "complete" else received.legs[-1].end
    assert sum(leg.end.startswith("dropped") for leg in received.legs) >= 1, (
        f"seed {seed}: {received.story()}"
    )
    found = await truth(rec, agent, received)
    check(received, found, binding, rejoins=False)
    start = "POST /message:stream" if binding == "rest" else "POST /jsonrpc SendStreamingMessage"
    assert host.seen.count(start) == 1, f"seed {seed}: the agent saw {host.seen}"
    assert not [s for s in host.seen if "ubscribe" in s], (
        f"seed {seed}: a reconnect reached the agent: {host.seen}"
    )


@pytest.mark.usefixtures("browser")
@pytest.mark.parametrize("n", range(2))
async def test_an_eventsource_cut_off_reconnects_and_gets_every_event_once(
    record: RecordFactory, tmp_path: Path, n: int
) -> None:
    seed = seed_of(8, n)
    host = agent_app(pace=0.5)
    rec = await record(host.app, hold=HOLD, rejoin_for=REJOIN_FOR)
    cuts = 0

    def plan(request: Relayed, rng: random.Random) -> Cut | None:
        nonlocal cuts
        if not request.path.endswith(":subscribe") or cuts >= 2:  # each costs a 3 s wait
            return None
        cuts += 1
        if cuts == 1:  # after the first event: the browser has an id to come back with
            return Cut(rng.randint(0, 3000), rng.choice(("rst", "close")), b"\n\n")
        return Cut(rng.randint(0, 3000), rng.choice(("rst", "close")))

    async with Cutter(rec.url, plan, seed=seed) as front:
        result = await in_chromium(host, f"{front.url}/page.html?mode=es", tmp_path / "profile")
    made = len(front.cuts())
    assert made >= 1, f"seed {seed}: the browser's stream was never cut"
    with await rec.log() as log:
        subscribes = [
            x
            for x in log.exchanges()
            if x["path"] == f"/tasks/{result['taskId']}:subscribe"
            and "last-event-id" not in x["request_headers"].lower()
        ]
        assert len(subscribes) == 1, f"seed {seed}: {len(subscribes)} subscribes went to the agent"
        blocks, tail = split(log.body(subscribes[0]["id"]))
        reconnects = [x for x in log.exchanges() if "last-event-id" in (x["request_headers"] or "").lower()]
    assert not tail, f"seed {seed}: the agent's subscribe was cut off"
    want = [{"id": b.id, "data": b.data} for b in blocks]
    assert result["seen"] == want, (
        f"seed {seed}: the EventSource got {[s['id'] for s in result['seen']]}, the agent sent "
        f"{[w['id'] for w in want]} ({made} cuts, {result['opens']} opens)"
    )
    # Each cut but one that came after the last event (the page had closed) made a reconnect.
    assert (
        reconnects
        and result["opens"] == len(reconnects) + 1
        and made in (len(reconnects), len(reconnects) + 1)
    ), f"seed {seed}: {made} cuts, {result['opens']} opens, {len(reconnects)} reconnects in the log"
    assert host.seen.count("POST /message:stream") == 1, f"seed {seed}: {host.seen}"
    assert host.seen.count(f"GET /tasks/{result['taskId']}:subscribe") == 1, f"seed {seed}: {host.seen}"


@pytest.mark.usefixtures("browser")
async def test_an_eventsource_left_open_past_the_end_is_told_it_ended(
    record: RecordFactory, tmp_path: Path
) -> None:
    host = agent_app(pace=0.05)
    rec = await record(host.app, hold=HOLD, rejoin_for=REJOIN_FOR)
    result = await in_chromium(host, f"{rec.url}/page.html?mode=es-open", tmp_path / "profile")
    # It came back once, after the last event, and was answered with a 204: it stopped.
    assert result["closed"] and result["opens"] == 1, result
    with await rec.log() as log:
        resumes = [(r["outcome"], r["last_event_id"]) for r in log.db["resumes"].rows]
    assert resumes == [("ended", result["seen"][-1]["id"])]
    assert host.seen.count(f"GET /tasks/{result['taskId']}:subscribe") == 1, host.seen
