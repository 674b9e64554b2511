"""What changed between two recordings of the same scenarios (``tasktape diff``).

Each exchange is read by its protocol (:mod:`tasktape.eventlog.protocols`): its reader
classifies the events and sums the response up (answer, finish, tokens); the protocol's
hooks say which text is a delta, which artifacts an event names and which ids its server
made up. Exchanges pair as :mod:`.pairing` says; each pair is compared on what a client
would notice, and times within a tolerance, since no two runs take the same time.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import groupby
from typing import Any

import orjson

from tasktape.errors import UsageError
from tasktape.eventlog.classify import Classification
from tasktape.eventlog.frames import at_log_end, protocol_of
from tasktape.eventlog.protocols.base import StreamReader
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.spans import StreamEvent, events_in
from tasktape.eventlog.uids import moment_ns

from .matching import MatchRules
from .pairing import IdMap, Run, ids_in, is_id, joined, pair, runs

SAFE_METHODS = frozenset({"GET", "HEAD"})  # HTTP's methods that only read

WRAP = 72  # a long answer is diffed in lines this wide, so a change shows where it is


class Aspect(StrEnum):
    """What of a pair can differ, in the order a pair's differences are listed."""

    STATUS = "status"  # HTTP status
    PROTOCOL = "protocol"
    OUTCOME = "outcome"  # complete, or how the response broke off
    FINISH = "finish"  # A2A's last task state; an LLM's finish reason; MCP's result or error
    KINDS = "kinds"  # the event-kind sequence, repeats collapsed
    ANSWER = "answer"
    TOOL_CALLS = "tool_calls"  # an LLM's: each tool called, with its arguments
    DELTAS = "deltas"  # the streamed texts, joined
    ARTIFACTS = "artifacts"
    USAGE = "usage"  # one field of it: tokens, credits, model
    TTFE = "ttfe"  # time to first event
    DURATION = "duration"


@dataclass(frozen=True)
class Reading:
    """One exchange as the diff compares it."""

    recorded: Recorded
    protocol: str | None
    operation: str | None
    reads: bool  # whether the request only reads: repeats of it are one run (a client polling)
    status: int | None
    outcome: str | None
    finish: str | None
    kinds: tuple[str, ...]
    answer: str
    tool_calls: tuple[str, ...]
    deltas: str
    artifacts: tuple[str, ...]
    usage: dict[str, Any]
    ttfe_ns: int | None
    duration_ns: int | None
    ids: tuple[str, ...]


def read(recorded: Recorded, resumptions: Sequence[Recorded] = ()) -> Reading:
    """An exchange as its protocol's reader and hooks read it (of no known protocol: its
    events all ``other``, no text), with the ``resumptions`` that carried the rest of its
    stream (:func:`.pairing.joined`): one answer, however many requests it took."""
    protocol = protocol_of(recorded)
    if protocol is not None:  # recognised once, not on every comparison of its request
        recorded.protocol = protocol.name
    reader = protocol.reader() if protocol is not None else StreamReader()
    keys = protocol.server_ids if protocol is not None else frozenset()
    kinds: list[str] = []
    deltas: list[str] = []
    artifacts: dict[str, None] = {}
    usage: dict[str, Any] = {}
    ids: dict[str, None] = {}
    ttfe = recorded.chunks[0][0] if recorded.chunks else None

    def take(data: str, c: Classification) -> None:
        kinds.append(c.kind)
        if protocol is not None:
            delta = protocol.delta(c)
            if delta:
                deltas.append(delta)
            artifacts.update(dict.fromkeys(protocol.artifact_names(data, c)))
        usage.update(c.usage or {})
        ids_in(data, keys, ids)

    if recorded.is_sse:
        events = _stream_events([recorded, *resumptions])
        ttfe = events[0].offset_ns if events else ttfe
        for event in events:
            if event.id is not None and is_id(event.id):
                ids[event.id] = None
            take(event.data, reader.event(event.data, event.event))
    elif recorded.chunks and not recorded.response_body_truncated:
        body = recorded.body.decode("utf-8", "replace")
        c = reader.body(body)
        if c is not None:
            take(body, c)
    summary = reader.finished()
    if not usage:  # a protocol whose events carry no usage may still sum it up
        counted = (("model", summary.model), ("input_tokens", summary.input_tokens))
        counted += (("output_tokens", summary.output_tokens),)
        usage = {k: v for k, v in counted if v is not None}
    last = resumptions[-1] if resumptions else recorded
    request = recorded.as_request()
    operation = protocol.request_info(request).rpc_method if protocol is not None else None
    reads = recorded.method in SAFE_METHODS or operation in (protocol.read_operations if protocol else ())
    return Reading(
        recorded,
        protocol.name if protocol is not None else None,
        operation,
        reads,
        recorded.status,
        last.outcome,  # how the answer's last part ended
        summary.finish,
        tuple(kinds),
        summary.answer or "",
        _calls(summary.tool_calls),
        (protocol.delta_separator if protocol is not None else "").join(deltas),
        tuple(artifacts),
        usage,
        ttfe,
        _duration(recorded, last),
        tuple(ids),
    )


