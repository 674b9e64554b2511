"""The resume gateway rejoining an agent stream that broke: the recorder subscribes to the
task again, catches its clients up from the snapshot (made-up events, marked in the log),
and carries on; each rejoin is a row of ``resumes``; a rejoin that cannot succeed ends the
client's stream as the agent's did, and says why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from sdk_agent import SdkAgent, run_sdk_agent
from test_replay import events_of
from test_resume_gateway import HEADERS, REST_BODY, counted, first_events, rest_of

from tasktape.agent import create_agent_app
from tasktape.errors import UsageError
from tasktape.eventlog.checker import report_log
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide
from tasktape.proxy.resume_options import UnknownResume


@pytest.fixture(scope="module")
def sdk_agent() -> Any:
    with run_sdk_agent() as running:
        yield running


def breaking(
    target: str, *, after: int, streams: int = 1, snapshot: Callable[[dict[str, Any]], None] | None = None
) -> tuple[web.Application, list[str]]:
    """A front for ``target`` that cuts the first ``streams`` message streams after
    ``after`` events (the connection aborted, as a crashed link is), and lets ``snapshot``
    change a subscribe's first event; the requests it saw."""
    seen: list[str] = []
    cut = [0]

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(f"{request.method} {request.path}")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        breaks = request.path.endswith("message:stream") or b"SendStreamingMessage" in body
        breaks = breaks and cut[0] < streams
        cut[0] += breaks
        edits = snapshot is not None and not breaks
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.request(request.method, target + request.path_qs, headers=headers, data=body) as up,
        ):
            kind = {"Content-Type": up.headers["Content-Type"]}
            response = web.StreamResponse(status=up.status, headers=kind)
            await response.prepare(request)
            sent = b""
            async for data in up.content.iter_any():
                sent += data
                chunk = data
                if edits:  # held back until the first event is whole, then sent changed
                    (first, *_) = [e for e in events_of(sent) if e.complete] or [None]
                    if first is None:
                        continue
                    frame = json.loads(first.data)
                    assert snapshot is not None
                    snapshot(frame.get("result", frame)["task"])
                    chunk = b"data: " + json.dumps(frame).encode() + b"\n\n" + sent[len(first.raw) :]
                    edits = False
                await response.write(chunk)
                if breaks and len([e for e in events_of(sent) if e.complete]) >= after:
                    assert request.transport is not None
                    request.transport.abort()
                    return response
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app, seen


async def read_all(url: str, body: Any, path: str = "/message:stream") -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", json=body, headers=HEADERS) as r,
    ):
        assert r.status == 200
        return await r.read()


def frames(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for e in events_of(raw):
        if e.complete and e.data:
            frame = json.loads(e.data)
            out.append(frame.get("result", frame))
    return out


def text_of(raw: bytes) -> str:
    """The answer's text as a client builds it: deltas appended, a whole artifact replacing."""
    text: dict[str, str] = {}
    for f in frames(raw):
        update = f.get("artifactUpdate")
        if update:
            part = "".join(p.get("text", "") for p in update["artifact"]["parts"])
            name = update["artifact"]["artifactId"]
            text[name] = text.get(name, "") + part if update.get("append") else part
    return "".join(text.values())


async def rejoins(rec: Any) -> list[dict[str, Any]]:
    await rec.proxy.wait_idle()
    rec.writer.flush()
    with await rec.log() as log:
        return list(log.db.query("SELECT * FROM resumes WHERE side = 'upstream' ORDER BY id"))


async def test_a_broken_agent_stream_is_rejoined_and_the_client_misses_nothing(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.05))
    whole = text_of(await read_all(agent, REST_BODY))  # what the agent answers, unbroken
    front, seen = breaking(agent, after=6)
    rec = await record(front, hold=30.0)
    got = await read_all(rec.url, REST_BODY)
    assert text_of(got) == whole  # the text once, whole, in order
    assert "TASK_STATE_COMPLETED" in json.dumps(frames(got)[-1])
    ids = [e.id for e in events_of(got) if e.complete]
    assert len(ids) == len(set(ids))
    assert seen.count("POST /message:stream") == 1  # one task
    assert len([s for s in seen if s.endswith(":subscribe")]) == 1
    (row,) = await rejoins(rec)
    assert row["outcome"] == "rejoined" and row["attempts"] == 1 and row["events_from_log"] == 6
    made = json.loads(row["synthesized"] or "[]")
    assert set(made) <= set(ids)  # the made-up events reached the client, under the ids the log names


