"""The data of the per-task page: one task's whole run, read back from the log.

Times are milliseconds since the task's first request arrived, so every exchange of
the task (a stream, a resubscribe, a cancel, polling) sits on one axis.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasktape.errors import FrameError
from tasktape.eventlog import EventLog, parse_stream_response
from tasktape.eventlog.models import Artifact as ArtifactModel
from tasktape.eventlog.models import JsonRpcResponse, Task, TaskStatus
from tasktape.eventlog.resumes import ResumeSide

from .display import ms_or_none, one_moment, parse_json

if TYPE_CHECKING:
    from tasktape.eventlog.checker import Finding

_MARKER = re.compile(r"\[\d+\]")  # an inline citation marker already in the text
_SENDS = ("SendMessage", "SendStreamingMessage")
# The task's events in time order, with what its streams carried that names no task: a
# frame cut off by a dropped connection, a frame that is not JSON. (CROSS JOIN keeps
# SQLite from scanning every task-less event of the log for the second part.)
# Only the columns the page reads (the data of the events that carry a state): a task of
# 100,000 events would read every one's data and usage for nothing.
_COLUMNS = """e.exchange_id, e.seq, e.kind, e.state, e.artifact_id, e.artifact_type, e.append,
e.last_chunk, e.text, e.event_id, e.complete, e.parse_error, e.task_id,
CASE WHEN e.state IS NOT NULL THEN e.data END AS data, x.started_ns + e.offset_ns AS at_ns"""
_EVENTS = f"""
SELECT {_COLUMNS}
FROM events e JOIN exchanges x ON x.id = e.exchange_id WHERE e.task_id = :t
UNION ALL
SELECT {_COLUMNS}
FROM exchanges x CROSS JOIN events e ON e.exchange_id = x.id WHERE x.task_id = :t AND e.task_id IS NULL
ORDER BY at_ns, exchange_id, seq
"""


@dataclass
class Exchange:
    """One HTTP exchange of the task."""

    id: int
    method: str
    path: str
    rpc_method: str | None
    binding: str | None
    status: int | None
    is_sse: bool
    outcome: str | None
    error: str | None
    start_ms: float
    ttfb_ms: float | None
    end_ms: float | None
    events: int = 0
    asked: str | None = None  # the text of the message it sent

    @property
    def label(self) -> str:
        return self.rpc_method or f"{self.method} {self.path}"

    @property
    def open(self) -> bool:
        """Whether the log holds no end of it yet: its recorder is still writing it (or
        was killed)."""
        return self.outcome is None


@dataclass
class Event:
    """One SSE event of the task, placed on the task's time axis."""

    exchange_id: int
    seq: int
    at_ms: float
    gap_ms: float | None  # since the task's previous event
    kind: str
    state: str | None
    artifact_id: str | None
    artifact_type: str | None
    append: bool
    last_chunk: bool
    text: str | None
    event_id: str | None
    complete: bool
    parse_error: str | None
    repeated: bool = False  # sent again with an SSE id already seen (a resubscribe overlap)
    task_id: str | None = None  # None: a frame of the task's stream that names no task

    @property
    def category(self) -> str:
        """What it is, for colour: state, thinking, answer, message, error or other."""
        if not self.complete or self.parse_error or self.kind == "error":
            return "error"
        if self.state is not None:
            return "state"
        if self.kind == "artifactUpdate":
            return "thinking" if self.artifact_type == "intermediate-thinking" else "answer"
        return "message" if self.kind == "message" else "other"


@dataclass
class StateChange:
    state: str
    at_ms: float
    exchange_id: int
    seq: int | None  # None: seen in a response body (SendMessage, GetTask), not a stream
    message: str | None  # the status message, when the agent said why


@dataclass
class Citation:
    number: int
    offset: int
    locator: str | None
    data_part_id: str | None
    source: str | None  # the cited data part, as indented JSON, when the artifact has it


