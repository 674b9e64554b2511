"""OpenAI and Anthropic token streams, with the official SDKs as clients: through the
recording proxy and against the replay server, the SDK assembles the same answer, model,
usage and finish as it does straight from the server; the log classifies each event by
its protocol, stream_summary holds what the SDK assembled, and the checker finds nothing
on clean streams and the broken rule on each deliberately broken one."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from llm_servers import anthropic_app, openai_app

from tasktape.eventlog import EventLog
from tasktape.eventlog.checker import check_log
from tasktape.eventlog.exchange_rows import ExchangeSummary
from tasktape.record import describe_exchange
from tasktape.replay import ReplayServer, load

PIECES = ("Hel", "lo", ", wörld", "!")
SAY_HELLO = "Say hello"


@dataclass
class Assembled:
    """What an SDK made of one stream."""

    answer: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    finish: str | None
    kinds: list[str]  # the event types the SDK yielded, in order


async def chat(base: str, prompt: str = SAY_HELLO) -> Assembled:
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    async with client:
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True},
        )
        texts, finish, usage, model, kinds = [], None, None, "", []
        async for chunk in stream:
            kinds.append(chunk.object)
            model = chunk.model
            usage = chunk.usage or usage
            for choice in chunk.choices:
                texts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    assert usage is not None
    return Assembled("".join(texts), model, usage.prompt_tokens, usage.completion_tokens, finish, kinds)


async def responses(base: str, prompt: str = SAY_HELLO) -> Assembled:
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    async with client:
        stream = await client.responses.create(model="gpt-4o-mini", input=prompt, stream=True)
        kinds, final = [], None
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.completed":
                final = event.response
    assert final is not None and final.usage is not None
    tokens = final.usage
    return Assembled(
        final.output_text, final.model, tokens.input_tokens, tokens.output_tokens, final.status, kinds
    )


async def messages(base: str, prompt: str = SAY_HELLO) -> Assembled:
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    async with client:
        kinds = []
        asked = client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": prompt}]
        )
        async with asked as stream:
            async for event in stream:
                kinds.append(event.type)
            final = await stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    usage = final.usage
    return Assembled(text, final.model, usage.input_tokens, usage.output_tokens, final.stop_reason, kinds)


CASES = {
    "openai-chat": (openai_app, chat, "openai", "chat.completions"),
    "openai-responses": (openai_app, responses, "openai", "responses"),
    "anthropic-messages": (anthropic_app, messages, "anthropic", "messages"),
}


def summary_of(log: EventLog, exchange_id: int) -> dict[str, Any]:
    (row,) = log.stream_summary(exchange_id)
    return dict(row)


@pytest.mark.parametrize("case", CASES)
async def test_the_sdk_assembles_the_same_through_record_and_replay(
    case: str, record: RecordFactory, serve: Serve
) -> None:
    make_app, client, protocol, call = CASES[case]
    direct = await client(await serve(make_app(PIECES)))
    assert direct.answer == "".join(PIECES)
    rec = await record(make_app(PIECES, delay=0.05))
    recorded = await client(rec.url)
    assert recorded == direct
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert (x["protocol"], x["rpc_method"], x["binding"]) == (protocol, call, None)
        assert x["outcome"] == "complete"
        summary = summary_of(log, x["id"])
        events = log.events(x["id"])
    # stream_summary holds what the SDK assembled: the model the stream reported, not the alias.
    assert (summary["protocol"], summary["answer"]) == (protocol, direct.answer)
    assert summary["model"] == direct.model
    assert (summary["input_tokens"], summary["output_tokens"], summary["finish"]) == (
        direct.input_tokens,
        direct.output_tokens,
        direct.finish,
    )
    assert summary["events"] == len(events) and 0 < summary["ttfe_ms"] <= summary["duration_ms"]
    assert "".join(e["text"] or "" for e in events) == direct.answer
    assert "other" not in {e["kind"] for e in events}
    assert check_log(EventLog(rec.db)) == []

    # Replayed from the log alone, at the recorded pace: the same again, byte for byte.
    started = time.monotonic()
    replayed = await client(await serve(ReplayServer(load([rec.db]), speed=1.0).app))
    took_ms = (time.monotonic() - started) * 1000
    assert replayed == direct
    assert took_ms >= 0.8 * summary["duration_ms"]


@pytest.mark.parametrize("case", CASES)
async def test_a_prompt_streamed_through_is_read_before_its_answer(case: str, record: RecordFactory) -> None:
    """A request body over 64 KiB goes to the upstream as it comes (as a chunked one does):
    the log still knows the protocol, and so each event, from the body it kept."""
    make_app, client, protocol, call = CASES[case]
    rec = await record(make_app(PIECES, delay=0))
    long_prompt = "Summarise this: " + "lorem ipsum " * 8_000  # 96 KB
    assembled = await client(rec.url, long_prompt)
    assert assembled.answer == "".join(PIECES)
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert (x["protocol"], x["rpc_method"]) == (protocol, call)
        assert len(x["request_body"]) > 65536 and not x["request_body_truncated"]
        events = log.events(x["id"])
        assert "other" not in {e["kind"] for e in events}
        assert summary_of(log, x["id"])["answer"] == assembled.answer
    assert check_log(EventLog(rec.db)) == []


async def test_event_kinds_per_protocol(record: RecordFactory) -> None:
    rec = await record(openai_app(PIECES, delay=0))
    await chat(rec.url)
    await responses(rec.url)
    rec2 = await record(anthropic_app(PIECES, delay=0))
    await messages(rec2.url)
    with await rec.log() as log:
        chat_x, responses_x = log.exchanges()
        assert [e["kind"] for e in log.events(chat_x["id"])] == [
            "delta",  # the role, and no text
            *["delta"] * len(PIECES),
            "finish",
            "usage",
            "done",
        ]
        kinds = [(e["event_type"], e["kind"]) for e in log.events(responses_x["id"])]
        assert kinds[0] == ("response.created", "event") and kinds[-1] == ("response.completed", "done")
        assert [k for t, k in kinds if t == "response.output_text.delta"] == ["delta"] * len(PIECES)
        first = log.events(chat_x["id"])[0]
        assert first["usage"] == '{"model":"gpt-4o-mini-2024-07-18"}'  # the model, once
    with await rec2.log() as log:
        (x,) = log.exchanges()
        events = log.events(x["id"])
        assert [e["kind"] for e in events] == [e["event_type"] for e in events]
        assert [e["kind"] for e in events][:3] == ["message_start", "content_block_start", "ping"]
        assert events[-2]["state"] == "end_turn" and events[-1]["kind"] == "message_stop"


async def test_an_anthropic_message_start_is_not_taken_for_a2a(record: RecordFactory) -> None:
    rec = await record(anthropic_app(PIECES, delay=0))
    await messages(rec.url)
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["binding"] is None and x["task_id"] is None
        assert log.task_ids() == []


BREAKS = [
    (openai_app, chat, "no_done", "openai-done-last"),
    (openai_app, chat, "done_not_last", "openai-done-last"),
    (openai_app, chat, "two_finishes", "openai-one-finish"),
    (openai_app, chat, "choice_unfinished", "openai-one-finish"),
    (openai_app, chat, "refusal_after_finish", "openai-one-finish"),
    (anthropic_app, messages, "unclosed_block", "anthropic-block-order"),
    (anthropic_app, messages, "stop_not_last", "anthropic-stop-last"),
    (anthropic_app, messages, "delta_before_start", "anthropic-block-order"),
]


@pytest.mark.parametrize(("make_app", "client", "broken", "rule"), BREAKS, ids=[b[2] for b in BREAKS])
async def test_each_broken_stream_breaks_its_rule(
    record: RecordFactory, make_app: Any, client: Any, broken: str, rule: str
) -> None:
    rec = await record(make_app(PIECES, delay=0, broken=broken))
    # The SDK trips over some breaks itself: the recording is what is checked.
    with contextlib.suppress(IndexError, AssertionError):
        await client(rec.url)
    with await rec.log() as log:
        findings = check_log(log)
    assert {f.rule for f in findings} == {rule}, findings


async def test_an_error_event_ends_an_openai_chat_stream(record: RecordFactory) -> None:
    rec = await record(openai_app(PIECES, delay=0, broken="error_event"))
    with pytest.raises(openai.APIError, match="The server had an error"):
        await chat(rec.url)
    with await rec.log() as log:
        (x,) = log.exchanges()
        summary = summary_of(log, x["id"])
        assert check_log(log) == []  # neither a choice unfinished nor its event field
    assert (summary["finish"], summary["answer"]) == ("error", "".join(PIECES))


async def test_a_responses_answer_read_whole_is_summarised(record: RecordFactory) -> None:
    rec = await record(openai_app(PIECES, delay=0))
    client = openai.AsyncOpenAI(base_url=f"{rec.url}/v1", api_key="sk-test", max_retries=0)
    async with client:
        response = await client.responses.create(model="gpt-4o-mini", input=SAY_HELLO)
    with await rec.log() as log:
        (x,) = log.exchanges()
        summary = summary_of(log, x["id"])
    assert (
        (summary["answer"], summary["finish"])
        == (response.output_text, "completed")
        == ("".join(PIECES), "completed")
    )
    assert (summary["input_tokens"], summary["output_tokens"]) == (
        response.usage.input_tokens,
        response.usage.output_tokens,
    )


async def test_an_error_event_ends_an_anthropic_stream(record: RecordFactory) -> None:
    rec = await record(anthropic_app(PIECES, delay=0, overloaded_after=2))
    with pytest.raises(anthropic.APIStatusError, match="overloaded_error"):
        await messages(rec.url)
    with await rec.log() as log:
        (x,) = log.exchanges()
        summary = summary_of(log, x["id"])
        assert check_log(log) == []
    assert (summary["finish"], summary["answer"]) == ("error", "".join(PIECES[:2]))


def answering(events: list[dict[str, Any] | str], *, cut: bool = False) -> web.Application:
    """An upstream that answers every POST with these events (an event's data names its
    type, as a Responses event's does); ``cut``: then it drops the connection."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for data in events:
            named = f"event: {data['type']}\n" if isinstance(data, dict) and "type" in data else ""
            await response.write(
                f"{named}data: {json.dumps(data) if isinstance(data, dict) else data}\n\n".encode()
            )
        if cut:
            assert request.transport is not None
            request.transport.close()
        else:
            await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def chat_chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-4o-mini",
        "choices": [choice],
    }


