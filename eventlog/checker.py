"""The lifecycle checker's public API: check recorded streams, get findings, save them.

Each protocol's rules run on that protocol's exchanges only (A2A's in
:mod:`tasktape.eventlog.rules`, the others' in their protocol modules)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from contextlib import closing
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from tasktape.choices import listed
from tasktape.errors import UsageError

from .frames import Problem, Rule, SseEvent, Stream, at_log_end, streams_of
from .listed import listed_ids
from .protocols import ProtocolName, by_name
from .protocols import protocols as known_protocols
from .reader import EventLog
from .recorded import Recorded, from_log
from .resumes import ResumeOutcome
from .schema import open_db

CUT_SHORT_RULE = "cut-short"  # a note, not a rule: the stream broke off, so how it ends is unknown


@dataclass(frozen=True)
class Finding:
    """One broken rule, and where."""

    rule: str
    task_id: str | None
    exchange: str  # where: the log exchange id as text, or the cassette "file:line" (Recorded.origin)
    exchange_id: int | None  # the log's exchanges.id when the source is a log, else None
    seq: int | None  # the event's seq within its exchange (as the events table numbers it)
    message: str


@dataclass(frozen=True)
class Report:
    """What a check found, and what it looked at."""

    findings: list[Finding]
    cut_short: list[Finding]  # streams that broke off (rule "cut-short"): noted, not broken rules
    streams: int  # SSE exchanges checked
    exchanges: int  # exchanges of known protocols checked, streams included
    tasks: int  # A2A tasks
    by_protocol: dict[str, int] = field(default_factory=dict)  # exchanges checked, per protocol
    # Reconnects a resume gateway answered from a stream it held, not checked on their own:
    # each is a slice of that stream, whose own exchange holds every event.
    reconnects: int = 0
    # The log's exchanges this report speaks for: saving it replaces their findings, and no
    # others' (a check of one protocol leaves the others' findings as they were).
    exchange_ids: tuple[int, ...] = ()


def all_rules() -> dict[str, Rule]:
    """Every protocol's rules by name, protocol after protocol."""
    return {name: rule for p in known_protocols() for name, rule in p.rules.items()}


def explain(name: str) -> str:
    """A rule's one-line explanation (its docstring)."""
    return (all_rules()[name].__doc__ or "").strip()


def protocol_names() -> list[str]:
    return [p.name for p in known_protocols()]


def check_recorded(recorded: Iterable[Recorded], protocols: Collection[str] | None = None) -> list[Finding]:
    """Findings about these exchanges, checked in order (a task's state carries across them)."""
    return report_recorded(recorded, protocols).findings


def check_log(
    log: EventLog, exchange_ids: Iterable[int] | None = None, protocols: Collection[str] | None = None
) -> list[Finding]:
    """Findings about a log's exchanges: all of them, or those ids."""
    return report_log(log, exchange_ids, protocols).findings


def report_recorded(recorded: Iterable[Recorded], protocols: Collection[str] | None = None) -> Report:
    """The full report on these exchanges (their place is ``Recorded.origin``); with
    ``protocols``, on the exchanges of those protocols only."""
    recorded = _recorded_list(recorded)
    checked = [r for r in recorded if r.reconnect_of is None]  # (as report_log leaves them)
    report = _report(streams_of([(r, r.origin, None) for r in checked], _only(protocols)))
    return replace(report, reconnects=len(recorded) - len(checked))


def report_log(
    log: EventLog, exchange_ids: Iterable[int] | None = None, protocols: Collection[str] | None = None
) -> Report:
    """The full report on a log's exchanges: all of them, or those ids."""
    given = _check_log_given(log, exchange_ids)
    ids = [x["id"] for x in log.exchanges()] if given is None else sorted(set(given))
    reconnects = log.reconnects_answered()
    checked = [i for i in ids if i not in reconnects]
    held = {i: events for i in checked if (events := _held_events(log, i)) is not None}
    # (A stream of 100,000 events takes most of a second to read again.)
    recorded = from_log(log, checked, unread=held.keys())
    at_log_end(recorded)
    items = [(r, str(i), i) for r, i in zip(recorded, checked, strict=True)]
    streams = streams_of(items, _only(protocols), held)
    # Every exchange when all protocols are checked (one of a protocol no longer known
    # loses its findings too); else those of the protocols checked.
    spoken_for = ids if protocols is None else [s.exchange_id for s in streams if s.exchange_id is not None]
    report = _report(streams, log.rejoins())
    return replace(report, reconnects=len(ids) - len(checked), exchange_ids=tuple(spoken_for))