@dataclass
class Artifact:
    artifact_id: str
    name: str | None
    type: str | None
    text: str
    closed: bool  # a lastChunk event closed it
    events: int  # the updates of it streamed
    citations: list[Citation] = field(default_factory=list)
    # The exchange whose response held it whole, in a task object (a GetTask's, a
    # SendMessage's not streamed): its text is that one's.
    answered_in: int | None = None
    streaming: bool = False  # not closed yet, on a stream the log holds no end of yet

    @property
    def thinking(self) -> bool:
        return self.type == "intermediate-thinking"

    def segments(self, limit: int | None = None) -> list[tuple[str, Citation | None]]:
        """The text (its first ``limit`` characters) cut at each citation: (text, None) runs
        and (marker, citation) marks."""
        text = self.text if limit is None else self.text[:limit]
        cut = len(text) < len(self.text)
        out: list[tuple[str, Citation | None]] = []
        pos = 0
        for cite in sorted(self.citations, key=lambda c: c.offset):
            if cut and cite.offset > len(text):
                break  # in the part not shown
            at = min(max(cite.offset, pos), len(text))
            if at > pos:
                out.append((text[pos:at], None))
            marker = _MARKER.match(text, at)
            out.append((f"[{cite.number}]", cite))
            pos = marker.end() if marker else at
        if pos < len(text):
            out.append((text[pos:], None))
        return out


@dataclass
class Reconnect:
    """A row of ``resumes`` about one of the task's exchanges: a side of a stream that
    reconnected, and how it went (``side`` and ``outcome`` as ResumeSide and ResumeOutcome
    spell them)."""

    id: int
    exchange_id: int  # the stream resumed
    at: str
    at_ms: float
    side: str
    last_event_id: str | None
    events_from_log: int | None
    new_exchange_id: int | None
    outcome: str
    attempts: int | None
    synthesized: list[str]
    error: str | None

    @property
    def client(self) -> bool:
        return self.side == ResumeSide.CLIENT

    @property
    def css_class(self) -> str:
        """``tt-side-client tt-rc-gave-up``: the side and the outcome, for the stylesheet."""
        return f"tt-side-{self.side} tt-rc-{self.outcome.replace('_', '-')}"


@dataclass
class TaskPage:
    task_id: str
    context_id: str | None
    exchanges: list[Exchange]
    events: list[Event]
    states: list[StateChange]
    artifacts: list[Artifact]
    usage: dict[str, Any] | None
    findings: list[Finding]
    checker_error: str | None
    reconnects: list[Reconnect] = field(default_factory=list)
    # As task_summary has them: the events that name the task, and its first request to
    # the last time it was seen (None when it was never seen in an event or an answer).
    recorded_events: int = 0
    seen_ms: float | None = None
    unnamed_events: int = 0  # drawn, but they name no task: a cut-off frame, one not JSON

    @property
    def events_drawn_once(self) -> int:
        """Events task_summary counts that the page draws once: a reconnect's slice of a
        stream whose own exchange holds them."""
        return self.recorded_events - (len(self.events) - self.unnamed_events)

    @property
    def final_state(self) -> str | None:
        return self.states[-1].state if self.states else None

    @property
    def ttfe_ms(self) -> float | None:
        return self.events[0].at_ms if self.events else None

    @property
    def open_exchanges(self) -> list[Exchange]:
        """Its exchanges the log holds no end of yet."""
        return [x for x in self.exchanges if x.open]

    @property
    def duration_ms(self) -> float:
        """Its first request to the end of its last exchange: the span of the time axis
        (while an exchange is open, to the last moment the log holds of it)."""
        ends = [x.end_ms for x in self.exchanges if x.end_ms is not None]
        ends += [e.at_ms for e in self.events] + [r.at_ms for r in self.reconnects]
        return max(ends, default=0.0)

    @property
    def first_delta(self) -> Event | None:
        """The first artifact update: when the model's first token reached the client."""
        return next((e for e in self.events if e.kind == "artifactUpdate"), None)

    @property
    def artifact_updates(self) -> int:
        return sum(1 for e in self.events if e.kind == "artifactUpdate")

    @property
    def longest_gap(self) -> Event | None:
        gapped = [e for e in self.events if e.gap_ms is not None]
        return max(gapped, key=lambda e: e.gap_ms or 0.0) if gapped else None

    @property
    def answers(self) -> list[Artifact]:
        return [a for a in self.artifacts if not a.thinking]

    @property
    def thinking(self) -> list[Artifact]:
        return [a for a in self.artifacts if a.thinking]