async def test_the_recorders_line_says_how_the_answer_finished(record: RecordFactory) -> None:
    """The line ``tasktape record`` prints for an LLM exchange says the finish the log
    stores: choice 0's when the request asked for two and choice 1 finished last; none for
    a Responses stream the upstream broke before its terminal event (it was in progress)."""
    two = [
        chat_chunk(0, {"content": "A"}),
        chat_chunk(1, {"content": "B"}),
        chat_chunk(0, {}, "stop"),
        chat_chunk(1, {}, "length"),
        "[DONE]",
    ]
    summaries: list[ExchangeSummary] = []
    rec = await record(answering(two), on_exchange=summaries.append)
    client = openai.AsyncOpenAI(base_url=f"{rec.url}/v1", api_key="sk-test", max_retries=0)
    async with client:
        chunks = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Two"}], n=2, stream=True
        )
        finishes = {
            c.index: c.finish_reason async for chunk in chunks for c in chunk.choices if c.finish_reason
        }
    assert finishes == {0: "stop", 1: "length"}
    pending = {"id": "resp_1", "object": "response", "model": "gpt-4o-mini", "status": "in_progress"}
    started = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
        {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hel"},
    ]
    cut = await record(answering(started, cut=True), on_exchange=summaries.append)
    with contextlib.suppress(aiohttp.ClientPayloadError):
        async with cut.session.post(
            f"{cut.url}/v1/responses", json={"model": "gpt-4o-mini", "input": "Hi", "stream": True}
        ) as response:
            await response.read()
    with await rec.log() as log, await cut.log() as cut_log:
        finish = log.exchanges()[0]["finish"]
        cut_finish = cut_log.exchanges()[0]["finish"]
    assert (finish, cut_finish) == ("stop", None)
    chat_line, responses_line = (describe_exchange(s) for s in summaries)
    assert chat_line.startswith("POST /v1/chat/completions 200  stop  5 events"), chat_line
    assert responses_line.startswith("POST /v1/responses 200  3 events"), responses_line
    assert "in_progress" not in responses_line and "[upstream_disconnected" in responses_line


