"""Replaying MCP to the official mcp 1.x client: progress notifications carry the client's
progress token, a dropped tool-call stream resumes with a GET, a miss lists the nearest
recordings, an injected error status leaves its recording for the SDK's retry, a sampling
request on the GET stream goes out with its call, and sessions at once each get their own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from conftest import RecordFactory, Serve
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_peers import run_mcp_server

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.replay import Faults, ReplayServer, load
from tasktape.replay.modes import ReplayMode

TIMEOUT = 20  # s: a client the replay leaves waiting fails the test instead of hanging it
Call = Callable[[ClientSession], Awaitable[Any]]


async def add(session: ClientSession) -> str:
    result = await session.call_tool("add", {"a": 2, "b": 3})
    return result.content[0].text  # type: ignore[union-attr]


async def count(session: ClientSession) -> tuple[str, list[tuple[float, str | None]]]:
    progress: list[tuple[float, str | None]] = []

    async def seen(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    result = await session.call_tool("slow_count", {"n": 3, "delay": 0.05}, progress_callback=seen)
    return result.content[0].text, progress  # type: ignore[union-attr]


async def run(url: str, *calls: Call) -> list[Any]:
    """What each call got, in one session of the SDK's client."""

    async def session() -> list[Any]:
        async with streamable_http_client(url) as (read, write, _), ClientSession(read, write) as s:
            await s.initialize()
            return [await call(s) for call in calls]

    return await asyncio.wait_for(session(), TIMEOUT)


async def recorded(
    record: RecordFactory, *server_args: str, calls: tuple[Call, ...]
) -> tuple[list[Any], Path]:
    with run_mcp_server(*server_args, sdk="1") as server:
        rec = await record(server.url.removesuffix("/mcp"))
        got = await run(f"{rec.url}/mcp", *calls)
        (await rec.log()).close()  # every exchange committed
    return got, rec.db


async def test_progress_carries_the_token_of_the_call_at_hand(record: RecordFactory, serve: Serve) -> None:
    # The SDK's progress token is the request id: called in another order, the tool call has another.
    (_, counted), db = await recorded(record, calls=(add, count))
    assert len(counted[1]) == 3
    replay = ReplayServer(load([db]), speed=0)
    url = await serve(replay.app)
    counted_again, added = await run(f"{url}/mcp", count, add)
    assert (counted_again, added) == (counted, "5")
    # The report names the token's rewrite beside the id's.
    (reasons,) = [s["reasons"] for s in replay.report()["streams"] if len(s["reasons"]) > 1]
    old, new = reasons[0].removeprefix("rewrite: the JSON-RPC id ").split(" is ")
    assert old != new
    assert reasons == [
        f"rewrite: the JSON-RPC id {old} is {new}",
        f"rewrite: the progress token {old} is {new}",
    ]


@pytest.mark.parametrize("add_ids", [False, True], ids=["event-store", "add-ids"])
async def test_a_dropped_tool_call_stream_resumes(record: RecordFactory, serve: Serve, add_ids: bool) -> None:
    # With an event store the server gives the ids; without, the replay adds them.
    store = () if add_ids else ("--event-store",)
    # Called in another order: the rest of the stream answers the call's id of this run.
    (_, counted), db = await recorded(record, *store, calls=(add, count))
    faults = Faults.parse("drop-after=3;times=1;path=/mcp")
    replay = ReplayServer(load([db]), speed=0, faults=faults, add_ids=add_ids)
    url = await serve(replay.app)
    assert await run(f"{url}/mcp", count, add) == [counted, "5"]
    assert replay.stats.refused == []
    streams = replay.report()["streams"]
    (dropped,) = [s for s in streams if s["faults"] == ["drop-after=3"]]
    (resumed,) = [s for s in streams if any(r.startswith("resume: after event") for r in s["reasons"])]
    assert (dropped["method"], resumed["method"], resumed["exchange"]) == ("POST", "GET", dropped["exchange"])


