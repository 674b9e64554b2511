"""The tools an LLM's answer calls: the log's ``tool_calls`` (on ``exchanges`` and in
``stream_summary``) holds each call's id, tool name and arguments as the official SDK
assembles them from the same stream (or answer), for OpenAI's Chat Completions and
Responses APIs and Anthropic's Messages; a stream cut short keeps the arguments that came;
the stream page shows them; older logs gain them on upgrade."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from conftest import RecordFactory, Serve
from inspector_log import page
from llm_servers import ARGUMENTS, anthropic_app, openai_app
from log_rows import before_migration

from tasktape.errors import SchemaTooOld
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.checker import check_log
from tasktape.eventlog.protocols.anthropic import AnthropicReader
from tasktape.eventlog.protocols.openai import OpenAIReader
from tasktape.eventlog.schema import SCHEMA_VERSION, STREAM_SUMMARY_15
from tasktape.inspector.app import create_datasette

SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
# (strict: the SDK's stream helper assembles only strict tools' calls)
CHAT_TOOLS = [
    {"type": "function", "function": {"name": name, "strict": True, "parameters": SCHEMA}}
    for name in ("get_weather", "get_time", "never_called")
]
RESPONSES_TOOLS = [{"type": "function", "name": t["function"]["name"], "parameters": {}} for t in CHAT_TOOLS]
ANTHROPIC_TOOLS = [{"name": t["name"], "input_schema": {"type": "object"}} for t in RESPONSES_TOOLS]
ASK = "What is the weather and the time in Zürich?"

Call = tuple[str, str, Any]  # id, name, arguments (parsed)
Asker = Callable[[str, bool], Awaitable[list[Call]]]


async def chat_calls(base: str, stream: bool) -> list[Call]:
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    async with client:
        asked: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": ASK}],
            "tools": CHAT_TOOLS,
        }
        if stream:
            async with client.chat.completions.stream(**asked) as events:
                async for _ in events:
                    pass
                message = (await events.get_final_completion()).choices[0].message
        else:
            message = (await client.chat.completions.create(**asked)).choices[0].message
    calls = message.tool_calls or []
    return [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls]  # type: ignore[union-attr]


async def responses_calls(base: str, stream: bool) -> list[Call]:
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)
    async with client:
        asked: dict[str, Any] = {"model": "gpt-4o-mini", "input": ASK, "tools": RESPONSES_TOOLS}
        if stream:
            async with client.responses.stream(**asked) as events:
                async for _ in events:
                    pass
                response = await events.get_final_response()
        else:
            response = await client.responses.create(**asked)
    items = [item for item in response.output if item.type == "function_call"]
    return [(i.call_id, i.name, json.loads(i.arguments)) for i in items]  # type: ignore[union-attr]


async def messages_calls(base: str, stream: bool) -> list[Call]:
    client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    async with client:
        asked: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": ASK}],
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            async with client.messages.stream(**asked) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**asked)
    return [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]


CASES: dict[str, tuple[Callable[..., Any], Asker, str]] = {
    "openai-chat": (openai_app, chat_calls, "tool_calls"),
    "openai-responses": (openai_app, responses_calls, "completed"),
    "anthropic-messages": (anthropic_app, messages_calls, "tool_use"),
}


def logged_calls(log: EventLog, exchange_id: int) -> list[Call]:
    (row,) = log.stream_summary(exchange_id)
    return [(c["id"], c["name"], json.loads(c["arguments"])) for c in json.loads(row["tool_calls"])]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("case", CASES)
async def test_the_log_holds_the_calls_the_sdk_assembled(
    case: str, stream: bool, record: RecordFactory
) -> None:
    make_app, ask, finish = CASES[case]
    rec = await record(make_app(delay=0))
    calls = await ask(rec.url, stream)
    assert [(name, arguments) for _, name, arguments in calls] == [
        ("get_weather", ARGUMENTS),
        ("get_time", ARGUMENTS),
    ]
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert logged_calls(log, x["id"]) == calls
        (summary,) = log.stream_summary(x["id"])
        assert summary["finish"] == finish
        assert check_log(log) == []
        # The arguments are the model's JSON text as it came, not parsed and dumped again.
        assert all(
            c["arguments"] == json.dumps(ARGUMENTS, separators=(",", ":"), ensure_ascii=False)
            for c in json.loads(x["tool_calls"])
        )


async def test_an_answer_without_calls_has_none(record: RecordFactory) -> None:
    rec = await record(openai_app(delay=0))
    client = openai.AsyncOpenAI(base_url=f"{rec.url}/v1", api_key="sk-test", max_retries=0)
    async with client:
        await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}]
        )
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["tool_calls"] is None and x["answer"]


@pytest.mark.parametrize("case", ["openai-chat", "anthropic-messages"])
async def test_a_stream_cut_short_keeps_the_arguments_that_came(case: str, record: RecordFactory) -> None:
    """The client leaves in the middle of the first call's arguments: the log names the
    call and holds its arguments as far as they came, which are no JSON yet."""
    make_app, _, _ = CASES[case]
    rec = await record(make_app(delay=0.02))
    if case == "openai-chat":
        client: Any = openai.AsyncOpenAI(base_url=f"{rec.url}/v1", api_key="sk-test", max_retries=0)
        asked = client.chat.completions.stream(
            model="gpt-4o-mini", messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS
        )
        wanted = "tool_calls.function.arguments.delta"
    else:
        client = anthropic.AsyncAnthropic(base_url=rec.url, api_key="sk-ant-test", max_retries=0)
        asked = client.messages.stream(
            model="claude-sonnet-4-5",
            max_tokens=64,
            messages=[{"role": "user", "content": ASK}],
            tools=ANTHROPIC_TOOLS,
        )
        wanted = "input_json"
    async with client, asked as events:
        pieces = 0
        async for event in events:
            pieces += event.type == wanted and bool(getattr(event, "partial_json", True))
            if pieces == 2:
                break
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "client_disconnected"
        (call,) = json.loads(x["tool_calls"])
        assert check_log(log) == []  # (arguments cut off with their stream break no rule)
    assert call["name"] == "get_weather" and call["id"]
    assert json.dumps(ARGUMENTS, separators=(",", ":"), ensure_ascii=False).startswith(call["arguments"])
    assert 0 < len(call["arguments"]) < len(json.dumps(ARGUMENTS, ensure_ascii=False)) - 2


async def test_the_stream_page_shows_the_calls(record: RecordFactory) -> None:
    rec = await record(anthropic_app(delay=0))
    calls = await messages_calls(rec.url, True)
    with await rec.log() as log:
        (x,) = log.exchanges()
    html = await page(create_datasette(rec.db), f"/{Path(rec.db).stem}/-/stream/{x['id']}")
    assert "<h3>2 tool calls</h3>" in html
    shown = re.findall(r'<div class="tt-art-head">(\w+) <code>(\w+)</code>', html)
    assert shown == [(name, call_id) for call_id, name, _ in calls]
    # The arguments indented, escaped as every recorded byte is.
    assert html.count('<pre class="tt-text">{\n  &#34;city&#34;: &#34;Zürich&#34;,') == 2


async def test_an_older_log_gains_its_calls_on_upgrade(record: RecordFactory, tmp_path: Path) -> None:
    """A log of schema version 15 (no tool_calls column) is read again on upgrade."""
    rec = await record(openai_app(delay=0))
    calls = await responses_calls(rec.url, True)
    with await rec.log():
        pass
    old = before_migration(
        rec.db, tmp_path / "old.db", "0016_tool_calls", column="tool_calls", summary_view=STREAM_SUMMARY_15
    )
    with pytest.raises(SchemaTooOld):
        EventLog(old)
    with LogWriter(old):  # opened for writing: upgraded
        pass
    with EventLog(old) as log:
        assert log.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        (x,) = log.exchanges()
        assert logged_calls(log, x["id"]) == calls


def calls_read(reader: Any, events: list[tuple[str | None, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The tool calls a protocol's reader makes of these events (type, data)."""
    for event_type, data in events:
        reader.event(json.dumps(data), event_type)
    return json.loads(reader.finished().tool_calls or "[]")


