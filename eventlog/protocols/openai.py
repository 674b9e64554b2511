"""OpenAI token streams: Chat Completions (``stream: true``, usage with
``stream_options.include_usage``, ended by ``data: [DONE]``) and the Responses API's
typed events (``event: response.output_text.delta`` ..., ended by ``response.completed``,
``response.failed`` or ``response.incomplete``). Servers that copy the API (vLLM,
llama.cpp, Ollama's compatibility layer) speak the same.

An exchange is OpenAI's when it POSTs to ``.../chat/completions``, ``.../completions`` or
``.../responses`` a JSON body with a ``model`` and its ``messages``, ``prompt`` or
``input``; or, when that body is not at hand as the answer begins (one streamed through),
when the answer's first event is a chunk with its choices or a named Responses event.
Event kinds: ``delta`` (adds text), ``refusal`` (adds the text of the model's refusal:
a chat delta's ``refusal``, a ``response.refusal.delta``), ``thinking`` (the model's
reasoning, no part of the answer: a ``response.reasoning_summary_text.delta`` or
``response.reasoning_text.delta``, a chat delta's ``reasoning_content`` or ``reasoning``
as servers that copy the API send it), ``finish`` (a choice's finish_reason), ``choice``
(a chunk of another choice than the first, when a request asks for ``n`` of them: its
text, its finish_reason), ``usage`` (token counts), ``done`` (the end: ``[DONE]`` or a
Responses terminal event), ``event`` (any other Responses event), ``error`` and ``other``.
A chat chunk's event is of choice 0's kind, its text all the text the chunk carries (for
search): choice 0's reasoning and its piece of the answer (a delta may carry both, where
the reasoning ends), then every other choice's, one line each; what it adds to the answer
(its delta) is choice 0's piece alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from ..classify import Classification, is_json
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
    last_state,
    parsed,
    quoted,
)

DONE = "[DONE]"
# The API call of each path tail, and the request body fields it needs one of beside its
# "model" (a Responses call may name none: a stored prompt, or the response it follows).
_CALLS = {
    "/chat/completions": ("chat.completions", ("messages",)),
    "/completions": ("completions", ("prompt",)),
    "/responses": ("responses", ("input", "prompt", "previous_response_id", "conversation")),
}
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})
# What the API names the objects it answers with: a chunk of a Chat Completions stream, a
# whole chat completion, a (legacy) completion; each with its "choices".
_CHOICE_OBJECTS = frozenset({"chat.completion.chunk", "chat.completion", "text_completion"})
_TEXT_DELTA = "response.output_text.delta"
_REFUSAL_DELTA = "response.refusal.delta"
# The Responses events that stream the model's reasoning: its summary, or the text itself.
_THINKING_DELTAS = frozenset({"response.reasoning_summary_text.delta", "response.reasoning_text.delta"})
# Where servers that copy the Chat API put a delta's reasoning (vLLM, DeepSeek: the first).
_REASONING_KEYS = ("reasoning_content", "reasoning")
# The output's content parts the answer is made of, and the key of each one's text.
_TEXT_PARTS = {"output_text": "text", "refusal": "refusal"}
# The Responses events that tell of a function call: its output item, its arguments' pieces.
_CALL_EVENTS = frozenset(
    {
        "response.output_item.added",
        "response.output_item.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    }
)


class OpenAIKind(StrEnum):
    DELTA = "delta"
    REFUSAL = "refusal"
    THINKING = "thinking"
    FINISH = "finish"
    CHOICE = "choice"
    USAGE = "usage"
    DONE = "done"
    EVENT = "event"
    ERROR = "error"
    OTHER = "other"


# A finish chunk may carry text too.
_DELTA_KINDS = frozenset({OpenAIKind.DELTA, OpenAIKind.REFUSAL, OpenAIKind.FINISH})


def _call(request: Request) -> str | None:
    if request.method != "POST":
        return None
    for tail, (call, needs) in _CALLS.items():
        if request.path.endswith(tail):
            body = request.json()
            if not isinstance(body, dict) or not any(need in body for need in needs):
                return None
            # A stored prompt may carry the model for a Responses call.
            named = isinstance(body.get("model"), str) or (call == "responses" and "prompt" in body)
            return call if named else None
    return None


class OpenAI(Protocol):
    name = "openai"
    kinds = OpenAIKind
    server_ids: ClassVar[frozenset[str]] = frozenset({"id"})  # chatcmpl-..., resp_..., call_...

    def claims(self, request: Request) -> bool:
        return _call(request) is not None

    def claims_stream(self, data: str, event_type: str | None) -> bool:
        """A response whose request body the log has not (yet): a Chat Completions chunk
        (or a whole completion) with its choices, or a Responses event whose data names
        its own type (or a whole response with its output)."""
        obj = parsed(data, OpenAIKind.OTHER) if data else None
        if not isinstance(obj, dict):
            return False
        if among(obj.get("object"), _CHOICE_OBJECTS):
            return isinstance(obj.get("choices"), list)
        if event_type is None:
            return obj.get("object") == "response" and isinstance(obj.get("output"), list)
        return event_type.startswith("response.") and obj.get("type") == event_type

    def request_info(self, request: Request) -> RequestInfo:
        return RequestInfo(rpc_method=_call(request))

    def reader(self) -> OpenAIReader:
        return OpenAIReader()

    def final_state(self, last: str | None, summary: Summary) -> str | None:
        """The finish the log stores: choice 0's finish_reason (the last event's may be
        another choice's), a Responses terminal status (none for a stream cut before it)."""
        return summary.finish

    def state_note(self, stream: Stream) -> str | None:
        """``last status in_progress`` (Responses), ``last finish reason length`` (chat:
        choice 0's, the answer's)."""
        state = last_state(stream, skipped=(OpenAIKind.CHOICE,))
        noun = "status" if _responses_api(stream) else "finish reason"
        return f"last {noun} {state}" if state else None

    def closes(self, data: str, event_type: str | None) -> bool:
        """``[DONE]``, or a Responses stream's terminal event."""
        return data == DONE or event_type in TERMINAL

    def ended(self, stream: Stream) -> bool:
        """A stream that carried its closing event owes nothing after it (the SDKs close
        their connection on ``[DONE]``, before the server ends its body)."""
        return any(f.complete and self.closes(f.data, f.event_type) for f in reversed(stream.frames))

    def delta(self, c: Classification) -> str | None:
        """The text deltas alone (an error's message is no part of the answer): a chat
        chunk's piece of the answer, not the reasoning or other choices' text its event's
        text holds beside it."""
        if c.kind not in _DELTA_KINDS:
            return None
        return c.piece if isinstance(c, ChatChunk) else c.text


