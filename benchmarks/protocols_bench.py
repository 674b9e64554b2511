"""What reading a stream costs per event, protocol by protocol: SSE decoding plus the
protocol's classification (as the log writer does it, summary kept), side by side with
A2A's; and the same streams ingested through the writer into SQLite."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tasktape.eventlog import LogWriter, SSEDecoder, classify
from tasktape.eventlog.protocols import by_name

from .eventlog_bench import EVENTS_PER_TASK, task_stream
from .harness import Section

TOKENS = EVENTS_PER_TASK - 10  # text deltas per stream, as in the A2A stream


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _data(value: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {value if isinstance(value, str) else _compact(value)}\n\n".encode()


def chat_stream(n: int) -> list[bytes]:
    """Chat Completions with include_usage: role, deltas, finish, usage, [DONE]."""
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 1796130507}
    base |= {"model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_45e993d645"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _data({**base, "choices": [choice], "usage": None})

    usage = {"prompt_tokens": 12, "completion_tokens": TOKENS, "total_tokens": 12 + TOKENS}
    return [
        chunk({"role": "assistant", "content": "", "refusal": None}),
        *(chunk({"content": f" token{i}"}) for i in range(TOKENS)),
        chunk({}, "stop"),
        _data({**base, "choices": [], "usage": usage}),
        _data("[DONE]"),
    ]


def responses_stream(n: int) -> list[bytes]:
    """The Responses API: lifecycle events around output_text deltas."""
    response = {"id": f"resp_{n}", "object": "response", "status": "in_progress", "model": "gpt-4o-mini"}
    item = {"item_id": f"msg_{n}", "output_index": 0, "content_index": 0}
    events = [("response.created", {"response": response}), ("response.in_progress", {"response": response})]
    events += [
        ("response.output_text.delta", {**item, "delta": f" token{i}", "logprobs": []}) for i in range(TOKENS)
    ]
    done = {**response, "status": "completed", "usage": {"input_tokens": 12, "output_tokens": TOKENS}}
    events += [
        ("response.output_text.done", {**item, "text": "..."}),
        ("response.completed", {"response": done}),
    ]
    return [
        _data({"type": kind, "sequence_number": i, **body}, kind) for i, (kind, body) in enumerate(events)
    ]


def anthropic_stream(n: int) -> list[bytes]:
    """Messages: message_start, one text block of deltas, message_delta, message_stop."""
    message = {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
    }
    message |= {"content": [], "stop_reason": None, "usage": {"input_tokens": 12, "output_tokens": 1}}
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f" token{i}"}}
            for i in range(TOKENS)
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": TOKENS}},
        {"type": "message_stop"},
    ]
    return [_data(e, e["type"]) for e in events]


def mcp_stream(n: int) -> list[bytes]:
    """A tool call's POST stream: progress notifications, then its result."""
    events = [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": n, "progress": i + 1, "total": TOKENS, "message": f"step {i + 1}"},
        }
        for i in range(TOKENS)
    ]
    events.append({"jsonrpc": "2.0", "id": n, "result": {"content": [{"type": "text", "text": "done"}]}})
    return [f"id: {n}-{i}\nevent: message\n".encode() + _data(e) for i, e in enumerate(events)]


# protocol, how its streams are made, the request that opens one (method, path, headers)
STREAMS: list[tuple[str, str, Callable[[int], list[bytes]], tuple[str, str, list[tuple[str, str]]]]] = [
    ("A2A (REST artifact deltas)", "a2a", task_stream, ("POST", "/message:stream", [])),
    (
        "MCP (progress + result)",
        "mcp",
        mcp_stream,
        ("POST", "/mcp", [("MCP-Protocol-Version", "2025-11-25")]),
    ),
    ("OpenAI Chat Completions", "openai", chat_stream, ("POST", "/v1/chat/completions", [])),
    ("OpenAI Responses API", "openai", responses_stream, ("POST", "/v1/responses", [])),
    ("Anthropic Messages", "anthropic", anthropic_stream, ("POST", "/v1/messages", [])),
]
_BODIES = {
    "/message:stream": b'{"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}',
    "/mcp": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "count"}}',
    "/v1/chat/completions": b'{"model": "gpt-4o-mini", "messages": [], "stream": true}',
    "/v1/responses": b'{"model": "gpt-4o-mini", "input": "hi", "stream": true}',
    "/v1/messages": b'{"model": "claude-sonnet-4-5", "messages": [], "max_tokens": 64, "stream": true}',
}


