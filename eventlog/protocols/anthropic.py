"""Anthropic Messages streaming: ``message_start``, then per content block
``content_block_start``, ``content_block_delta``s and ``content_block_stop``, then
``message_delta`` (the stop reason, the output tokens so far) and ``message_stop``;
``ping`` anywhere, and ``error`` when the API fails mid-stream. Each event names its
type twice: in its ``event`` field and in its data's ``type``.

An exchange is Anthropic's when it POSTs to ``.../v1/messages`` (or a ``.../messages``
with an ``anthropic-version`` header) a JSON body with ``model`` and ``messages``; or,
when that body is not at hand as the answer begins, when the answer's first event is a
``message_start``. Event kinds are the event types, but for a thinking block's deltas:
kind ``thinking``, their text the model's thinking (no part of the answer).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import StrEnum
from typing import Any, ClassVar

from ..classify import Classification, is_json, load_json
from ..frames import Problem, Stream, readable
from ..stored_counts import stored_count
from .base import (
    Protocol,
    Request,
    RequestInfo,
    StreamReader,
    Summary,
    ToolCall,
    among,
    classified,
    excerpt,
    index_or_id,
    json_text,
    last_state,
    parsed,
    quoted,
)


class AnthropicKind(StrEnum):
    MESSAGE_START = "message_start"
    CONTENT_BLOCK_START = "content_block_start"
    CONTENT_BLOCK_DELTA = "content_block_delta"
    CONTENT_BLOCK_STOP = "content_block_stop"
    MESSAGE_DELTA = "message_delta"
    MESSAGE_STOP = "message_stop"
    PING = "ping"
    ERROR = "error"
    THINKING = "thinking"  # a content_block_delta of a thinking block: its thinking_delta
    OTHER = "other"


_KINDS = {k.value: k for k in AnthropicKind if k is not AnthropicKind.THINKING}  # (no event type)
_DELTA_KINDS = frozenset({AnthropicKind.CONTENT_BLOCK_DELTA})
_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})  # a block that calls a tool
_CACHE_READ, _CACHE_WRITE = "cache_read_input_tokens", "cache_creation_input_tokens"
# The counts of a usage object, and the names tasktape gives them (as OpenAI's mean them).
_NAMES = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    _CACHE_READ: "cached_input_tokens",
    _CACHE_WRITE: _CACHE_WRITE,
}
REFUSAL = "refusal"  # the stop_reason of an answer the model declined to give


class Anthropic(Protocol):
    name = "anthropic"
    kinds = AnthropicKind
    server_ids: ClassVar[frozenset[str]] = frozenset({"id"})  # msg_..., toolu_...

    def claims(self, request: Request) -> bool:
        if request.method != "POST":
            return False
        path = request.path.rstrip("/")
        if not (path.endswith("/v1/messages") or path.endswith("/messages/count_tokens")) and not (
            path.endswith("/messages") and request.header("anthropic-version") is not None
        ):
            return False
        body = request.json()
        return isinstance(body, dict) and isinstance(body.get("model"), str) and "messages" in body

    def claims_stream(self, data: str, event_type: str | None) -> bool:
        """A response whose request body the log has not (yet): a stream's first event, a
        ``message_start`` with its message (or a whole assistant message)."""
        obj = parsed(data, AnthropicKind.OTHER) if data else None
        if not isinstance(obj, dict):
            return False
        if event_type is None and obj.get("type") == "message":
            return obj.get("role") == "assistant" and isinstance(obj.get("content"), list)
        return (
            event_type in (None, AnthropicKind.MESSAGE_START)
            and obj.get("type") == AnthropicKind.MESSAGE_START
            and isinstance(obj.get("message"), dict)
        )

    def request_info(self, request: Request) -> RequestInfo:
        tail = "messages.count_tokens" if request.path.rstrip("/").endswith("count_tokens") else "messages"
        return RequestInfo(rpc_method=tail)

    def reader(self) -> AnthropicReader:
        return AnthropicReader()

    def final_state(self, last: str | None, summary: Summary) -> str | None:
        """The stop reason the log stores (none for a stream cut before it came)."""
        return summary.finish

    def state_note(self, stream: Stream) -> str | None:
        """``last stop reason tool_use``: what message_delta last said (or ``error``)."""
        state = last_state(stream)
        return f"last stop reason {state}" if state else None

    def closes(self, data: str, event_type: str | None) -> bool:
        """``message_stop``, by its event field (or, without one, its type)."""
        if event_type is not None:
            return event_type == AnthropicKind.MESSAGE_STOP
        obj = parsed(data, AnthropicKind.OTHER)
        return isinstance(obj, dict) and obj.get("type") == AnthropicKind.MESSAGE_STOP

    def ended(self, stream: Stream) -> bool:
        """A stream that carried its ``message_stop`` owes nothing after it."""
        return any(f.complete and self.closes(f.data, f.event_type) for f in reversed(stream.frames))

    def delta(self, c: Classification) -> str | None:
        """The text deltas alone (an error's message is no part of the answer)."""
        return c.text if c.kind in _DELTA_KINDS else None


def _input(value: Any) -> str:
    """A tool's input as JSON text (an empty object as none: the stream sends its pieces)."""
    return (json_text(value) or "") if isinstance(value, dict) and value else ""


class AnthropicReader(StreamReader):
    """The answer is the text blocks' deltas (the thinking blocks' are kept apart); tokens
    as the last event counted them; the tool calls are the tool_use blocks, their input
    joined from its JSON pieces."""

    def __init__(self) -> None:
        super().__init__()
        # A tool block's input as it started (used if no piece came).
        self._given: dict[int | str | None, str] = {}
        self._closed: set[int | str | None] = set()  # the tool blocks that came to their stop
        self._cache = {_CACHE_READ: 0, _CACHE_WRITE: 0}  # the cache's input tokens, as last counted

    def event(self, data: str, event_type: str | None) -> Classification:
        obj = parsed(data, AnthropicKind.OTHER)
        if isinstance(obj, Classification):
            return obj
        named = obj.get("type")
        kind = _KINDS[named] if among(named, _KINDS) else AnthropicKind.OTHER
        s = self.summary
        if kind is AnthropicKind.CONTENT_BLOCK_DELTA:
            delta = obj.get("delta")
            return self._delta(obj, delta) if isinstance(delta, dict) else classified(kind)
        if kind is AnthropicKind.CONTENT_BLOCK_STOP:
            index = index_or_id(obj.get("index"))
            if index in self.calls:
                self._closed.add(index)
            return classified(kind)
        if kind is AnthropicKind.CONTENT_BLOCK_START:
            block = obj.get("content_block")
            if isinstance(block, dict) and among(block.get("type"), _TOOL_BLOCKS):
                index = index_or_id(obj.get("index"))
                self._tool_block(index, block)
                self._given[index] = _input(block.get("input"))
            return classified(kind)
        if kind is AnthropicKind.MESSAGE_START:
            message = obj.get("message") if isinstance(obj.get("message"), dict) else {}
            usage = self._usage(message.get("model"), message.get("usage"))
            self._count(usage)
            return classified(kind, None, None, usage)
        if kind is AnthropicKind.MESSAGE_DELTA:
            delta = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            reason = delta.get("stop_reason")
            state = reason if isinstance(reason, str) else None
            usage = self._usage(None, obj.get("usage"))
            self._count(usage)
            s.finish = state or s.finish
            return classified(kind, None, state, usage)
        if kind is AnthropicKind.ERROR:
            error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
            s.finish = "error"
            named, message = error.get("type"), error.get("message")
            said = named if isinstance(named, str) else quoted(named)
            text = f"{said}: {message}" if isinstance(message, str) else None
            return classified(kind, text, "error")
        return classified(kind)

    def _delta(self, obj: dict[str, Any], delta: dict[str, Any]) -> Classification:
        """A block's delta: the answer's text, the model's thinking, or a piece of a tool's input."""
        named = delta.get("type")
        if named == "text_delta" and isinstance(text := delta.get("text"), str):
            self.pieces.append(text)
            return classified(AnthropicKind.CONTENT_BLOCK_DELTA, text)
        if named == "thinking_delta" and isinstance(thinking := delta.get("thinking"), str):
            return classified(AnthropicKind.THINKING, thinking or None)
        if named == "input_json_delta" and isinstance(piece := delta.get("partial_json"), str):
            self.calls.setdefault(index_or_id(obj.get("index")), ToolCall()).arguments += piece
        return classified(AnthropicKind.CONTENT_BLOCK_DELTA)

    def body(self, data: bytes | str) -> Classification | None:
        """A whole message (``stream`` false)."""
        try:
            obj = load_json(data)
        except (ValueError, RecursionError):
            return None
        if isinstance(obj, dict) and "type" not in obj and type(obj.get("input_tokens")) is int:
            return self._token_count(obj)
        if not isinstance(obj, dict) or obj.get("type") != "message":
            return self.event(data if isinstance(data, str) else data.decode("utf-8", "replace"), None)
        usage = self._usage(obj.get("model"), obj.get("usage"))
        self._count(usage)
        content = obj.get("content") if isinstance(obj.get("content"), list) else []
        texts = [b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)]
        self.pieces.extend(texts)
        for index, block in enumerate(content):
            if isinstance(block, dict) and among(block.get("type"), _TOOL_BLOCKS):
                given = block.get("input")  # whole here
                call = self._tool_block(index, block)
                call.arguments = (json_text(given) or "") if given is not None else ""
        reason = obj.get("stop_reason")
        self.summary.finish = reason if isinstance(reason, str) else None
        return Classification(
            AnthropicKind.OTHER, text="".join(texts) or None, state=self.summary.finish, usage=usage
        )

    def _token_count(self, obj: dict[str, Any]) -> Classification:
        """messages.count_tokens's answer: the input tokens the request would take."""
        usage = self._usage(None, obj)
        self._count(usage)
        return classified(AnthropicKind.OTHER, None, None, usage)

    def _tool_block(self, index: int | str | None, block: dict[str, Any]) -> ToolCall:
        call = self.calls.setdefault(index, ToolCall())
        call.id = block.get("id") if isinstance(block.get("id"), str) else None
        call.name = block.get("name") if isinstance(block.get("name"), str) else None
        return call

    def finished(self) -> Summary:
        for index, call in self.calls.items():
            if not call.arguments:  # no piece came: the input as the block started; a tool of no
                # input, whose block closed: "{}" (what the SDK makes of it)
                call.arguments = self._given.get(index) or ("{}" if index in self._closed else "")
        return super().finished()

    def _usage(self, model: Any, usage: Any) -> dict[str, Any] | None:
        """Token counts as OpenAI's mean them: the input is every input token (Anthropic's
        ``input_tokens`` leaves out those read from the cache and those written to it),
        ``cached_input_tokens`` those read from the cache; ``cache_creation_input_tokens``
        those written to it. A count that comes later (message_delta) is a running total. A
        count the log cannot hold (past 64 bits) is none."""
        out: dict[str, Any] = {"model": model} if isinstance(model, str) else {}
        if not isinstance(usage, dict):
            return out or None
        counts = {k: stored_count(usage.get(k)) for k in _NAMES}
        self._cache.update((k, counts[k]) for k in self._cache if counts[k] is not None)
        if (given := counts["input_tokens"]) is not None:
            cached = self._cache[_CACHE_READ] + self._cache[_CACHE_WRITE]
            # (counts the log holds may add up to one it does not)
            counts["input_tokens"] = stored_count(given + cached)
        out.update((_NAMES[k], n) for k, n in counts.items() if n is not None)
        return out or None

    def _count(self, usage: dict[str, Any] | None) -> None:
        if usage:
            s = self.summary
            s.model = usage.get("model", s.model)
            s.input_tokens = usage.get("input_tokens", s.input_tokens)
            s.output_tokens = usage.get("output_tokens", s.output_tokens)
            s.cached_input_tokens = usage.get("cached_input_tokens", s.cached_input_tokens)


