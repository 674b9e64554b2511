"""The replay server against real recordings: bytes, pacing, speed, resume,
misses, JSON-RPC ids, faults, modes, and real clients (the official a2a-sdk too)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import RecordFactory, Serve
from sdk_agent import run_sdk_agent
from sdk_client import stream_message

from tasktape.a2a_client import A2AClient
from tasktape.agent import create_agent_app
from tasktape.errors import Unfaithful, UsageError
from tasktape.eventlog import EventLog, LogWriter, SSEDecoder
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.protocols import protocols
from tasktape.eventlog.recorded import Recorded, from_log
from tasktape.eventlog.redact import Redactor
from tasktape.replay import Faults, ReplayMode, ReplayServer, fidelity, load
from tasktape.replay.kept import KEPT
from tasktape.replay.tape import TapeOptions, TapeSession
from tasktape.replay_command import report

MS = 1_000_000


async def recorded_demo(
    record: RecordFactory, serve: Serve, *texts_and_bindings: tuple[str, str], pace: float = 0.2
) -> tuple[Path, list[Any]]:
    """Record demo-agent streams through the proxy; returns the log and the client's results."""
    agent = await serve(create_agent_app(pace=pace))
    rec = await record(agent)
    results = []
    for text, binding in texts_and_bindings:
        client = await A2AClient.connect(rec.session, rec.url, binding)
        results.append(await client.stream(text))
    (await rec.log()).close()
    return rec.db, results


def stream_exchange(db: Path, task_id: str) -> Recorded:
    with EventLog(db) as log:
        ids = [x["id"] for x in log.exchanges() if x["task_id"] == task_id and x["is_sse"]]
        return from_log(log, ids)[0]


async def timed_post(
    url: str, body: Any, headers: dict[str, str] | list[tuple[str, str]] | None = None
) -> tuple[bytes, list[float], int]:
    """POST and read the answer, noting when each piece arrived (s after the request)."""
    received, arrivals = b"", []
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        async with session.post(url, json=body, headers=headers or {}) as r:
            async for data in r.content.iter_any():
                arrivals.append(time.perf_counter() - start)
                received += data
            return received, arrivals, r.status


