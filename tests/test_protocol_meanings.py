"""What recorded MCP and LLM traffic means, as the log's rows and the inspector's pages say
it: a tool that failed is a failure, a log message and a refusal are text, token counts
mean the same for every API, a failed call says why, what a turn last sent is what it
asked, and a client's reply to a server's request is named. Recorded through the proxy
from the official SDKs (the mcp SDK as server and client; the openai and anthropic SDKs
against stand-in APIs)."""

from __future__ import annotations

import asyncio
import json
import select
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from conftest import RecordFactory
from llm_servers import anthropic_app
from log_rows import before_migration
from test_llm_tool_calls import messages_calls

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.schema import STREAM_SUMMARY_16
from tasktape.inspector.app import create_datasette

# An MCP server (FastMCP) with a tool that fails, one that logs, and two that ask the
# client (sampling, elicitation); and a client that calls each, a tool that does not
# exist too. ``python mcp.py server`` prints ``ready URL``; ``python mcp.py client URL``
# prints what the SDK got, as JSON.
MCP_PEERS = """
import asyncio, json, socket, sys
from pydantic import BaseModel


def server() -> None:
    import uvicorn
    from mcp.server.fastmcp import Context, FastMCP
    from mcp.types import SamplingMessage, TextContent

    mcp = FastMCP("meanings", log_level="WARNING")

    @mcp.tool()
    def fail(why: str) -> str:
        raise ValueError(f"tool failed: {why}")

    @mcp.tool()
    async def chatty(ctx: Context) -> str:
        await ctx.info("starting up")
        await ctx.warning("careful: Zürich ☃")
        await ctx.session.send_log_message(
            "error", {"disk": "full", "free": 0}, logger="store", related_request_id=ctx.request_id
        )
        return "chatty done"

    @mcp.tool()
    async def ask_llm(topic: str, ctx: Context) -> str:
        asked = SamplingMessage(role="user", content=TextContent(type="text", text=f"a poem about {topic}"))
        got = await ctx.session.create_message(messages=[asked], max_tokens=50)
        return "sampled: " + got.content.text

    class Colour(BaseModel):
        colour: str

    @mcp.tool()
    async def ask_user(ctx: Context) -> str:
        got = await ctx.elicit(message="Favourite colour?", schema=Colour)
        return f"elicited: {got.action} {got.data.colour}"

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(mcp.streamable_http_app(), log_level="warning")
    srv = uvicorn.Server(config)

    async def run() -> None:
        serving = asyncio.create_task(srv.serve(sockets=[sock]))
        while not srv.started:
            await asyncio.sleep(0.01)
        print(f"ready http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
        await serving

    asyncio.run(run())


async def client(url: str) -> None:
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamablehttp_client

    logs = []

    async def on_log(params):
        logs.append([params.level, params.data])

    async def sampling(ctx, params):
        text = types.TextContent(type="text", text="roses are red")
        return types.CreateMessageResult(role="assistant", content=text, model="stub", stopReason="endTurn")

    async def elicit(ctx, params):
        return types.ElicitResult(action="accept", content={"colour": "blue"})

    got = {}
    async with streamablehttp_client(url) as (r, w, _), ClientSession(
        r, w, sampling_callback=sampling, elicitation_callback=elicit, logging_callback=on_log
    ) as s:
        await s.initialize()
        for name, args in [("fail", {"why": "boom"}), ("nope", {}), ("chatty", {}),
                           ("ask_llm", {"topic": "sea"}), ("ask_user", {})]:
            result = await s.call_tool(name, args)
            got[name] = {"isError": result.isError, "text": result.content[0].text}
    got["logs"] = logs
    print(json.dumps(got), flush=True)


if sys.argv[1] == "server":
    server()
else:
    asyncio.run(client(sys.argv[2]))
"""


@pytest.fixture(scope="module")
def mcp_peers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = tmp_path_factory.mktemp("peers") / "mcp_meanings.py"
    script.write_text(MCP_PEERS)
    return script


