"""The built-in protocols take whatever JSON an agent or a model sends: realistic traffic of
each protocol, some values in it replaced by ones of another type (a list where an index
goes, an object where a name goes, null, a float, a huge number, a long string), is
classified event by event, summed up, and checked by the protocol's lifecycle rules
without an exception. The recorder calls these for every event it logs: one that raised
lost the event's rows."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tasktape.eventlog.checker import report_recorded
from tasktape.eventlog.classify import Classification
from tasktape.eventlog.protocols import Summary, by_name
from tasktape.eventlog.recorded import Recorded

DONE = "[DONE]"
MCP_HEADERS = [("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Session-Id", "s1")]
# Stands for arrays nested as deep as JSON is read here: deeper than the standard
# library writes (it is put into the text as it is sent).
DEEP = "\u0000deep"
# What hostile traffic puts where a name, an index, a count or a text goes.
HOSTILE = st.sampled_from(
    [
        None,
        True,
        False,
        0,
        -1,
        1.5,
        float("nan"),
        float("inf"),
        2**64,
        -(2**70),
        10**300,
        10**400,  # past what orjson reads, or writes
        "",
        "NaN",
        "x" * 20_000,
        "\u0000\ud7ff",
        [],
        [0],
        [None, {}],
        {},
        {"index": [0], "type": {}},
        [[{"": []}]],
    ]
)
# The protocols whose readers and rules quote, or write back, the JSON they read.
QUOTING = ("a2a", "anthropic", "mcp", "openai-chat", "openai-responses")


@dataclass
class Exchange:
    """One exchange: its request, and its response's events (JSON, or ``[DONE]``, with
    their event field) or, for one that is not a stream, its body."""

    protocol: str
    path: str
    request: Any
    events: list[tuple[Any, str | None]] = field(default_factory=list)
    body: Any = None
    method: str = "POST"
    headers: list[tuple[str, str]] = field(default_factory=list)

    def recorded(self, n: int) -> Recorded:
        if self.body is not None:
            chunks = [(0, text_of(self.body).encode())]
        else:
            chunks = [(i * 1000, sse(data, event)) for i, (data, event) in enumerate(self.events)]
        return Recorded(
            method=self.method,
            path=self.path,
            request_headers=self.headers,
            request_body=None if self.request is None else text_of(self.request).encode(),
            status=200,
            is_sse=self.body is None,
            chunks=chunks,
            outcome="complete",
            origin=f"fuzz.jsonl:{n}",
            protocol=self.protocol,
        )


def text_of(data: Any) -> str:
    """JSON as sent (``DEEP`` as it stands for); an event's ``[DONE]``, and a priming
    event's nothing, as they are."""
    if data in (DONE, ""):
        return data
    return json.dumps(data).replace(json.dumps(DEEP), "[" * 1000 + "]" * 1000)


def sse(data: Any, event: str | None) -> bytes:
    text = text_of(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


def typed(*events: dict[str, Any]) -> list[tuple[Any, str | None]]:
    """Events that name their type in their event field too (Anthropic's, the Responses API's)."""
    return [(e, e["type"]) for e in events]


def chat_chunk(delta: dict[str, Any], index: int = 0, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [choice]}


def openai_chat() -> list[Exchange]:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ""}}
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": 5,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }
    events: list[Any] = [
        chat_chunk({"role": "assistant", "content": "", "refusal": None}),
        chat_chunk({"reasoning_content": "Thinking."}),
        chat_chunk({"content": "Hello"}),
        chat_chunk({"content": "Other"}, index=1),
        chat_chunk({"tool_calls": [call]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chat_chunk({"tool_calls": [{"id": "call_2", "function": {"name": "time", "arguments": "{}"}}]}),
        chat_chunk({"function_call": {"name": "legacy", "arguments": "{}"}}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chat_chunk({"refusal": "I cannot"}, index=1),
        chat_chunk({}, finish="tool_calls"),
        chat_chunk({}, index=1, finish="stop"),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "gpt-4o",
            "choices": [],
            "usage": usage,
        },
        DONE,
    ]
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call | {"function": {"name": "w", "arguments": "{}"}}],
    }
    whole = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": usage,
    }
    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 2}
    return [
        Exchange("openai", "/v1/chat/completions", request, [(e, None) for e in events]),
        Exchange("openai", "/v1/chat/completions", request | {"stream": False}, body=whole),
        Exchange(
            "openai",
            "/v1/completions",
            {"model": "m", "prompt": "p"},
            body={
                "object": "text_completion",
                "choices": [{"index": 0, "text": "t", "finish_reason": "stop"}],
            },
        ),
    ]