class ChatChunk(Classification):
    """The event of a chat chunk that says more than its piece of the answer (choice 0's
    reasoning, other choices' text): its text all of it, for search; ``piece`` what the
    answer takes."""

    piece: str | None = None


def _chunk(
    kind: str, text: str | None, state: str | None, usage: dict[str, Any] | None, piece: str | None
) -> Classification:
    """A chat chunk's event; its piece of the answer kept apart when its text says more."""
    c = classified(kind, text, state, usage)
    if text == piece:  # most chunks: nothing beside the piece, nothing more to keep
        return c
    chunk = ChatChunk._make(c)
    chunk.piece = piece
    return chunk


# Each count of a usage object, by its path there, and the name tasktape gives it: the
# Chat API's prompt/completion tokens, the Responses API's input/output tokens. The
# input counts every input token, the cached ones too (as both APIs count them).
_COUNTS = (
    (("prompt_tokens",), "input_tokens"),
    (("completion_tokens",), "output_tokens"),
    (("input_tokens",), "input_tokens"),
    (("output_tokens",), "output_tokens"),
    (("total_tokens",), "total_tokens"),
    (("prompt_tokens_details", "cached_tokens"), "cached_input_tokens"),
    (("input_tokens_details", "cached_tokens"), "cached_input_tokens"),
    (("completion_tokens_details", "reasoning_tokens"), "reasoning_tokens"),
    (("output_tokens_details", "reasoning_tokens"), "reasoning_tokens"),
)