def message(text: str, message_id: str = "m-other") -> dict[str, Any]:
    return {"message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}}


async def test_bytes_identical_and_at_the_recorded_pace(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, ("What does J45.909 mean?", "rest"))
    recorded = stream_exchange(db, result.task_id)
    url = await serve(ReplayServer(load([db]), speed=1.0).app)
    # A different messageId, as every client run makes: still a match.
    body, arrivals, status = await timed_post(f"{url}/message:stream", message("What does J45.909 mean?"))
    assert status == 200 and body == recorded.body == result.raw
    # Each event arrives at its recorded offset: compare the gaps since the first one.
    offsets = [o / 1e9 for o, _ in recorded.chunks]
    if len(arrivals) == len(offsets):
        errors = [
            abs((a - arrivals[0]) - (o - offsets[0])) * 1000 for a, o in zip(arrivals, offsets, strict=True)
        ]
        assert statistics.median(errors) < 5 and errors[-1] < 15, errors
    assert abs(arrivals[-1] - offsets[-1]) < 0.25  # and the whole run takes as long as it did


async def test_speed_0_and_speed_10(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, ("a long answer", "rest"), pace=0.5)
    recorded = stream_exchange(db, result.task_id)
    took = recorded.chunks[-1][0] / 1e9
    assert took > 1.0
    for speed, low, high in ((0.0, 0.0, 0.3), (10.0, took / 10 * 0.7, took / 10 * 2 + 0.1)):
        url = await serve(ReplayServer(load([db]), speed=speed).app)
        body, arrivals, _ = await timed_post(f"{url}/message:stream", message("a long answer"))
        assert body == recorded.body and low <= arrivals[-1] <= high, (speed, arrivals[-1], took)


def events_of(body: bytes) -> list[Any]:
    decoder = SSEDecoder()
    return decoder.feed(body) + decoder.close()


async def test_resume_after_every_event(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, ("What does J45.909 mean?", "rest"), pace=0.05)
    recorded = stream_exchange(db, result.task_id)
    events = events_of(recorded.body)
    url = await serve(ReplayServer(load([db]), speed=0, allow_repeats=True).app)
    position = 0
    for event in events:
        position += len(event.raw)
        body, _, status = await timed_post(
            f"{url}/message:stream", message("What does J45.909 mean?"), {"Last-Event-ID": event.id}
        )
        assert status == 200 and body == recorded.body[position:], event.id
    body, _, status = await timed_post(
        f"{url}/message:stream", message("What does J45.909 mean?"), {"Last-Event-ID": "evt.never"}
    )
    error = json.loads(body)["error"]
    assert (
        status == 400
        and "'evt.never' names no event" in error["message"]
        and "ids run from" in error["message"]
    )
    # A resume that failed used nothing up: without repeats, the stream is still there.
    strict = await serve(ReplayServer(load([db]), speed=0).app)
    question = message("What does J45.909 mean?")
    assert (await timed_post(f"{strict}/message:stream", question, {"Last-Event-ID": "evt.never"}))[2] == 400
    body, _, status = await timed_post(f"{strict}/message:stream", question)
    assert status == 200 and body == recorded.body


async def test_resume_streams_recorded_without_ids_with_add_ids(record: RecordFactory) -> None:
    with run_sdk_agent() as agent:
        rec = await record(agent.url)
        await stream_message(rec.url, "hello", "rest")
        (await rec.log()).close()
    recorded = [r for r in load([rec.db]) if r.is_sse]
    assert all(e.id is None for e in events_of(recorded[0].body))
    plain = TestServer(ReplayServer(load([rec.db]), speed=0, allow_repeats=True).app, host="127.0.0.1")
    ided = TestServer(
        ReplayServer(load([rec.db]), speed=0, add_ids=True, allow_repeats=True).app, host="127.0.0.1"
    )
    for server in (plain, ided):
        await server.start_server()
    try:
        body = json.loads(recorded[0].request_body or b"{}")
        answer, _, status = await timed_post(
            str(plain.make_url("/message:stream")), body, {"Last-Event-ID": "x"}
        )
        assert status == 400 and "--add-ids" in json.loads(answer)["error"]["message"]
        full, _, _ = await timed_post(str(ided.make_url("/message:stream")), body)
        with_ids = events_of(full)
        number = next(n for n, r in enumerate(load([rec.db]), 1) if r.is_sse)  # its place in the source
        assert [e.id for e in with_ids] == [f"tt{number}.{n}" for n in range(1, len(with_ids) + 1)]
        assert [e.data for e in with_ids] == [
            e.data for e in events_of(recorded[0].body)
        ]  # only ids were added
        for n, event in enumerate(with_ids):
            rest, _, status = await timed_post(
                str(ided.make_url("/message:stream")), body, {"Last-Event-ID": event.id}
            )
            assert status == 200 and [e.data for e in events_of(rest)] == [e.data for e in with_ids[n + 1 :]]
    finally:
        await plain.close()
        await ided.close()


async def test_jsonrpc_answers_carry_the_request_id(record: RecordFactory, serve: Serve) -> None:
    db, (result,) = await recorded_demo(record, serve, ("What does J45.909 mean?", "jsonrpc"), pace=0.05)
    recorded = stream_exchange(db, result.task_id)
    url = await serve(ReplayServer(load([db]), speed=0).app)
    rpc = {
        "jsonrpc": "2.0",
        "id": "another-id-42",
        "method": "SendStreamingMessage",
        "params": message("What does J45.909 mean?"),
    }
    body, _, _ = await timed_post(f"{url}/jsonrpc", rpc)
    frames = [json.loads(e.data) for e in events_of(body)]
    assert {f["id"] for f in frames} == {"another-id-42"}
    original_id = json.loads(recorded.request_body or b"{}")["id"]
    assert body == recorded.body.replace(f'"id":{json.dumps(original_id)}'.encode(), b'"id":"another-id-42"')


async def test_a_miss_names_the_closest_recordings(record: RecordFactory, serve: Serve) -> None:
    db, _ = await recorded_demo(
        record, serve, ("What does J45.909 mean?", "rest"), ("This will fail", "rest"), pace=0.05
    )
    server = ReplayServer(load([db]), speed=0, miss_status=418)
    url = await serve(server.app)
    body, _, status = await timed_post(f"{url}/message:stream", message("Something else"))
    error = json.loads(body)["error"]
    assert status == 418 and error["message"] == "no recorded exchange matches POST /message:stream"
    assert error["closest"][0]["request"] == "POST /message:stream"
    assert 'body differs at /message/parts/0/text ("Something else" vs' in error["closest"][0]["differs"][0]
    assert len(server.stats.missed) == 1 and server.stats.served == 0
    assert {r.path for r in server.unused()} == {"/.well-known/agent-card.json", "/message:stream"}


async def test_identical_requests_replay_in_order(tmp_path: Path, serve: Serve) -> None:
    def answer(text: str) -> Recorded:
        return Recorded(
            method="POST",
            path="/message:send",
            request_body=b'{"message": {"messageId": "a"}}',
            status=200,
            response_headers=[("Content-Type", "application/json")],
            chunks=[(1000, text.encode())],
            duration_ns=2000,
            outcome="complete",
        )

    write_cassette(tmp_path / "two.jsonl", [answer('{"n": 1}'), answer('{"n": 2}')])
    for repeats, third in ((False, 404), (True, 200)):
        url = await serve(ReplayServer(load([tmp_path / "two.jsonl"]), speed=0, allow_repeats=repeats).app)
        got = []
        for _ in range(3):
            body, _, status = await timed_post(f"{url}/message:send", {"message": {"messageId": "b"}})
            got.append(status if status != 200 else json.loads(body)["n"])
        assert got == [1, 2, third if third != 200 else 2]


def answers_ok(tmp_path: Path, path: str, request_body: bytes, query: str | None = None) -> list[Recorded]:
    """A cassette of one POST answered ``ok``, loaded back."""
    rec = Recorded(
        method="POST",
        path=path,
        query=query,
        request_body=request_body,
        status=200,
        chunks=[(0, b"ok")],
        outcome="complete",
    )
    write_cassette(tmp_path / "c.jsonl", [rec])
    return load([tmp_path / "c.jsonl"])


async def test_ignore_pointers(tmp_path: Path, serve: Serve) -> None:
    recorded = answers_ok(tmp_path, "/x", b'{"trace": "abc", "q": 1}')
    strict = await serve(ReplayServer(recorded, speed=0).app)
    lenient = await serve(ReplayServer(recorded, speed=0, ignore=("/trace",)).app)
    assert (await timed_post(f"{strict}/x", {"trace": "xyz", "q": 1}))[2] == 404
    assert (await timed_post(f"{lenient}/x", {"trace": "xyz", "q": 1}))[0] == b"ok"


def test_the_protocols_are_loaded_before_the_first_request(tmp_path: Path) -> None:
    """Finding the plug-ins and loading the protocols takes some 20-30 ms: done when the
    server is made, so the first answer does not start that much behind its pace."""
    from_a_log = Recorded(method="POST", path="/x", status=200, chunks=[(0, b"ok")], protocol="a2a")
    protocols.cache_clear()
    ReplayServer([from_a_log], speed=0)  # (a log's recordings name their protocol already)
    assert protocols.cache_info().currsize == 1


async def test_a_request_body_as_big_as_a_recorder_keeps_is_matched(tmp_path: Path, serve: Serve) -> None:
    """A prompt of some MiB (a recorder keeps 16 by default) is read and matched; a bigger
    one gets a JSON 413 saying why, and is counted as refused."""
    prompt = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 3_000_000}]})
    server = ReplayServer(answers_ok(tmp_path, "/v1/chat/completions", prompt.encode()), speed=0)
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", data=prompt) as r:
            assert (r.status, await r.read()) == (200, b"ok")
        async with session.post(f"{url}/v1/chat/completions", data=b"x" * (16 * 1024 * 1024 + 1)) as r:
            refusal = (r.status, (await r.json())["error"]["message"])
    assert refusal[0] == 413 and "over 16,777,216 bytes" in refusal[1]
    assert (server.stats.served, server.stats.refused) == (
        1,
        ["POST /v1/chat/completions (a body over 16,777,216 bytes)"],
    )