def openai_responses() -> list[Exchange]:
    call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "completed",
        "arguments": '{"a":1}',
        "call_id": "call_1",
        "name": "f",
    }
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hi"}, {"type": "refusal", "refusal": "no"}],
    }
    usage = {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 1},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 1},
    }
    pending = {"id": "resp_1", "object": "response", "model": "gpt-4o", "status": "in_progress", "output": []}
    done = pending | {"status": "completed", "output": [call, message], "usage": usage}
    at = {"item_id": "fc_1", "output_index": 0}
    text_at = {"item_id": "msg_1", "output_index": 1, "content_index": 0}
    events = typed(
        {"type": "response.created", "sequence_number": 0, "response": pending},
        {"type": "response.in_progress", "sequence_number": 1, "response": pending},
        {"type": "response.output_item.added", "output_index": 0, "item": call | {"arguments": ""}},
        {"type": "response.function_call_arguments.delta", **at, "delta": '{"a":'},
        {"type": "response.function_call_arguments.delta", **at, "delta": "1}"},
        {"type": "response.function_call_arguments.done", **at, "arguments": '{"a":1}'},
        {"type": "response.output_item.done", "output_index": 0, "item": call},
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 2,
            "delta": "Hm.",
        },
        {"type": "response.output_item.added", "output_index": 1, "item": message | {"content": []}},
        {"type": "response.content_part.added", **text_at, "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", **text_at, "delta": "Hi"},
        {"type": "response.refusal.delta", **text_at, "delta": "no"},
        {"type": "response.output_text.done", **text_at, "text": "Hi"},
        {"type": "response.output_item.done", "output_index": 1, "item": message},
        {"type": "response.completed", "sequence_number": 9, "response": done},
    )
    failed = typed(
        {"type": "error", "code": "server_error", "message": "boom", "param": None},
        {
            "type": "response.failed",
            "response": pending | {"status": "failed", "error": {"code": "x", "message": "m"}},
        },
    )
    request = {"model": "gpt-4o", "input": "hi", "stream": True}
    return [
        Exchange("openai", "/v1/responses", request, events),
        Exchange("openai", "/v1/responses", request, failed),
        Exchange("openai", "/v1/responses", request | {"stream": False}, body=done),
        Exchange(
            "openai", "/v1/chat/completions", request, [({"error": {"message": "bad", "type": "x"}}, "error")]
        ),
    ]


