"""Which exchanges of recording A answer to which of recording B, for ``tasktape diff``.

Exchanges pair by their request as replay matching sees it (:mod:`.matching`), in A's
recorded order, each with the first unpaired match in B. Repeated identical requests (a
client polling) are one run, however many times each recording asked. Ids the server
makes up differ from run to run, so they pair by position: the n-th new id in the
responses of a pair in A is the n-th in B's, and A's requests are read with B's ids
before they are matched (a ``GET /tasks/{id}``, a follow-up message's ``taskId``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tasktape.eventlog.classify import load_json
from tasktape.eventlog.frames import protocol_of
from tasktape.eventlog.protocols import Request, by_name
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.spans import events_in

from .matching import Incoming, MatchRules, match_key, mismatches

if TYPE_CHECKING:
    from .diff import Reading

# Shorter values, and numbers, are counters and words (an SSE id "3", a skill id) more
# often than made-up ids: mapping them would rewrite unrelated text.
MIN_ID_LENGTH = 8
# What an id looks like inside a path, a body or a text: word characters and dashes,
# joined by single dots (task.0192f4c8-..., a UUID, chatcmpl-...), not a sentence's end.
_TOKEN = re.compile(r"[\w-]+(?:\.[\w-]+)*")


def is_id(value: str) -> bool:
    return len(value) >= MIN_ID_LENGTH and not value.isdigit()


def ids_in(data: str, keys: frozenset[str], into: dict[str, None]) -> None:
    """Add to ``into`` the ids a JSON text names under ``keys`` (each object's own before
    those nested in it: the same order for the same shape)."""
    if not keys or not data:
        return
    try:
        obj = load_json(data)
    except (ValueError, RecursionError):
        return
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if key in keys and isinstance(item, str) and is_id(item):
                    into[item] = None
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            stack.extend(reversed(value))


@dataclass
class Run:
    """One exchange, or consecutive identical requests: compared by the last answer."""

    members: list[Reading]

    @property
    def first(self) -> Reading:
        return self.members[0]

    @property
    def last(self) -> Reading:
        return self.members[-1]

    @property
    def ids(self) -> list[str]:
        return list(dict.fromkeys(i for m in self.members for i in m.ids))


@dataclass
class IdMap:
    """A's ids to B's, learned pair by pair; one-to-one."""

    to_b: dict[str, str] = field(default_factory=dict)
    _taken: set[str] = field(default_factory=set)

    def learn(self, a_ids: Iterable[str], b_ids: Iterable[str]) -> None:
        for a, b in zip(a_ids, b_ids, strict=False):
            if a not in self.to_b and b not in self._taken:
                self.to_b[a] = b
                self._taken.add(b)

    def translate(self, text: str) -> str:
        """``text`` with A's ids written as B's."""
        if not self.to_b:
            return text
        return _TOKEN.sub(lambda m: self.to_b.get(m[0], m[0]), text)

    def request(self, recorded: Recorded) -> Recorded:
        """A's request as it reads with B's ids."""
        body = recorded.request_body
        with contextlib.suppress(UnicodeDecodeError):  # a body that is not text keeps its bytes
            body = body and self.translate(body.decode("utf-8")).encode("utf-8")
        query = None if recorded.query is None else self.translate(recorded.query)
        return replace(recorded, path=self.translate(recorded.path), query=query, request_body=body)


def _incoming(recorded: Recorded) -> Incoming:
    """A recorded request as matching takes one: with its headers (a multipart body is
    read at the boundary its own Content-Type names)."""
    return Incoming(
        recorded.method, recorded.path, recorded.query, recorded.request_body, list(recorded.request_headers)
    )


def same_request(a: Recorded, b: Recorded, rules: MatchRules) -> bool:
    """Whether the two requests match, either way round: a value redacted in either
    recording matches any."""
    return not mismatches(_incoming(a), b, rules) or not mismatches(_incoming(b), a, rules)


def joined(recorded: Sequence[Recorded]) -> list[list[Recorded]]:
    """The exchanges, each stream with the resumptions that continue it (in order): a
    request carrying the Last-Event-ID of an event the stream (or a resumption of it) sent,
    that the stream's protocol lets continue it (MCP: a GET after a tool call's POST
    stream the server closed), carries the rest of that stream's answer."""
    if not any(r.as_request().header("Last-Event-ID") for r in recorded):
        return [[r] for r in recorded]
    groups: list[list[Recorded]] = []
    sent_by: dict[str, list[Recorded]] = {}  # an event id: the group whose stream sent it
    for r in recorded:
        request = r.as_request()
        group = sent_by.get(request.header("Last-Event-ID") or "")
        if group is not None and _continues(request, group[0]):
            group.append(r)
        else:
            group = [r]
            groups.append(group)
        if r.is_sse:
            sent_by.update((e.id, group) for e in events_in(r.chunks) if e.id)
    return groups