async def test_match_headers(tmp_path: Path, serve: Serve) -> None:
    rec = Recorded(
        method="POST",
        path="/x",
        request_headers=[("X-Tenant", "north"), ("Authorization", "[REDACTED]"), ("User-Agent", "a/1")],
        request_body=b"{}",
        status=200,
        chunks=[(0, b"ok")],
        outcome="complete",
    )
    write_cassette(tmp_path / "c.jsonl", [rec])
    recorded = load([tmp_path / "c.jsonl"])
    # By default headers do not take part: clients differ in them from run to run.
    url = await serve(ReplayServer(recorded, speed=0).app)
    assert (await timed_post(f"{url}/x", {}, {"X-Tenant": "south"}))[2] == 200
    server = ReplayServer(recorded, speed=0, allow_repeats=True, match_headers=("x-tenant", "Authorization"))
    url = await serve(server.app)
    # Names in any case; a redacted value matches any; other headers still do not count.
    sent = {"X-Tenant": "north", "Authorization": "Bearer live-secret-1", "User-Agent": "b/2"}
    assert (await timed_post(f"{url}/x", {}, sent))[2] == 200
    for changed, why in (
        ({"X-Tenant": "south"}, 'header x-tenant "south" vs "north"'),
        ({"X-Tenant": None}, 'header x-tenant (absent) vs "north"'),
        ({"Authorization": None}, "header authorization (absent) vs (a value)"),
    ):
        headers = {k: v for k, v in {**sent, **changed}.items() if v is not None}
        body, _, status = await timed_post(f"{url}/x", {}, headers)
        assert status == 404 and json.loads(body)["error"]["closest"][0]["differs"] == [why], changed
    # A credential sent is never shown in what a miss reports: neither a header redacted by
    # default nor one the recording redacted.
    rec.request_headers = [("X-Tenant", "north"), ("X-Internal-Token", "[REDACTED]")]
    write_cassette(tmp_path / "e.jsonl", [rec])
    url = await serve(
        ReplayServer(load([tmp_path / "e.jsonl"]), speed=0, match_headers=("X-Internal-Token",)).app
    )
    two = [("X-Internal-Token", "live-secret-3"), ("X-Internal-Token", "live-secret-4")]
    body, _, status = await timed_post(f"{url}/x", {}, two)
    assert status == 404 and b"live-secret" not in body
    assert json.loads(body)["error"]["closest"][0]["differs"] == [
        "header x-internal-token (2 values) vs (a value)"
    ]
    rec.request_headers = [("Authorization", "Bearer kept-secret-0")]
    write_cassette(tmp_path / "d.jsonl", [rec])
    url = await serve(
        ReplayServer(load([tmp_path / "d.jsonl"]), speed=0, match_headers=("Authorization",)).app
    )
    body, _, status = await timed_post(f"{url}/x", {}, {"Authorization": "Bearer live-secret-2"})
    assert status == 404 and b"live-secret-2" not in body and b"kept-secret-0" not in body
    assert json.loads(body)["error"]["closest"][0]["differs"] == [
        "header authorization (a value) vs (a value)"
    ]


async def test_a_query_value_redacted_in_the_recording_matches_any(tmp_path: Path, serve: Serve) -> None:
    recorded = answers_ok(tmp_path, "/x", b"{}", query="key=[REDACTED]&lang=en&key=[REDACTED]")
    url = await serve(ReplayServer(recorded, speed=0, allow_repeats=True).app)
    for same in ("lang=en&key=a&key=b", "key=b&key=a&lang=en"):
        assert (await timed_post(f"{url}/x?{same}", {}))[2] == 200, same
    for different in ("key=a&lang=de&key=b", "key=a&lang=en", "key=a&lang=en&key=b&page=2", "lang=en"):
        assert (await timed_post(f"{url}/x?{different}", {}))[2] == 404, different


async def test_a_query_redacted_with_semicolons_matches_and_a_miss_shows_no_credential(
    tmp_path: Path, serve: Serve
) -> None:
    """Redaction reads ';' as a separator too: the recorded query of ``token=T;api_key=K``
    is two redacted parameters, which the request as it was recorded matches. A miss's
    report shows no credential of the request's query (it reaches test and CI output)."""
    recorded = answers_ok(tmp_path, "/x", b"{}", query="token=[REDACTED];api_key=[REDACTED]&lang=en")
    replay = ReplayServer(recorded, speed=0, allow_repeats=True)
    url = await serve(replay.app)
    assert (await timed_post(f"{url}/x?token=sk-t1;api_key=sk-k1&lang=en", {}))[2] == 200
    body, _, status = await timed_post(f"{url}/x?token=sk-t2;api_key=sk-k2&lang=de", {})
    assert status == 404 and b"sk-" not in body
    (miss,) = replay.stats.missed
    assert miss.request == "POST /x?token=[REDACTED];api_key=[REDACTED]&lang=de"
    assert "sk-" not in json.dumps(miss.closest)


def rpc_posts(tmp_path: Path, *bodies: dict[str, Any], query: str | None) -> list[Recorded]:
    """A cassette of JSON-RPC POSTs to /rpc (each answered ``ok``), loaded back."""
    posts = [answers_ok(tmp_path, "/rpc", json.dumps(b).encode(), query)[0] for b in bodies]
    write_cassette(tmp_path / "c.jsonl", posts)
    return load([tmp_path / "c.jsonl"])