def _usage(model: Any, usage: Any) -> dict[str, Any] | None:
    """Token counts in one vocabulary (``_COUNTS``), and the model; a count the log cannot
    hold (past 64 bits) is none."""
    out: dict[str, Any] = {}
    if isinstance(model, str):
        out["model"] = model
    for path, ours in _COUNTS if isinstance(usage, dict) else ():
        value: Any = usage
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if (count := stored_count(value)) is not None:
            out[ours] = count
    return out or None


class OpenAIReader(StreamReader):
    """The answer is choice 0's deltas (or the output text; the reasoning kept apart); the
    model the stream reports, recorded on an event's usage when it first appears or changes."""

    def __init__(self) -> None:
        super().__init__()
        self._seen_model: str | None = None
        self._calls = _Calls(self.calls)

    def event(self, data: str, event_type: str | None) -> Classification:
        if data == DONE:
            return classified(OpenAIKind.DONE)
        return self._read(data)

    def body(self, data: bytes | str) -> Classification | None:
        return self._read(data) if data else None

    def _read(self, data: bytes | str) -> Classification:
        obj = parsed(data, OpenAIKind.OTHER)
        if isinstance(obj, Classification):
            return obj
        if "error" in obj and isinstance(obj["error"], dict):
            return self._error(obj["error"])
        kind = obj.get("type")
        if isinstance(kind, str):
            return self._typed(kind, obj)
        if obj.get("object") == "response":  # a Responses API answer read whole (no stream)
            return self._response(obj, terminal=True)
        return self._chat(obj)

    def _error(self, error: dict[str, Any]) -> Classification:
        message = error.get("message")
        self.summary.finish = "error"
        return Classification(
            OpenAIKind.ERROR, text=message if isinstance(message, str) else None, state="error"
        )

    def _model(self, model: Any) -> Any:
        """The model, when it is news (first seen, or changed; an empty name is none)."""
        if not isinstance(model, str) or not model or model == self._seen_model:
            return None
        self._seen_model = self.summary.model = model
        return model

    def _tokens(self, usage: dict[str, Any] | None) -> None:
        if usage:
            s = self.summary
            s.input_tokens = usage.get("input_tokens", s.input_tokens)
            s.output_tokens = usage.get("output_tokens", s.output_tokens)
            s.cached_input_tokens = usage.get("cached_input_tokens", s.cached_input_tokens)

    def _chat(self, obj: dict[str, Any]) -> Classification:
        """A chat.completion.chunk (or text_completion, or a whole chat.completion)."""
        # Runs for every chunk: the model and usage are looked at only when there is news.
        model, counts = obj.get("model"), obj.get("usage")
        usage = None
        if counts or (model is not None and model != self._seen_model):
            usage = _usage(self._model(model), counts)
            self._tokens(usage)
        first, others = _split(obj.get("choices"))
        # Every other choice's text rides on the chunk's event, for search.
        besides = [text for choice in others for text in _said(choice)]
        if first is not None:
            return self._first_choice(first, usage, besides)
        if others:
            return _other_choices(others, usage, besides)
        # A chunk without choice 0 is there for its counts (a server that counts on every
        # chunk counts on choice 0's too: those are deltas).
        return classified(OpenAIKind.USAGE if type(counts) is dict else OpenAIKind.DELTA, None, None, usage)

    def _first_choice(
        self, choice: dict[str, Any], usage: dict[str, Any] | None, besides: list[str]
    ) -> Classification:
        """Choice 0's piece of the answer (or refusal, or reasoning), its tool calls, its finish;
        the event's text is all the chunk says (``besides``: the other choices' text)."""
        holder = _holder(choice)
        piece, kind = _piece(choice, holder), OpenAIKind.DELTA
        if piece is None and type(holder) is dict:
            if refusal := _refusal(holder):  # what the model said instead
                piece, kind = refusal, OpenAIKind.REFUSAL
            elif _reasoning(holder):
                kind = OpenAIKind.THINKING
        if calls := _choice_calls(holder):
            self._calls.chat(calls)
        reason = choice.get("finish_reason")
        finish = reason if type(reason) is str else None
        if finish is not None:
            self.summary.finish = finish
        text = _lines([*_said(choice), *besides])
        if kind is OpenAIKind.THINKING:  # (its finish, if it carries one, as its state)
            return classified(kind, text, finish, usage)
        if piece is not None:
            self.pieces.append(piece)
        if finish is not None:
            return _chunk(OpenAIKind.FINISH, text, finish, usage, piece)
        return _chunk(kind, text, None, usage, piece)

    def _typed(self, kind: str, obj: dict[str, Any]) -> Classification:
        """A Responses API event."""
        if kind in (_TEXT_DELTA, _REFUSAL_DELTA):
            delta = obj.get("delta")
            text = delta if isinstance(delta, str) else None
            if text:
                self.pieces.append(text)
            return classified(OpenAIKind.DELTA if kind == _TEXT_DELTA else OpenAIKind.REFUSAL, text)
        if kind in _THINKING_DELTAS:
            delta = obj.get("delta")
            return classified(OpenAIKind.THINKING, delta if isinstance(delta, str) and delta else None)
        if kind == "error":
            return self._error(obj)
        if kind in _CALL_EVENTS:
            self._calls.responses(kind, obj)
            return classified(OpenAIKind.EVENT)
        response = obj.get("response")
        if not isinstance(response, dict):
            return classified(OpenAIKind.EVENT)
        return self._response(response, terminal=kind in TERMINAL)

    def _response(self, response: dict[str, Any], *, terminal: bool) -> Classification:
        """A response object: an event's, or the whole answer. A terminal one says how the
        response finished, and its output text is the answer where none was streamed."""
        usage = _usage(self._model(response.get("model")), response.get("usage"))
        self._tokens(usage)
        status = response.get("status")
        status = status if isinstance(status, str) else None
        if terminal:
            self.summary.finish = status
            if not self.pieces:
                self.pieces.extend(_output_text(response))
            self._calls.output(response)
            return classified(OpenAIKind.DONE, _error_message(response), status, usage)
        return classified(OpenAIKind.EVENT, None, status, usage)