def load_task(path: str | Path, task_id: str) -> TaskPage | None:
    """The task's page data, or None when the log knows no such task: read as the log was
    at one moment, however a recorder writes it meanwhile."""
    # Before the moment read: findings kept for this state of the file are then never
    # older than the rows they were found in.
    file_state = _file_state(Path(path))
    with one_moment(path) as log:
        return _read_task(log, task_id, file_state)


def _read_task(log: EventLog, task_id: str, file_state: tuple[FileState, FileState]) -> TaskPage | None:
    rows = log.db.query(
        "SELECT * FROM exchanges WHERE task_id = :t OR id IN "
        "(SELECT exchange_id FROM events WHERE task_id = :t) ORDER BY started_ns, id",
        {"t": task_id},
    )
    xrows = list(rows)
    if not xrows:
        return None
    origin = min(x["started_ns"] for x in xrows)
    exchanges = [_exchange(x, origin) for x in xrows]
    erows = list(log.db.query(_EVENTS, {"t": task_id}))
    every = _events(erows, origin)
    counts = Counter(e.exchange_id for e in every)
    for x in exchanges:
        x.events = counts[x.id]
    # A reconnect the resume gateway answered holds a slice of a stream it held, whose
    # own exchange holds every event: the task's events are counted and drawn once.
    answered = log.reconnects_answered()
    events = [e for e in every if e.exchange_id not in answered]
    snapshots = _snapshots(xrows, origin)
    findings, checker_error = _findings(log, [x.id for x in exchanges], file_state)
    summary = _summary(log, task_id)
    artifacts = _merged(_artifacts(log, task_id), snapshots, max((e.at_ms for e in every), default=None))
    _mark_streaming(artifacts, every, {x.id for x in exchanges if x.open})
    return TaskPage(
        task_id=task_id,
        context_id=next((x["context_id"] for x in xrows if x["context_id"]), None),
        exchanges=exchanges,
        events=events,
        states=_states(_state_frames(erows), events, snapshots),
        artifacts=artifacts,
        usage=_usage(log, task_id, snapshots),
        findings=findings,
        checker_error=checker_error,
        reconnects=_reconnects(log, [x.id for x in exchanges], origin),
        recorded_events=summary["events"] if summary else 0,
        seen_ms=summary["duration_ms"] if summary else None,
        unnamed_events=sum(1 for e in events if e.task_id is None),
    )


def _mark_streaming(artifacts: list[Artifact], events: list[Event], open_ids: set[int]) -> None:
    """Mark the artifacts not closed whose updates came on a stream still open: their
    lastChunk may yet come."""
    open_artifacts = {e.artifact_id for e in events if e.exchange_id in open_ids}
    for a in artifacts:
        a.streaming = not a.closed and a.answered_in is None and a.artifact_id in open_artifacts


def _summary(log: EventLog, task_id: str) -> dict[str, Any] | None:
    """The task's row of task_summary, for the figures the page shares with it."""
    rows = log.db.query("SELECT events, duration_ms FROM task_summary WHERE task_id = ?", [task_id])
    return next(iter(rows), None)


def _exchange(x: dict[str, Any], origin: int) -> Exchange:
    start = (x["started_ns"] - origin) / 1e6
    ttfb, duration = ms_or_none(x["ttfb_ns"]), ms_or_none(x["duration_ns"])
    return Exchange(
        id=x["id"],
        method=x["method"],
        path=x["path"],
        rpc_method=x["rpc_method"],
        binding=x["binding"],
        status=x["status"],
        is_sse=bool(x["is_sse"]),
        outcome=x["outcome"],
        error=x["error"],
        start_ms=start,
        ttfb_ms=ttfb,
        end_ms=None if duration is None else start + duration,
        asked=_asked(x["request_body"]) if x["rpc_method"] in _SENDS else None,
    )