async def test_a_miss_shows_no_value_at_a_place_any_recording_redacted(tmp_path: Path, serve: Serve) -> None:
    """A query parameter or a JSON field one recording holds redacted holds a credential in
    every request: a miss's answer and report (which end up in test and CI output) show
    none there, even against a recording that has no such field, or inside a value shown."""
    recorded = rpc_posts(
        tmp_path,
        {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t1"}},
        {"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {"apiKey": "[REDACTED]", "n": 1}},
        {"jsonrpc": "2.0", "id": 3, "method": "tasks/list", "params": ["t1"]},
        query="sess=[REDACTED]&v=1",
    )
    replay = ReplayServer(recorded, speed=0)
    url = await serve(replay.app)
    asked = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t1", "apiKey": "sk-live-1"}}
    body, _, status = await timed_post(f"{url}/rpc?sess=sk-live-2&v=2", asked)
    assert status == 404 and b"sk-live" not in body
    assert (
        json.loads(body)["error"]["message"] == "no recorded exchange matches POST /rpc?sess=[REDACTED]&v=2"
    )
    (miss,) = replay.stats.missed
    assert miss.request == "POST /rpc?sess=[REDACTED]&v=2"
    query = "query sess=[REDACTED]&v=2 vs sess=[REDACTED]&v=1"
    assert [c["differs"] for c in miss.closest] == [
        [query, "body differs at /params/apiKey ((a value) vs (absent))"],
        [
            query,
            'body differs at /method ("tasks/get" vs "tasks/list"), '
            '/params ({"id": "t1", "apiKey": "[REDACTED]"} vs ["t1"])',
        ],
        [
            query,
            'body differs at /method ("tasks/get" vs "message/send"), /params/id ("t1" vs (absent)), '
            "/params/n ((absent) vs 1)",
        ],
    ]


async def test_a_miss_shows_no_value_the_redaction_options_name(tmp_path: Path, serve: Serve) -> None:
    """What the user redacts (``tasktape replay --redact-*``, the marker's ``redact_*=``) a
    miss hides too, though no recording holds it redacted."""
    recorded = rpc_posts(tmp_path, {"method": "tasks/get", "params": {"id": "t1"}}, query="v=1")
    redactor = Redactor(json_pointers=["/**/apiKey"], query=["sess"])
    replay = ReplayServer(recorded, speed=0, redactor=redactor)
    url = await serve(replay.app)
    asked = {"method": "tasks/get", "params": {"id": "t1", "auth": {"apiKey": "sk-live-4"}}}
    body, _, status = await timed_post(f"{url}/rpc?sess=sk-live-5&v=1", asked)
    assert status == 404 and b"sk-live" not in body
    (miss,) = replay.stats.missed
    assert miss.request == "POST /rpc?sess=[REDACTED]&v=1"
    assert miss.closest[0]["differs"] == [
        "query sess=[REDACTED]&v=1 vs v=1",
        "body differs at /params/auth/apiKey ((a value) vs (absent))",
    ]


async def test_a_field_at_its_default_matches_its_absence(tmp_path: Path, serve: Serve) -> None:
    # A2A's JSON is protobuf JSON: the official SDK sends "configuration": {} where other
    # clients leave it out, and both mean the same.
    recorded = answers_ok(
        tmp_path,
        "/message:send",
        b'{"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}]}, "metadata": {}}',
    )
    url = await serve(ReplayServer(recorded, speed=0, allow_repeats=True).app)
    hi = {"role": "ROLE_USER", "parts": [{"text": "hi"}]}
    for same in (
        {"message": hi},
        {"message": {**hi, "taskId": ""}, "configuration": {}, "metadata": None},
        {"message": hi, "configuration": {"blocking": False, "acceptedOutputModes": []}},
    ):
        assert (await timed_post(f"{url}/message:send", same))[2] == 200, same
    for different in (
        {"message": hi, "configuration": {"blocking": True}},
        {"message": {**hi, "taskId": "t"}},
    ):
        assert (await timed_post(f"{url}/message:send", different))[2] == 404, different


async def test_a_recording_cut_short_replays_cut_short(tmp_path: Path, serve: Serve) -> None:
    events = [b"id: 1\ndata: {}\n\n", b'id: 2\ndata: {"half']
    rec = Recorded(
        method="GET",
        path="/events",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(1_000_000, events[0]), (2_000_000, events[1])],
        duration_ns=60_000_000,  # the upstream went away 58 ms after its last bytes
        outcome="upstream_disconnected",
    )
    write_cassette(tmp_path / "c.jsonl", [rec])
    url = await serve(ReplayServer(load([tmp_path / "c.jsonl"]), speed=1, allow_repeats=True).app)
    for last_id, expected in ((None, b"".join(events)), ("1", events[1])):
        received = b""
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            async with session.get(
                f"{url}/events", headers={"Last-Event-ID": last_id} if last_id else {}
            ) as r:
                with pytest.raises(aiohttp.ClientPayloadError):
                    async for data in r.content.iter_any():
                        received += data
            dropped = time.perf_counter() - start
        assert received == expected
        assert dropped >= 0.059 - (0.001 if last_id else 0)  # never before the recorded moment


@pytest.mark.parametrize("where", ["server", "request"])
async def test_faults(record: RecordFactory, serve: Serve, where: str) -> None:
    db, (result,) = await recorded_demo(record, serve, ("What does J45.909 mean?", "rest"), pace=0.05)

    async def run(spec: str) -> tuple[bytes, list[float], int, str | None]:
        server = ReplayServer(load([db]), speed=0, faults=Faults.parse(spec) if where == "server" else None)
        url = await serve(server.app)
        headers = {"X-Tasktape-Fault": spec} if where == "request" else {}
        received, arrivals = b"", []
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            async with session.post(
                f"{url}/message:stream", json=message("What does J45.909 mean?"), headers=headers
            ) as r:
                try:
                    async for data in r.content.iter_any():
                        arrivals.append(time.perf_counter() - start)
                        received += data
                except aiohttp.ClientPayloadError as exc:
                    return received, arrivals, r.status, type(exc).__name__
                return received, arrivals, r.status, None

    body, _, _, error = await run("drop-after=3")
    assert error == "ClientPayloadError" and len([e for e in events_of(body) if e.complete]) == 3
    body, arrivals, _, error = await run("stall=2:300")
    assert error is None and body == result.raw and arrivals[-1] >= 0.3
    body, _, status, _ = await run("status=503")
    assert status == 503 and "fault injected" in body.decode()
    body, arrivals, status, _ = await run("delay-headers=250")
    assert status == 200 and body == result.raw and arrivals[0] >= 0.25


async def test_a_bad_fault_header_is_explained(tmp_path: Path, serve: Serve) -> None:
    write_cassette(tmp_path / "c.jsonl", [Recorded(method="GET", path="/", status=200, outcome="complete")])
    url = await serve(ReplayServer(load([tmp_path / "c.jsonl"])).app)
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"X-Tasktape-Fault": "explode=1"}) as r,
    ):
        assert r.status == 400 and "unknown fault 'explode'" in (await r.text())
    with pytest.raises(ValueError, match="stall=N:MS"):
        Faults.parse("stall=two")
    for slow in ("stall=1:3600001", "delay-headers=1e300", "stall=2:inf"):
        with pytest.raises(ValueError, match=r"waits too long: stalls and delays are at most 3,600,000 ms"):
            Faults.parse(slow)
    assert Faults.parse("stall=1:3600000").stall_ms == 3_600_000