def _events(make: Callable[[int], list[bytes]], n_streams: int) -> list[list[tuple[str, str | None]]]:
    streams = []
    for n in range(n_streams):
        decoder = SSEDecoder()
        streams.append([(e.data, e.event) for chunk in make(n) for e in decoder.feed(chunk)])
    return streams


def decode_only(make: Callable[[int], list[bytes]], n_streams: int) -> float:
    """µs per event of SSE decoding alone."""
    streams = [make(n) for n in range(n_streams)]
    events = 0
    start = time.perf_counter()
    for chunks in streams:
        decoder = SSEDecoder()
        for chunk in chunks:
            events += len(decoder.feed(chunk))
    return (time.perf_counter() - start) / events * 1e6


def classify_only(
    read: Callable[[str, str | None], object] | None,
    protocol: str,
    make: Callable[[int], list[bytes]],
    n_streams: int,
) -> float:
    """µs per event of classification alone: the protocol's reader (and its summary), or
    ``read`` on its own."""
    streams = _events(make, n_streams)
    events = sum(map(len, streams))
    start = time.perf_counter()
    for stream in streams:
        if read is None:
            reader = by_name(protocol).reader()  # type: ignore[union-attr]
            for data, event_type in stream:
                reader.event(data, event_type)
            reader.finished()
        else:
            for data, event_type in stream:
                read(data, event_type)
    return (time.perf_counter() - start) / events * 1e6


def ingest(path: Path, make: Callable[[int], list[bytes]], request: tuple, n_streams: int) -> float:
    """events/s through the writer, one event per chunk, first chunk to last commit."""
    method, url, headers = request
    streams = [make(n) for n in range(n_streams)]
    with LogWriter(path) as w:
        cap = w.begin_capture(source="benchmark")
        events = 0
        start = time.perf_counter()
        for chunks in streams:
            ex = w.begin_exchange(
                cap, method=method, path=url, request_headers=headers, request_body=_BODIES[url]
            )
            w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
            for i, chunk in enumerate(chunks):
                w.chunk(ex, i, chunk)
            w.end_exchange(ex, duration_ns=len(chunks))
            events += len(chunks)
        w.flush()
        elapsed = time.perf_counter() - start
        assert w.stats.rows_lost == 0
    return events / elapsed


def run(quick: bool) -> list[Section]:
    n = 50 if quick else 250
    section = Section(
        "Reading streams, protocol by protocol",
        [
            "stream",
            "bytes/event",
            "decode µs/event",
            "classify µs/event",
            "classify vs A2A",
            "ingest events/s",
            "ingest vs A2A",
        ],
    )
    # A2A as it was read before protocols had readers: its classifier alone, no summary.
    base = min(classify_only(lambda data, _: classify(data), "a2a", task_stream, n) for _ in range(3))
    section.add("A2A, its classifier alone (before readers)", 199.0, "", base, "1.00x", "", "")
    base_ingest = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, protocol, make, request) in enumerate(STREAMS):
            decode = min(decode_only(make, n) for _ in range(3))
            read = min(classify_only(None, protocol, make, n) for _ in range(3))
            stored = max(ingest(Path(tmp) / f"{i}-{r}.db", make, request, n) for r in range(3))
            size = sum(map(len, make(0))) / len(make(0))
            base_ingest = base_ingest or stored
            section.add(
                name, size, decode, read, f"{base / read:.2f}x", stored, f"{stored / base_ingest:.2f}x"
            )
    section.notes.append(
        f"{n} streams of about {EVENTS_PER_TASK} events each, best of 3. Classify is the protocol's "
        "reader per event (its classification and summary), against A2A's classifier alone; decode is "
        "the SSE decoder's share (an MCP event has id and event lines beside its data); ingest is the "
        "whole writer, rows and commit included, against A2A's. A ratio above 1x is faster."
    )
    return [section]