# -- lifecycle rules ----------------------------------------------------------------------


def _events(stream: Stream) -> Iterator[tuple[Any, dict[str, Any]]]:
    for frame in stream.frames:
        if frame.complete and frame.payload is not None:
            yield frame, frame.payload


def block_order(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Blocks open in index order, one at a time, take deltas while open, and close before the end."""
    for stream in streams:
        if not stream.is_sse:
            continue
        open_block: tuple[int, Any] | None = None  # (index, the frame that opened it)
        next_index = 0
        for frame, event in _events(stream):
            kind, index = event.get("type"), event.get("index")
            if kind == AnthropicKind.CONTENT_BLOCK_START:
                if open_block is not None:
                    yield Problem(
                        stream,
                        frame,
                        f"block {quoted(index)} starts while block {quoted(open_block[0])} is open",
                    )
                elif index != next_index:
                    yield Problem(
                        stream, frame, f"block {quoted(index)} starts where block {next_index} was due"
                    )
                open_block, next_index = (index, frame), (index if isinstance(index, int) else next_index) + 1
            elif kind in (AnthropicKind.CONTENT_BLOCK_DELTA, AnthropicKind.CONTENT_BLOCK_STOP):
                if open_block is None or open_block[0] != index:
                    what = "a delta" if kind == AnthropicKind.CONTENT_BLOCK_DELTA else "a stop"
                    yield Problem(stream, frame, f"{what} for block {quoted(index)}, which is not open")
                elif kind == AnthropicKind.CONTENT_BLOCK_STOP:
                    open_block = None
            elif kind in (AnthropicKind.MESSAGE_DELTA, AnthropicKind.MESSAGE_STOP) and open_block is not None:
                block, opened = quoted(open_block[0]), open_block[1].seq
                yield Problem(stream, frame, f"{kind} while block {block} (opened at event {opened}) is open")
                open_block = None


def stop_last(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A stream opens with message_start and, run to its end, ends with one message_stop (or an error)."""
    for stream in streams:
        if not stream.is_sse:
            continue
        events = list(_events(stream))
        if not events:
            continue
        first = events[0][1].get("type")
        if first not in (AnthropicKind.MESSAGE_START, AnthropicKind.ERROR):
            yield Problem(stream, events[0][0], f"the stream starts with {quoted(first)}, not message_start")
        stops = [f for f, e in events if e.get("type") == AnthropicKind.MESSAGE_STOP]
        if stops and events[-1][0] is not stops[-1]:
            after = events[[f for f, _ in events].index(stops[0]) + 1][0]
            yield Problem(stream, after, f"an event after message_stop (event {stops[0].seq})")
        elif len(stops) > 1:
            yield Problem(stream, stops[1], "a second message_stop")
        elif not stops and stream.complete and events[-1][1].get("type") != AnthropicKind.ERROR:
            yield Problem(stream, events[-1][0], "the stream ended without message_stop")


def well_formed(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Every event is a JSON object whose type is its event field."""
    for stream in streams:
        if not stream.is_sse:
            continue
        for frame, problem in readable(stream):
            if problem is not None:
                yield problem
            elif frame.payload is not None and frame.event_type != frame.payload.get("type"):
                yield Problem(
                    stream,
                    frame,
                    f"event {frame.event_type!r} carries data of type {quoted(frame.payload.get('type'))}",
                )


def tool_json(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A tool call's input, joined from its input_json_delta pieces, is JSON once its block closes."""
    # (No piece at all, or only empty ones, is a tool of no input: the SDK keeps the input
    # the block started with, {}.)
    for stream in streams:
        if not stream.is_sse:
            continue
        tools: dict[int, tuple[Any, list[str]]] = {}  # the open tool blocks: name, input pieces
        for frame, event in _events(stream):
            kind, index = event.get("type"), event.get("index")
            if type(index) is not int:
                continue
            if kind == AnthropicKind.CONTENT_BLOCK_START:
                block = event.get("content_block")
                if isinstance(block, dict) and among(block.get("type"), _TOOL_BLOCKS):
                    tools[index] = (block.get("name"), [])
            elif kind == AnthropicKind.CONTENT_BLOCK_DELTA and index in tools:
                piece = _input_piece(event.get("delta"))
                if piece is not None:
                    tools[index][1].append(piece)
            elif kind == AnthropicKind.CONTENT_BLOCK_STOP and index in tools:
                name, pieces = tools.pop(index)
                joined = "".join(pieces)
                if joined and not is_json(joined):
                    what = f"the input of tool {quoted(name)} (block {index})"
                    yield Problem(stream, frame, f"{what} is not JSON: {excerpt(joined)}")


def _input_piece(delta: Any) -> str | None:
    """An input_json_delta's piece of a tool's input."""
    if isinstance(delta, dict) and delta.get("type") == "input_json_delta":
        piece = delta.get("partial_json")
        return piece if isinstance(piece, str) else None
    return None


Anthropic.rules = {
    "anthropic-block-order": block_order,
    "anthropic-stop-last": stop_last,
    "anthropic-frame": well_formed,
    "anthropic-tool-json": tool_json,
}