async def test_record_missing_records_misses_for_the_next_run(tmp_path: Path, serve: Serve) -> None:
    agent = await serve(create_agent_app(pace=0.02))
    db = tmp_path / "grows.db"
    with LogWriter(db) as writer:
        server = ReplayServer(
            [], speed=0, mode=ReplayMode.RECORD_MISSING, upstream=agent, writer=writer, log_path=db
        )
        url = await serve(server.app)
        answers = [
            (await timed_post(f"{url}/message:stream", message("What does J45.909 mean?")))[0]
            for _ in range(2)
        ]
        for _ in range(100):  # each recording is added once the log has it
            if len(server.recorded) == 2:
                break
            await asyncio.sleep(0.02)
        # Identical requests in one run are new episodes: both went to the agent.
        assert server.stats.forwarded == 2 and len(server.recorded) == 2 and server.unused() == []
    with EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["complete", "complete"]
    # The next run replays them, in order, without the agent.
    again = ReplayServer(load([db]), speed=0)
    url = await serve(again.app)
    replayed = [
        (await timed_post(f"{url}/message:stream", message("What does J45.909 mean?")))[0] for _ in range(2)
    ]
    assert replayed == answers and again.stats.forwarded == 0


async def test_passthrough_forwards_everything(tmp_path: Path, serve: Serve) -> None:
    agent = await serve(create_agent_app(pace=0))
    server = ReplayServer([], mode=ReplayMode.PASSTHROUGH, upstream=agent)
    url = await serve(server.app)
    body, _, status = await timed_post(f"{url}/message:stream", message("hello"))
    assert status == 200 and b"TASK_STATE_COMPLETED" in body and server.stats.forwarded == 1
    with pytest.raises(ValueError, match="give one"):
        ReplayServer([], mode=ReplayMode.PASSTHROUGH)
    with pytest.raises(
        ValueError, match="not a replay mode; choose one of replay, record-missing, passthrough"
    ):
        ReplayMode.parse("record_missing")


@pytest.mark.parametrize("binding", ["rest", "jsonrpc"])
async def test_the_official_sdk_client_against_a_replay(
    record: RecordFactory, serve: Serve, binding: str
) -> None:
    agent = await serve(create_agent_app(pace=0.05))
    rec = await record(agent)
    live = await stream_message(rec.url, "What does J45.909 mean?", binding)
    (await rec.log()).close()
    url = await serve(ReplayServer(load([rec.db]), speed=0).app)
    replayed = await stream_message(url, "What does J45.909 mean?", binding)  # a new client run
    assert replayed == live


async def test_a_reconnecting_client_resumes_the_stream_it_was_served(
    record: RecordFactory, serve: Serve
) -> None:
    db, _ = await recorded_demo(record, serve, ("What does J45.909 mean?", "rest"), pace=0.05)
    server = ReplayServer(load([db]), speed=0)  # no repeats allowed: the stream is used once served
    url = await serve(server.app)
    full, _, _ = await timed_post(f"{url}/message:stream", message("What does J45.909 mean?"))
    events = events_of(full)
    rest, _, status = await timed_post(
        f"{url}/message:stream", message("What does J45.909 mean?"), {"Last-Event-ID": events[20].id}
    )
    assert status == 200 and [e.id for e in events_of(rest)] == [e.id for e in events[21:]]
    assert server.stats.missed == []


def get_stream(outcome: str, duration_ns: int) -> Recorded:
    return Recorded(
        method="GET",
        path="/mcp",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(10 * MS, b'id: 1\ndata: {"jsonrpc":"2.0","method":"notifications/message"}\n\n')],
        duration_ns=duration_ns,
        outcome=outcome,
    )


async def test_a_stream_its_client_ended_stays_open_until_the_client_leaves(serve: Serve) -> None:
    server = ReplayServer([get_stream("client_disconnected", 50 * MS)], speed=1.0)
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/mcp") as resp:
        first = await resp.content.readuntil(b"\n\n")
        assert first.startswith(b"id: 1\n")
        # Well past the moment the recorded client left, the stream is still open.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(resp.content.read(1), 0.5)


async def test_a_posted_stream_its_client_left_breaks_off_where_it_did(serve: Serve) -> None:
    """A token stream the client left (an SDK that broke out of its loop): the agent was
    still sending. Replayed, it breaks off after the same bytes; held open, a client that
    reads on would wait for ever."""
    left = replace(get_stream("client_disconnected", 50 * MS), method="POST", path="/v1/chat/completions")
    url = await serve(ReplayServer([left], speed=1.0).app)
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v1/chat/completions") as resp:
        got = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            while chunk := await asyncio.wait_for(resp.content.readany(), 2):
                got += chunk
    assert got == left.body


async def test_a_stream_ends_at_its_recorded_end(serve: Serve) -> None:
    url = await serve(ReplayServer([get_stream("complete", 300 * MS)], speed=1.0).app)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/mcp") as resp:
        started = time.monotonic()
        await resp.content.readuntil(b"\n\n")
        assert await resp.content.read() == b""
        assert time.monotonic() - started >= 0.25  # the server closed it when the recorded one did


