"""aiohttp apps that speak OpenAI's and Anthropic's streaming HTTP APIs the way the real ones
send them, with named protocol breaks for the lifecycle checker's tests.

The bytes follow real captures: JSON is compact (no spaces) and keeps non-ASCII text as UTF-8;
OpenAI pretty-prints (indent 2) only its non-streamed bodies; Anthropic pads each streamed
event's JSON with a run of spaces before the closing brace and sends its ping as
``{"type": "ping"}``, with spaces. OpenAI's stream chunks carry a random ``obfuscation`` (unless
``stream_options.include_obfuscation`` is false) and, under ``include_usage``, ``"usage":null``.
The server reports a dated model for the alias asked for. A request that offers ``tools``
is answered with a call to each of the first two (``ARGUMENTS``, streamed in pieces), as the
APIs stream tool calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import string
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal, get_args

from aiohttp import web

TEXT = ("Hello", "!", " How can I", " help?")  # the answer, as its text deltas
DELAY = 0.02  # seconds between two events

ChatBreak = Literal[
    "no_done",  # the stream ends without data: [DONE]
    "done_not_last",  # [DONE] comes before the last chunk
    "two_finishes",  # two chunks carry a finish_reason
    "choice_unfinished",  # a second choice (n=2) that never gets a finish_reason
    "refusal_after_finish",  # choice 0 refuses after its finish_reason
    "error_event",  # an error event in place of the finish (what the API sends mid-stream)
]
MessagesBreak = Literal[
    "unclosed_block",  # no content_block_stop
    "stop_not_last",  # a message_delta after message_stop
    "delta_before_start",  # a content_block_delta for index 1, never started
]

# Alias asked for -> the dated model the API reports; other names come back as asked.
MODELS = {
    "gpt-4o-mini": "gpt-4o-mini-2024-07-18",
    "gpt-4.1-mini": "gpt-4.1-mini-2025-04-14",
    "claude-sonnet-4-5": "claude-sonnet-4-5-20250929",
    "claude-haiku-4-5": "claude-haiku-4-5-20251001",
}
ARGUMENTS = {"city": "Zürich", "unit": "celsius"}  # what each tool is called with
STRAY = " (stray)"  # the text of delta_before_start's delta
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
_ALNUM = string.ascii_letters + string.digits


def openai_app(
    pieces: Sequence[str] = TEXT,
    *,
    delay: float = DELAY,
    broken: ChatBreak | None = None,
    arguments: dict[str, Any] = ARGUMENTS,
) -> web.Application:
    """POST /v1/chat/completions and /v1/responses answering ``pieces``, streamed or whole
    (and the tools offered called with ``arguments``); ``broken`` breaks the chat completion
    stream."""
    _check(broken, ChatBreak)

    async def chat(request: web.Request) -> web.StreamResponse:
        started, body = time.monotonic(), await request.json()
        completion = _Completion(body, pieces, arguments)
        if not body.get("stream"):
            return _pretty(completion.whole(), _openai_headers(started, "application/json"))
        frames = _chat_frames(completion, broken)
        return await _stream(
            request, _openai_headers(started, "text/event-stream; charset=utf-8"), frames, delay
        )

    async def responses(request: web.Request) -> web.StreamResponse:
        started, body = time.monotonic(), await request.json()
        response = _response(body, pieces, arguments)
        if not body.get("stream"):
            return _pretty(response, _openai_headers(started, "application/json"))
        frames = [_event(event["type"], _compact(event)) for event in _response_events(response, pieces)]
        return await _stream(
            request, _openai_headers(started, "text/event-stream; charset=utf-8"), frames, delay
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/responses", responses)
    return app


def anthropic_app(
    pieces: Sequence[str] = TEXT,
    *,
    delay: float = DELAY,
    broken: MessagesBreak | None = None,
    overloaded_after: int | None = None,
    arguments: dict[str, Any] = ARGUMENTS,
) -> web.Application:
    """POST /v1/messages answering ``pieces``, streamed or whole (and the tools offered
    called with ``arguments``); ``broken`` breaks the stream, and ``overloaded_after`` ends it
    with an overloaded_error event after that many deltas."""
    _check(broken, MessagesBreak)

    async def messages(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        message = _message(body, pieces, arguments)
        if not body.get("stream"):
            headers = _anthropic_headers("application/json")
            return web.Response(body=_compact(message).encode(), headers=headers)
        events = _message_events(message, pieces, broken, overloaded_after)
        frames = [_event(event["type"], _anthropic_json(event)) for event in events]
        return await _stream(request, _anthropic_headers("text/event-stream; charset=utf-8"), frames, delay)

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    return app


def _check(broken: str | None, names: Any) -> None:
    if broken is not None and broken not in get_args(names):
        raise ValueError(f"no such protocol break: {broken!r} (known: {', '.join(get_args(names))})")


async def _stream(
    request: web.Request, headers: dict[str, str], frames: Iterable[bytes], delay: float
) -> web.StreamResponse:
    """``frames`` one write each, ``delay`` seconds apart, until the client leaves."""
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):
        for i, frame in enumerate(frames):
            if i:
                await asyncio.sleep(delay)
            await response.write(frame)
        await response.write_eof()
    return response


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _pretty(value: Any, headers: dict[str, str]) -> web.Response:
    return web.Response(body=json.dumps(value, indent=2, ensure_ascii=False).encode(), headers=headers)


def _data(text: str) -> bytes:
    return f"data: {text}\n\n".encode()


def _event(kind: str, text: str) -> bytes:
    return f"event: {kind}\ndata: {text}\n\n".encode()


def _token(length: int, alphabet: str = _ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def _tool_names(body: dict[str, Any]) -> list[str]:
    """The names of the first two tools a request offers (Chat nests them under "function")."""
    tools = body.get("tools") or []
    return [t.get("function", t)["name"] for t in tools[:2]]


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _chat_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _prompt_tokens(prompt: Any) -> int:
    """A stand-in count: about one token per four characters of the prompt's JSON."""
    return max(1, len(_compact(prompt)) // 4)


def _openai_headers(started: float, content_type: str) -> dict[str, str]:
    return {
        "Content-Type": content_type,
        "access-control-expose-headers": "X-Request-ID",
        "openai-organization": "user-tasktape",
        "openai-processing-ms": str(round((time.monotonic() - started) * 1000)),
        "openai-project": "proj_" + _token(24),
        "openai-version": "2020-10-01",
        "x-ratelimit-limit-requests": "10000",
        "x-ratelimit-remaining-requests": "9999",
        "x-ratelimit-reset-requests": "6ms",
        "x-request-id": "req_" + secrets.token_hex(16),
        "x-content-type-options": "nosniff",
        "Server": "cloudflare",
    }


def _anthropic_headers(content_type: str) -> dict[str, str]:
    headers = {"Content-Type": content_type}
    if content_type.startswith("text/event-stream"):
        headers["Cache-Control"] = "no-cache"
    return headers | {
        "anthropic-ratelimit-requests-limit": "4000",
        "anthropic-ratelimit-requests-remaining": "3999",
        "anthropic-ratelimit-requests-reset": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "request-id": "req_011C" + _token(20),
        "anthropic-organization-id": "00000000-0000-4000-8000-000000000000",
        "x-robots-tag": "none",
        "Server": "cloudflare",
    }


class _Completion:
    """One chat completion: what every chunk shares, the request's options, and its usage."""

    def __init__(self, body: dict[str, Any], pieces: Sequence[str], arguments: dict[str, Any]) -> None:
        options = body.get("stream_options") or {}
        self.pieces = pieces
        self.calls = [("call_" + _token(24), name) for name in _tool_names(body)]
        self.arguments = _compact(arguments)
        self.include_usage = bool(options.get("include_usage"))
        self.obfuscate = options.get("include_obfuscation", True)
        self.envelope = {
            "id": "chatcmpl-" + _token(29),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODELS.get(body["model"], body["model"]),
            "service_tier": "default",
            "system_fingerprint": "fp_" + _token(10, "0123456789abcdef"),
        }
        prompt = _prompt_tokens(body.get("messages"))
        self.usage = {
            "prompt_tokens": prompt,
            "completion_tokens": len(pieces),
            "total_tokens": prompt + len(pieces),
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    @property
    def finish(self) -> str:
        return "tool_calls" if self.calls else "stop"

    def chunk(self, delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
        """A chat.completion.chunk with one choice, or none (the usage chunk) for ``delta`` None."""
        chunk: dict[str, Any] = dict(self.envelope)
        if delta is None:
            chunk |= {"choices": [], "usage": self.usage}
        else:
            chunk["choices"] = [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ]
            if self.include_usage:
                chunk["usage"] = None
        if self.obfuscate:
            chunk["obfuscation"] = _token(3 + secrets.randbelow(12))
        return chunk

    def whole(self) -> dict[str, Any]:
        """The chat.completion a request without ``stream`` gets."""
        message = {"role": "assistant", "content": "".join(self.pieces), "refusal": None, "annotations": []}
        if self.calls:
            calls = [_chat_call(call_id, name, self.arguments) for call_id, name in self.calls]
            message |= {"content": None, "tool_calls": calls}
        return {
            "id": self.envelope["id"],
            "object": "chat.completion",
            "created": self.envelope["created"],
            "model": self.envelope["model"],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish}],
            "usage": self.usage,
            "service_tier": self.envelope["service_tier"],
            "system_fingerprint": self.envelope["system_fingerprint"],
        }


def _chat_frames(completion: _Completion, broken: ChatBreak | None) -> list[bytes]:
    chunks = [completion.chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks += [completion.chunk({"content": piece}) for piece in completion.pieces]
    for index, (call_id, name) in enumerate(completion.calls):
        opened = {"index": index, **_chat_call(call_id, name, "")}
        chunks.append(completion.chunk({"tool_calls": [opened]}))
        chunks += [
            completion.chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(completion.arguments)
        ]
    if broken == "choice_unfinished":
        second = completion.chunk({"content": "and another"})
        chunks.append(second | {"choices": [second["choices"][0] | {"index": 1}]})
    if broken == "error_event":
        error = {"error": {"message": "The server had an error", "type": "server_error", "code": None}}
        return [_data(_compact(chunk)) for chunk in chunks] + [_event("error", _compact(error))]
    chunks += [completion.chunk({}, completion.finish)] * (2 if broken == "two_finishes" else 1)
    if broken == "refusal_after_finish":
        chunks.append(completion.chunk({"refusal": "I cannot"}))
    if completion.include_usage:
        chunks.append(completion.chunk(None))
    frames = [_data(_compact(chunk)) for chunk in chunks]
    if broken == "done_not_last":
        frames.insert(-1, _data("[DONE]"))
    elif broken != "no_done":
        frames.append(_data("[DONE]"))
    return frames


def _response(body: dict[str, Any], pieces: Sequence[str], arguments: dict[str, Any]) -> dict[str, Any]:
    """The completed Responses API response object answering ``body`` with ``pieces``."""
    text = "".join(pieces)
    prompt = _prompt_tokens(body.get("input"))
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    item = {"id": "msg_" + secrets.token_hex(24), "type": "message", "status": "completed"}
    return {
        "id": "resp_" + secrets.token_hex(24),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": MODELS.get(body["model"], body["model"]),
        "output": [_function_call(name, arguments) for name in _tool_names(body)]
        or [item | {"content": [part], "role": "assistant"}],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "prompt_cache_key": None,
        "reasoning": {"effort": None, "summary": None},
        "safety_identifier": None,
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(pieces),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + len(pieces),
        },
        "user": None,
        "metadata": {},
    }


def _function_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "fc_" + secrets.token_hex(24),
        "type": "function_call",
        "status": "completed",
        "arguments": _compact(arguments),
        "call_id": "call_" + _token(24),
        "name": name,
    }


