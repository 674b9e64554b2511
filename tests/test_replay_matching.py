"""How a replay server matches a request to a recording: a field at its default is one left
out only in a protocol whose JSON is protobuf JSON (A2A, or a plug-in that says so), numbers
are compared as numbers, a repeated query parameter's values in their order, and an MCP
tool call that gave no progress token gets no recorded progress."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ProgressNotification, ServerNotification
from mcp_peers import run_mcp_server
from test_protocols import batch_call

from tasktape.eventlog import protocols as registry
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import Redactor
from tasktape.replay import ReplayServer, load
from tasktape.replay.diff import read
from tasktape.replay.matching import MatchRules
from tasktape.replay.pairing import pair, runs, same_request

TIMEOUT = 20  # s: a client the replay leaves waiting fails the test instead of hanging it
MCP_HEADERS = [("Content-Type", "application/json"), ("Mcp-Session-Id", "s1")]


def exchange(
    path: str, body: Any, headers: list[tuple[str, str]] | None = None, query: str | None = None
) -> Recorded:
    """A POST of ``body`` (JSON) answered ``{"ok": true}``."""
    return Recorded(
        method="POST",
        path=path,
        query=query,
        request_headers=headers or [("Content-Type", "application/json")],
        request_body=json.dumps(body).encode(),
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(0, b'{"ok": true}')],
        outcome="complete",
    )


async def replaying(tmp_path: Path, serve: Serve, *recorded: Recorded) -> tuple[ReplayServer, str]:
    """A replay server of a cassette of ``recorded`` (repeats allowed), and its URL."""
    write_cassette(tmp_path / "c.jsonl", list(recorded))
    replay = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0, allow_repeats=True)
    return replay, await serve(replay.app)


async def status_of(url: str, body: Any, headers: list[tuple[str, str]] | None = None) -> int:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers or []) as response:
        await response.read()
        return response.status


def tool_call(arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "set_level", "arguments": arguments},
    }


async def test_an_mcp_argument_at_its_default_is_not_one_left_out(tmp_path: Path, serve: Serve) -> None:
    # MCP's JSON is plain JSON: level 0 is not false, "", null, [], {}, or no level at all.
    replay, url = await replaying(tmp_path, serve, exchange("/mcp", tool_call({"level": 0}), MCP_HEADERS))
    assert await status_of(f"{url}/mcp", tool_call({"level": 0}), MCP_HEADERS) == 200
    others: list[dict[str, Any]] = [{"level": v} for v in (False, "", None, [], {})] + [{}]
    for arguments in others:
        assert await status_of(f"{url}/mcp", tool_call(arguments), MCP_HEADERS) == 400, arguments
    assert [m.closest[0]["differs"] for m in replay.stats.missed] == [
        [f"body differs at /params/arguments/level ({shown} vs 0)"]
        for shown in ("false", '""', "null", "[]", "{}", "(absent)")
    ]


async def test_an_llm_request_without_temperature_misses_the_temperature_0_recording(
    tmp_path: Path, serve: Serve
) -> None:
    # OpenAI's and Anthropic's defaults are the server's to choose: leaving one out asks for that.
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    message = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
    }
    replay, url = await replaying(
        tmp_path,
        serve,
        exchange("/v1/chat/completions", {**chat, "temperature": 0}),
        exchange("/v1/messages", {**message, "temperature": 0}),
    )
    assert [r.protocol for r in replay.recorded] == ["openai", "anthropic"]
    assert await status_of(f"{url}/v1/chat/completions", {**chat, "temperature": 0.0}) == 200
    assert await status_of(f"{url}/v1/chat/completions", chat) == 404
    assert await status_of(f"{url}/v1/messages", message) == 404
    assert [m.closest[0]["differs"] for m in replay.stats.missed] == [
        ["body differs at /temperature ((absent) vs 0)"]
    ] * 2


async def test_a_request_of_no_known_protocol_compares_defaults_as_values(
    tmp_path: Path, serve: Serve
) -> None:
    replay, url = await replaying(tmp_path, serve, exchange("/x", {"n": 0, "tags": [], "opts": {}}))
    assert replay.recorded[0].protocol is None
    assert await status_of(f"{url}/x", {"n": 0, "tags": [], "opts": {}}) == 200
    for different in ({"tags": [], "opts": {}}, {"n": False, "tags": [], "opts": {}}, {"n": 0, "opts": {}}):
        assert await status_of(f"{url}/x", different) == 404, different
    # An object left out is the empty one (SDKs differ in sending `"params": {}` or nothing);
    # an object with members is not.
    assert await status_of(f"{url}/x", {"n": 0, "tags": []}) == 200
    assert await status_of(f"{url}/x", {"n": 0, "tags": [], "opts": {"deep": 0}}) == 404


PLUGIN = """
from enum import StrEnum