def _continues(resuming: Request, stream: Recorded) -> bool:
    protocol = protocol_of(stream)
    return protocol is not None and protocol.resumable(resuming, stream.as_request())


def runs(readings: Iterable[Reading], rules: MatchRules) -> list[Run]:
    """The exchanges in runs: a request that only reads joins the run of the last exchange
    with the same method, path and operation when it is identical to it (the exchanges of
    other requests in between, as concurrent clients interleave them, do not break a
    run). A request that makes something (a message, a tool call) is a run of its own,
    however often it was sent: each answer counts. So is a stream taken up again after
    another event (its Last-Event-ID) that is not joined to it (:func:`joined`): MCP's GET
    stream and its resumption are two."""
    found: list[Run] = []
    last: dict[tuple[str, str | None, str, str | None], Run] = {}
    for reading in readings:
        r = reading.recorded
        key = (r.method, r.as_request().header("Last-Event-ID"), r.path, reading.operation)
        run = last.get(key)
        if run is not None and reading.reads and same_request(r, run.last.recorded, rules):
            run.members.append(reading)
            continue
        last[key] = run = Run([reading])
        found.append(run)
    return found


@dataclass
class Pairing:
    pairs: list[tuple[Run, Run]]
    only_a: list[Run]
    only_b: list[Run]
    ids: IdMap


def pair(a: list[Run], b: list[Run], rules: MatchRules) -> Pairing:
    """Each run of A with the first unpaired run of B whose request matches its own."""
    ids = IdMap()
    free = _Candidates(b, {run.first.protocol for run in (*a, *b)}, rules)
    pairs: list[tuple[Run, Run]] = []
    only_a: list[Run] = []
    for run in a:
        request = ids.request(run.first.recorded)
        match = free.take(request, run.first.operation, run.first.protocol)
        if match is None:
            only_a.append(run)
            continue
        pairs.append((run, match))
        ids.learn(run.ids, match.ids)
    paired = {id(b_run) for _, b_run in pairs}
    return Pairing(pairs, only_a, [run for run in b if id(run) not in paired], ids)


class _Candidates:
    """B's unpaired runs, found by the keys of their requests (:func:`match_key`) rather
    than compared one by one: recordings of hundreds of exchanges that do not pair (a
    prompt changed) would take minutes. A request is compared with those sharing a key,
    and with those that have none (a redacted value, which matches any)."""

    def __init__(self, b: list[Run], protocols: set[str | None], rules: MatchRules) -> None:
        self._rules = rules
        self._protocols = {name: by_name(name) if name else None for name in protocols}
        self._order = {id(run): n for n, run in enumerate(b)}
        self._paired: set[int] = set()
        # Only a request of the same method, path and operation can match.
        self._keyed: dict[tuple[Any, ...], list[Run]] = {}
        self._unkeyed: dict[tuple[str, str, str | None], list[Run]] = {}
        self._all: dict[tuple[str, str, str | None], list[Run]] = {}
        for run in b:
            r = run.first.recorded
            where = (r.method, r.path, run.first.operation)
            self._all.setdefault(where, []).append(run)
            for name, protocol in self._protocols.items():
                key = match_key(_incoming(r), protocol, rules)
                if key is None:
                    self._unkeyed.setdefault(where, []).append(run)
                    break
                self._keyed.setdefault((*where, name, key), []).append(run)

    def take(self, request: Recorded, operation: str | None, protocol: str | None) -> Run | None:
        """The first unpaired run whose request matches ``request``: compared either way
        round (:func:`same_request`), so under its protocol or the run's."""
        where = (request.method, request.path, operation)
        found: list[Run] = list(self._unkeyed.get(where, ()))
        for name, each in self._protocols.items():
            key = match_key(_incoming(request), each, self._rules)
            if key is None:  # compared with every run there
                found = self._all.get(where, [])
                break
            found += (
                run
                for run in self._keyed.get((*where, name, key), ())
                if name in (protocol, run.first.protocol)
            )
        for run in sorted({id(r): r for r in found}.values(), key=lambda r: self._order[id(r)]):
            if id(run) not in self._paired and same_request(request, run.first.recorded, self._rules):
                self._paired.add(id(run))
                return run
        return None