def _recorded_list(recorded: Iterable[Recorded]) -> list[Recorded]:
    """``recorded`` as a list of ``Recorded``: one alone, or anything else, is a usage
    error saying what to pass (it was a TypeError, or an AttributeError on a str's letters)."""
    if isinstance(recorded, Recorded):
        raise UsageError("the exchanges to check are a list of Recorded, not one alone: write [recorded]")
    if not isinstance(recorded, Iterable):
        raise UsageError(f"the exchanges to check are a list of Recorded, not {type(recorded).__name__}")
    recorded = list(recorded)
    other = next((r for r in recorded if not isinstance(r, Recorded)), None)
    if other is not None:
        raise UsageError(
            f"the exchanges to check are Recorded (read_log, read_cassette, load), not {type(other).__name__}"
        )
    _check_shapes(recorded)
    return recorded


def _check_shapes(recorded: list[Recorded]) -> None:
    """Refuse a ``Recorded`` changed since it was made (a chunk of text appended, a header
    value an int): checked, it failed far inside naming no exchange, or was taken."""
    for n, r in enumerate(recorded, 1):
        problem = r.misshapen()
        if problem is not None:
            raise UsageError(f"exchange {n} to check ({r.origin or r.request_line}): {problem}")


def _check_log_given(log: EventLog, exchange_ids: Iterable[int] | None) -> list[int] | None:
    """The exchange ids given, as a list (None: all). A path where the ``EventLog`` goes,
    or ids in another shape than a list (one id, a string), is a usage error saying what
    to pass."""
    if isinstance(log, str | Path):
        raise UsageError(f"the log to check is an EventLog, not a path: write EventLog({str(log)!r})")
    if not isinstance(log, EventLog):
        raise UsageError(f"the log to check is an EventLog, not {type(log).__name__}")
    return None if exchange_ids is None else listed_ids(exchange_ids, "exchange_ids")


def _held_events(log: EventLog, exchange_id: int) -> list[SseEvent] | None:
    """The events of a stream that the log's events table holds as its chunks would
    decode to, else None: a stream without event rows is read from its chunks (a body the
    writer could not decode is kept whole, without events), and so is one ending in a
    cut-off event (redacted, it was written back as a whole one)."""
    rows = log.finished_stream_events(exchange_id)
    if not rows or not rows[-1][3]:
        return None
    return [
        SseEvent(seq, ident, data, bool(complete), at, kind) for seq, ident, data, complete, at, kind in rows
    ]


def _only(names: Collection[str] | None) -> set[str] | None:
    if names is None:
        return None
    names = listed(names, "protocols")
    unknown = sorted(set(names) - set(protocol_names()))
    if unknown:
        raise UsageError(f"unknown protocol {', '.join(unknown)}: known are {', '.join(protocol_names())}")
    return set(names)