from tasktape.eventlog.protocols.base import Protocol


class Kind(StrEnum):
    OTHER = "other"


class Grpcish(Protocol):
    name = "grpcish"
    kinds = Kind
    defaults_are_absent = {absent}

    def claims(self, request):
        return request.header("Grpcish-Version") is not None
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``plugin(absent)`` installs a plug-in protocol (through its entry point, as pip
    would) saying whether its defaults are fields left out; forgotten after the test."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def install(absent: bool) -> None:
        (folder / "grpcish_tasktape.py").write_text(PLUGIN.replace("{absent}", str(absent)))
        info = folder / "grpcish_tasktape-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: grpcish-tasktape\nVersion: 0.1.0\n")
        points = f"[{registry.ENTRY_POINT_GROUP}]\ngrpcish = grpcish_tasktape:Grpcish\n"
        (info / "entry_points.txt").write_text(points)
        importlib.invalidate_caches()
        registry.protocols.cache_clear()

    yield install
    registry.protocols.cache_clear()
    sys.modules.pop("grpcish_tasktape", None)


@pytest.mark.parametrize("absent", [True, False])
async def test_a_plugin_protocol_says_whether_its_defaults_are_left_out(
    tmp_path: Path, serve: Serve, plugin: Any, absent: bool
) -> None:
    # What the plug-in declares reaches matching through the guard that wraps it.
    plugin(absent)
    headers = [("Content-Type", "application/json"), ("Grpcish-Version", "1")]
    replay, url = await replaying(tmp_path, serve, exchange("/rpc", {"page": 0, "filter": ""}, headers))
    assert replay.recorded[0].protocol == "grpcish"
    assert await status_of(f"{url}/rpc", {}, headers) == (200 if absent else 404)


async def test_numbers_match_as_numbers_and_booleans_are_no_numbers(tmp_path: Path, serve: Serve) -> None:
    # JSON has one number type: a client that writes 3.0 asks what one that writes 3 does.
    replay, url = await replaying(
        tmp_path,
        serve,
        exchange("/mcp", tool_call({"n": 3, "scale": 0.5, "on": 1}), MCP_HEADERS),
        exchange("/x", {"flag": 0, "values": [1, 2]}),
    )
    assert await status_of(f"{url}/mcp", tool_call({"n": 3.0, "scale": 0.5, "on": 1.0}), MCP_HEADERS) == 200
    assert await status_of(f"{url}/x", {"flag": 0.0, "values": [1.0, 2]}) == 200
    assert await status_of(f"{url}/mcp", tool_call({"n": 3, "scale": 0.5, "on": True}), MCP_HEADERS) == 400
    assert await status_of(f"{url}/x", {"flag": False, "values": [1, 2]}) == 404
    assert await status_of(f"{url}/mcp", tool_call({"n": 3.5, "scale": 0.5, "on": 1}), MCP_HEADERS) == 400
    assert [m.closest[0]["differs"] for m in replay.stats.missed] == [
        ["body differs at /params/arguments/on (true vs 1)"],
        ["body differs at /flag (false vs 0)"],
        ["body differs at /params/arguments/n (3.5 vs 3)"],
    ]


async def test_a_repeated_query_parameter_keeps_the_order_of_its_values(tmp_path: Path, serve: Serve) -> None:
    # Different names in any order; one name's values are a list, which a server reads in order.
    replay, url = await replaying(tmp_path, serve, exchange("/x", {}, query="b=2&a=1&a=0"))
    assert await status_of(f"{url}/x?a=1&b=2&a=0", {}) == 200
    assert await status_of(f"{url}/x?a=1&a=0&b=2", {}) == 200
    assert await status_of(f"{url}/x?a=0&a=1&b=2", {}) == 404
    assert await status_of(f"{url}/x?b=2&a=0&a=1", {}) == 404
    assert replay.stats.missed[0].closest[0]["differs"] == ["query a=0&a=1&b=2 vs b=2&a=1&a=0"]