def chunk(*pieces: dict[str, Any]) -> tuple[None, dict[str, Any]]:
    choice = {"index": 0, "delta": {"tool_calls": list(pieces)}, "finish_reason": None}
    return None, {"object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def test_the_variants_servers_that_copy_the_apis_send() -> None:
    """Calls without an index (each its own, by its id), an id that comes empty first, a
    Responses item whose id is null (its place in the output names it), a tool of no
    input (arguments "{}", as the SDK makes it; "" only while the block is open)."""
    unindexed = [
        chunk({"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
        chunk({"function": {"arguments": '{"city":"A"}'}}),
        chunk({"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": ""}}),
        chunk({"function": {"arguments": '{"tz":"B"}'}}),
    ]
    assert calls_read(OpenAIReader(), unindexed) == [
        {"id": "call_a", "name": "get_weather", "arguments": '{"city":"A"}'},
        {"id": "call_b", "name": "get_time", "arguments": '{"tz":"B"}'},
    ]
    late_id = [
        chunk({"index": 0, "id": "", "function": {"name": "f", "arguments": "{}"}}),
        chunk({"index": 0, "id": "call_real"}),
    ]
    assert calls_read(OpenAIReader(), late_id) == [{"id": "call_real", "name": "f", "arguments": "{}"}]
    items = [
        {
            "type": "function_call",
            "id": None,
            "call_id": f"call_{n}",
            "name": "f",
            "arguments": f'{{"n":{n}}}',
        }
        for n in (1, 2)
    ]
    added = [
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": n, "item": item},
        )
        for n, item in enumerate(items)
    ]
    assert [c["id"] for c in calls_read(OpenAIReader(), added)] == ["call_1", "call_2"]

    def block(closed: bool) -> list[tuple[str, dict[str, Any]]]:
        tool = {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}
        events = [
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": tool}),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": ""},
                },
            ),
        ]
        return events + [("content_block_stop", {"type": "content_block_stop", "index": 0})] * closed

    assert calls_read(AnthropicReader(), block(True)) == [{"id": "toolu_1", "name": "now", "arguments": "{}"}]
    assert calls_read(AnthropicReader(), block(False))[0]["arguments"] == ""  # cut before any came