async def test_an_sdk_agent_stream_is_rejoined(
    record: RecordFactory, serve: Serve, sdk_agent: SdkAgent
) -> None:
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "slow hello"}]}}
    whole = text_of(await read_all(sdk_agent.url, body))
    front, _ = breaking(sdk_agent.url, after=3)
    rec = await record(await serve(front), hold=30.0)
    got = await read_all(rec.url, body)
    assert text_of(got) == whole
    assert "TASK_STATE_COMPLETED" in json.dumps(frames(got)[-1])
    (row,) = await rejoins(rec)
    assert row["outcome"] == "rejoined", row["error"]


async def test_a_jsonrpc_stream_is_rejoined_with_its_request_s_id(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.05))
    ask = {"jsonrpc": "2.0", "id": "ask-1", "method": "SendStreamingMessage", "params": REST_BODY}
    whole = text_of(await read_all(agent, ask, "/jsonrpc"))
    front, _ = breaking(agent, after=5)
    rec = await record(front, hold=30.0)
    got = await read_all(rec.url, ask, "/jsonrpc")
    assert text_of(got) == whole
    assert {json.loads(e.data)["id"] for e in events_of(got) if e.complete and e.data} == {"ask-1"}
    (row,) = await rejoins(rec)
    assert row["outcome"] == "rejoined"


async def test_a_client_that_drops_while_the_agent_broke_gets_the_rest(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.05))
    whole = text_of(await read_all(agent, REST_BODY))
    front, _ = breaking(agent, after=4)
    rec = await record(front, hold=30.0)
    first = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{rec.url}/message:stream", json=REST_BODY, headers=HEADERS) as r,
    ):
        while len([e for e in events_of(first) if e.complete]) < 3:
            first += await r.content.readany()
    kept = b"".join(e.raw for e in events_of(first) if e.complete)
    last = [e for e in events_of(kept) if e.complete][-1].id
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{rec.url}/message:stream", json=REST_BODY, headers={**HEADERS, "Last-Event-ID": last}
        ) as r,
    ):
        rest = await r.read()
    assert text_of(kept + rest) == whole


async def test_an_agent_that_cannot_be_rejoined_ends_the_stream_and_the_log_says_why(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.05))
    front, _ = breaking(agent, after=4)
    rec = await record(await serve(gated(front)), hold=30.0, rejoin_for=1.0)
    with pytest.raises(aiohttp.ClientPayloadError):
        await read_all(rec.url, REST_BODY)
    (row,) = await rejoins(rec)
    assert row["outcome"] == "gave_up" and "404" in row["error"] and row["attempts"] == 1


def gated(front: web.Application) -> web.Application:
    """``front``, but refusing every subscribe with a 404 (as an agent that lost its tasks)."""

    @web.middleware
    async def refuse(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith(":subscribe"):
            return web.json_response({"error": "no such task"}, status=404)
        return await handler(request)

    front.middlewares.append(refuse)
    return front


async def until_broken(url: str, headers: dict[str, str]) -> bytes:
    """What a repeated message:stream gets before its stream ends, abruptly or not."""
    got = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/message:stream", json=REST_BODY, headers={**HEADERS, **headers}) as r,
    ):
        assert r.status == 200
        try:
            async for data in r.content.iter_any():
                got += data
        except aiohttp.ClientPayloadError:
            pass
    return got


