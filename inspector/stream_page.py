"""The data of the LLM stream page: one OpenAI or Anthropic exchange read back from the log,
what it came to (the answer, the tools it calls, the model the stream reported, tokens, the
finish), its events
and the gaps between its text deltas, and the findings ``tasktape check`` saved about it.

Times are milliseconds since the request arrived.
"""

from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasktape.eventlog import EventLog
from tasktape.eventlog.protocols import ProtocolName
from tasktape.eventlog.protocols.anthropic import AnthropicKind
from tasktape.eventlog.protocols.openai import OpenAIKind

from .display import parse_json
from .findings import SavedFinding, saved_findings

LLM_PROTOCOLS = frozenset({ProtocolName.OPENAI.value, ProtocolName.ANTHROPIC.value})
_FINISH = frozenset({OpenAIKind.FINISH, AnthropicKind.MESSAGE_DELTA})
_DONE = frozenset({OpenAIKind.DONE, AnthropicKind.MESSAGE_STOP})
_ERROR = frozenset({OpenAIKind.ERROR, AnthropicKind.ERROR})
LONGEST = 3  # the longest gaps the page names
TITLES = {ProtocolName.OPENAI.value: "OpenAI", ProtocolName.ANTHROPIC.value: "Anthropic"}
# Finishes that mean the answer is not whole: cut at the token limit, filtered, failed.
CUT_SHORT = frozenset({"error", "failed", "incomplete", "length", "max_tokens", "content_filter", "refusal"})


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

    @property
    def category(self) -> str:
        """What it is, for colour: delta, finish, done, usage, error or other."""
        if not self.complete or self.parse_error or self.kind in _ERROR:
            return "error"
        if self.text:
            return "delta"
        if self.kind in _FINISH:
            return "finish"
        if self.kind in _DONE:
            return "done"
        if self.tokens:
            return "usage"
        return "other"

    @property
    def tokens(self) -> str | None:
        """The token counts it carries: ``9 in · 12 out``."""
        usage = self.usage or {}
        counts = (("input_tokens", "in"), ("output_tokens", "out"))
        return " · ".join(f"{usage[k]} {name}" for k, name in counts if isinstance(usage.get(k), int)) or None


@dataclass
class ShownCall:
    """A tool call as the page shows it: its arguments indented when they are JSON."""

    id: str | None
    name: str | None
    arguments: str
    whole: bool  # whether the arguments are JSON (not: cut off with the stream, or malformed)


def _calls(value: str | None) -> list[ShownCall]:
    calls = parse_json(value)
    shown = []
    for call in calls if isinstance(calls, list) else ():
        arguments = call.get("arguments") or ""
        try:
            arguments, whole = json.dumps(json.loads(arguments), indent=2, ensure_ascii=False), True
        except ValueError:
            whole = False
        shown.append(ShownCall(call.get("id"), call.get("name"), arguments, whole))
    return shown


@dataclass
class Gap:
    """The time between two text deltas."""

    ms: float
    after: StreamEvent  # the delta before it
    before: StreamEvent  # the delta that ended it
    number: int  # which delta ended it, counting from 1


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
    prompt: str | None  # the last user message's text
    model: str | None  # as the stream reported it
    answer: str | None
    input_tokens: int | None
    output_tokens: int | None
    finish: str | None
    tool_calls: list[ShownCall]
    ttfb_ms: float | None
    duration_ms: float | None
    events: list[StreamEvent]
    findings: list[SavedFinding]

    @property
    def protocol_title(self) -> str:
        return TITLES.get(self.protocol, self.protocol)

    @property
    def finished_badly(self) -> bool:
        return self.finish in CUT_SHORT

    @property
    def deltas(self) -> list[StreamEvent]:
        return [e for e in self.events if e.category == "delta"]

    @property
    def first_token(self) -> StreamEvent | None:
        """The first event that added text: when the first token reached the client."""
        return next(iter(self.deltas), None)

    @property
    def end_ms(self) -> float:
        return max([self.duration_ms or 0.0, *(e.at_ms for e in self.events)])

    @property
    def gaps(self) -> list[Gap]:
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


def load_stream(path: str | Path, exchange_id: int) -> StreamPage | None:
    """The stream's page data, or None when the log has no such OpenAI or Anthropic exchange."""
    with EventLog(path) as log:
        rows = list(log.db.query("SELECT * FROM exchanges WHERE id = ?", [exchange_id]))
        if not rows or rows[0]["protocol"] not in LLM_PROTOCOLS:
            return None
        x = rows[0]
        events = _events(list(log.events(exchange_id)))
        body = parse_json(x["request_body"])
        body = body if isinstance(body, dict) else {}
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
            prompt=_prompt(body),
            model=x["model"],
            answer=x["answer"],
            input_tokens=x["input_tokens"],
            output_tokens=x["output_tokens"],
            finish=x["finish"],
            tool_calls=_calls(x["tool_calls"]),
            ttfb_ms=None if x["ttfb_ns"] is None else x["ttfb_ns"] / 1e6,
            duration_ms=None if x["duration_ns"] is None else x["duration_ns"] / 1e6,
            events=events,
            findings=saved_findings(log, [exchange_id]),
        )


def _events(rows: list[dict[str, Any]]) -> list[StreamEvent]:
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
            )
        )
    return events


def _prompt(body: dict[str, Any]) -> str | None:
    """The text of the last user message (chat messages, Responses input, a prompt)."""
    for key in ("messages", "input", "prompt"):
        value = body.get(key)
        if isinstance(value, str):
            return value
        for message in reversed(value) if isinstance(value, list) else ():
            if isinstance(message, dict) and message.get("role") == "user":
                return _text(message.get("content"))
    return None


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    return (
        "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)) or None
    )