def _asked(body: Any) -> str | None:
    """The text of the message a SendMessage request carried (REST or JSON-RPC)."""
    obj = parse_json(body)
    if not isinstance(obj, dict):
        return None
    params = obj.get("params") if "jsonrpc" in obj else obj
    message = params.get("message") if isinstance(params, dict) else None
    if not isinstance(message, dict):
        return None
    parts = message.get("parts") or []
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "".join(texts) or None


def _events(rows: list[dict[str, Any]], origin: int) -> list[Event]:
    events: list[Event] = []
    seen: set[str] = set()
    for r in rows:
        at = (r["at_ns"] - origin) / 1e6
        events.append(
            Event(
                exchange_id=r["exchange_id"],
                seq=r["seq"],
                at_ms=at,
                gap_ms=at - events[-1].at_ms if events else None,
                kind=r["kind"],
                state=r["state"],
                artifact_id=r["artifact_id"],
                artifact_type=r["artifact_type"],
                append=bool(r["append"]),
                last_chunk=bool(r["last_chunk"]),
                text=r["text"],
                event_id=r["event_id"],
                complete=bool(r["complete"]),
                parse_error=r["parse_error"],
                repeated=r["event_id"] is not None and r["event_id"] in seen,
                task_id=r["task_id"],
            )
        )
        if r["event_id"] is not None:
            seen.add(r["event_id"])
    return events


def _frame_status(data: str) -> TaskStatus | None:
    """The status a task or statusUpdate frame carries."""
    try:
        frame = parse_stream_response(data)
    except FrameError:
        return None
    if isinstance(frame, JsonRpcResponse):
        if frame.result is None:
            return None
        frame = frame.result
    return getattr(frame.payload, "status", None)


@dataclass
class _Snapshot:
    """A task object in a response body that is not a stream (SendMessage, GetTask...)."""

    task: Task
    at_ms: float
    exchange_id: int


def _snapshots(xrows: list[dict[str, Any]], origin: int) -> list[_Snapshot]:
    snapshots = []
    for x in xrows:
        obj = parse_json(x["response_body"]) if not x["is_sse"] else None
        if isinstance(obj, dict) and "jsonrpc" in obj:
            obj = obj.get("result")
        if isinstance(obj, dict) and isinstance(obj.get("task"), dict):
            obj = obj["task"]
        if not (isinstance(obj, dict) and "id" in obj and isinstance(obj.get("status"), dict)):
            continue
        try:
            task = Task.model_validate(obj)
        except ValueError:
            continue
        end = x["started_ns"] + (x["duration_ns"] or x["ttfb_ns"] or 0)
        snapshots.append(_Snapshot(task, (end - origin) / 1e6, x["id"]))
    return snapshots