@contextmanager
def mcp_server(script: Path, timeout: float = 20.0) -> Iterator[str]:
    """The server running on a free loopback port: its endpoint's URL."""
    process = subprocess.Popen(
        [sys.executable, str(script), "server"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        while not select.select([process.stdout], [], [], 0.05)[0]:
            assert process.poll() is None and time.monotonic() < deadline, "the MCP server did not start"
        yield process.stdout.readline().removeprefix("ready ").strip()
    finally:
        process.terminate()
        process.wait(timeout=10)


def mcp_client(script: Path, url: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(script), "client", url], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


@pytest.fixture
async def mcp_log(record: RecordFactory, mcp_peers: Path) -> tuple[Path, dict[str, Any]]:
    """A session recorded through the proxy, and what the SDK client got."""
    with mcp_server(mcp_peers) as url:
        rec = await record(url.removesuffix("/mcp"))
        got = await asyncio.to_thread(mcp_client, mcp_peers, f"{rec.url}/mcp")
        (await rec.log()).close()
    return rec.db, got


def tool_calls(db: Path) -> dict[str, dict[str, Any]]:
    """The log's tools/call exchanges, by tool."""
    with EventLog(db) as log:
        calls = [x for x in log.exchanges() if x["rpc_method"] == "tools/call"]
    return {json.loads(x["request_body"])["params"]["name"]: x for x in calls}


async def get(db: Path, path: str) -> str:
    response = await create_datasette(db).client.get(f"/{db.stem}{path}")
    assert response.status_code == 200, path
    return response.text


# -- MCP ------------------------------------------------------------------------------------------


async def test_a_tool_that_failed_is_a_failure_in_the_log_and_on_the_page(
    mcp_log: tuple[Path, dict[str, Any]],
) -> None:
    """A tool that raises, and a tool that does not exist, answer with a result whose isError
    is true: the SDK reports the call failed, and so must the log, its session's errors
    and the session page."""
    db, got = mcp_log
    assert got["fail"] == {"isError": True, "text": "Error executing tool fail: tool failed: boom"}
    assert got["nope"]["isError"] is True
    calls = tool_calls(db)
    assert {name: x["finish"] for name, x in calls.items()} == {
        "fail": "tool_error",
        "nope": "tool_error",
        "chatty": "result",
        "ask_llm": "result",
        "ask_user": "result",
    }
    assert calls["fail"]["answer"] == got["fail"]["text"]
    with EventLog(db) as log:
        (answer,) = [e for e in log.events(calls["fail"]["id"]) if e["kind"] == "response"]
    assert answer["state"] == "tool_error"
    sessions = json.loads(await get(db, "/mcp_sessions.json?_shape=array"))
    assert [s["errors"] for s in sessions] == [2]
    html = await get(db, f"/-/session/{calls['fail']['session_id']}")
    errors_card = html.split('<span class="tt-label">errors</span>', 1)[1]
    assert errors_card.startswith("<strong>2</strong>")
    (fail,) = [a for a in html.split("<article") if f'id="call-{calls["fail"]["id"]}"' in a]
    assert 'class="tt-call tt-call-error"' in fail and "tool error at" in fail
    assert "Error executing tool fail: tool failed: boom" in fail


async def test_a_log_message_is_its_level_and_its_data(mcp_log: tuple[Path, dict[str, Any]]) -> None:
    """notifications/message carries its text in params.data (a string or any JSON) and its
    level in params.level: the event's text says both, full-text search finds it, and the
    session page shows it with the call whose stream carried it."""
    db, got = mcp_log
    assert got["logs"] == [
        ["info", "starting up"],
        ["warning", "careful: Zürich ☃"],
        ["error", {"disk": "full", "free": 0}],
    ]
    chatty = tool_calls(db)["chatty"]
    with EventLog(db) as log:
        logs = [(e["kind"], e["text"]) for e in log.events(chatty["id"]) if e["kind"] != "response"]
    assert logs == [
        ("log", "info: starting up"),
        ("log", "warning: careful: Zürich ☃"),
        ("log", 'error [store]: {"disk": "full", "free": 0}'),
    ]
    found = json.loads(await get(db, "/search_event_text.json?_shape=array&text=careful"))
    assert [(f["exchange_id"], f["kind"]) for f in found] == [(chatty["id"], "log")]
    html = await get(db, f"/-/session/{chatty['session_id']}")
    (call,) = [a for a in html.split("<article") if f'id="call-{chatty["id"]}"' in a]
    assert "info: starting up" in call and "warning: careful: Zürich ☃" in call
    assert "error [store]: {&#34;disk&#34;: &#34;full&#34;, &#34;free&#34;: 0}" in call


# -- LLM APIs -------------------------------------------------------------------------------------

MODEL = "gpt-4o-2024-08-06"
CLAUDE = "claude-sonnet-4-5-20250929"
REFUSAL = ["I'm sorry,", " I can't", " help with that."]
FAILED_MESSAGE = "The model failed to answer."


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


async def _sse(request: web.Request, frames: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
    await response.write_eof()
    return response


def _chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    return f"data: {_json(chunk | {'choices': [choice]} | more)}\n\n".encode()


def _named(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {_json(event)}\n\n".encode()


CHAT_USAGE = {
    "prompt_tokens": 20003,
    "completion_tokens": 5,
    "total_tokens": 20008,
    "prompt_tokens_details": {"cached_tokens": 20000},
    "completion_tokens_details": {"reasoning_tokens": 2},
}


def _chat_frames(model: str) -> list[bytes]:
    """A chat stream of each kind the tests ask for, by the model asked."""
    if model == "refuse":
        pieces = [_chunk({"role": "assistant", "content": None, "refusal": ""})]
        pieces += [_chunk({"refusal": p}) for p in REFUSAL]
        return [*pieces, _chunk({}, "stop"), b"data: [DONE]\n\n"]
    if model == "counts-every-chunk":  # as vLLM does; its first chunk names no model
        usage = {"usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}}
        first = _chunk({"role": "assistant", "content": ""}, **usage).replace(MODEL.encode(), b"")
        return [first, _chunk({"content": "Hi"}, **usage), _chunk({}, "stop", **usage), b"data: [DONE]\n\n"]
    last = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL, "choices": []}
    usage = f"data: {_json(last | {'usage': CHAT_USAGE})}\n\n".encode()
    return [_chunk({"role": "assistant", "content": "Done."}), _chunk({}, "stop"), usage, b"data: [DONE]\n\n"]


def _response(status: str, content: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant", "content": content}
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-4.1-2025-04-14",
        "output": [item] if content else [],
        "error": None,
        "incomplete_details": None,
        "tools": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
    } | more


def _responses_events(model: str) -> list[dict[str, Any]]:
    if model == "fail":
        error = {"code": "server_error", "message": FAILED_MESSAGE}
        return [{"type": "response.failed", "response": _response("failed", [], error=error)}]
    part = {"type": "refusal", "refusal": "".join(REFUSAL)}
    at = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    deltas = [{"type": "response.refusal.delta", **at, "delta": p} for p in REFUSAL]
    done = [
        {"type": "response.refusal.done", **at, "refusal": part["refusal"]},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.completed", "response": _response("completed", [part])},
    ]
    return [{"type": "response.created", "response": _response("in_progress", [])}, *deltas, *done]


def _message_events(model: str) -> list[dict[str, Any]]:
    usage = {"input_tokens": 3, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 20000}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": CLAUDE, "content": []}
    start = {"type": "message_start", "message": message | {"usage": usage | {"output_tokens": 1}}}
    blocks = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Done."}},
        {"type": "content_block_stop", "index": 0},
    ]
    stop = "refusal" if model == "refuse" else "end_turn"
    end = {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}
    return [start, *(blocks if model != "refuse" else []), end, {"type": "message_stop"}]


async def _chat(request: web.Request) -> web.StreamResponse:
    model = (await request.json())["model"]
    if model == "missing":
        error = {"message": "The model `missing` does not exist", "type": "invalid_request_error"}
        return web.json_response({"error": error | {"param": None, "code": "model_not_found"}}, status=404)
    return await _sse(request, _chat_frames(model))


async def _responses(request: web.Request) -> web.StreamResponse:
    events = _responses_events((await request.json())["model"])
    return await _sse(request, [_named(e | {"sequence_number": n}) for n, e in enumerate(events)])


async def _messages(request: web.Request) -> web.StreamResponse:
    model = (await request.json())["model"]
    if model == "overloaded":
        error = {"type": "overloaded_error", "message": "Overloaded"}
        return web.json_response({"type": "error", "error": error}, status=529)
    return await _sse(request, [_named(e) for e in _message_events(model)])


def llm_app() -> web.Application:
    """Stand-in OpenAI and Anthropic APIs, each answer chosen by the model asked."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/responses", _responses)
    app.router.add_post("/v1/messages", _messages)
    return app


def openai_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)


def anthropic_client(url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)


def summaries(db: Path) -> list[dict[str, Any]]:
    with EventLog(db) as log:
        return list(log.db.query("SELECT * FROM stream_summary ORDER BY exchange_id"))


def events_of(db: Path, exchange_id: int) -> list[dict[str, Any]]:
    with EventLog(db) as log:
        return log.events(exchange_id)


def answer_section(html: str) -> str:
    return html.split("<h2>Answer</h2>", 1)[1].split("<h2>Model and usage</h2>", 1)[0]


async def test_a_refusal_is_the_answer_and_the_page_says_it_is_one(record: RecordFactory) -> None:
    """A model that declines streams its refusal where its answer would be (a chat delta's
    refusal, Responses' response.refusal.delta): the SDK shows it, so the log's answer and
    event text hold it, search finds it, and the page shows it as a refusal. Anthropic's
    refusal is a stop_reason alone: the page says the model refused."""
    rec = await record(llm_app())
    client = openai_client(rec.url)
    stream = await client.chat.completions.create(
        model="refuse", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    chat = "".join([c.choices[0].delta.refusal or "" async for c in stream if c.choices])
    stream = await client.responses.create(model="refuse", input="hi", stream=True)
    said = "".join([e.delta async for e in stream if e.type == "response.refusal.delta"])
    async with anthropic_client(rec.url).messages.stream(
        model="refuse", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as events:
        claude = await events.get_final_message()
    assert chat == said == "".join(REFUSAL) and claude.stop_reason == "refusal"
    (await rec.log()).close()
    rows = summaries(rec.db)
    assert [(s["answer"], s["finish"]) for s in rows] == [
        ("".join(REFUSAL), "stop"),
        ("".join(REFUSAL), "completed"),
        (None, "refusal"),
    ]
    kinds = [(e["kind"], e["text"]) for e in events_of(rec.db, rows[1]["exchange_id"]) if e["text"]]
    assert kinds == [("refusal", p) for p in REFUSAL]
    found = json.loads(await get(rec.db, "/search_event_text.json?_shape=array&text=sorry"))
    assert [(f["exchange_id"], f["kind"]) for f in found] == [(s["exchange_id"], "refusal") for s in rows[:2]]
    for row in rows[:2]:
        shown = answer_section(await get(rec.db, f"/-/stream/{row['exchange_id']}"))
        assert "refused" in shown and "I&#39;m sorry, I can&#39;t help with that." in shown
        assert "No answer text was streamed" not in shown
    shown = answer_section(await get(rec.db, f"/-/stream/{rows[2]['exchange_id']}"))
    assert "Refused: the model declined to answer (finish: refusal)." in shown


async def test_input_tokens_count_the_cached_ones_for_every_api(record: RecordFactory) -> None:
    """OpenAI's input tokens include the cached ones; Anthropic's leave out those read from
    the cache and written to it. The log counts every input token for both, with the
    cached ones beside them, so that one sum reads both APIs alike."""
    rec = await record(llm_app())
    stream = await openai_client(rec.url).chat.completions.create(
        model="cached",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage async for c in stream if c.usage][-1]
    claude = await anthropic_client(rec.url).messages.create(
        model="cached", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    start, *_ = [e async for e in claude]
    assert usage.prompt_tokens == 20003 and usage.prompt_tokens_details.cached_tokens == 20000
    assert start.message.usage.input_tokens == 3 and start.message.usage.cache_read_input_tokens == 20000
    (await rec.log()).close()
    rows = summaries(rec.db)
    assert [
        (s["protocol"], s["input_tokens"], s["cached_input_tokens"], s["output_tokens"]) for s in rows
    ] == [
        ("openai", 20003, 20000, 5),
        ("anthropic", 20103, 20000, 5),
    ]
    counted = [[e["usage"] for e in events_of(rec.db, s["exchange_id"]) if e["usage"]] for s in rows]
    assert json.loads(counted[0][-1]) == {
        "input_tokens": 20003,
        "output_tokens": 5,
        "total_tokens": 20008,
        "cached_input_tokens": 20000,
        "reasoning_tokens": 2,
    }
    assert json.loads(counted[1][0]) == {
        "model": CLAUDE,
        "input_tokens": 20103,
        "output_tokens": 1,
        "cached_input_tokens": 20000,
        "cache_creation_input_tokens": 100,
    }
    for row in rows:
        html = await get(rec.db, f"/-/stream/{row['exchange_id']}")
        assert "<tr><th>of which cached</th><td>20000</td></tr>" in html
    # A log of the schema before (Anthropic's input counted without its cache) is read anew.
    old = before_migration(
        rec.db,
        rec.db.with_name("old.db"),
        "0017_cached_input_tokens",
        column="cached_input_tokens",
        summary_view=STREAM_SUMMARY_16,
    )
    with sqlite3.connect(old) as conn:
        conn.execute("UPDATE exchanges SET input_tokens = 3 WHERE protocol = 'anthropic'")
    conn.close()
    with LogWriter(old):  # opened for writing: upgraded
        pass
    assert summaries(old) == rows


async def test_a_call_that_failed_says_why_on_its_page(record: RecordFactory) -> None:
    """A 404 for a model that does not exist, an Anthropic 529 overloaded, a Responses
    stream that ends in response.failed: the SDK says why, and so does the stream page."""
    rec = await record(llm_app())
    client = openai_client(rec.url)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        await anthropic_client(rec.url).messages.create(
            model="overloaded", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        )
    stream = await client.responses.create(model="fail", input="hi", stream=True)
    (failed,) = [e async for e in stream]
    assert failed.response.error.message == FAILED_MESSAGE
    (await rec.log()).close()
    rows = summaries(rec.db)
    assert [s["finish"] for s in rows] == ["error", "error", "failed"]
    said = ["The model `missing` does not exist", "overloaded_error: Overloaded", FAILED_MESSAGE]
    for row, why in zip(rows, said, strict=True):
        shown = answer_section(await get(rec.db, f"/-/stream/{row['exchange_id']}"))
        assert f'<span class="tt-label">failed</span> {why}' in shown.replace("&#96;", "`")
        assert "No answer text was streamed" not in shown
    (ttft,) = json.loads(await get(rec.db, "/llm_streams.json?_shape=array&exchange_id=3"))[-1:]
    assert ttft["ttft_ms"] is None  # why it failed is no token of an answer


async def test_what_a_tool_result_turn_asked_is_the_result_it_sent(record: RecordFactory) -> None:
    """An agent's turn after a tool ran sends the tool's result last (OpenAI's tool message,
    a user message of tool_result blocks to Anthropic): the page shows that, said as such,
    not an earlier user text or nothing."""
    rec = await record(llm_app())
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    sent = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 °C, sunny"},
    ]
    stream = await openai_client(rec.url).chat.completions.create(model="cached", messages=sent, stream=True)
    assert [c async for c in stream]
    use = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 °C"}]}
    async with anthropic_client(rec.url).messages.stream(
        model="cached",
        max_tokens=16,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ],
    ) as events:
        assert (await events.get_final_message()).content[0].text == "Done."
    (await rec.log()).close()
    for row, text in zip(summaries(rec.db), ["18 °C, sunny", "18 °C"], strict=True):
        html = await get(rec.db, f"/-/stream/{row['exchange_id']}")
        asked = html.split('<blockquote class="tt-asked">', 1)[1].split("</blockquote>", 1)[0]
        assert asked == f'<span class="tt-label">sent a tool&#39;s result</span>{text}'


async def test_counts_on_every_chunk_leave_the_chunks_what_they_are(record: RecordFactory) -> None:
    """A server that counts tokens on every chunk (vLLM), its first chunk naming no model:
    the first chunk is still the delta that opens the answer, with no empty model."""
    rec = await record(llm_app())
    stream = await openai_client(rec.url).chat.completions.create(
        model="counts-every-chunk", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == "Hi"
    (await rec.log()).close()
    (row,) = summaries(rec.db)
    events = events_of(rec.db, row["exchange_id"])
    assert [e["kind"] for e in events] == ["delta", "delta", "finish", "done"]
    assert json.loads(events[0]["usage"]) == {"input_tokens": 4, "output_tokens": 1, "total_tokens": 5}
    assert (row["model"], row["answer"], row["input_tokens"]) == (MODEL, "Hi", 4)


async def test_the_stream_pages_json_gives_the_arguments_as_recorded(record: RecordFactory) -> None:
    """The page indents a tool call's arguments; its JSON gives them as the model wrote them."""
    rec = await record(anthropic_app(delay=0))
    calls = await messages_calls(rec.url, True)
    (await rec.log()).close()
    (row,) = summaries(rec.db)
    page = json.loads(await get(rec.db, f"/-/stream/{row['exchange_id']}.json"))
    written = [c["arguments"] for c in json.loads(row["tool_calls"])]
    assert [c["arguments"] for c in page["tool_calls"]] == written
    assert [json.loads(a) for a in written] == [arguments for _, _, arguments in calls]
    assert all("\n" not in a for a in written)  # as streamed, not indented
    html = await get(rec.db, f"/-/stream/{row['exchange_id']}")
    assert html.count('<pre class="tt-text">{\n  &#34;city&#34;: &#34;Zürich&#34;,') == 2


async def test_a_clients_answer_to_a_servers_request_is_named(mcp_log: tuple[Path, dict[str, Any]]) -> None:
    """A tool that asks the client (sampling, elicitation) gets the client's answer in a POST
    of its own, which carries no method: the log names it a response, and the session page
    the request it answers."""
    db, got = mcp_log
    assert got["ask_llm"]["text"] == "sampled: roses are red"
    assert got["ask_user"]["text"] == "elicited: accept blue"
    with EventLog(db) as log:
        answers = [
            x for x in log.exchanges() if x["method"] == "POST" and b'"result"' in x["request_body"].encode()
        ]
    assert [(x["rpc_method"], x["status"]) for x in answers] == [("response", 202), ("response", 202)]
    html = await get(db, f"/-/session/{answers[0]['session_id']}")
    for x, asked in zip(answers, ["sampling/createMessage", "elicitation/create"], strict=True):
        row = html.split(f'<tr id="exchange-{x["id"]}">', 1)[1].split("</tr>", 1)[0]
        assert f"<td>response to {asked}</td>" in row and '<td class="tt-evtext">accepted</td>' in row