@pytest.mark.parametrize("status", [100, 101, 200, 204, 304, 399, 600, True])
def test_a_miss_is_answered_with_an_error_status(status: int) -> None:
    # A 1xx leaves the client waiting for ever; a 204 or a 304 loses the error's body.
    with pytest.raises(UsageError, match="a miss is answered with an error status, 400 to 599"):
        ReplayServer([], miss_status=status)
    assert ReplayServer([], miss_status=599).miss_status == 599


@pytest.mark.parametrize("speed", [float("nan"), float("inf"), -1.0])
def test_a_speed_is_a_finite_number(speed: float) -> None:
    with pytest.raises(
        UsageError, match=r"the speed is 0 \(as fast as possible\) or a finite number above it"
    ):
        ReplayServer([], speed=speed)


def sse_answer(**fields: Any) -> Recorded:
    return Recorded(
        **{
            "method": "GET",
            "path": "/events",
            "status": 200,
            "response_headers": [("Content-Type", "text/event-stream")],
            "is_sse": True,
            "chunks": [(MS, b"id: 1\ndata: a\n\n"), (2 * MS, b"id: 2\ndata: b\n\n")],
            "outcome": "complete",
            **fields,
        }
    )


async def test_an_empty_last_event_id_is_a_fresh_request(tmp_path: Path, serve: Serve) -> None:
    """In SSE an empty id is no last event: a client sending one asks for the stream from
    its start, and a recording of such a request answers a request without one."""
    whole = b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n"
    for recorded, sent in (
        (sse_answer(), {"Last-Event-ID": ""}),
        (sse_answer(request_headers=[("Last-Event-ID", "")]), {}),
    ):
        write_cassette(tmp_path / "c.jsonl", [recorded])
        server = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0)
        url = await serve(server.app)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/events", headers=sent) as r:
            assert (r.status, await r.read()) == (200, whole), sent
        assert server.stats.refused == [] and server.stats.missed == [] and server.unused() == []
        assert [s["reasons"] for s in server.report()["streams"]] == [[]]


async def test_a_request_forwarded_live_gets_no_faults_and_says_so(tmp_path: Path, serve: Serve) -> None:
    """The replay's own header reaches neither the agent nor the recording, and the faults
    it asked for, which nothing replayed could be given, are listed as not applied."""
    seen: list[str] = []
    app = create_agent_app(pace=0)

    async def note(request: web.Request, response: web.StreamResponse) -> None:
        seen.append(request.headers.get("X-Tasktape-Fault", "(none)"))

    app.on_response_prepare.append(note)
    agent = await serve(app)
    fault = {"X-Tasktape-Fault": "drop-after=1;path=/message*"}
    passthrough = ReplayServer([], mode=ReplayMode.PASSTHROUGH, upstream=agent)
    db = tmp_path / "grows.db"
    with LogWriter(db) as writer:
        recording = ReplayServer(
            [], speed=0, mode=ReplayMode.RECORD_MISSING, upstream=agent, writer=writer, log_path=db
        )
        for server in (passthrough, recording):
            url = await serve(server.app)
            body, _, status = await timed_post(f"{url}/message:stream", message("hello"), fault)
            assert status == 200 and b"TASK_STATE_COMPLETED" in body  # whole: not dropped
            # Faults a replayed answer would not get either (of another path; on events, for
            # an answer that is no stream) are not missed.
            card = f"{url}/.well-known/agent-card.json"
            for spec in ("skip=2", "status=500;path=/other"):
                headers = {"X-Tasktape-Fault": spec}
                async with aiohttp.ClientSession() as session, session.get(card, headers=headers) as r:
                    assert r.status == 200
            async with aiohttp.ClientSession() as session, session.get(f"{url}/_tasktape/faults") as r:
                assert (await r.json())["not_applied"] == [
                    {
                        "request": "POST /message:stream",
                        "fault": "drop-after=1",
                        "reason": "the request was forwarded live to the upstream, and faults are made on "
                        "replayed answers only",
                        "times": 1,
                    }
                ]
            assert [str(u) for u in server.stats.unapplied] == [
                "X-Tasktape-Fault drop-after=1 of POST /message:stream not applied: the request was "
                "forwarded live to the upstream, and faults are made on replayed answers only"
            ]
        for _ in range(100):  # the recording is added once the log has it
            if recording.recorded:
                break
            await asyncio.sleep(0.02)
    # The two streams and the card reads that reached it (record-missing replays a card it
    # recorded once the log has it), none with the header.
    assert len(seen) in (5, 6) and set(seen) == {"(none)"}
    for recorded in load([db]):  # the stream and the two card reads
        assert "x-tasktape-fault" not in {name.lower() for name, _ in recorded.request_headers}
    # Nothing is replayed in passthrough: a fault given to it has nothing to apply to.
    with pytest.raises(UsageError, match="mode passthrough replays nothing"):
        ReplayServer([], mode=ReplayMode.PASSTHROUGH, upstream=agent, faults=Faults.parse("drop-after=1"))
    with pytest.raises(UsageError, match="mode passthrough replays nothing"):
        passthrough.arm(Faults.parse("drop-after=1"), "tasktape.fault()")


BODY = b'{"n": 1}'