async def count(session: ClientSession, progress: bool) -> tuple[str, list[float]]:
    """The slow tool's result, and the progress its callback got (with ``progress``)."""
    seen: list[float] = []

    async def callback(done: float, total: float | None, message: str | None) -> None:
        seen.append(done)

    result = await session.call_tool(
        "slow_count", {"n": 3, "delay": 0.05}, progress_callback=callback if progress else None
    )
    return result.content[0].text, seen  # type: ignore[union-attr]


async def session_run(url: str, progress: bool) -> tuple[str, list[float], list[Any]]:
    """One session of the SDK's client calling the slow tool: its result, the progress its
    callback got, and every progress notification the client received, asked for or not."""
    received: list[Any] = []

    async def handler(message: Any) -> None:
        if isinstance(message, ServerNotification) and isinstance(message.root, ProgressNotification):
            received.append(message.root.params.progressToken)

    async def run() -> tuple[str, list[float], list[Any]]:
        async with (
            streamable_http_client(url) as (read, write, _),
            ClientSession(read, write, message_handler=handler) as session,
        ):
            await session.initialize()
            text, seen = await count(session, progress)
            return text, seen, received

    return await asyncio.wait_for(run(), TIMEOUT)


@pytest.mark.parametrize("add_ids", [False, True], ids=["as-recorded", "add-ids"])
async def test_a_tool_call_without_a_progress_token_gets_no_progress(
    record: RecordFactory, serve: Serve, add_ids: bool
) -> None:
    # Recorded with a progress callback (the SDK sends a token), replayed to a call without
    # one: the client asked for no progress, and gets none, of a token it never gave.
    with run_mcp_server(sdk="1") as server:
        rec = await record(server.url.removesuffix("/mcp"))
        text, seen, received = await session_run(f"{rec.url}/mcp", progress=True)
        (await rec.log()).close()
    assert (text, len(seen), len(received)) == ("counted to 3", 3, 3)
    replay = ReplayServer(load([rec.db]), speed=0, add_ids=add_ids)
    url = await serve(replay.app)
    assert await session_run(f"{url}/mcp", progress=False) == ("counted to 3", [], [])
    token = json.dumps(received[0])
    (reasons,) = [
        s["reasons"] for s in replay.report()["streams"] if any("progress" in r for r in s["reasons"])
    ]
    assert (
        f"rewrite: 3 progress notifications of token {token} are left out: the request gave no progress token"
        in reasons
    )
    assert replay.stats.missed == [] and replay.stats.refused == []


def message(rpc_id: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, **({"params": params} if params else {})}


def answer(rpc_id: Any, text: str | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "result": {"content": [{"type": "text", "text": text}]} if text else {},
    }


async def posted(url: str, batch: list[dict[str, Any]]) -> tuple[int, list[Any]]:
    """The status of a batch's answer, and its messages (each SSE event's, or the JSON array)."""
    async with aiohttp.ClientSession() as http, http.post(f"{url}/mcp", json=batch) as response:
        text = await response.text()
    if response.content_type == "text/event-stream":
        return response.status, [
            json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")
        ]
    return response.status, json.loads(text)


async def test_a_json_rpc_batch_matches_whatever_its_ids_and_is_answered_with_them(
    tmp_path: Path, serve: Serve
) -> None:
    """The ids in a batch are ignored, as a single message's id is, and the answers (an SSE
    stream, a JSON array; in any order) carry the ids of the replayed batch, each the id of
    the request in the place of the one it answered; progress its request's token. A batch
    nothing matches gets a JSON-RPC error for each of its requests."""
    add = message(5, "tools/call", name="add", arguments={"a": 1, "b": 2}, _meta={"progressToken": 5})
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 5, "progress": 1},
    }
    streamed = batch_call([add, message(6, "ping")], [answer(6), progress, answer(5, "3")])
    pings = [
        message(9, "ping"),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        message(10, "ping"),
    ]
    in_json = batch_call(pings, None, [answer(10), answer(9)])
    replay, url = await replaying(tmp_path, serve, streamed, in_json)
    add_again = {**add, "id": 50, "params": {**add["params"], "_meta": {"progressToken": "p50"}}}
    assert await posted(url, [add_again, message(60, "ping")]) == (
        200,
        [answer(60), {**progress, "params": {"progressToken": "p50", "progress": 1}}, answer(50, "3")],
    )
    assert await posted(url, [{**pings[0], "id": "a"}, pings[1], {**pings[2], "id": "b"}]) == (
        200,
        [answer("b"), answer("a")],
    )
    status, errors = await posted(
        url, [message(70, "tools/call", name="nope"), pings[1], message(80, "ping")]
    )
    assert (status, [(e["id"], e["error"]["code"]) for e in errors]) == (400, [(70, -32000), (80, -32000)])
    reasons = [r for s in replay.report()["streams"] for r in s["reasons"]]
    assert {
        "rewrite: the JSON-RPC id 5 is 50",
        "rewrite: the JSON-RPC id 6 is 60",
        'rewrite: the progress token 5 is "p50"',
        'rewrite: the JSON-RPC id 9 is "a"',
        'rewrite: the JSON-RPC id 10 is "b"',
    } <= set(reasons)