def anthropic() -> list[Exchange]:
    usage = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 2,
        "cache_read_input_tokens": 3,
        "output_tokens": 1,
    }
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "usage": usage,
    }
    tool = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}
    events = typed(
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm."}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hello"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": tool},
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": '{"city"'},
        },
        {
            "type": "content_block_delta",
            "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": ': "Paris"}'},
        },
        {"type": "content_block_stop", "index": 2},
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": tool | {"id": "toolu_2", "input": {"a": 1}},
        },
        {"type": "content_block_stop", "index": 3},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": usage | {"output_tokens": 7},
        },
        {"type": "message_stop"},
    )
    error = typed(
        {"type": "message_start", "message": message},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    whole = message | {
        "content": [{"type": "text", "text": "Hi"}, tool | {"input": {"a": [1]}}],
        "stop_reason": "tool_use",
    }
    request = {
        "model": "claude-x",
        "max_tokens": 99,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    return [
        Exchange("anthropic", "/v1/messages", request, events),
        Exchange("anthropic", "/v1/messages", request, error),
        Exchange("anthropic", "/v1/messages", request | {"stream": False}, body=whole),
        Exchange("anthropic", "/v1/messages/count_tokens", request, body={"input_tokens": 12}),
    ]


def rpc(rpc_id: Any, **message: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", **({} if rpc_id is None else {"id": rpc_id}), **message}


def mcp() -> list[Exchange]:
    call = rpc(
        2, method="tools/call", params={"name": "add", "arguments": {"a": 1}, "_meta": {"progressToken": 2}}
    )
    sampling = {"messages": [{"role": "user", "content": {"type": "text", "text": "Say hi"}}], "maxTokens": 9}
    events = [
        ({}, None),
        (
            rpc(
                None,
                method="notifications/progress",
                params={"progressToken": 2, "progress": 1, "total": 3, "message": "one"},
            ),
            None,
        ),
        (
            rpc(
                None,
                method="notifications/progress",
                params={"progressToken": 2, "progress": 2.5, "total": 3},
            ),
            None,
        ),
        (
            rpc(
                None,
                method="notifications/message",
                params={"level": "info", "logger": "add", "data": {"k": [1]}},
            ),
            None,
        ),
        (rpc(0, method="sampling/createMessage", params=sampling), None),
        (rpc(1, method="elicitation/create", params={"message": "Name?", "requestedSchema": {}}), None),
        (rpc(2, result={"content": [{"type": "text", "text": "2"}], "isError": False}), None),
    ]
    initialized = rpc(
        1, result={"protocolVersion": "2025-11-25", "capabilities": {}, "serverInfo": {"name": "s"}}
    )
    failing = rpc(3, method="tools/call", params={"name": "x", "arguments": {}})
    return [
        Exchange(
            "mcp",
            "/mcp",
            rpc(1, method="initialize", params={"protocolVersion": "2025-11-25"}),
            body=initialized,
        ),
        Exchange("mcp", "/mcp", call, [(e if e else "", None) for e, _ in events], headers=MCP_HEADERS),
        Exchange(
            "mcp",
            "/mcp",
            rpc(
                0,
                result={
                    "role": "assistant",
                    "content": {"type": "text", "text": "hi"},
                    "model": "m",
                    "stopReason": "endTurn",
                },
            ),
            body={},
            headers=MCP_HEADERS,
        ),
        Exchange(
            "mcp",
            "/mcp",
            failing,
            [(rpc(3, error={"code": -32602, "message": "no such tool"}), None)],
            headers=MCP_HEADERS,
        ),
        Exchange(
            "mcp",
            "/mcp",
            None,
            [(rpc(None, method="notifications/tools/list_changed"), None)],
            method="GET",
            headers=[*MCP_HEADERS, ("Last-Event-ID", "e1")],
        ),
    ]


def a2a_status(state: str, **extra: Any) -> dict[str, Any]:
    status = {
        "state": state,
        "message": {"messageId": "m2", "role": "ROLE_AGENT", "parts": [{"text": "Working."}]},
    }
    return {"taskId": "t1", "contextId": "c1", "status": status, **extra}


def a2a_artifact(artifact_id: str, text: str, **extra: Any) -> dict[str, Any]:
    artifact = {
        "artifactId": artifact_id,
        "name": artifact_id,
        "parts": [{"text": text}],
        "metadata": {"type": "intermediate-thinking"},
    }
    return {"taskId": "t1", "contextId": "c1", "artifact": artifact, **extra}


def a2a() -> list[Exchange]:
    usage = {"model": "m", "inputTokens": 10, "outputTokens": 2}
    task = {
        "id": "t1",
        "contextId": "c1",
        "status": {"state": "TASK_STATE_SUBMITTED"},
        "artifacts": [],
        "history": [],
    }
    frames = [
        {"task": task},
        {"statusUpdate": a2a_status("TASK_STATE_WORKING")},
        {"artifactUpdate": a2a_artifact("a1", "Hel")},
        {"artifactUpdate": a2a_artifact("a1", "lo", append=True)},
        {"artifactUpdate": a2a_artifact("a1", "Hello", lastChunk=True)},
        {"statusUpdate": a2a_status("TASK_STATE_COMPLETED", metadata={"$usage": usage})},
    ]
    v03 = [
        {"kind": "task", **task, "status": {"state": "submitted"}},
        {"kind": "status-update", **a2a_status("working"), "final": False},
        {"kind": "artifact-update", **a2a_artifact("a1", "Hi"), "lastChunk": True},
        {"kind": "status-update", **a2a_status("completed"), "final": True},
    ]
    message = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    return [
        Exchange("a2a", "/message:stream", message, [(f, None) for f in frames]),
        Exchange(
            "a2a",
            "/",
            rpc(7, method="SendStreamingMessage", params=message),
            [(rpc(7, result=f), None) for f in frames],
        ),
        Exchange(
            "a2a",
            "/",
            rpc(8, method="message/stream", params=message),
            [(rpc(8, result=f), None) for f in v03],
        ),
        Exchange(
            "a2a", "/tasks/t1", None, body=task | {"status": {"state": "TASK_STATE_COMPLETED"}}, method="GET"
        ),
    ]


SCENARIOS = {
    "openai-chat": openai_chat,
    "openai-responses": openai_responses,
    "anthropic": anthropic,
    "mcp": mcp,
    "a2a": a2a,
}


def slots(exchanges: list[Exchange]) -> list[tuple[Any, Any]]:
    """Every place in the traffic a value may be replaced: (container, key or index), the
    request bodies, the events and the bodies themselves included."""
    found: list[tuple[Any, Any]] = []
    for exchange in exchanges:
        found.append((exchange, "request"))
        if exchange.body is not None:
            found.append((exchange, "body"))
        found.extend((exchange.events, i) for i in range(len(exchange.events)))
        for value in [exchange.request, exchange.body, *(data for data, _ in exchange.events)]:
            found.extend(inside(value))
    return found


def inside(value: Any) -> Iterator[tuple[Any, Any]]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield value, key
        yield from inside(item)


def put(slot: tuple[Any, Any], hostile: Any) -> None:
    container, key = slot
    if isinstance(container, Exchange):
        setattr(container, key, hostile)
    elif isinstance(container, list) and isinstance(container[key], tuple):
        container[key] = (hostile, container[key][1])  # an event: its data, its event field kept
    else:
        container[key] = hostile


@st.composite
def hostile_traffic(
    draw: st.DrawFn, names: Sequence[str] = tuple(SCENARIOS), values: st.SearchStrategy[Any] = HOSTILE
) -> list[Exchange]:
    """The traffic of one of the ``names`` scenarios, one to four of its values replaced
    by hostile ones."""
    exchanges = SCENARIOS[draw(st.sampled_from(names))]()
    for _ in range(draw(st.integers(1, 4))):
        places = slots(exchanges)
        put(
            places[draw(st.integers(0, len(places) - 1))], copy.deepcopy(draw(values))
        )  # (it may be spoilt next)
    return exchanges


def read(exchange: Exchange) -> Summary:
    """The exchange's response through its protocol's reader, as the log writer reads it."""
    protocol = by_name(exchange.protocol)
    assert protocol is not None
    reader = protocol.reader()
    kinds = set(protocol.kinds)
    if exchange.body is not None:
        text = text_of(exchange.body)
        c = reader.body(text)
        assert c is None or (isinstance(c, Classification) and c.kind in kinds)
        protocol.claims_stream(text, None)
    for data, event in exchange.events:
        text = text_of(data)
        c = reader.event(text, event)
        assert isinstance(c, Classification) and c.kind in kinds, (text[:200], c)
        protocol.delta(c)
        protocol.closes(text, event)
        protocol.claims_stream(text, event)
    summary = reader.finished()
    assert isinstance(summary, Summary)
    if summary.tool_calls is not None:
        assert isinstance(json.loads(summary.tool_calls), list)
    return summary


def test_the_unspoilt_traffic_is_read_and_checked() -> None:
    """The traffic the hostile values go into is what each protocol reads: an answer, tool
    calls, a finish, and streams the rules pass."""
    for name, scenario in SCENARIOS.items():
        exchanges = scenario()
        summaries = [read(x) for x in exchanges]
        assert any(s.finish for s in summaries), name
        report = report_recorded([x.recorded(n) for n, x in enumerate(exchanges)])
        assert report.exchanges == len(exchanges), name
    (chat, *_) = [read(x) for x in openai_chat()]
    assert chat.answer == "Hello" and chat.finish == "tool_calls"
    assert [c["arguments"] for c in json.loads(chat.tool_calls or "")] == ['{"city":"Paris"}', "{}", "{}"]


@settings(max_examples=400, deadline=None)
@given(hostile_traffic())
def test_each_reader_classifies_hostile_events(exchanges: list[Exchange]) -> None:
    for exchange in exchanges:
        read(exchange)


@settings(max_examples=250, deadline=None)
@given(hostile_traffic())
def test_the_lifecycle_rules_check_hostile_streams(exchanges: list[Exchange]) -> None:
    checked(exchanges)


@settings(max_examples=100, deadline=None)
@given(hostile_traffic(QUOTING, st.just(DEEP)))
def test_json_nested_too_deep_to_write_back_is_read_and_checked(exchanges: list[Exchange]) -> None:
    """JSON nested deeper than Python writes it (or gives its repr) in a finding's quote, a
    log line's data, a tool's input."""
    for exchange in exchanges:
        read(exchange)
    checked(exchanges)


def checked(exchanges: list[Exchange]) -> None:
    """The exchanges checked, as ``tasktape check`` checks them: each finding says where and what."""
    report = report_recorded([x.recorded(n) for n, x in enumerate(exchanges)])
    assert report.exchanges <= len(exchanges)
    for finding in report.findings + report.cut_short:
        assert finding.rule and finding.exchange.startswith("fuzz.jsonl:") and finding.message


def test_an_a2a_stream_nested_too_deep_is_read_and_its_id_quoted() -> None:
    """A frame nested deeper than the exact-frame decoder reads, and a JSON-RPC id nested
    deeper than Python gives its repr: read as another frame, the id said to differ."""
    message = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    deep_status = {"statusUpdate": a2a_status("TASK_STATE_WORKING") | {"metadata": {"x": DEEP}}}
    exchange = Exchange(
        "a2a",
        "/",
        rpc(7, method="SendStreamingMessage", params=message),
        [(rpc(7, result=deep_status), None), ({"jsonrpc": "2.0", "id": [DEEP], "result": deep_status}, None)],
    )
    assert read(exchange) is not None
    report = report_recorded([exchange.recorded(0)])
    assert any("nested too deep" in f.message for f in report.findings), report.findings