def mcp_post(body: dict[str, Any], answer: dict[str, Any]) -> Recorded:
    return Recorded(
        method="POST",
        path="/mcp",
        request_headers=[("Content-Type", "application/json"), ("Mcp-Session-Id", "s1")],
        request_body=json.dumps(body).encode(),
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(0, json.dumps(answer).encode())],
        outcome="complete",
    )


def rpc(rpc_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}


async def test_a_miss_lists_the_nearest_recordings_first(tmp_path: Path, serve: Serve) -> None:
    asks = [
        rpc(1, "tools/call", {"name": "add", "arguments": {"a": 1, "b": 2}}),
        rpc(2, "tools/list", {}),
        rpc(3, "tools/call", {"name": "slow_count", "arguments": {"n": 3, "delay": 0.1}}),
        rpc(4, "prompts/get", {"name": "greet", "arguments": {"who": "x"}}),
        rpc(5, "resources/read", {"uri": "data://greeting"}),
    ]
    write_cassette(
        tmp_path / "c.jsonl", [mcp_post(a, {"jsonrpc": "2.0", "id": a["id"], "result": {}}) for a in asks]
    )
    replay = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0)
    url = await serve(replay.app)
    async with aiohttp.ClientSession() as http:
        ask = rpc(9, "resources/read", {"uri": "data://farewell"})
        async with http.post(f"{url}/mcp", json=ask, headers={"Mcp-Session-Id": "s1"}) as response:
            assert response.status == 400
            closest = (await response.json())["error"]["data"]["closest"]
    assert closest[0]["differs"] == ['body differs at /params/uri ("data://farewell" vs "data://greeting")']


async def test_a_retry_after_an_injected_status_gets_the_recording(tmp_path: Path, serve: Serve) -> None:
    ask = rpc(1, "tools/list", {})
    write_cassette(
        tmp_path / "c.jsonl", [mcp_post(ask, {"jsonrpc": "2.0", "id": 1, "result": {"tools": []}})]
    )
    replay = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0, faults=Faults.parse("status=500;times=1"))
    url = await serve(replay.app)
    statuses = []
    async with aiohttp.ClientSession() as http:
        for _ in range(2):  # a client retrying an error status, as the SDKs do
            async with http.post(f"{url}/mcp", json=ask, headers={"Mcp-Session-Id": "s1"}) as response:
                statuses.append((response.status, await response.read()))
    assert statuses[0][0] == 500
    assert statuses[1] == (200, replay.recorded[0].body)
    assert replay.stats.missed == [] and replay.unused() == []


async def test_a_stream_the_server_closed_early_is_taken_up_from_the_upstream(
    tmp_path: Path, serve: Serve
) -> None:
    """An MCP server closes a tool call's stream after its first progress (SEP-1699), and
    the client resumes with a GET after that event. Recording misses, the replay found the
    closed stream holding the event and answered its rest, nothing: the client asked again
    for ever. Its rest was never recorded: the GET goes to the server, and is recorded."""
    db = tmp_path / "grows.db"
    args = ("--event-store", "--retry-ms", "100", "--close-stream-after", "1")
    with run_mcp_server(*args, sdk="1") as mcp_server, LogWriter(db) as writer:
        replay = ReplayServer(
            [],
            speed=0,
            mode=ReplayMode.RECORD_MISSING,
            upstream=mcp_server.url.removesuffix("/mcp"),
            writer=writer,
            log_path=db,
        )
        url = await serve(replay.app)
        (answer, progress), added = await run(f"{url}/mcp", count, add)
    assert (answer, [done for done, _ in progress], added) == ("counted to 3", [1.0, 2.0, 3.0], "5")
    with EventLog(db) as log:
        gets = [x for x in log.exchanges() if x["method"] == "GET"]
        resumed = [x for x in gets if "last-event-id" in x["request_headers"].lower()]  # (as sent)
    assert resumed and all(x["status"] == 200 for x in resumed)
    # Replayed from what was recorded, the same session runs through, nothing missed.
    again = ReplayServer(load([db]), speed=0)
    url = await serve(again.app)
    assert await run(f"{url}/mcp", count, add) == [(answer, progress), "5"]
    assert again.stats.missed == []