def _stream_events(parts: Sequence[Recorded]) -> list[StreamEvent]:
    """The whole events of a stream and of its resumptions, each once (a resumption sends
    again what came after its Last-Event-ID: an id already read is an event sent again). A
    tail cut off mid-event says nothing but where the break came: the outcome says that."""
    seen: set[str] = set()
    events = []
    for part in parts:
        for event in events_in(part.chunks):
            if event.complete and (event.id is None or event.id not in seen):
                events.append(event)
                seen.update([event.id] if event.id is not None else [])
    return events


def _duration(first: Recorded, last: Recorded) -> int | None:
    """From the first request's start to the end of the last part of its answer; its own
    duration when that is all there is, or the recordings do not say when each began."""
    if last is first or not (first.started_at and last.started_at) or last.duration_ns is None:
        return first.duration_ns
    return moment_ns(last.started_at) - moment_ns(first.started_at) + last.duration_ns


def _calls(tool_calls: str | None) -> tuple[str, ...]:
    """Each call as ``name(arguments)``: its id is the server's, made up on every run; its
    arguments compact when they are JSON (how a model spaces them says nothing)."""
    shown = []
    for call in orjson.loads(tool_calls) if tool_calls else ():
        arguments = call["arguments"]
        with contextlib.suppress(ValueError, RecursionError):  # (json: big integers stay exact)
            arguments = json.dumps(json.loads(arguments), separators=(",", ":"), ensure_ascii=False)
        shown.append(f"{call['name']}({arguments})")
    return tuple(shown)


@dataclass(frozen=True)
class Tolerance:
    """How far a time may move before it differs: by more than ``percent`` of A's time
    and by more than ``ms``."""

    percent: float = 50.0
    ms: float = 10.0

    def within(self, a_ns: int | None, b_ns: int | None) -> bool:
        if a_ns is None or b_ns is None:
            return a_ns == b_ns
        change = abs(b_ns - a_ns)
        return change <= self.ms * 1e6 or change <= a_ns * self.percent / 100

    @classmethod
    def parse(cls, values: Iterable[str]) -> Tolerance:
        """``20%`` sets the percentage, ``50ms`` or ``0.5s`` the duration; the last of each wins."""
        tolerance = cls()
        for value in values:
            m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(%|ms|s)\s*", value)
            if m is None:
                raise UsageError(f"{value!r} is neither a percentage (20%) nor a duration (50ms, 0.5s)")
            number, unit = float(m[1]), m[2]
            if unit == "%":
                tolerance = cls(number, tolerance.ms)
            else:
                tolerance = cls(tolerance.percent, number * 1000 if unit == "s" else number)
        return tolerance


@dataclass(frozen=True)
class Difference:
    aspect: Aspect
    a: Any
    b: Any
    field: str | None = None  # the usage field
    diff: tuple[str, ...] = ()  # a unified diff of the two texts


@dataclass(frozen=True)
class Pair:
    a: Run
    b: Run
    differences: list[Difference]


@dataclass(frozen=True)
class Report:
    pairs: list[Pair]
    only_a: list[Run]
    only_b: list[Run]

    @property
    def differs(self) -> bool:
        return bool(self.only_a or self.only_b or any(p.differences for p in self.pairs))