def _state_frames(rows: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    """The data of the events that carry a state, by (exchange, seq): those that name the
    task and those of its streams that name none (a statusUpdate without a taskId)."""
    return {(r["exchange_id"], r["seq"]): r["data"] for r in rows if r["state"] is not None}


def _states(
    data: dict[tuple[int, int], str], events: list[Event], snapshots: list[_Snapshot]
) -> list[StateChange]:
    """Each change of state, from the streams and from task objects in other responses."""
    seen: list[StateChange] = []
    for e in events:
        if e.state is not None:
            status = _frame_status(data[e.exchange_id, e.seq])
            message = status.message.text if status and status.message else None
            seen.append(StateChange(e.state, e.at_ms, e.exchange_id, e.seq, message))
    for snap in snapshots:
        status = snap.task.status
        if status and isinstance(status.state, str):
            message = status.message.text if status.message else None
            seen.append(StateChange(status.state, snap.at_ms, snap.exchange_id, None, message))
    seen.sort(key=lambda s: s.at_ms)
    changes: list[StateChange] = []
    for s in seen:
        if not changes or s.state != changes[-1].state:
            changes.append(s)
        elif s.message and not changes[-1].message:
            changes[-1].message = s.message
    return changes


def _artifact(
    artifact_id: str,
    model: ArtifactModel | None,
    *,
    text: str,
    type_: str | None,
    closed: bool,
    events: int,
) -> Artifact:
    citations: list[Citation] = []
    if model is not None:
        # Whatever the agent sent is shown, whatever its shape: ids are strings or nothing.
        sources = {
            key: json.dumps(p.data, indent=2, ensure_ascii=False)
            for p in model.parts
            if p.data is not None and (key := _text_or_none(_metadata(p).get("dataPartId"))) is not None
        }
        marks = [
            c
            for p in model.parts
            if p.text is not None and isinstance(cites := _metadata(p).get("citations"), list)
            for c in cites
            if isinstance(c, dict)
        ]
        marks.sort(key=lambda c: c.get("offset") if isinstance(c.get("offset"), int) else len(text))
        for n, c in enumerate(marks, 1):
            offset = c.get("offset")
            citations.append(
                Citation(
                    number=n,
                    offset=offset if isinstance(offset, int) else len(text),
                    locator=str(c["locator"]) if c.get("locator") is not None else None,
                    data_part_id=_text_or_none(c.get("data_part_id")),
                    source=sources.get(_text_or_none(c.get("data_part_id"))),
                )
            )
    return Artifact(
        artifact_id=artifact_id,
        name=model.name if model else None,
        type=type_,
        text=text,
        closed=closed,
        events=events,
        citations=citations,
    )


def _metadata(part: Any) -> dict[str, Any]:
    return part.metadata if isinstance(part.metadata, dict) else {}


def _text_or_none(value: Any) -> str | None:
    """An id as the page shows it: a string (a number spelt out), else none."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _event_artifact(data: str) -> ArtifactModel | None:
    try:
        frame = parse_stream_response(data)
    except FrameError:
        return None
    if isinstance(frame, JsonRpcResponse):
        frame = frame.result
    return getattr(frame.payload, "artifact", None) if frame else None


def _artifacts(log: EventLog, task_id: str) -> list[Artifact]:
    """The task's streamed artifacts, reassembled (by the task_artifacts view) with the
    parts of their closing event: names, citations and the data parts cited."""
    artifacts = []
    for a in log.db.query("SELECT * FROM task_artifacts WHERE task_id = ?", [task_id]):
        # (None for an artifact only a subscribe's snapshot holds: no update of it came.)
        closing = next(
            log.db.query(
                "SELECT data FROM events WHERE task_id = ? AND artifact_id = ? "
                "ORDER BY last_chunk DESC, rowid DESC LIMIT 1",
                [task_id, a["artifact_id"]],
            ),
            None,
        )
        artifacts.append(
            _artifact(
                a["artifact_id"],
                None if closing is None else _event_artifact(closing["data"]),
                text=a["text"] or "",
                type_=a["artifact_type"],
                closed=bool(a["closed"]),
                events=a["events"],
            )
        )
    return artifacts


def _merged(
    streamed: list[Artifact], snapshots: list[_Snapshot], last_event_ms: float | None
) -> list[Artifact]:
    """The task's artifacts: as streamed, but a task object with artifacts answered after
    the task's last event (a GetTask after a dropped stream holds the whole answer, as
    task_summary reads it) gives its artifacts, each in place of the streamed one of its
    id; the streamed ones it lacks stay."""
    latest = next((s for s in reversed(snapshots) if s.task.artifacts), None)
    if latest is None or (last_event_ms is not None and latest.at_ms <= last_event_ms):
        return streamed
    answered = {
        a.artifact_id or "": replace(
            _artifact(a.artifact_id or "", a, text=a.text or "", type_=a.type, closed=False, events=0),
            answered_in=latest.exchange_id,
        )
        for a in latest.task.artifacts or []
    }
    # A streamed one keeps what its stream did: its updates, and whether a lastChunk closed it.
    merged = [
        replace(answered.pop(a.artifact_id), events=a.events, closed=a.closed)
        if a.artifact_id in answered
        else a
        for a in streamed
    ]
    return merged + list(answered.values())


def _usage(log: EventLog, task_id: str, snapshots: list[_Snapshot]) -> dict[str, Any] | None:
    """The task's last $usage: from its stream, else from a task object."""
    rows = list(
        log.db.query(
            "SELECT e.usage FROM events e JOIN exchanges x ON x.id = e.exchange_id "
            "WHERE e.task_id = ? AND e.usage IS NOT NULL "
            "ORDER BY x.started_ns + e.offset_ns DESC, e.exchange_id DESC, e.seq DESC LIMIT 1",
            [task_id],
        )
    )
    if rows:
        usage = parse_json(rows[0]["usage"])
        return usage if isinstance(usage, dict) else None
    for snap in reversed(snapshots):
        value = (snap.task.metadata or {}).get("$usage")
        if isinstance(value, dict):
            return value
    return None


