"""The data of the LLM stream page: one OpenAI or Anthropic exchange read back from the log,
what it came to (the answer, each choice's when it asked for several, the model's thinking,
the tools it calls, the model the stream reported, tokens, the finish), its events and the
gaps between its text deltas, and the findings ``tasktape check`` saved about it.

Times are milliseconds since the request arrived.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tasktape.eventlog.protocols import ProtocolName, by_name, openai
from tasktape.eventlog.protocols.anthropic import REFUSAL, AnthropicKind
from tasktape.eventlog.protocols.openai import Choice, OpenAIKind

from .display import one_moment, parse_json
from .findings import SavedFinding, saved_findings

LLM_PROTOCOLS = frozenset({ProtocolName.OPENAI.value, ProtocolName.ANTHROPIC.value})
_FINISH = frozenset({OpenAIKind.FINISH, AnthropicKind.MESSAGE_DELTA})
_DONE = frozenset({OpenAIKind.DONE, AnthropicKind.MESSAGE_STOP})
_ERROR = frozenset({OpenAIKind.ERROR, AnthropicKind.ERROR})
# The kinds whose text is no token of the answer: an error's message, why a response failed.
NOT_TOKENS = _ERROR | _DONE
# The model's thinking: tokens it streams, but no part of the answer.
_THINKING = frozenset({OpenAIKind.THINKING, AnthropicKind.THINKING})
# A chunk of another choice than the first (of n): no part of the answer either.
_OTHER_CHOICES = frozenset({OpenAIKind.CHOICE})
HEAD_ROWS, TAIL_ROWS = 1_000, 20  # the events table shows these first and last events of a long stream
LONGEST = 3  # the longest gaps the page names
TITLES = {ProtocolName.OPENAI.value: "OpenAI", ProtocolName.ANTHROPIC.value: "Anthropic"}
# Finishes that mean the answer is not whole: cut at the token limit, filtered, failed.
CUT_SHORT = frozenset({"error", "failed", "incomplete", "length", "max_tokens", "content_filter", "refusal"})
FAILED = frozenset({"error", "failed"})  # finishes that say the call failed, and have a reason


@dataclass
class StreamEvent:
    seq: int
    at_ms: float
    gap_ms: float | None  # since the previous event
    kind: str
    event_type: str | None
    state: str | None
    text: str | None
    usage: dict[str, Any] | None
    complete: bool
    parse_error: str | None
    # The model's thinking it carries: a thinking delta's text; an OpenAI chunk's read again
    # from its data, as its text may hold more (the answer's first piece, other choices').
    thought: str | None

    @property
    def category(self) -> str:
        """What it is, for colour: delta, finish, done, usage, error or other."""
        if not self.complete or self.parse_error or self.kind in _ERROR:
            return "error"
        if self.kind in _DONE:  # (a failed response's says why)
            return "done"
        if self.text:
            return "delta"
        if self.kind in _FINISH:
            return "finish"
        if self.tokens:
            return "usage"
        return "other"

    @property
    def thinking(self) -> bool:
        """Whether it is a thinking delta (one that carries thinking beside answer text is not)."""
        return self.kind in _THINKING

    @property
    def tokens(self) -> str | None:
        """The token counts it carries: ``9 in · 12 out``."""
        usage = self.usage or {}
        counts = (("input_tokens", "in"), ("output_tokens", "out"))
        return " · ".join(f"{usage[k]} {name}" for k, name in counts if isinstance(usage.get(k), int)) or None


@dataclass
class ShownCall:
    """A tool call: its arguments as the model wrote them (the page indents them when they
    are JSON)."""

    id: str | None
    name: str | None
    arguments: str

    @property
    def indented(self) -> str | None:
        """The arguments indented, or None when they are not JSON (cut off with the
        stream, or malformed)."""
        try:
            return json.dumps(json.loads(self.arguments), indent=2, ensure_ascii=False)
        except ValueError:
            return None


def _calls(value: str | None) -> list[ShownCall]:
    calls = parse_json(value)
    return [
        ShownCall(call.get("id"), call.get("name"), call.get("arguments") or "")
        for call in (calls if isinstance(calls, list) else ())
        if isinstance(call, dict)
    ]


@dataclass
class Gap:
    """The time between two text deltas."""

    ms: float
    after: StreamEvent  # the delta before it
    before: StreamEvent  # the delta that ended it
    number: int  # which text delta ended it, counting from 1


@dataclass
class StreamPage:
    exchange_id: int
    protocol: str
    call: str | None  # chat.completions, responses, messages...
    method: str
    path: str
    status: int | None
    is_sse: bool
    outcome: str | None
    error: str | None
    started_at: str | None
    asked_model: str | None  # as the request named it
    prompt: str | None  # what the request sent last: the user's text, or a tool's result
    prompt_is_tool_result: bool  # whether it is the result of a tool the model called
    model: str | None  # as the stream reported it
    answer: str | None
    input_tokens: int | None  # every input token, the cached ones too
    output_tokens: int | None
    summary_cached_input_tokens: int | None  # as the exchange's summary counts them
    finish: str | None
    failure: str | None  # why the call failed, in the API's words
    tool_calls: list[ShownCall]
    ttfb_ms: float | None
    duration_ms: float | None
    events: list[StreamEvent]
    findings: list[SavedFinding]
    # Each choice's answer and finish, when the request asked for several (OpenAI's n);
    # else empty: the answer is all there is. The answer and finish above are choice 0's.
    choices: list[Choice]

    @property
    def open(self) -> bool:
        """Whether the log holds no end of it yet: its recorder is still writing it (or
        was killed)."""
        return self.outcome is None

    @property
    def protocol_title(self) -> str:
        return TITLES.get(self.protocol, self.protocol)

    @property
    def finished_badly(self) -> bool:
        return self.finish in CUT_SHORT

    @property
    def refused(self) -> bool:
        """Whether the model declined: it said so (OpenAI's refusal), or stopped for it
        (Anthropic's stop_reason)."""
        return self.finish == REFUSAL or any(e.kind == OpenAIKind.REFUSAL for e in self.events)

    @property
    def cached_input_tokens(self) -> int | None:
        """The input tokens read from the cache, as the last count of them said; else as
        the summary counts them (an answer not streamed has no events to count them)."""
        counts = [
            e.usage["cached_input_tokens"]
            for e in self.events
            if e.usage and "cached_input_tokens" in e.usage
        ]
        return counts[-1] if counts else self.summary_cached_input_tokens

    @property
    def cut_short(self) -> frozenset[str]:
        """The finishes that mean an answer (a choice's) is not whole."""
        return CUT_SHORT

    @cached_property  # (the page and its time axis ask for it many times)
    def deltas(self) -> list[StreamEvent]:
        """The events that carried text: the answer's, the thinking's, other choices'."""
        return [e for e in self.events if e.category == "delta"]

    @cached_property
    def answer_deltas(self) -> list[StreamEvent]:
        """The events whose text the answer (choice 0's) is made of."""
        return [e for e in self.deltas if not e.thinking and e.kind not in _OTHER_CHOICES]

    @cached_property
    def thinking_deltas(self) -> list[StreamEvent]:
        """The events whose text carries the model's thinking (some, answer text too)."""
        return [e for e in self.deltas if e.thought]

    @property
    def thinking(self) -> str | None:
        """The model's thinking, as it streamed it (no part of the answer)."""
        return "".join(e.thought or "" for e in self.thinking_deltas) or None

    @property
    def first_token(self) -> StreamEvent | None:
        """The first event that added text, thinking too: when the model's first token
        reached the client."""
        return next(iter(self.deltas), None)

    @property
    def first_answer_token(self) -> StreamEvent | None:
        """The first event that added text to an answer (any choice's), not thinking."""
        return next((e for e in self.deltas if not e.thinking), None)

    @property
    def end_ms(self) -> float:
        return max([self.duration_ms or 0.0, *(e.at_ms for e in self.events)])

    @cached_property
    def gaps(self) -> list[Gap]:
        """The times between consecutive events that carried text (answer and thinking
        alike); events without (tool-call arguments, signatures, counts) are not timed."""
        pairs = itertools.pairwise(self.deltas)
        return [Gap(b.at_ms - a.at_ms, a, b, n) for n, (a, b) in enumerate(pairs, 2)]

    @property
    def gap_p50(self) -> float | None:
        gaps = [g.ms for g in self.gaps]
        return statistics.median(gaps) if gaps else None

    @property
    def widest_gap(self) -> float:
        """The longest time between two events (deltas or not), for scaling bars."""
        return max((e.gap_ms for e in self.events if e.gap_ms is not None), default=0.0)

    @property
    def longest_gaps(self) -> list[Gap]:
        return sorted(self.gaps, key=lambda g: -g.ms)[:LONGEST]

    @property
    def table_head(self) -> list[StreamEvent]:
        """The events the events table shows first: all of them, unless the stream is long."""
        return self.events if len(self.events) <= HEAD_ROWS + TAIL_ROWS else self.events[:HEAD_ROWS]

    @property
    def table_tail(self) -> list[StreamEvent]:
        """The last events of a long stream, shown after the ones left out."""
        return [] if len(self.events) <= HEAD_ROWS + TAIL_ROWS else self.events[-TAIL_ROWS:]

    @property
    def left_out(self) -> int:
        """How many events the table leaves out (the events table of the log has them all)."""
        return len(self.events) - len(self.table_head) - len(self.table_tail)


def load_stream(path: str | Path, exchange_id: int) -> StreamPage | None:
    """The stream's page data, or None when the log has no such OpenAI or Anthropic exchange:
    read as the log was at one moment, however a recorder writes it meanwhile."""
    with one_moment(path) as log:
        rows = list(log.db.query("SELECT * FROM exchanges WHERE id = ?", [exchange_id]))
        if not rows or rows[0]["protocol"] not in LLM_PROTOCOLS:
            return None
        x = rows[0]
        event_rows = list(log.events(exchange_id))
        events = _events(x["protocol"], event_rows)
        body = parse_json(x["request_body"])
        body = body if isinstance(body, dict) else {}
        prompt, tool_result = _prompt(body)
        return StreamPage(
            exchange_id=exchange_id,
            protocol=x["protocol"],
            call=x["rpc_method"],
            method=x["method"],
            path=x["path"],
            status=x["status"],
            is_sse=bool(x["is_sse"]),
            outcome=x["outcome"],
            error=x["error"],
            started_at=x["started_at"],
            asked_model=body.get("model") if isinstance(body.get("model"), str) else None,
            prompt=prompt,
            prompt_is_tool_result=tool_result,
            model=x["model"],
            answer=x["answer"],
            input_tokens=x["input_tokens"],
            output_tokens=x["output_tokens"],
            summary_cached_input_tokens=x["cached_input_tokens"],
            finish=x["finish"],
            failure=_failure(x, events),
            tool_calls=_calls(x["tool_calls"]),
            ttfb_ms=None if x["ttfb_ns"] is None else x["ttfb_ns"] / 1e6,
            duration_ms=None if x["duration_ns"] is None else x["duration_ns"] / 1e6,
            events=events,
            findings=saved_findings(log, [exchange_id]),
            choices=_choices(x, body, events, event_rows),
        )


def _events(protocol: str, rows: list[dict[str, Any]]) -> list[StreamEvent]:
    events: list[StreamEvent] = []
    for r in rows:
        at = r["offset_ns"] / 1e6
        usage = parse_json(r["usage"])
        events.append(
            StreamEvent(
                seq=r["seq"],
                at_ms=at,
                gap_ms=at - events[-1].at_ms if events else None,
                kind=r["kind"],
                event_type=r["event_type"],
                state=r["state"],
                text=r["text"],
                usage=usage if isinstance(usage, dict) else None,
                complete=bool(r["complete"]),
                parse_error=r["parse_error"],
                thought=_thought(protocol, r),
            )
        )
    return events


def _thought(protocol: str, row: dict[str, Any]) -> str | None:
    """The thinking an event carries: an OpenAI chunk's is read again from its data, as its
    text may hold the answer's first piece (or other choices' text) beside it."""
    if protocol == ProtocolName.OPENAI.value:
        return openai.thinking(row["data"], row["kind"], row["text"])
    return row["text"] if row["kind"] in _THINKING else None


def _choices(
    x: dict[str, Any], body: dict[str, Any], events: list[StreamEvent], rows: list[dict[str, Any]]
) -> list[Choice]:
    """Each choice's answer, when an OpenAI answer has several: read again from the events'
    data (a chunk may carry more than one choice), or from the body of an answer not streamed."""
    if x["protocol"] != ProtocolName.OPENAI.value:
        return []
    several = openai.asks_for_choices(body) or any(e.kind in _OTHER_CHOICES for e in events)
    if not several:
        return []
    found = openai.choices(r["data"] for r in rows) if x["is_sse"] else openai.choices([x["response_body"]])
    return found if len(found) > 1 else []


def _failure(x: dict[str, Any], events: list[StreamEvent]) -> str | None:
    """Why the call failed: what its error events or its failed response said, else the
    error body it was answered with, as its protocol reads it."""
    if x["finish"] not in FAILED:
        return None
    said = [e.text for e in events if e.text and (e.kind in _ERROR or e.kind in _DONE)]
    if said:
        return said[-1]
    protocol = by_name(x["protocol"])
    if x["is_sse"] or not x["response_body"] or protocol is None:
        return None
    read = protocol.reader().body(x["response_body"])
    return read.text if read is not None else None


# A message that carries a tool's result: OpenAI's tool (or legacy function) message, a
# Responses function_call_output item; Anthropic's are tool_result blocks of a user message.
_TOOL_ROLES = frozenset({"tool", "function"})
_TOOL_OUTPUT = "function_call_output"
_TOOL_RESULT_BLOCK = "tool_result"


def _prompt(body: dict[str, Any]) -> tuple[str | None, bool]:
    """What the request sent last (chat messages, Responses input, a prompt): the last user
    message's text, or the result of a tool the model called, and whether it is that."""
    for key in ("messages", "input", "prompt"):
        value = body.get(key)
        if isinstance(value, str):
            return value, False
        for message in reversed(value) if isinstance(value, list) else ():
            if not isinstance(message, dict):
                continue
            if message.get("role") in _TOOL_ROLES or message.get("type") == _TOOL_OUTPUT:
                return _text(message.get("content", message.get("output"))), True
            if message.get("role") == "user":
                return _user_text(message.get("content"))
    return None, False


def _user_text(content: Any) -> tuple[str | None, bool]:
    """A user message's text, or the tool results it carries (Anthropic's)."""
    blocks = content if isinstance(content, list) else []
    results = [b for b in blocks if isinstance(b, dict) and b.get("type") == _TOOL_RESULT_BLOCK]
    if not results:
        return _text(content), False
    texts = [t for b in results if (t := _text(b.get("content"))) is not None]
    return "\n".join(texts) or None, True


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    return (
        "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)) or None
    )