def _response_events(response: dict[str, Any], pieces: Sequence[str]) -> list[dict[str, Any]]:
    """The typed events that stream ``response`` in ``pieces``, numbered by sequence_number."""
    pending = response | {"status": "in_progress", "service_tier": "auto", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(response["output"]):
        if item["type"] == "function_call":
            events += _function_call_events(index, item)
        else:
            events += _message_item_events(index, item, pieces)
    events.append({"type": "response.completed", "response": response})
    return [{"type": e["type"], "sequence_number": n, **e} for n, e in enumerate(events)]


def _function_call_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    opened = item | {"status": "in_progress", "arguments": ""}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": opened}
    ]
    for piece in _pieces(item["arguments"]):
        obfuscation = _token(3 + secrets.randbelow(12))
        events.append(
            {
                "type": "response.function_call_arguments.delta",
                **at,
                "delta": piece,
                "obfuscation": obfuscation,
            }
        )
    events += [
        {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
    return events


def _message_item_events(index: int, item: dict[str, Any], pieces: Sequence[str]) -> list[dict[str, Any]]:
    part = item["content"][0]
    at = {"item_id": item["id"], "output_index": index, "content_index": 0}
    events: list[dict[str, Any]] = [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": item | {"status": "in_progress", "content": []},
        },
        {"type": "response.content_part.added", **at, "part": part | {"text": ""}},
    ]
    for piece in pieces:
        obfuscation = _token(3 + secrets.randbelow(12))
        events.append(
            {
                "type": "response.output_text.delta",
                **at,
                "delta": piece,
                "logprobs": [],
                "obfuscation": obfuscation,
            }
        )
    events += [
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
    return events


def _message(body: dict[str, Any], pieces: Sequence[str], arguments: dict[str, Any]) -> dict[str, Any]:
    """The Messages API message answering ``body`` with ``pieces``, as a request without stream gets it."""
    return {
        "id": "msg_01" + _token(22),
        "type": "message",
        "role": "assistant",
        "model": MODELS.get(body["model"], body["model"]),
        "content": [
            {"type": "text", "text": "".join(pieces)},
            *(
                {"type": "tool_use", "id": "toolu_01" + _token(22), "name": name, "input": arguments}
                for name in _tool_names(body)
            ),
        ],
        "stop_reason": "tool_use" if _tool_names(body) else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": _prompt_tokens([body.get("system"), body.get("messages")]),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "output_tokens": len(pieces),
            "service_tier": "standard",
        },
    }


def _message_events(
    message: dict[str, Any], pieces: Sequence[str], broken: MessagesBreak | None, overloaded_after: int | None
) -> list[dict[str, Any]]:
    """The events that stream ``message`` in ``pieces``, broken as asked."""
    usage = message["usage"]
    started = message | {"content": [], "stop_reason": None, "usage": usage | {"output_tokens": 1}}
    head = [
        {"type": "message_start", "message": started},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
    ]
    deltas = [_text_delta(0, piece) for piece in pieces]
    if broken == "delta_before_start":
        deltas.append(_text_delta(1, STRAY))
    if overloaded_after is not None:
        return [*head, *deltas[:overloaded_after], OVERLOADED]
    stops = [] if broken == "unclosed_block" else [{"type": "content_block_stop", "index": 0}]
    for index, block in enumerate(message["content"][1:], 1):  # its tool calls
        opened = block | {"input": {}}
        stops += [
            {"type": "content_block_start", "index": index, "content_block": opened},
            *(_json_delta(index, piece) for piece in ["", *_pieces(_compact(block["input"]))]),
            {"type": "content_block_stop", "index": index},
        ]
    counts = {
        key: usage[key] for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    }
    finish = {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": counts | {"output_tokens": usage["output_tokens"]},
    }
    after = [finish] if broken == "stop_not_last" else []
    return [*head, *deltas, *stops, finish, {"type": "message_stop"}, *after]


def _text_delta(index: int, text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def _json_delta(index: int, piece: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": piece},
    }


def _anthropic_json(event: dict[str, Any]) -> str:
    """An event's JSON as Anthropic's API streams it: the ping spaced, the error compact, the rest
    compact with a run of 0 to 15 spaces before the closing brace (it varies with the event)."""
    if event["type"] == "ping":
        return json.dumps(event)
    text = _compact(event)
    if event["type"] == "error":
        return text
    return text[:-1] + " " * (len(text) % 16) + "}"