@pytest.mark.parametrize("lengths", [["99"], ["2"], ["-8"], ["8 bytes"], ["8", "8"]])
async def test_a_recorded_length_that_is_not_the_body_s_is_left_out(
    tmp_path: Path, serve: Serve, caplog: pytest.LogCaptureFixture, lengths: list[str]
) -> None:
    """A cassette edited by hand: too long a length would hang the client, too short a one
    would cut the body. The body goes out whole, framed as HTTP says, and the load says why."""

    def answer(lengths: list[str], **fields: Any) -> Recorded:
        return Recorded(
            **{
                "method": "GET",
                "path": "/x",
                "status": 200,
                "response_headers": [("Content-Type", "application/json")]
                + [("Content-Length", v) for v in lengths],
                "chunks": [(0, BODY[:4]), (MS, BODY[4:])],
                "outcome": "complete",
                **fields,
            }
        )

    write_cassette(tmp_path / "c.jsonl", [answer(lengths), answer(["8"], path="/right")])
    server = ReplayServer(load([tmp_path / "c.jsonl"]), speed=0)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "tasktape.replay"]
    assert warning.startswith("tasktape replay: GET /x (c.jsonl:2): its Content-Length")
    assert warning.endswith("; it is left out, and the body sent whole")
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/x") as r:
            assert await asyncio.wait_for(r.read(), 5) == BODY and "Content-Length" not in r.headers
        async with session.get(f"{url}/right") as r:  # a right one goes out as recorded
            assert await r.read() == BODY and r.headers.getall("Content-Length") == ["8"]
    # No body to frame, or one that broke off: the recorded length is no mistake; nor is
    # the length of a body the recorder redacted (the upstream's, before), left out quietly.
    caplog.clear()
    redacted = b'{"apiKey": "[REDACTED]"}'
    server = ReplayServer([answer(["31"], chunks=[(0, redacted)])], speed=0)
    assert [r for r in caplog.records if r.name == "tasktape.replay"] == []
    async with aiohttp.ClientSession() as session, session.get(f"{await serve(server.app)}/x") as r:
        assert await asyncio.wait_for(r.read(), 5) == redacted and "Content-Length" not in r.headers
    ReplayServer(
        [
            answer(["99"], method="HEAD", chunks=[]),
            answer(["99"], status=304, chunks=[]),
            answer(["99"], outcome="upstream_disconnected"),
        ]
    )
    assert [r for r in caplog.records if r.name == "tasktape.replay"] == []