async def test_a_resume_after_a_stream_closed_early_without_its_rest_is_a_miss(
    tmp_path: Path, serve: Serve
) -> None:
    """A cassette with the tool call's stream closed early, and no recording of the GET
    that took it up: the GET is a miss, said as one, not an empty rest served as matched."""
    call = rpc(3, "tools/call", {"name": "slow_count", "arguments": {"n": 3, "delay": 0.1}})
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 3, "progress": 1},
    }
    closed = Recorded(
        method="POST",
        path="/mcp",
        request_headers=[("Content-Type", "application/json"), ("Mcp-Session-Id", "s1")],
        request_body=json.dumps(call).encode(),
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(0, b"id: e0\ndata: \n\n"), (1000, f"id: e1\ndata: {json.dumps(progress)}\n\n".encode())],
        outcome="complete",
    )
    write_cassette(tmp_path / "c.jsonl", [closed])
    replay = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0)
    url = await serve(replay.app)
    headers = {"Mcp-Session-Id": "s1", "Accept": "text/event-stream", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/mcp", data=json.dumps(call), headers=headers) as r:
            assert r.status == 200 and b"e1" in await r.read()
        async with http.get(f"{url}/mcp", headers={**headers, "Last-Event-ID": "e1"}) as r:
            assert r.status == 400
            (nearest, *_) = (await r.json())["error"]["closest"]
    assert nearest["differs"] == [
        "its stream ends at event e1, before its answer: what came after (the request resuming it) "
        "was not recorded"
    ]
    assert [m.request for m in replay.stats.missed] == ["GET /mcp"] and replay.stats.served == 1


def counting(n: int, delay: float) -> Call:
    """A slow_count call: its result and the progress messages its callback got."""

    async def call(session: ClientSession) -> tuple[str, list[str | None]]:
        progress: list[str | None] = []

        async def seen(done: float, total: float | None, message: str | None) -> None:
            progress.append(message)

        result = await session.call_tool("slow_count", {"n": n, "delay": delay}, progress_callback=seen)
        return result.content[0].text, progress  # type: ignore[union-attr]

    return call


async def together(url: str, first: Call, second: Call) -> list[Any]:
    """Two calls under way at once in one session: the second sent once the first was."""

    async def session() -> list[Any]:
        async with streamable_http_client(url) as (read, write, _), ClientSession(read, write) as s:
            await s.initialize()
            started = asyncio.create_task(first(s))
            await asyncio.sleep(0.05)
            return [await second(s), await started]

    return await asyncio.wait_for(session(), TIMEOUT)


async def test_a_resumed_stream_answers_the_call_of_this_run(record: RecordFactory, serve: Serve) -> None:
    """Two tool calls whose streams the server closes after their first progress, each
    resumed with a GET; replayed in the other order, the ids and progress tokens swap: the
    resuming GETs carry the ids this run gave, as the POSTs they resume do."""
    three, two = counting(3, 0.15), counting(2, 0.1)
    args = ("--event-store", "--retry-ms", "100", "--close-stream-after", "1")
    with run_mcp_server(*args, sdk="1") as server:
        rec = await record(server.url.removesuffix("/mcp"))
        got_two, got_three = await together(f"{rec.url}/mcp", three, two)
        (await rec.log()).close()  # every exchange committed
    assert got_three == ("counted to 3", ["counted 1 of 3", "counted 2 of 3", "counted 3 of 3"])
    assert got_two == ("counted to 2", ["counted 1 of 2", "counted 2 of 2"])
    replay = ReplayServer(load([rec.db]), speed=1)
    url = await serve(replay.app)
    assert await together(f"{url}/mcp", two, three) == [got_three, got_two]
    assert (replay.stats.missed, replay.stats.refused) == ([], [])
    rewritten = [s for s in replay.report()["streams"] if s["method"] == "GET" and s["reasons"]]
    assert len(rewritten) == 2
    for stream in rewritten:
        assert any(r.startswith("rewrite: the progress token") for r in stream["reasons"]), stream


@pytest.mark.parametrize(
    ("events", "said"),
    [
        (b"", "the recorded stream carried no events"),
        (
            b'data: {"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n\n',
            "this stream was recorded without event ids: replay with add_ids (--add-ids) to resume it",
        ),
    ],
    ids=["no-events", "no-ids"],
)
async def test_a_refused_resume_of_the_get_stream_says_what_it_carried(
    tmp_path: Path, serve: Serve, events: bytes, said: str
) -> None:
    """The session's GET stream, recorded until the client left: a Last-Event-ID it cannot
    hold is refused saying why, no events at all being other than events without ids."""
    standing = Recorded(
        method="GET",
        path="/mcp",
        request_headers=[("Accept", "text/event-stream"), ("Mcp-Session-Id", "s1")],
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(0, events)] if events else [],
        outcome="client_disconnected",
    )
    write_cassette(tmp_path / "c.jsonl", [standing])
    replay = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0)
    url = await serve(replay.app)
    headers = {"Mcp-Session-Id": "s1", "Accept": "text/event-stream", "Last-Event-ID": "nope"}
    async with aiohttp.ClientSession() as http, http.get(f"{url}/mcp", headers=headers) as r:
        assert r.status == 400
        message = (await r.json())["error"]["message"]
    assert message == (
        "Last-Event-ID 'nope' names no event of the recorded stream (GET /mcp, c.jsonl:2); " + said
    )