async def test_a_reconnect_to_a_stream_that_could_not_be_rejoined_never_reaches_the_agent(
    record: RecordFactory, serve: Serve
) -> None:
    # The agent's ids, the agent ended the stream unfinished, and it cannot be rejoined: a
    # reconnect after one of its ids is answered from the stream held, ended as the agent's
    # was. Sent to the agent, the repeated message:stream would start a second task.
    agent = await serve(create_agent_app(pace=0.05))
    front, seen = breaking(agent, after=4)
    rec = await record(await serve(gated(front)), hold=30.0, rejoin_for=0.5)
    got = [e for e in events_of(await until_broken(rec.url, {})) if e.complete]
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    rest = await until_broken(rec.url, {"Last-Event-ID": got[1].id})
    assert rest == b"".join(e.raw for e in got[2:])
    assert seen.count("POST /message:stream") == 1


async def test_a_failing_subscribe_is_retried_with_backoff_until_rejoin_for(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.05))
    front, seen = breaking(agent, after=4)

    @web.middleware
    async def unavailable(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith(":subscribe") and len([s for s in seen if s.endswith(":subscribe")]) < 2:
            seen.append(f"{request.method} {request.path}")
            return web.json_response({"error": "busy"}, status=503)
        return await handler(request)

    front.middlewares.append(unavailable)
    whole = text_of(await read_all(agent, REST_BODY))
    rec = await record(await serve(front), hold=30.0)
    started = asyncio.get_running_loop().time()
    got = await read_all(rec.url, REST_BODY)
    assert text_of(got) == whole
    (row,) = await rejoins(rec)
    assert row["outcome"] == "rejoined" and row["attempts"] == 3  # two 503s, then the stream
    assert asyncio.get_running_loop().time() - started >= 0.6  # waited 0.2 s, then 0.4 s


async def test_a_subscribe_the_agent_never_answers_gives_up_at_rejoin_for(
    record: RecordFactory, serve: Serve
) -> None:
    """The agent takes the subscribe's connection and says nothing: the client's stream
    hung for as long as the agent said nothing (for ever, if it never did)."""
    agent = await serve(create_agent_app(pace=0.05))
    front, _ = breaking(agent, after=4)
    slow_subscribes(front, 60)
    rec = await record(await serve(front), hold=30.0, rejoin_for=1.0)
    started = asyncio.get_running_loop().time()
    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(read_all(rec.url, REST_BODY), 20)
    assert asyncio.get_running_loop().time() - started < 5
    (row,) = await rejoins(rec)
    assert row["outcome"] == "gave_up" and row["attempts"] == 1  # (it waited to the deadline)
    assert "the agent did not answer within 1.0 s (--rejoin-for)" in row["error"]


def slow_subscribes(front: web.Application, seconds: float) -> None:
    """The agent is back only after ``seconds``: its task runs on meanwhile."""

    @web.middleware
    async def later(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith(":subscribe"):
            await asyncio.sleep(seconds)
        return await handler(request)

    front.middlewares.append(later)


async def test_what_the_agent_sent_while_away_is_made_up_from_its_snapshot(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.3))
    whole = text_of(await read_all(agent, REST_BODY))
    front, _ = breaking(agent, after=4)
    slow_subscribes(front, 0.5)
    rec = await record(front, hold=30.0)
    got = await read_all(rec.url, REST_BODY)
    assert text_of(got) == whole
    (row,) = await rejoins(rec)
    made = json.loads(row["synthesized"])
    assert row["outcome"] == "rejoined" and made
    sent = {e.id: json.loads(e.data) for e in events_of(got) if e.complete and e.data}
    # What was streamed while the agent was away comes as an update per artifact, under the
    # gateway's ids, right after what the client had; the text it had is not sent again.
    updates = [sent[i]["artifactUpdate"] for i in made if "artifactUpdate" in sent[i]]
    assert updates and len({u["artifact"]["artifactId"] for u in updates}) == len(updates)
    assert updates[0]["append"] is True  # the artifact the client was being sent goes on
    assert list(sent).index(made[0]) == 4


async def test_an_open_artifact_the_snapshot_leaves_out_is_a_gap_the_log_names(
    record: RecordFactory, serve: Serve
) -> None:
    agent = await serve(create_agent_app(pace=0.3))
    front, _ = breaking(agent, after=4, snapshot=lambda task: task.pop("artifacts", None))
    rec = await record(front, hold=30.0)
    got = await read_all(rec.url, REST_BODY)
    assert "TASK_STATE_COMPLETED" in json.dumps(frames(got)[-1])
    (row,) = await rejoins(rec)
    assert row["outcome"] == "gap"
    assert "clients were sent it; the snapshot leaves it out" in row["error"]


async def test_an_unknown_id_goes_to_the_agent_with_resume_unknown_forward(record: RecordFactory) -> None:
    app, seen = counted(create_agent_app(pace=0.3))
    rec = await record(app, hold=30.0, resume_unknown="forward")
    await first_events(rec.url, REST_BODY, 2)
    status, body = await rest_of(rec.url, REST_BODY, "evt.never")
    assert status == 200 and "TASK_STATE_COMPLETED" in body.decode()
    assert seen.count("POST /message:stream") == 2  # as without --resume: the agent answered it
    await rec.proxy.wait_idle()
    rec.writer.flush()
    with await rec.log() as log:
        (row,) = log.db.query("SELECT * FROM resumes")
        forwarded = log.exchange(row["new_exchange_id"])
    assert row["side"] == "client" and row["outcome"] == "forwarded" and row["last_event_id"] == "evt.never"
    # Which exchange sent it to the agent, and why it was not answered here.
    assert forwarded["method"] == "POST" and forwarded["status"] == 200
    assert "Last-Event-ID 'evt.never' names no event of the stream held here" in row["error"]
    line = Resume(
        row["exchange_id"],
        ResumeSide(row["side"]),
        ResumeOutcome(row["outcome"]),
        last_event_id=row["last_event_id"],
        new_exchange_id=row["new_exchange_id"],
        error=row["error"],
    ).describe()
    assert line.endswith(f"forwarded to the agent by exchange {row['new_exchange_id']} ({row['error']})")


def test_a_typo_in_resume_unknown_is_refused() -> None:
    refused = "'froward' is not a --resume-unknown choice; choose one of refuse, forward"
    with pytest.raises(UsageError, match=refused):
        UnknownResume.parse("froward")


async def test_the_task_views_and_check_read_a_rejoined_stream_as_its_client_got_it(
    record: RecordFactory, serve: Serve
) -> None:
    """The events made up from a subscribe's snapshot reach the log's answer (the snapshot
    holds what they carried), and the note on the stream that broke says who carried it on."""
    agent = await serve(create_agent_app(pace=0.3))
    front, _ = breaking(agent, after=4)
    slow_subscribes(front, 0.5)
    rec = await record(front, hold=30.0)
    got = await read_all(rec.url, REST_BODY)
    (row,) = await rejoins(rec)
    assert row["outcome"] == "rejoined" and json.loads(row["synthesized"])
    with await rec.log() as log:
        ((thinking, answer),) = log.db.execute("SELECT thinking, answer FROM task_summary").fetchall()
        texts = [r["text"] for r in log.db.query("SELECT text FROM task_artifacts ORDER BY first_seen")]
        (note,) = report_log(log).cut_short
    assert f"{thinking or ''}{answer}" == text_of(got) == "".join(texts)  # the thinking, then the answer
    assert note.exchange_id == row["exchange_id"]
    assert note.message.endswith(
        f"; rejoined by exchange {row['new_exchange_id']}, the task last COMPLETED there"
    )