LIVE = "sk-LIVE-SECRET"
FORM = "application/x-www-form-urlencoded"


async def post_bytes(url: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, data=body, headers={"Content-Type": content_type}) as response,
    ):
        return response.status, await response.read()


def multipart_body(boundary: str, fields: list[tuple[str, str]]) -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{n}"\r\n\r\n{v}\r\n' for n, v in fields]
    return "".join([*parts, f"--{boundary}--\r\n"]).encode()


async def test_a_recorded_form_replays_its_redacted_fields_matching_any(
    record: RecordFactory, serve: Serve
) -> None:
    """An OAuth token request recorded with its password redacted answers the same request
    again, its fields in any order; a multipart form its parts, under the boundary a client
    makes up afresh. A miss names the fields that differ, a credential's value never."""

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"access_token": "t"})

    app = web.Application()
    app.router.add_post("/oauth/token", ok)
    app.router.add_post("/upload", ok)
    rec = await record(app)
    form = f"grant_type=password&username=ann&password={LIVE}".encode()
    upload = multipart_body("rec1", [("token", LIVE), ("note", "hi")])
    for path, body, content_type in [
        ("/oauth/token", form, FORM),
        ("/upload", upload, "multipart/form-data; boundary=rec1"),
    ]:
        assert (await post_bytes(f"{rec.url}{path}", body, content_type))[0] == 200
    (await rec.log()).close()
    replay = ReplayServer(load([rec.db]), speed=0, allow_repeats=True)
    url = await serve(replay.app)
    assert await post_bytes(f"{url}/oauth/token", form, FORM) == (200, b'{"access_token": "t"}')
    reordered = b"password=other&grant_type=password&username=ann"
    assert (await post_bytes(f"{url}/oauth/token", reordered, FORM))[0] == 200
    again = multipart_body("run2", [("token", "sk-other"), ("note", "hi")])
    assert (await post_bytes(f"{url}/upload", again, "multipart/form-data; boundary=run2"))[0] == 200

    miss = f"grant_type=refresh_token&username=ann&password={LIVE}&client_secret={LIVE}".encode()
    status, answer = await post_bytes(f"{url}/oauth/token", miss, FORM)
    assert status == 404 and LIVE.encode() not in answer
    other = multipart_body("run3", [("token", LIVE), ("note", "bye")])
    status, answer = await post_bytes(f"{url}/upload", other, "multipart/form-data; boundary=run3")
    assert status == 404 and LIVE.encode() not in answer
    assert [m.closest[0]["differs"] for m in replay.stats.missed] == [
        [
            "body differs at form field client_secret ((a value) vs (absent)), "
            'form field grant_type ("refresh_token" vs "password")'
        ],
        ['body differs at form field note ("bye" vs "hi")'],
    ]


def test_form_requests_pair_as_comparing_them_does() -> None:
    """``tasktape diff`` finds candidates by key: two forms alike but for their fields'
    order, or for a value one recording redacted, pair as comparing them does."""
    headers = [("Content-Type", FORM)]
    bodies_a = [b"a=1&b=2", b"password=[REDACTED]&x=1", b"q=1&q=2", b"a=1&b=3"]
    bodies_b = [b"x=1&password=pw", b"b=2&a=1", b"q=2&q=1", b"a=1&b=3"]
    rules = MatchRules()
    a = runs([read(Recorded("POST", "/t", None, headers, body, status=200)) for body in bodies_a], rules)
    b = runs([read(Recorded("POST", "/t", None, headers, body, status=200)) for body in bodies_b], rules)
    expected = [
        (i, j)
        for i, j in [(0, 1), (1, 0), (3, 3)]
        if same_request(a[i].first.recorded, b[j].first.recorded, rules)
    ]
    assert expected == [(0, 1), (1, 0), (3, 3)]
    assert [(a.index(x), b.index(y)) for x, y in pair(a, b, rules).pairs] == expected