class Sampler:
    """A client's sampling callback: answers ``<tag>: <question>``, noting each question."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.asked: list[str] = []

    async def __call__(
        self, context: Any, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        question = params.messages[-1].content.text  # type: ignore[union-attr]
        self.asked.append(question)
        answer = types.TextContent(type="text", text=f"{self.tag}: {question}")
        return types.CreateMessageResult(role="assistant", content=answer, model="m")


def sampling(q: str) -> Call:
    async def call(session: ClientSession) -> str:
        result = await session.call_tool("sample", {"q": q})
        return result.content[0].text  # type: ignore[union-attr]

    return call


@dataclass
class Sessions:
    """What a client saw of its session: the id it was given, and the session id each answer
    named (``Mcp-Session-Id``), after the request's JSON-RPC method (or HTTP method)."""

    given: str | None = None
    answers: list[tuple[str, str | None]] = field(default_factory=list)

    async def answered(self, response: httpx.Response) -> None:
        body = json.loads(response.request.content or b"null")
        method = body.get("method", "reply") if isinstance(body, dict) else response.request.method
        self.answers.append((method, response.headers.get("Mcp-Session-Id")))


async def sampled(
    url: str, sampler: Sampler, *calls: Call, wait: float = 0.0, seen: Sessions | None = None
) -> list[Any]:
    """What each call got, in one session of the SDK's client that samples with ``sampler``,
    started ``wait`` seconds late."""
    seen = seen or Sessions()

    async def session() -> list[Any]:
        await asyncio.sleep(wait)
        hooks = {"response": [seen.answered]}
        async with (
            create_mcp_http_client() as http,
            streamable_http_client(url, http_client=http) as (read, write, given),
            ClientSession(read, write, sampling_callback=sampler) as s,
        ):
            http.event_hooks = hooks
            await s.initialize()
            seen.given = given()
            return [await call(s) for call in calls]

    return await asyncio.wait_for(session(), TIMEOUT)


async def ended_get(replay: ReplayServer) -> dict[str, Any]:
    """The report of the GET stream, once it has ended (it ends as its client leaves)."""
    while (report := replay.report())["under_way"]:
        await asyncio.sleep(0.05)
    (stream,) = [s for s in report["streams"] if s["method"] == "GET"]
    return stream