async def test_a_token_count_is_the_requests_input_tokens(record: RecordFactory) -> None:
    """messages.count_tokens answers with the input tokens a request would take: the log
    holds them as its input tokens."""

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"input_tokens": 42})

    app = web.Application()
    app.router.add_post("/v1/messages/count_tokens", count)
    rec = await record(app)
    client = anthropic.AsyncAnthropic(base_url=rec.url, api_key="sk-ant-test", max_retries=0)
    async with client:
        counted = await client.messages.count_tokens(
            model="claude-sonnet-4-5", messages=[{"role": "user", "content": SAY_HELLO}]
        )
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert (x["protocol"], x["rpc_method"]) == ("anthropic", "messages.count_tokens")
    assert x["input_tokens"] == counted.input_tokens == 42


async def test_a_token_count_the_log_cannot_hold_is_none(record: RecordFactory) -> None:
    """Token counts past SQLite's INTEGER (64 bits) once failed the writer's batch, and the
    exchange was lost: they are none now, the other counts kept. Anthropic's input tokens
    add the cache's to its own: counts each within 64 bits may add up to one past them."""
    chat_usage = {
        "prompt_tokens": 10**30,
        "completion_tokens": 5,
        "total_tokens": 10**30 + 5,
        "prompt_tokens_details": {"cached_tokens": True},
    }
    usage_chunk = {**chat_chunk(0, {}, "stop"), "usage": chat_usage}
    chats = await record(answering([chat_chunk(0, {"content": "Hi"}), usage_chunk, "[DONE]"]))
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "usage": {"input_tokens": 2**63 - 1, "cache_read_input_tokens": 7, "output_tokens": 1},
        },
    }
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2**64}}
    anthropics = await record(answering([start, delta, {"type": "message_stop"}]))
    for rec, path in ((chats, "/v1/chat/completions"), (anthropics, "/v1/messages")):
        body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
        async with rec.session.post(f"{rec.url}{path}", json=body) as response:
            assert response.status == 200 and "_tokens" in await response.text()
    with await chats.log() as chat_log, await anthropics.log() as anthropic_log:
        (chat_x,), (anthropic_x,) = chat_log.exchanges(), anthropic_log.exchanges()
        chat_usage_kept = [json.loads(e["usage"]) for e in chat_log.events(chat_x["id"]) if e["usage"]]
    assert chats.writer.stats.rows_lost == anthropics.writer.stats.rows_lost == 0
    assert (chat_x["protocol"], chat_x["finish"], chat_x["answer"]) == ("openai", "stop", "Hi")
    assert (chat_x["input_tokens"], chat_x["output_tokens"], chat_x["cached_input_tokens"]) == (None, 5, None)
    assert chat_usage_kept[-1] == {"output_tokens": 5}  # (the event's usage: what the log can hold)
    assert (anthropic_x["protocol"], anthropic_x["finish"]) == ("anthropic", "end_turn")
    # (the output tokens the message began with stand: the later count is none)
    assert (
        anthropic_x["input_tokens"],
        anthropic_x["output_tokens"],
        anthropic_x["cached_input_tokens"],
    ) == (None, 1, 7)