def diff_recordings(
    a: Sequence[Recorded], b: Sequence[Recorded], tolerance: Tolerance, rules: MatchRules
) -> Report:
    """The pairs of two recordings with their differences, and what is in one alone. An
    exchange a log holds no end of (its recorder still writing it) is cut short where the
    log stops, as check and export read it: a log and its export do not differ."""
    for side in (a, b):
        at_log_end(side)
    a_runs, b_runs = (
        runs((read(first, rest) for first, *rest in joined(in_time_order(side))), rules) for side in (a, b)
    )
    pairing = pair(a_runs, b_runs, rules)
    pairs = [Pair(x, y, compare(x.last, y.last, pairing.ids, tolerance)) for x, y in pairing.pairs]
    return Report(pairs, pairing.only_a, pairing.only_b)


def in_time_order(recorded: Sequence[Recorded]) -> list[Recorded]:
    """The exchanges in the order they started, when each says when (those started at once
    in the recording's order): a log merged from several recorders numbers its exchanges
    recorder by recorder, and a follow-up is read with the ids of what it follows only
    once that has paired."""
    starts = [moment_ns(r.started_at) if r.started_at else None for r in recorded]
    if None in starts:
        return list(recorded)
    return [r for _, r in sorted(zip(starts, recorded, strict=True), key=lambda each: each[0] or 0)]


def kind_runs(kinds: Sequence[str]) -> list[tuple[str, int]]:
    """Consecutive repeats of a kind as one (kind, count)."""
    return [(kind, len(list(group))) for kind, group in groupby(kinds)]


def compare(a: Reading, b: Reading, ids: IdMap, tolerance: Tolerance) -> list[Difference]:
    """How B's answer differs from A's, A's ids read as B's."""
    found = [
        Difference(aspect, x, y)
        for aspect, x, y in (
            (Aspect.STATUS, a.status, b.status),
            (Aspect.PROTOCOL, a.protocol, b.protocol),
            (Aspect.OUTCOME, a.outcome, b.outcome),
            (Aspect.FINISH, a.finish, b.finish),
        )
        if x != y
    ]
    # How many deltas carried the answer is the stream's business: the sequence is
    # compared with repeats collapsed, and the texts below say whether the answer changed.
    a_kinds, b_kinds = kind_runs(a.kinds), kind_runs(b.kinds)
    if [k for k, _ in a_kinds] != [k for k, _ in b_kinds]:
        found.append(Difference(Aspect.KINDS, a_kinds, b_kinds))
    answer, deltas = ids.translate(a.answer), ids.translate(a.deltas)
    if answer != b.answer:
        found.append(Difference(Aspect.ANSWER, answer, b.answer, diff=text_diff(answer, b.answer)))
    calls = tuple(map(ids.translate, a.tool_calls))
    if calls != b.tool_calls:
        found.append(Difference(Aspect.TOOL_CALLS, list(calls), list(b.tool_calls)))
    # Deltas that join into the answer on both sides would only repeat its diff.
    if deltas != b.deltas and not (deltas == answer and b.deltas == b.answer):
        found.append(Difference(Aspect.DELTAS, deltas, b.deltas, diff=text_diff(deltas, b.deltas)))
    artifacts = tuple(map(ids.translate, a.artifacts))
    if artifacts != b.artifacts:
        found.append(Difference(Aspect.ARTIFACTS, list(artifacts), list(b.artifacts)))
    for key in dict.fromkeys([*a.usage, *b.usage]):
        if a.usage.get(key) != b.usage.get(key):
            found.append(Difference(Aspect.USAGE, a.usage.get(key), b.usage.get(key), field=key))
    times = ((Aspect.TTFE, a.ttfe_ns, b.ttfe_ns), (Aspect.DURATION, a.duration_ns, b.duration_ns))
    found += [Difference(aspect, x, y) for aspect, x, y in times if not tolerance.within(x, y)]
    return found


def text_diff(a: str, b: str) -> tuple[str, ...]:
    """A unified diff of two texts, long lines wrapped first; wrapped the same way, two
    texts that differ only in where their lines break are diffed as they are."""
    for split in (_wrapped, _lines):
        lines = tuple(difflib.unified_diff(split(a), split(b), "A", "B", n=1, lineterm=""))
        if lines:
            return lines
    return ()


def _lines(text: str) -> list[str]:
    return text.split("\n") if text else []


def _wrapped(text: str) -> list[str]:
    """Each line cut between words into pieces at most WRAP wide, every character kept."""
    out = []
    for line in _lines(text):
        piece = ""
        for word in re.findall(r"\S+\s*|\s+", line) or [""]:
            if piece and len(piece) + len(word) > WRAP:
                out.append(piece)
                piece = ""
            piece += word
        out.append(piece)
    return out