def _reconnects(log: EventLog, exchange_ids: list[int], origin: int) -> list[Reconnect]:
    """The reconnects of the task's streams, and those that brought a request of the task."""
    # EventLog refuses a log older than this tasktape's schema (tasktape inspect says how
    # to upgrade it), so the resumes table is there in every log a page is read from.
    marks = ",".join("?" * len(exchange_ids))
    rows = log.db.query(
        f"SELECT * FROM resumes WHERE exchange_id IN ({marks}) OR new_exchange_id IN ({marks}) "
        "ORDER BY at_ns, id",
        exchange_ids * 2,
    )
    reconnects = []
    for r in rows:
        made = parse_json(r["synthesized"])
        reconnects.append(
            Reconnect(
                id=r["id"],
                exchange_id=r["exchange_id"],
                at=r["at"],
                at_ms=(r["at_ns"] - origin) / 1e6,
                side=r["side"],
                last_event_id=r["last_event_id"],
                events_from_log=r["events_from_log"],
                new_exchange_id=r["new_exchange_id"],
                outcome=r["outcome"],
                attempts=r["attempts"],
                synthesized=[str(m) for m in made] if isinstance(made, list) else [],
                error=r["error"],
            )
        )
    return reconnects


def _findings(
    log: EventLog, exchange_ids: list[int], file_state: tuple[FileState, FileState]
) -> tuple[list[Finding], str | None]:
    """The lifecycle checker's findings about these exchanges: computed when the page is
    first drawn, and again once the log has changed (``file_state``, as it was before
    ``log`` was read)."""
    findings, error = _checked(_Asked(str(log.path), tuple(exchange_ids), file_state, log))
    return list(findings), error


# A file's (inode, size, modification time), None when it is missing.
FileState = tuple[int, int, int] | None


def _file_state(path: Path) -> tuple[FileState, FileState]:
    """What tells that a log was written to since: its file's state, and its WAL's (a
    write goes there until a checkpoint moves it into the file)."""

    def state(p: Path) -> FileState:
        try:
            st = p.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    return state(path), state(path.with_name(path.name + "-wal"))


@dataclass(frozen=True)
class _Asked:
    """What the checker is asked: about exchanges of a log as it is (``file_state``). The
    log, opened for the page, is what they are read from: no part of the question."""

    path: str
    exchange_ids: tuple[int, ...]
    file_state: tuple[FileState, FileState]
    log: EventLog = field(compare=False, repr=False)


@lru_cache(maxsize=16)
def _checked(asked: _Asked) -> tuple[tuple[Finding, ...], str | None]:
    """The checker's findings, read where the page reads the rest (the same moment of the
    log): a task of 100,000 events takes seconds to check, so a page drawn again reuses them."""
    # Datasette imports this plugin in every run in the environment; the checker is
    # needed only when a task page is asked for.
    from tasktape.eventlog.checker import check_log  # noqa: PLC0415

    try:
        return tuple(check_log(asked.log, asked.exchange_ids)), None
    except Exception as exc:  # a checker bug must not hide the run itself
        return (), f"{type(exc).__name__}: {exc}"