def answering(events: list[tuple[str | None, Any]]) -> web.Application:
    """An upstream that answers every POST with these events (event field, data)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event_type, data in events:
            named = f"event: {event_type}\n" if event_type else ""
            text = data if isinstance(data, str) else json.dumps(data)
            await response.write(f"{named}data: {text}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    return app


def typed(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    """An event that names its type twice, as Anthropic's and the Responses API's do."""
    return kind, {"type": kind, **fields}


def tool_block(index: int, name: str) -> tuple[str, dict[str, Any]]:
    block = {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}
    return typed("content_block_start", index=index, content_block=block)


def json_piece(index: int, piece: str) -> tuple[str, dict[str, Any]]:
    delta = {"type": "input_json_delta", "partial_json": piece}
    return typed("content_block_delta", index=index, delta=delta)


def chat_piece(index: int, **call: Any) -> tuple[None, dict[str, Any]]:
    choice = {"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}, "finish_reason": None}
    return None, {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


NOT_JSON = '{"city": Paris}'  # what a model may write, and no SDK reads
STARTED = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []}
# A call whose input is not JSON, then a call of a tool of no input (only "" came).
BAD_MESSAGE = [
    typed("message_start", message={**STARTED, "usage": {"input_tokens": 9, "output_tokens": 1}}),
    tool_block(0, "get_weather"),
    json_piece(0, NOT_JSON[:9]),
    json_piece(0, NOT_JSON[9:]),
    typed("content_block_stop", index=0),
    tool_block(1, "get_time"),
    json_piece(1, ""),
    typed("content_block_stop", index=1),
    typed("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 12}),
    typed("message_stop"),
]
# A call whose arguments stop mid-object, then one whose arguments are "" (json.loads fails).
BAD_CHAT = [
    chat_piece(0, id="call_1", type="function", function={"name": "get_weather", "arguments": '{"a":'}),
    chat_piece(1, id="call_2", type="function", function={"name": "get_time", "arguments": ""}),
    (
        None,
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
        },
    ),
    (None, "[DONE]"),
]
CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather"}
BAD_RESPONSE = [
    typed("response.created", response={"id": "r", "model": "m", "status": "in_progress", "output": []}),
    typed(
        "response.output_item.added", output_index=0, item={**CALL, "arguments": "", "status": "in_progress"}
    ),
    typed("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta=NOT_JSON),
    typed("response.function_call_arguments.done", item_id="fc_1", output_index=0, arguments=NOT_JSON),
    typed(
        "response.output_item.done",
        output_index=0,
        item={**CALL, "arguments": NOT_JSON, "status": "completed"},
    ),
    typed(
        "response.completed",
        response={
            "id": "r",
            "object": "response",
            "model": "m",
            "status": "completed",
            "output": [{**CALL, "arguments": NOT_JSON, "status": "completed"}],
        },
    ),
]
STRICT = {"type": "object", "properties": {}, "additionalProperties": False}


async def test_arguments_that_are_not_json_break_a_rule(record: RecordFactory, serve: Serve) -> None:
    """A stream that ran to its end with a tool call's arguments that are not JSON: the SDK
    fails on them, and ``tasktape check`` says which call (an Anthropic tool of no input,
    whose input is "", is what the SDK reads as {}: no finding)."""
    client = anthropic.AsyncAnthropic(
        base_url=await serve(answering(BAD_MESSAGE)), api_key="k", max_retries=0
    )
    async with client, client.messages.stream(model="claude-x", max_tokens=64, messages=[]) as events:
        with pytest.raises(ValueError, match="Unable to parse tool parameter JSON"):
            await events.get_final_message()
    chat = openai.AsyncOpenAI(base_url=f"{await serve(answering(BAD_CHAT))}/v1", api_key="k", max_retries=0)
    tools = [
        {"type": "function", "function": {"name": n, "strict": True, "parameters": STRICT}}
        for n in ("get_weather", "get_time")
    ]
    async with chat, chat.chat.completions.stream(model="m", messages=[], tools=tools) as events:
        with pytest.raises(ValueError, match="Expecting value"):
            await events.get_final_completion()
    answers = {"/v1/messages": BAD_MESSAGE, "/v1/chat/completions": BAD_CHAT, "/v1/responses": BAD_RESPONSE}
    found: dict[str, list[tuple[str, int | None, str]]] = {}
    for path, answer in answers.items():
        rec = await record(answering(answer))
        body = {"model": "m", "messages": [], "input": "x", "stream": True}
        async with rec.session.post(rec.url + path, json=body) as response:
            await response.read()
        with await rec.log() as log:
            found[path] = [(f.rule, f.seq, f.message) for f in check_log(log)]
    assert found == {
        "/v1/messages": [
            (
                "anthropic-tool-json",
                4,
                "the input of tool 'get_weather' (block 0) is not JSON: '{\"city\": Paris}'",
            )
        ],
        "/v1/chat/completions": [
            (
                "openai-tool-json",
                None,
                "the arguments of tool call call_1 (get_weather) are not JSON: '{\"a\":'",
            ),
            ("openai-tool-json", None, "the arguments of tool call call_2 (get_time) are not JSON: ''"),
        ],
        "/v1/responses": [
            (
                "openai-tool-json",
                None,
                "the arguments of tool call call_1 (get_weather) are not JSON: '{\"city\": Paris}'",
            )
        ],
    }