def test_multipart_requests_with_boundaries_of_their_own_pair() -> None:
    """Each client makes up its boundary: the same upload recorded twice pairs, read at
    each recording's own boundary."""

    def upload(boundary: str) -> Recorded:
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"\r\n\r\nhello\r\n--{boundary}--\r\n'
        ).encode()
        headers = [("Content-Type", f"multipart/form-data; boundary={boundary}")]
        return Recorded("POST", "/upload", None, headers, body, status=200)

    rules = MatchRules()
    a, b = runs([read(upload("aaaa1111"))], rules), runs([read(upload("bbbb2222"))], rules)
    assert same_request(a[0].first.recorded, b[0].first.recorded, rules)
    assert len(pair(a, b, rules).pairs) == 1


async def test_a_miss_hides_a_redacted_field_in_each_message_of_a_json_rpc_batch(
    record: RecordFactory, serve: Serve
) -> None:
    """``--redact-json /params/apiKey`` redacts it in each message of a batch: a miss's answer
    and report hide it there too, though the recording has none."""

    async def rpc(request: web.Request) -> web.Response:
        calls = await request.json()
        return web.json_response([{"jsonrpc": "2.0", "id": c["id"], "result": {}} for c in calls])

    app = web.Application()
    app.router.add_post("/rpc", rpc)
    redactor = Redactor(json_pointers=["/params/apiKey"])
    rec = await record(app, redactor=redactor)
    batch = [{"jsonrpc": "2.0", "id": 1, "method": "search", "params": {"name": "a"}}]
    async with rec.session.post(f"{rec.url}/rpc", json=batch) as r:
        assert r.status == 200
    (await rec.log()).close()
    replay = ReplayServer(load([rec.db]), speed=0, redactor=redactor)
    url = await serve(replay.app)
    batch[0]["params"]["apiKey"] = LIVE
    async with aiohttp.ClientSession() as http, http.post(f"{url}/rpc", json=batch) as response:
        assert response.status == 404 and LIVE not in await response.text()
    assert replay.stats.missed[0].closest[0]["differs"] == [
        "body differs at /0/params/apiKey ((a value) vs (absent))"
    ]


async def test_a_miss_shows_a_value_holding_a_redacted_place_in_another_shape_as_its_shape(
    tmp_path: Path, serve: Serve
) -> None:
    """A credential sent in another shape than its pointer names (a list, a string where
    ``/metadata/session`` is) is shown as its type and size, never its value; what the
    pointer does not reach (the model) still shows."""
    recorded = exchange("/v1/chat", {"model": "m", "metadata": {"session": "[REDACTED]"}})
    write_cassette(tmp_path / "c.jsonl", [recorded])
    redactor = Redactor(json_pointers=["/metadata/session"])
    replay = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0, redactor=redactor)
    url = await serve(replay.app)
    for body in ({"model": "m", "metadata": [LIVE]}, {"model": "other", "metadata": LIVE}):
        async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/chat", json=body) as response:
            assert response.status == 404 and LIVE not in await response.text()
    assert [m.closest[0]["differs"] for m in replay.stats.missed] == [
        ['body differs at /metadata ((a list of 1 item) vs {"session": "[REDACTED]"})'],
        [
            'body differs at /metadata ((a string of 14 characters) vs {"session": "[REDACTED]"}), '
            '/model ("other" vs "m")'
        ],
    ]


async def test_a_resume_past_a_recordings_end_says_only_that_the_rest_was_not_recorded(
    tmp_path: Path, serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """With --allow-repeats, a stream never served yet, resumed from the last event it broke
    off after: the miss said the rest was not recorded, yet its hint (and the console) also
    said it was already served and to use --allow-repeats, which was on. Only what is not
    there is said."""
    stream = Recorded(
        method="GET",
        path="/events",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(0, b"id: 1\ndata: {}\n\n"), (1000, b"id: 2\ndata: {}\n\n")],
        outcome="upstream_disconnected",
    )
    _, url = await replaying(tmp_path, serve, stream)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/events", headers={"Last-Event-ID": "2"}) as response,
    ):
        assert response.status == 404
        error = (await response.json())["error"]
    assert error["closest"][0]["differs"] == [
        "its recording breaks off after event 2 (upstream_disconnected): what came after was not recorded"
    ]
    assert "--allow-repeats" not in error["hint"]
    assert "no recording matches GET /events" in caplog.text and "already served" not in caplog.text