def save_findings(
    db_path: str | Path, findings: Iterable[Finding], *, exchange_ids: Iterable[int] | None = None
) -> int:
    """Write findings into the log's ``findings`` table, replacing the earlier findings of
    the exchanges checked: ``exchange_ids`` (pass them so a now clean exchange loses its
    old findings), else those the findings name. Returns how many were written."""
    findings = list(findings)
    if any(f.exchange_id is None for f in findings):
        raise UsageError("only findings about a log's exchanges can be saved into it")
    checked = {f.exchange_id for f in findings} if exchange_ids is None else set(exchange_ids)
    checked_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with closing(open_db(db_path)) as db:
        db.execute("BEGIN IMMEDIATE")  # a recorder may be writing too: take the lock first
        try:
            marks = ",".join("?" * len(checked))
            db.execute(f"DELETE FROM findings WHERE exchange_id IN ({marks})", sorted(checked))
            db.conn.executemany(
                "INSERT INTO findings (checked_at, rule, task_id, exchange_id, seq, message)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(checked_at, f.rule, f.task_id, f.exchange_id, f.seq, f.message) for f in findings],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return len(findings)


def _report(streams: list[Stream], rejoins: Mapping[int, tuple[ResumeOutcome, int]] | None = None) -> Report:
    """The report on these streams; ``rejoins``: the streams a resume gateway followed
    again after they broke (``EventLog.rejoins``), whose cut-short notes say so."""
    found: list[tuple[int, int, int, Finding]] = []
    order = 0
    by_protocol: dict[str, int] = {}
    for protocol in known_protocols():
        own = [s for s in streams if s.protocol == protocol.name]
        if own:
            by_protocol[protocol.name] = len(own)
        for name, rule in protocol.rules.items():
            order += 1
            for problem in rule(own) if own else ():
                seq = problem.frame.seq if problem.frame else None
                found.append(
                    (problem.stream.index, -1 if seq is None else seq, order, _finding(name, problem))
                )
    found.sort(key=lambda item: item[:3])
    tasks = {f.task_id for s in streams if s.protocol == ProtocolName.A2A for f in s.frames if f.task_id}
    return Report(
        [f for *_, f in found],
        [
            _cut_short(s, streams, (rejoins or {}).get(s.exchange_id or -1))
            for s in streams
            if s.is_sse and not s.complete and not _ended(s)
        ],
        sum(s.is_sse for s in streams),
        len(streams),
        len(tasks),
        by_protocol,
    )


def _finding(rule: str, problem: Problem) -> Finding:
    stream, frame = problem.stream, problem.frame
    task_id = frame.task_id if frame else stream.task_id
    return Finding(
        rule, task_id, stream.where, stream.exchange_id, frame.seq if frame else None, problem.message
    )


def _cut_short(stream: Stream, streams: list[Stream], rejoin: tuple[ResumeOutcome, int] | None) -> Finding:
    """The note on a stream that broke off: where, and how it ends, when a resume gateway
    followed it again (``rejoin``: how, and by which exchange)."""
    last = _state_note(stream)
    last = f", {last}" if last else ""
    why = f": {stream.error}" if stream.error else ""
    done = sum(f.complete for f in stream.frames)
    message = f"broke off after {done} complete events{last} ({stream.outcome}{why})"
    message += "; how it ends is unknown" if rejoin is None else f"; {_followed_again(*rejoin, streams)}"
    seq = stream.frames[-1].seq if stream.frames else None
    return Finding(CUT_SHORT_RULE, stream.task_id, stream.where, stream.exchange_id, seq, message)


def _ended(stream: Stream) -> bool:
    """Whether a stream that broke off had carried all it owed first, as its protocol
    says (an MCP stream that carried its response)."""
    protocol = by_name(stream.protocol)
    return protocol is not None and protocol.ended(stream)


def _state_note(stream: Stream) -> str | None:
    """Where a stream (or an answer) last stood, in its protocol's words (``the task last
    WORKING``, ``last stop reason tool_use``)."""
    protocol = by_name(stream.protocol)
    return protocol.state_note(stream) if protocol is not None else None


def _followed_again(outcome: ResumeOutcome, by: int, streams: list[Stream]) -> str:
    """How a stream a resume gateway followed again went on: by which exchange, and where
    it last stood there (that exchange's own note says if it broke off too)."""
    how = "caught up from" if outcome is ResumeOutcome.CAUGHT_UP else "rejoined by"
    gap = ", with a gap" if outcome is ResumeOutcome.GAP else ""
    carried = next((s for s in streams if s.exchange_id == by), None)
    state = None if carried is None else _state_note(carried)
    there = f", {state} there" if state else ""
    return f"{how} exchange {by}{gap}{there}"