class _Calls:
    """The tool calls of one answer (a chat choice's, a response's), joined from their
    pieces as the SDKs join them, into ``calls`` by the key each protocol form gives one."""

    def __init__(self, calls: dict[Any, ToolCall]) -> None:
        self.calls = calls
        self._last_unindexed: Any = None  # the key of the last call that came without an index

    def chat(self, calls: Any) -> None:
        """A choice's tool calls: a delta's pieces of each (its index names the call; the
        name and arguments come in pieces, as the SDKs join them), or a whole message's;
        or the legacy ``function_call``, one call without an id."""
        if isinstance(calls, dict):
            calls = [{"index": "function_call", "function": calls}]
        for position, piece in enumerate(calls if isinstance(calls, list) else ()):
            if not isinstance(piece, dict):
                continue
            key = index_or_id(piece.get("index"))
            call = self.calls.setdefault(self._unindexed(piece, position) if key is None else key, ToolCall())
            if not call.id and isinstance(piece.get("id"), str):
                call.id = piece["id"]
            function = piece.get("function")
            if isinstance(function, dict):
                if isinstance(name := function.get("name"), str):
                    call.name = (call.name or "") + name
                if isinstance(arguments := function.get("arguments"), str):
                    call.arguments += arguments

    def _unindexed(self, piece: dict[str, Any], position: int) -> Any:
        """The call a piece without an index belongs to (servers that copy the API may give
        none): a new one for a new id, or for a second piece of one list; else the last."""
        new_id = piece.get("id")
        if (
            position
            or self._last_unindexed is None
            or (isinstance(new_id, str) and new_id and new_id != self.calls[self._last_unindexed].id)
        ):
            self._last_unindexed = ("unindexed", len(self.calls))
        return self._last_unindexed

    def responses(self, kind: str, obj: dict[str, Any]) -> None:
        """A Responses function call's output item (whole when done), or its arguments'
        pieces; by the item's place in the output (every event names it), else its id."""
        if kind.startswith("response.output_item."):
            item = obj.get("item")
            if isinstance(item, dict):
                self._item(_place(obj.get("output_index"), item.get("id") or item.get("call_id")), item)
            return
        call = self.calls.setdefault(_place(obj.get("output_index"), obj.get("item_id")), ToolCall())
        arguments = obj.get("arguments" if kind.endswith(".done") else "delta")
        if isinstance(arguments, str):
            call.arguments = arguments if kind.endswith(".done") else call.arguments + arguments

    def output(self, response: dict[str, Any]) -> None:
        """A finished response's calls, whole in its output."""
        for index, item in enumerate(_output(response)):
            if isinstance(item, dict):
                self._item(index, item)

    def _item(self, key: int | str | None, item: dict[str, Any]) -> None:
        if item.get("type") != "function_call":
            return
        call = self.calls.setdefault(key, ToolCall())
        if isinstance(item.get("call_id"), str):
            call.id = item["call_id"]
        if isinstance(item.get("name"), str):
            call.name = item["name"]
        if isinstance(item.get("arguments"), str) and item["arguments"]:
            call.arguments = item["arguments"]