async def test_a_sampling_request_on_the_get_stream_goes_out_with_its_call(
    record: RecordFactory, serve: Serve
) -> None:
    """mcp 1.x sends a tool's sampling request on the session's GET stream: replayed, the
    client is asked when it makes that call, and only then."""
    with run_mcp_server(sdk="1") as server:
        rec = await record(server.url.removesuffix("/mcp"))
        live = Sampler("model")
        got = await sampled(f"{rec.url}/mcp", live, count, sampling("hi"))
        (await rec.log()).close()  # every exchange committed
    assert (got[1], live.asked) == ("sampled: model: hi", ["hi"])
    # Never made, the call's request is never sent; the report names it held back.
    replay = ReplayServer(load([rec.db]), speed=0, every_answer=True)
    url = await serve(replay.app)
    counting_only = Sampler("model")
    assert await sampled(f"{url}/mcp", counting_only, count) == [got[0]]
    assert counting_only.asked == []
    stream = await asyncio.wait_for(ended_get(replay), TIMEOUT)
    assert not stream["identical"]
    assert any(
        r.startswith("rewrite: held back: sampling/createMessage (its event 1), sent during tools/call")
        for r in stream["reasons"]
    ), stream
    # Made alone, at the recorded pace, it is asked, and its answer is the one recorded.
    replay = ReplayServer(load([rec.db]), speed=1)
    url = await serve(replay.app)
    sampling_only = Sampler("model")
    assert await sampled(f"{url}/mcp", sampling_only, sampling("hi")) == [got[1]]
    assert sampling_only.asked == ["hi"]
    assert (replay.stats.missed, replay.stats.refused) == ([], [])
    assert [(r.method, r.rpc_method) for r in replay.unused()] == [("POST", "tools/call")]  # the count


async def test_two_sessions_started_in_another_order_each_get_their_own(
    record: RecordFactory, serve: Serve
) -> None:
    """Two clients at once, each asked to sample during its own call: started in the other
    order, each gets the other's recorded session id from ``initialize``, but is bound to its
    own recorded session by its first call: it is asked its own question, and the requests
    both sessions made alike (``tools/list``, the ``DELETE``) get its own session's answers."""
    with run_mcp_server(sdk="1") as server:
        rec = await record(server.url.removesuffix("/mcp"))
        one, two = Sampler("one"), Sampler("two")
        lived = Sessions(), Sessions()
        got = await asyncio.gather(
            sampled(f"{rec.url}/mcp", one, add, sampling("q1"), seen=lived[0]),
            sampled(f"{rec.url}/mcp", two, sampling("q2"), wait=0.3, seen=lived[1]),
        )
        (await rec.log()).close()  # every exchange committed
    assert got == [["5", "sampled: one: q1"], ["sampled: two: q2"]]
    replay = ReplayServer(load([rec.db]), speed=1)
    url = await serve(replay.app)
    one, two = Sampler("one"), Sampler("two")
    seen = Sessions(), Sessions()
    again = await asyncio.gather(
        sampled(f"{url}/mcp", one, add, sampling("q1"), wait=0.3, seen=seen[0]),
        sampled(f"{url}/mcp", two, sampling("q2"), seen=seen[1]),
    )
    assert (again, one.asked, two.asked) == (got, ["q1"], ["q2"]), json.dumps(replay.report(), indent=1)
    assert (replay.stats.missed, replay.stats.refused, replay.unused()) == ([], [], [])
    # Each GET stream went to the other client: the sampling requests moved with their calls.
    reasons = [r for s in replay.report()["streams"] if s["method"] == "GET" for r in s["reasons"]]
    moved = [r for r in reasons if r.startswith("rewrite: sampling/createMessage (its event 1), recorded on")]
    assert len(moved) == 2, reasons
    for live, replayed in zip(lived, seen, strict=True):
        assert replayed.given == ({s.given for s in lived} - {live.given}).pop()  # the other's
        # (The GET stream, opened before the first call, is the one next in recorded order.)
        answers = [(method, named) for method, named in replayed.answers if method != "GET"]
        first_call = [method for method, _ in answers].index("tools/call")
        assert {method for method, _ in answers[first_call:]} >= {"tools/list", "DELETE"}
        assert {named for _, named in answers[first_call:]} == {live.given}, replayed.answers