def test_what_a_load_says_of_a_recording_hides_the_values_misses_hide(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Content-Length edited by hand and a body cut when recorded were said with the query
    as recorded (a cassette written by hand with ?key=...): a miss hides the defaults' names,
    those the replay is told to redact, and those any recording holds redacted, a later one too."""

    def answer(query: str, **fields: Any) -> Recorded:
        return Recorded(
            method="GET",
            path="/x",
            query=query,
            status=200,
            response_headers=[("Content-Type", "application/json")],
            chunks=[(0, BODY)],
            outcome="complete",
            **fields,
        )

    wrong_length = answer("key=sk-live-1&mode=sk-live-2&sess=sk-live-3&page=1")
    wrong_length.response_headers.append(("Content-Length", "99"))
    recorded = [
        wrong_length,
        answer("mode=sk-live-4", response_body_truncated=True),
        answer("sess=[REDACTED]"),
    ]
    write_cassette(tmp_path / "c.jsonl", recorded)
    ReplayServer(load([tmp_path / "c.jsonl"]), speed=0, redactor=Redactor(query=["mode"]))
    said = [r.getMessage() for r in caplog.records if r.name == "tasktape.replay"]
    assert [line.split(": ", 2)[1] for line in said] == [
        "GET /x?key=[REDACTED]&mode=[REDACTED]&sess=[REDACTED]&page=1 (c.jsonl:2)",
        "GET /x?mode=[REDACTED] (c.jsonl:5)",
    ]
    assert "sk-live" not in "".join(said)


async def test_a_resume_from_no_recorded_event_is_refused_without_a_credential_s_value(
    serve: Serve,
) -> None:
    """The refusal named the recorded stream by its request as recorded (``?key=...``), which
    a client's test output shows, though a miss's answer hides it."""
    stream = Recorded(
        method="GET",
        path="/events",
        query="key=sk-live-1",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        chunks=[(0, b"id: 1\ndata: a\n\n")],
        outcome="complete",
        is_sse=True,
        origin="c.jsonl:2",
    )
    url = await serve(ReplayServer([stream], speed=0).app)
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}/events?key=sk-live-1", headers={"Last-Event-ID": "nope"}) as r,
    ):
        text = await r.text()
    assert r.status == 400 and "sk-live" not in text
    assert "names no event of the recorded stream (GET /events?key=[REDACTED], c.jsonl:2)" in text


async def test_a_replayed_answer_has_the_recorded_headers_and_a_date(tmp_path: Path, serve: Serve) -> None:
    """aiohttp names itself in a Server header and types an untyped body: a replayed answer
    gets neither, only a Date where the recording has none (as the recorder passes it on)."""
    untyped = Recorded(
        method="GET", path="/untyped", status=200, response_headers=[], chunks=[(0, BODY)], outcome="complete"
    )
    named = Recorded(
        method="GET",
        path="/named",
        status=200,
        response_headers=[("Server", "agent/1.0"), ("Date", "Sun, 06 Dec 2026 15:00:00 GMT")],
        chunks=[(0, BODY)],
        outcome="complete",
    )
    url = await serve(ReplayServer([untyped, named], speed=0).app)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/untyped") as r:
            assert await r.read() == BODY
            assert "Server" not in r.headers and "Content-Type" not in r.headers and "Date" in r.headers
        async with session.get(f"{url}/named") as r:
            assert (r.headers["Server"], r.headers["Date"]) == ("agent/1.0", "Sun, 06 Dec 2026 15:00:00 GMT")


def long_run_cassette(tmp_path: Path) -> Path:
    """A page, an agent card (rewritten each time: it differs every time alike) and a
    JSON-RPC call (a request with another id differs in its own way), each to ask again."""
    page = Recorded(method="GET", path="/page", status=200, chunks=[(0, b"page")], outcome="complete")
    card = Recorded(
        method="GET",
        path="/.well-known/agent-card.json",
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(0, b'{"name": "agent", "url": "http://agent.example/rpc"}')],
        outcome="complete",
    )
    call = Recorded(
        method="POST",
        path="/rpc",
        request_body=b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(0, b'{"jsonrpc": "2.0", "id": 1, "result": {}}')],
        outcome="complete",
    )
    write_cassette(tmp_path / "c.jsonl", [page, card, call])
    return tmp_path / "c.jsonl"


async def ask(url: str, times: int, path: str, method: str = "GET", **request: Any) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(times):
            async with session.request(method, f"{url}{path}", **request) as r:
                await r.read()


async def test_a_long_run_keeps_a_bounded_record_and_exact_counts(
    tmp_path: Path, serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay that serves for days keeps the latest answers and the first that differed
    in full, and counts every answer; its exit summary says each way answers differed
    once, with how many did."""
    monkeypatch.setattr(fidelity, "RECENT", 10)
    monkeypatch.setattr(fidelity, "DIFFERED", 5)
    monkeypatch.setattr(fidelity, "SUMMARY_LINES", 3)
    server = ReplayServer(load([long_run_cassette(tmp_path)]), speed=0, allow_repeats=True)
    url = await serve(server.app)
    await ask(url, 1, "/page", headers={"X-Tasktape-Fault": "status=503"})  # answer 1
    await ask(url, 15, "/.well-known/agent-card.json")  # 2 to 16
    await ask(url, 30, "/page")  # 17 to 46, each identical
    for n in (7, 8, 9):  # 47 to 49
        await ask(url, 1, "/rpc", method="POST", json={"jsonrpc": "2.0", "id": n, "method": "ping"})
    report = server.report()
    streams = report.pop("streams")
    assert report == {
        "answers": 49,
        "identical": 30,
        "reasons": {"fault": 1, "rewrite": 18},
        "lateness_ms": report["lateness_ms"],
        "under_way": 0,
        "omitted": 34,
    }
    # The first five that differed, then the latest ten.
    assert [s["answer"] for s in streams] == [1, 2, 3, 4, 5, *range(40, 50)]
    assert streams[0]["reasons"] == ["fault: status=503"] and streams[-1]["identical"] is False
    assert [s.number for s in server.served] == [s["answer"] for s in streams]
    page, card, call = (r.origin for r in server.recorded)
    first, *lines = fidelity.summary(server.fidelity)
    assert first.startswith("  fidelity: 30 of 49 answers byte-identical, latest chunk ")
    assert lines == [
        f"    GET /page ({page}): fault: status=503",
        f"    GET /.well-known/agent-card.json ({card}): rewrite: the agent card points at {url} (x15)",
        f"    POST /rpc ({call}): rewrite: the JSON-RPC id 1 is 7",
        "    and 2 more answers that differed otherwise",
    ]


async def test_a_test_s_tape_keeps_every_answer_for_assert_faithful(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test's server lives as long as the test: its report has every answer, and
    assert_faithful finds the one that was not the recording among many."""
    monkeypatch.setattr(fidelity, "RECENT", 10)
    monkeypatch.setattr(fidelity, "DIFFERED", 0)
    session = TapeSession(TapeOptions(long_run_cassette(tmp_path), allow_repeats=True), {}, lambda _: False)
    tape = await session.start()
    try:
        await ask(tape.url, 30, "/page")
        await ask(tape.url, 1, "/page", headers={"X-Tasktape-Fault": "status=503"})
        await ask(tape.url, 30, "/page")
        report = tape.report()
        assert (report["answers"], report["omitted"], len(report["streams"])) == (61, 0, 61)
        with pytest.raises(Unfaithful, match=r"GET /page \(c\.jsonl:\d+\): fault: status=503") as failed:
            tape.assert_faithful()
        assert str(failed.value).count("\n") == 1  # that one answer only
        tape.assert_faithful(allow="fault")
    finally:
        await session.stop(passed=True)


async def test_a_long_run_keeps_misses_and_refusals_bounded_with_exact_counts(
    tmp_path: Path, serve: Serve
) -> None:
    """A client polling paths never recorded for days: every miss and refusal is counted,
    the first of each distinct one kept (``KEPT`` of them at most), and the exit summary
    says each once, with how many came, then how many more."""
    server = ReplayServer(load([long_run_cassette(tmp_path)]), speed=0)
    url = await serve(server.app)
    for path in ("/health", "/poll", "/status"):
        await ask(url, KEPT, path)
    async with aiohttp.ClientSession() as session:
        for n in range(KEPT):  # (3 distinct ones kept already: the last 3 are past the bound)
            async with session.get(f"{url}/item/{n}") as r:
                await r.read()
    await ask(url, 3 * KEPT, "/page", headers={"X-Tasktape-Fault": "explode=1"})
    stats = server.stats
    assert (stats.misses.total, stats.misses.others, len(stats.missed)) == (4 * KEPT, 3, KEPT)
    assert (stats.refusals.total, len(stats.refused), stats.served) == (3 * KEPT, 1, 0)
    lines = report(server, [])
    assert lines[0] == f"tasktape replay: 0 served, {4 * KEPT} missed, {3 * KEPT} refused"
    missed = [line for line in lines if line.startswith("  missed ")]
    assert missed[:4] == [
        "  missed GET /health (x50)",
        "  missed GET /poll (x50)",
        "  missed GET /status (x50)",
        "  missed GET /item/0",
    ]
    assert len(missed) == KEPT and sum(line.startswith("    closest: ") for line in lines) == 3 * KEPT
    assert "  and 3 more requests that missed otherwise" in lines
    (refused,) = [line for line in lines if line.startswith("  refused ")]
    assert refused.startswith("  refused GET /page (X-Tasktape-Fault 'explode=1'") and refused.endswith(
        f"(x{3 * KEPT})"
    )


async def test_a_test_s_tape_keeps_every_miss_to_fail_the_test(tmp_path: Path) -> None:
    """A test's server lives as long as the test, which fails naming each of its misses:
    past the distinct ones a long-running replay keeps, and each time one came again."""
    session = TapeSession(TapeOptions(long_run_cassette(tmp_path)), {}, lambda _: False)
    tape = await session.start()
    try:
        await ask(tape.url, 2, "/health")
        async with aiohttp.ClientSession() as http:
            for n in range(KEPT + 1):
                async with http.get(f"{tape.url}/item/{n}") as r:
                    await r.read()
        assert (len(tape.missed), tape.server.stats.misses.total) == (KEPT + 3, KEPT + 3)
        problems = tape.problems() or ""
        assert problems.count("GET /health matches nothing") == 2
        assert f"GET /item/{KEPT} matches nothing" in problems
    finally:
        await session.stop(passed=True)