def _place(output_index: Any, item_id: Any) -> int | str | None:
    """The key of a Responses function call: its place in the output, else its item's id."""
    index = index_or_id(output_index)
    return index_or_id(item_id) if index is None else index


def _output(response: dict[str, Any]) -> list[Any]:
    """A response's output items."""
    output = response.get("output")
    return output if type(output) is list else []


def _choice_calls(holder: Any) -> Any:
    """The tool calls a choice's delta (or whole message) carries, if any."""
    return type(holder) is dict and (holder.get("tool_calls") or holder.get("function_call"))


def _split(choices: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """A chunk's choice 0 (the answer), and the other choices a request for ``n`` of them gets."""
    first = None
    others: list[dict[str, Any]] = []
    for choice in choices if type(choices) is list else ():
        if type(choice) is dict:
            if choice.get("index", 0) == 0:
                first = choice
            else:
                others.append(choice)
    return first, others


def _refusal(holder: dict[str, Any]) -> str | None:
    refusal = holder.get("refusal")
    return refusal if type(refusal) is str and refusal else None


def _said(choice: dict[str, Any]) -> list[str]:
    """All the text a choice's chunk carries, in the order the model says it: its reasoning,
    then its piece of the answer and its refusal."""
    holder = _holder(choice)
    if type(holder) is not dict:
        return [piece] if (piece := _piece(choice, holder)) is not None else []
    said = (_reasoning(holder), _piece(choice, holder), _refusal(holder))
    return [text for text in said if text is not None]


def _lines(texts: list[str]) -> str | None:
    """Texts as one event's text: a line each, so that search tells their words apart."""
    return "\n".join(texts) or None


def _reasoning(holder: dict[str, Any]) -> str | None:
    """A chat delta's reasoning, as servers that copy the API send it."""
    for key in _REASONING_KEYS:
        value = holder.get(key)
        if type(value) is str and value:
            return value
    return None


def _holder(choice: dict[str, Any]) -> Any:
    """What holds a choice's content: a chunk's delta, a whole completion's message."""
    holder = choice.get("delta")
    return choice.get("message") if holder is None else holder


def _piece(choice: dict[str, Any], holder: Any) -> str | None:
    """The text a choice's chunk adds to its answer (a legacy completion's, on the choice)."""
    piece = holder.get("content") if type(holder) is dict else choice.get("text")
    return piece if type(piece) is str and piece else None


def _other_choices(
    choices: list[dict[str, Any]], usage: dict[str, Any] | None, said: list[str]
) -> Classification:
    """A chunk of choices other than the first: their text (``said``, for search) and
    finish_reason, kind ``choice``; no part of the answer, which is choice 0's."""
    reasons = [r for c in choices if type(r := c.get("finish_reason")) is str]
    return classified(OpenAIKind.CHOICE, _lines(said), reasons[-1] if reasons else None, usage)


@dataclass
class Choice:
    """One of the answers a chat request for ``n`` of them gets: its text, how it finished."""

    index: int
    answer: str = ""
    finish: str | None = None


def asks_for_choices(body: Any) -> bool:
    """Whether a request body asks for more than one choice (``n``)."""
    n = body.get("n") if isinstance(body, dict) else None
    return type(n) is int and n > 1


def choices(payloads: Iterable[str | bytes | None]) -> list[Choice]:
    """Each choice's answer and finish, in index order, from a chat stream's events' data
    (or a whole completion's body)."""
    found: dict[int, Choice] = {}
    for payload in payloads:
        obj = parsed(payload, OpenAIKind.OTHER) if payload and payload != DONE else None
        listed = obj.get("choices") if type(obj) is dict else None
        for choice in listed if type(listed) is list else ():
            index = choice.get("index", 0) if type(choice) is dict else None
            if type(index) is not int:
                continue
            into = found.setdefault(index, Choice(index))
            into.answer += _piece(choice, _holder(choice)) or ""
            if type(reason := choice.get("finish_reason")) is str:
                into.finish = reason
    return [found[i] for i in sorted(found)]


def thinking(data: str | None, kind: str, text: str | None) -> str | None:
    """The model's thinking an event carries: a chat chunk's choice 0 reasoning, read again
    from its data (the event's text holds the rest of what the chunk says beside it), or a
    Responses reasoning delta's text."""
    # Only data that names reasoning can carry it: the others, most events, are not parsed.
    if kind != OpenAIKind.THINKING and (not data or "reasoning" not in data):
        return None
    obj = parsed(data, OpenAIKind.OTHER) if data else None
    if type(obj) is not dict or isinstance(obj.get("type"), str):  # (a Responses event, as _read tells)
        return text if kind == OpenAIKind.THINKING else None
    first, _ = _split(obj.get("choices"))
    holder = _holder(first) if first is not None else None
    return _reasoning(holder) if type(holder) is dict else None


def _error_message(response: dict[str, Any]) -> str | None:
    """Why a response failed (``response.failed``), as its error says."""
    error = response.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def _output_text(response: dict[str, Any]) -> list[str]:
    """The text of the output's messages: their text parts, and refusals."""
    texts = []
    for item in _output(response):
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if type(content) is list else ():
            named = part.get("type") if isinstance(part, dict) else None
            key = _TEXT_PARTS.get(named) if type(named) is str else None
            if key is not None and isinstance(part.get(key), str):
                texts.append(part[key])
    return texts


# -- lifecycle rules ----------------------------------------------------------------------


def _responses_api(stream: Stream) -> bool:
    """Whether the stream answers a Responses call: its request says so or, a request body
    the log could not read (cut at --max-body), its events name their response.* types."""
    call = stream.request.rpc_method
    if call is not None:
        return call == "responses"
    first = stream.frames[0] if stream.frames else None
    return first is not None and (first.event_type or "").startswith("response.")


def done_last(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A stream run to its end ends on one end marker: [DONE], or a terminal response.* event."""
    for stream in streams:
        if not stream.is_sse:
            continue
        frames = [f for f in stream.frames if f.complete]
        ends = [f for f in frames if f.c.kind == OpenAIKind.DONE]
        if any(f.c.kind == OpenAIKind.ERROR for f in frames):
            continue  # an error ends a stream as well
        marker = "a terminal response event" if _responses_api(stream) else "data: [DONE]"
        for extra in ends[1:]:
            yield Problem(stream, extra, f"a second end marker ({marker})")
        if ends and frames[-1] is not ends[-1]:
            after = frames[frames.index(ends[0]) + 1]
            yield Problem(stream, after, f"an event after the end marker ({marker}) of event {ends[0].seq}")
        elif not ends and stream.complete and frames:
            yield Problem(stream, frames[-1], f"the stream ended without {marker}")


# What a choice's delta adds to its answer: its text, a refusal, tool calls (and a legacy
# completion's text, on the choice itself).
_ADDS = ("content", "refusal", "tool_calls", "function_call")


def _adds(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    return bool(choice.get("text")) or (isinstance(delta, dict) and any(delta.get(k) for k in _ADDS))


def one_finish(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Each choice of a chat stream gets one finish_reason, after which it adds nothing."""
    # (Nothing: no text, refusal or tool call. A stream an error ended need not finish them.)
    for stream in streams:
        if not stream.is_sse or _responses_api(stream):
            continue
        finished: dict[int, int | None] = {}
        seen: dict[int, None] = {}  # the choices, in the order they came
        for frame in stream.frames:
            choices = (frame.payload or {}).get("choices")
            for choice in choices if isinstance(choices, list) else ():
                index = choice.get("index", 0) if isinstance(choice, dict) else None
                if type(index) is not int:
                    continue  # an index that is no integer names no choice (as ``choices`` reads them)
                seen.setdefault(index, None)
                if index in finished and (_adds(choice) or choice.get("finish_reason")):
                    what = "a second finish_reason" if choice.get("finish_reason") else "more of its answer"
                    yield Problem(
                        stream, frame, f"{what} for choice {index}, finished at event {finished[index]}"
                    )
                elif choice.get("finish_reason"):
                    finished[index] = frame.seq
        if (
            not stream.complete
            or not stream.frames
            or any(f.c.kind == OpenAIKind.ERROR for f in stream.frames)
        ):
            continue
        if not finished:
            yield Problem(stream, None, "no choice got a finish_reason")
        for index in (i for i in seen if finished and i not in finished):
            yield Problem(stream, None, f"choice {index} got no finish_reason")


def well_formed(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Every event is a JSON object (or [DONE]); a Responses event's event field is its type."""
    for stream in streams:
        responses = _responses_api(stream)  # (a chat stream names only its error event)
        for frame, problem in readable(stream):
            if problem is not None:
                yield problem
            elif (
                responses
                and frame.event_type is not None
                and frame.payload
                and frame.payload.get("type") != frame.event_type
            ):
                yield Problem(
                    stream,
                    frame,
                    f"event {frame.event_type!r} carries data of type {quoted(frame.payload.get('type'))}",
                )


def tool_json(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Each tool call's arguments, joined from their pieces, are JSON once the stream has ended."""
    # (Not "" either: the SDKs json.loads it. A stream cut short, or ended by an error, is exempt.)
    for stream in streams:
        if not stream.complete or any(f.c.kind == OpenAIKind.ERROR for f in stream.frames):
            continue
        for choice, call in _calls_made(stream):
            if not is_json(call.arguments):
                of = f" of choice {choice}" if choice else ""  # (choice 0's calls are the answer's)
                called = " ".join(filter(None, ("tool call", call.id, call.name and f"({call.name})")))
                yield Problem(
                    stream, None, f"the arguments of {called}{of} are not JSON: {excerpt(call.arguments)}"
                )


def _calls_made(stream: Stream) -> Iterator[tuple[int | None, ToolCall]]:
    """Each tool call of a stream (or an answer), joined as its reader joins them: with the
    index of its chat choice (None: a Responses call)."""
    joined: dict[int | None, _Calls] = {}
    for frame in stream.frames:
        obj = frame.payload if frame.complete else None
        if obj is None:
            continue
        kind = obj.get("type")
        if among(kind, _CALL_EVENTS):
            joined.setdefault(None, _Calls({})).responses(kind, obj)
        elif among(kind, TERMINAL) or obj.get("object") == "response":
            response = obj.get("response") if among(kind, TERMINAL) else obj
            if isinstance(response, dict):
                joined.setdefault(None, _Calls({})).output(response)
        listed = obj.get("choices")
        for choice in listed if type(listed) is list else ():
            index = choice.get("index", 0) if type(choice) is dict else None
            if type(index) is int and (calls := _choice_calls(_holder(choice))):
                joined.setdefault(index, _Calls({})).chat(calls)
    for index, calls in joined.items():
        for call in calls.calls.values():
            yield index, call


OpenAI.rules = {
    "openai-done-last": done_last,
    "openai-one-finish": one_finish,
    "openai-frame": well_formed,
    "openai-tool-json": tool_json,
}
