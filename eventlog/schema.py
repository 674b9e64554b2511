"""The event log's SQLite schema: tables, indexes and views, applied as migrations.

Table and column names are a public contract (people write SQL against them), so a
change is always a new migration; opening an older log upgrades it, and a log with
migrations this version does not know is refused rather than misread. A new log is made
from the schema the migrations build (``new_log``), at a tenth of their cost.
"""

from __future__ import annotations

import os
import pwd
import shlex
import sqlite3
import time
from collections.abc import Callable
from contextlib import closing
from enum import IntEnum
from functools import cache
from pathlib import Path

import sqlite_utils
from sqlite_utils.migrations import Migrations

from tasktape.errors import LogError, SchemaTooNew, SchemaTooOld, UsageError

from . import new_log
from .a2a_terms import V03_STATES
from .file_kinds import FileKind, damage_note, is_cassette, kind_of, read_only_uri, result_code
from .requests import SUBSCRIBE_METHODS
from .resumes import ResumeOutcome, ResumeSide
from .writer_lock import refuse_writer_of_0_1_0, release_writer_lock, take_writer_lock

migrations = Migrations("tasktape")
MigrationFn = Callable[[sqlite_utils.Database], None]
KNOWN: list[str] = []  # migration names in order; the schema version is their count


def _migration(name: str) -> Callable[[MigrationFn], MigrationFn]:
    KNOWN.append(name)
    return migrations(name=name)


@_migration("0001_tables")
def _tables(db: sqlite_utils.Database) -> None:
    db["captures"].create(
        {
            "id": int,
            "started_at": str,
            "ended_at": str,
            "source": str,
            "upstream": str,
            "tool_version": str,
            "argv": str,
        },
        pk="id",
    )
    db["exchanges"].create(
        {
            "id": int,
            "capture_id": int,
            "started_at": str,
            "started_ns": int,
            "method": str,
            "path": str,
            "query": str,
            "request_headers": str,
            "request_body": bytes,
            "status": int,
            "response_headers": str,
            "response_body": bytes,
            "is_sse": int,
            "binding": str,
            "rpc_method": str,
            "task_id": str,
            "context_id": str,
            "ttfb_ns": int,
            "duration_ns": int,
            "outcome": str,
            "error": str,
        },
        pk="id",
        foreign_keys=[("capture_id", "captures", "id")],
    )
    db["chunks"].create(
        {"exchange_id": int, "seq": int, "offset_ns": int, "data": bytes},
        pk=("exchange_id", "seq"),
        foreign_keys=[("exchange_id", "exchanges", "id")],
    )
    db["events"].create(
        {
            "exchange_id": int,
            "seq": int,
            "offset_ns": int,
            "event_id": str,
            "last_event_id": str,
            "event_type": str,
            "data": str,
            "retry": int,
            "complete": int,
            "kind": str,
            "task_id": str,
            "context_id": str,
            "state": str,
            "artifact_id": str,
            "artifact_type": str,
            "append": int,
            "last_chunk": int,
            "text": str,
            "usage": str,
            "parse_error": str,
        },
        pk=("exchange_id", "seq"),
        foreign_keys=[("exchange_id", "exchanges", "id")],
    )
    db["events"].create_index(["task_id", "event_id"], index_name="events_task_event")
    db["events"].create_index(["context_id"], index_name="events_context")
    db["exchanges"].create_index(["task_id"], index_name="exchanges_task")
    db["exchanges"].create_index(["context_id"], index_name="exchanges_context")
    db["exchanges"].create_index(["capture_id"], index_name="exchanges_capture")


# Absolute time of an event: its exchange's start plus its offset within it.
_AT = "x.started_ns + e.offset_ns"
_ISO = "strftime('%Y-%m-%dT%H:%M:%fZ', ({}) / 1e9, 'unixepoch')"


def _event_at(rowid: str) -> str:
    """Absolute time of the event with that rowid."""
    return (
        f"(SELECT x.started_ns + e.offset_ns FROM events e JOIN exchanges x ON x.id = e.exchange_id"
        f" WHERE e.rowid = {rowid})"
    )


def _task_time(agg: str, expr: str, v: TaskViews) -> str:
    """An aggregate over the times of one task's events (``{at}`` = event time): those
    the views of version ``v`` read (``_read_events``)."""
    return (
        f"(SELECT {agg}({expr.format(at=_AT)}) FROM events e JOIN exchanges x ON x.id = e.exchange_id"
        f" WHERE e.task_id = t.task_id{_read_events(v)})"
    )


# The outcomes of a client's reconnect that the resume gateway answered from a stream it
# held: the reconnect's exchange holds a slice of that stream (the events after its
# Last-Event-ID, with the gateway's ids), every event of which the stream's own exchanges
# (the agent's, its subscribes') hold too, or the gateway made up (a rejoin's catch-up, which
# the subscribe's snapshot holds). Its events are all sent again.
ANSWERED_FROM_HELD = (ResumeOutcome.RESUMED, ResumeOutcome.ENDED)
# The exchanges that hold such a slice (few: SQLite reads them once per statement).
_ANSWERED = ", ".join(f"'{o}'" for o in ANSWERED_FROM_HELD)
SLICES = (
    f"SELECT r.new_exchange_id FROM resumes r WHERE r.side = '{ResumeSide.CLIENT}'"
    f" AND r.outcome IN ({_ANSWERED}) AND r.new_exchange_id IS NOT NULL"
)
# Whether event row e is counted by the views since schema version 20: not a slice's.
_COUNTED = f"e.exchange_id NOT IN ({SLICES})"


class TaskViews(IntEnum):
    """The versions of the task views (``task_artifacts``, ``task_summary``), each named by
    the schema version whose migration made it; the views of the migrations before 0018
    are made as 0018 made them, which the later ones replace."""

    APPEND_FLAGS = 18  # an artifact's text follows its events' append flags
    OVER_RECONNECTS = 20  # a reconnect's slice left out, the subscribes' snapshots read
    DELIVERED = 21  # only events a client was sent; times and answers from the task's first request


def _read_events(v: TaskViews) -> str:
    """The condition (after an AND) on event row e that the views of version ``v`` read
    a task's state, text, usage and event times from: since version 20, not a slice's
    (``_COUNTED``); since 21, also one its client was sent (``complete``: an event cut
    before its blank line was never dispatched, as ``tasktape check`` reads a stream)."""
    if v >= TaskViews.DELIVERED:
        return f" AND {_COUNTED} AND e.complete = 1"
    return f" AND {_COUNTED}" if v >= TaskViews.OVER_RECONNECTS else ""


def _sent_before(e: str, x: str) -> str:
    """Whether event row ``e`` (of exchange row ``x``) is one its task's streams sent
    before, as ``frames.Repeats`` tells them: its stream continues an earlier one (a
    request carrying Last-Event-ID the latest that sent that id; else a subscribe to the
    task its latest stream) and that one sent an event with its id. Any other event is
    new, whatever its id: a task's streams may number their events from 1 each. (Looked
    up only for an id an earlier stream of the task used, through the (task, id) index;
    the request's headers, a JSON array of [name, value] pairs, are read only when they
    name the header.)"""
    subscribes = ", ".join(f"'{m}'" for m in sorted(SUBSCRIBE_METHODS))
    return f"""({e}.event_id IS NOT NULL AND EXISTS (SELECT 1 FROM events p
      WHERE p.task_id = {e}.task_id AND p.event_id = {e}.event_id AND p.rowid < {e}.rowid)
      AND coalesce(
          (SELECT max(q.exchange_id) FROM json_each(CASE WHEN instr(lower({x}.request_headers),
             '"last-event-id"') THEN {x}.request_headers END) h CROSS JOIN events q
           ON q.task_id = {e}.task_id AND q.event_id = json_extract(h.value, '$[1]')
             AND q.exchange_id < {e}.exchange_id
           WHERE lower(json_extract(h.value, '$[0]')) = 'last-event-id'),
          (SELECT max(c.id) FROM exchanges c WHERE {x}.rpc_method IN ({subscribes})
           AND c.task_id = {e}.task_id AND c.is_sse = 1 AND c.id < {e}.exchange_id),
          0)  -- (continuing none: no exchange's id)
        IN (SELECT p.exchange_id FROM events p
            WHERE p.task_id = {e}.task_id AND p.event_id = {e}.event_id))"""


def _snapshots(task: str | None) -> str:
    """The artifacts of the task snapshots that subscribes (to ``task``, or to any task)
    began with, one row each: its task, id, type and text parts joined, when and where
    the snapshot came. A client takes a snapshot's artifact as the whole of it so far; the
    resume gateway, rejoining a stream, sends its clients what they lack of it (the
    events it makes up, which the log keeps only as ids)."""
    subscribes = ", ".join(f"'{m}'" for m in sorted(SUBSCRIBE_METHODS))
    of_task = "x.task_id IS NOT NULL" if task is None else f"x.task_id = {task}"
    return f"""SELECT x.task_id, json_extract(a.value, '$.artifactId') AS artifact_id,
      json_extract(a.value, '$.metadata.type') AS artifact_type,
      (SELECT group_concat(json_extract(p.value, '$.text'), '') FROM json_each(a.value, '$.parts') p
       WHERE json_type(p.value, '$.text') = 'text') AS text,
      {_AT} AS at_ns, e.exchange_id, e.seq, e.rowid AS row
    FROM exchanges x CROSS JOIN events e ON e.exchange_id = x.id
      AND e.seq = (SELECT min(f.seq) FROM events f WHERE f.exchange_id = x.id)
    JOIN json_each({_body_task("e.data")}, '$.artifacts') a
    WHERE {of_task} AND x.rpc_method IN ({subscribes}) AND x.is_sse = 1 AND e.kind = 'task'"""


def _artifact_text(task: str, artifact: str, v: TaskViews) -> str:
    """An artifact's text: its events in order, an event with append false (a first delta,
    or a lastChunk's consolidation) replacing the text so far and one with append true
    adding to it; an event sent again (``_sent_before``) counts once. So: the last event
    that does not append, and those after it that do. Before version 21, a lastChunk that
    does not append was read alone, as if nothing could come after it (a later turn of
    the task may replace or add to the artifact). Since version 20, a slice's events are
    left out (``SLICES``: every one of them is sent again), and a subscribe's snapshot of
    the artifact replaces the text so far; since 21, an event never sent is left out."""
    events = (
        "FROM events e JOIN exchanges x ON x.id = e.exchange_id"
        f" WHERE e.task_id = {task} AND e.artifact_id = {artifact}{_read_events(v)}"
    )
    order = f"{_AT}, e.exchange_id, e.seq"
    latest = f"ORDER BY {_AT} DESC, e.exchange_id DESC, e.seq DESC LIMIT 1"
    if v >= TaskViews.OVER_RECONNECTS:
        return _text_from_bases(task, artifact, events, order, latest, v)
    return f"""coalesce(
    (SELECT e.text {events} AND e.last_chunk = 1 AND coalesce(e.append, 0) = 0 {latest}),
    (SELECT group_concat(d.text, '') FROM (
       SELECT e.text FROM (SELECT 1) one
       LEFT JOIN (SELECT e.rowid AS row, {_AT} AS at_ns, e.exchange_id, e.seq {events}
                  AND coalesce(e.append, 0) = 0 AND NOT {_sent_before("e", "x")} {latest}) b
       JOIN events e ON e.task_id = {task} AND e.artifact_id = {artifact}
       JOIN exchanges x ON x.id = e.exchange_id
       WHERE e.rowid = b.row OR (e.append = 1
         AND (b.row IS NULL OR ({order}) > (b.at_ns, b.exchange_id, b.seq))
         AND NOT {_sent_before("e", "x")})
       ORDER BY {order}) d))"""


def _text_from_bases(task: str, artifact: str, events: str, order: str, latest: str, v: TaskViews) -> str:
    """``_artifact_text`` from ``events`` (those counted) and the subscribes' snapshots:
    the latest base (an event that does not append, or a snapshot of the artifact), then
    the events after it that append."""
    bases = f"""SELECT e.text, {_AT} AS at_ns, e.exchange_id, e.seq {events}
        AND coalesce(e.append, 0) = 0 AND NOT {_sent_before("e", "x")}
      UNION ALL SELECT s.text, s.at_ns, s.exchange_id, s.seq FROM ({_snapshots(task)}) s
        WHERE s.artifact_id = {artifact}"""
    read = f"""(SELECT CASE WHEN c.text IS NOT NULL OR c.tail IS NOT NULL
       THEN coalesce(c.text, '') || coalesce(c.tail, '') END
     FROM (SELECT b.text, (SELECT group_concat(d.text, '') FROM (
             SELECT e.text {events} AND e.append = 1
               AND (b.at_ns IS NULL OR ({order}) > (b.at_ns, b.exchange_id, b.seq))
               AND NOT {_sent_before("e", "x")}
             ORDER BY {order}) d) AS tail
           FROM (SELECT 1) one
           LEFT JOIN (SELECT * FROM ({bases})
                      ORDER BY at_ns DESC, exchange_id DESC, seq DESC LIMIT 1) b) c)"""
    if v >= TaskViews.DELIVERED:
        return read
    closed = f"(SELECT e.text {events} AND e.last_chunk = 1 AND coalesce(e.append, 0) = 0 {latest})"
    return f"coalesce(\n    {closed},\n    {read})"


def _answer(op: str, v: TaskViews) -> str:
    """The task's artifacts joined in order of appearance: ``<>`` the answer (all but
    intermediate thinking), ``=`` the intermediate thinking. Since version 20, as
    ``_artifact_text`` reads them, an artifact only a subscribe's snapshot holds too."""
    artifacts = """artifact_id, min(rowid) AS first_row FROM events
          WHERE task_id = t.task_id AND kind = 'artifactUpdate' AND artifact_id IS NOT NULL"""
    if v >= TaskViews.OVER_RECONNECTS:
        artifacts = f"""artifact_id, min(row) AS first_row FROM (
            SELECT e.artifact_id, e.artifact_type, e.rowid AS row FROM events e
            WHERE e.task_id = t.task_id AND e.kind = 'artifactUpdate' AND e.artifact_id IS NOT NULL
              {_read_events(v).lstrip()}
            UNION ALL SELECT s.artifact_id, s.artifact_type, s.row FROM ({_snapshots("t.task_id")}) s
            WHERE s.artifact_id IS NOT NULL)"""
    return f"""(SELECT group_concat(part, char(10)) FROM (
    SELECT {_artifact_text("t.task_id", "g.artifact_id", v)} AS part
    FROM (SELECT {artifacts}
          GROUP BY artifact_id
          HAVING coalesce(max(artifact_type), '') {op} 'intermediate-thinking'
          ORDER BY first_row) g))"""


# The task's latest object answered without a stream that has ``{has}``.
_LATEST_ANSWER = (
    "(SELECT a.task FROM task_answers a"
    " WHERE a.task_id = t.task_id AND json_type(a.task, '{has}') IS NOT NULL"
    " ORDER BY a.at_ns DESC, a.exchange_id DESC LIMIT 1)"
)


def _newer(streamed: str, answered: str, has: str, v: TaskViews) -> str:
    """Of a value from the task's events and one from its latest object answered without a
    stream (one that has ``has``), the one seen last: a GetTask after a dropped stream
    holds the whole answer."""
    answered_at = (
        "(SELECT max(a.at_ns) FROM task_answers a"
        f" WHERE a.task_id = t.task_id AND json_type(a.task, '{has}') IS NOT NULL)"
    )
    # Most tasks have no such object: then the time of their last event is not looked up.
    return (
        f"CASE WHEN {answered_at} IS NULL THEN {streamed}"
        f" WHEN {answered_at} > coalesce({_task_time('max', '{at}', v)}, 0)"
        f" THEN coalesce({answered}, {streamed}) ELSE coalesce({streamed}, {answered}) END"
    )


def _usage(field: str, v: TaskViews) -> str:
    """A field of the task's last ``$usage``: from its events (since version 21, those
    ``_read_events`` reads) or its answered objects."""
    read = _read_events(v) if v >= TaskViews.DELIVERED else ""
    streamed = (
        f"(SELECT e.usage FROM events e JOIN exchanges x ON x.id = e.exchange_id"
        f" WHERE e.task_id = t.task_id AND e.usage IS NOT NULL{read}"
        f" ORDER BY {_AT} DESC, e.exchange_id DESC, e.seq DESC LIMIT 1)"
    )
    usage = '$.metadata."$usage"'
    answered = f"json_extract({_LATEST_ANSWER.format(has=usage)}, '{usage}')"
    return f"json_extract({_newer(streamed, answered, usage, v)}, '$.{field}')"


def _sql_state(expr: str) -> str:
    """A state as the log stores it: A2A 0.3 names become v1.0's (as the classifier does)."""
    whens = " ".join(f"WHEN '{old}' THEN '{new}'" for old, new in V03_STATES.items())
    return f"CASE {expr} {whens} ELSE {expr} END"


def _body_task(body: str) -> str:
    """The task object in a non-streamed answer: a REST body or a JSON-RPC result, the task
    itself (GetTask, CancelTask) or wrapped in ``task`` (SendMessage)."""
    whens = " ".join(
        f"WHEN json_type({body}, '{path}') = 'object' THEN json_extract({body}, '{path}')"
        for path in ("$.result.task", "$.result", "$.task", "$")
    )
    return f"CASE WHEN json_valid({body}) THEN CASE {whens} END END"


def _answered_text(op: str) -> str:
    """Like ``_answer``, from the artifacts of the task's latest object answered without a
    stream: each artifact's text parts joined, the artifacts one per line."""
    return f"""(SELECT group_concat(part, char(10)) FROM (
    SELECT (SELECT group_concat(json_extract(p.value, '$.text'), '') FROM json_each(g.value, '$.parts') p
            WHERE json_type(p.value, '$.text') = 'text') AS part
    FROM json_each({_LATEST_ANSWER.format(has="$.artifacts")}, '$.artifacts') g
    WHERE coalesce(json_extract(g.value, '$.metadata.type'), '') {op} 'intermediate-thinking'
    ORDER BY g.key))"""


def _task_exchanges(counted: bool = False) -> str:
    """Every exchange of the task: those that streamed its events and those that answered
    it; ``counted``: but a reconnect's that holds a slice (``SLICES``)."""
    of_events = f" AND exchange_id NOT IN ({SLICES})" if counted else ""
    return (
        f"SELECT exchange_id FROM events WHERE task_id = t.task_id{of_events}"
        " UNION SELECT exchange_id FROM task_answers WHERE task_id = t.task_id"
    )


def _seen(agg: str, v: TaskViews) -> str:
    """The first or last moment the task was seen: its events and its answers alike
    (since version 21, not a slice's events, which its own streams' exchanges hold)."""
    counted = f" AND {_COUNTED}" if v >= TaskViews.DELIVERED else ""
    return (
        f"(SELECT {agg}(s.at_ns) FROM (SELECT {_AT} AS at_ns FROM events e JOIN exchanges x"
        f" ON x.id = e.exchange_id WHERE e.task_id = t.task_id{counted}"
        " UNION ALL SELECT at_ns FROM task_answers WHERE task_id = t.task_id) s)"
    )


def _first_request(v: TaskViews) -> str:
    """When the task's first request arrived, of the exchanges its times count."""
    exchanges = _task_exchanges(counted=v >= TaskViews.DELIVERED)
    return f"(SELECT min(started_ns) FROM exchanges WHERE id IN ({exchanges}))"


def _ttfe(v: TaskViews) -> str:
    """The task's time to first event: from its first request (since version 21; before,
    from the start of the first exchange that streamed an event of it)."""
    first = _task_time("min", "{at}", v)
    if v >= TaskViews.DELIVERED:
        return f"round(({first} - {_first_request(v)}) / 1e6, 3)"
    return f"round(({first} - {_task_time('min', 'x.started_ns', v)}) / 1e6, 3)"


def _artifact_rows(v: TaskViews) -> str:
    """The rows ``task_artifacts`` groups by task and artifact: the artifact updates (since
    version 20, those counted, and a subscribe's snapshot of an artifact, counted as no
    update of it; since 21, those ``_read_events`` reads)."""
    if v < TaskViews.OVER_RECONNECTS:
        return """SELECT task_id, artifact_id, max(artifact_type) AS artifact_type, count(*) AS events,
         max(last_chunk) AS closed, min(rowid) AS first_row
  FROM events
  WHERE kind = 'artifactUpdate' AND task_id IS NOT NULL AND artifact_id IS NOT NULL
  GROUP BY task_id, artifact_id"""
    # Two groupings, not one over both: a task's rows are then looked up by its index.
    return f"""SELECT e.task_id, e.artifact_id, max(e.artifact_type) AS artifact_type, count(*) AS events,
         max(e.last_chunk) AS closed, min(e.rowid) AS first_row
  FROM events e
  WHERE e.kind = 'artifactUpdate' AND e.task_id IS NOT NULL AND e.artifact_id IS NOT NULL{_read_events(v)}
  GROUP BY e.task_id, e.artifact_id
  UNION ALL
  SELECT s.task_id, s.artifact_id, max(s.artifact_type), 0, 0, min(s.row)
  FROM ({_snapshots(None)}) s
  WHERE s.artifact_id IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM events e WHERE e.task_id = s.task_id AND e.artifact_id = s.artifact_id
      AND e.kind = 'artifactUpdate'{_read_events(v)})
  GROUP BY s.task_id, s.artifact_id"""


def _task_artifacts(v: TaskViews) -> str:
    """The ``task_artifacts`` view of version ``v`` (see ``_artifact_text``)."""
    return f"""
SELECT
  a.task_id,
  a.artifact_id,
  a.artifact_type,
  a.events,
  a.closed,
  {_ISO.format(_event_at("a.first_row"))} AS first_seen,
  {_artifact_text("a.task_id", "a.artifact_id", v)} AS text
FROM (
  {_artifact_rows(v)}
  ORDER BY first_row
) a
"""


def _task_summary(v: TaskViews) -> str:
    """The ``task_summary`` view of version ``v``: since 20, its events' figures and answer
    leave out a slice's events, its answer reads the subscribes' snapshots; since 21, they
    leave out the events never sent, and its times a slice's (see ``_read_events``)."""
    return f"""
SELECT
  t.task_id,
  coalesce(
    (SELECT e.context_id FROM events e WHERE e.task_id = t.task_id AND e.context_id IS NOT NULL LIMIT 1),
    (SELECT a.context_id FROM task_answers a WHERE a.task_id = t.task_id AND a.context_id IS NOT NULL LIMIT 1)
  ) AS context_id,
  {_ISO.format(_seen("min", v))} AS first_seen,
  {_ISO.format(_seen("max", v))} AS last_seen,
  (SELECT s.state FROM (
     SELECT {_AT} AS at_ns, e.exchange_id, e.seq, e.state
     FROM events e JOIN exchanges x ON x.id = e.exchange_id
     WHERE e.task_id = t.task_id AND e.state IS NOT NULL{_read_events(v)}
     UNION ALL
     SELECT a.at_ns, a.exchange_id, 0, a.state FROM task_answers a
     WHERE a.task_id = t.task_id AND a.state IS NOT NULL
   ) s ORDER BY s.at_ns DESC, s.exchange_id DESC, s.seq DESC LIMIT 1) AS final_state,
  t.events,
  (SELECT count(*) FROM ({_task_exchanges()})) AS exchanges,
  {_ttfe(v)} AS ttfe_ms,
  round(({_seen("max", v)} - {_first_request(v)}) / 1e6, 3)
    AS duration_ms,
  {_newer(_answer("<>", v), _answered_text("<>"), "$.artifacts", v)} AS answer,
  {_newer(_answer("=", v), _answered_text("="), "$.artifacts", v)} AS thinking,
  {_usage("model", v)} AS model,
  {_usage("inputTokens", v)} AS input_tokens,
  {_usage("outputTokens", v)} AS output_tokens,
  {_usage("cachedInputTokens", v)} AS cached_input_tokens,
  {_usage("totalTokens", v)} AS total_tokens,
  {_usage("credits", v)} AS credits
FROM (
  -- In order of the exchange that first carried the task. rowid follows arrival, and the
  -- (task_id, event_id) index holds it: grouping events needs no table read, so listing
  -- tasks stays cheap on big logs. The two parts hold different tasks, so that a lookup
  -- of one task goes down to both (no grouping over their union).
  SELECT g.task_id, g.events, g.first_row,
         (SELECT exchange_id FROM events WHERE rowid = g.first_row) AS first_exchange
  FROM (SELECT task_id, count(*) AS events, min(rowid) AS first_row
        FROM events WHERE task_id IS NOT NULL GROUP BY task_id) g
  UNION ALL
  SELECT a.task_id, 0, NULL, min(a.exchange_id) FROM task_answers a
  WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.task_id = a.task_id)
  GROUP BY a.task_id
  ORDER BY first_exchange, first_row
) t
"""


VIEWS = {
    "task_answers": f"""
SELECT
  s.exchange_id,
  s.task_id,
  s.context_id,
  {_ISO.format("s.at_ns")} AS at,
  s.at_ns,
  {_sql_state("json_extract(s.task, '$.status.state')")} AS state,
  s.task
FROM (
  SELECT x.id AS exchange_id, x.task_id, x.context_id,
         x.started_ns + coalesce(x.duration_ns, x.ttfb_ns, 0) AS at_ns,
         {_body_task("x.response_body")} AS task
  FROM exchanges x
  WHERE x.is_sse = 0 AND x.task_id IS NOT NULL AND x.response_body IS NOT NULL
) s
WHERE json_extract(s.task, '$.id') = s.task_id AND json_type(s.task, '$.status') = 'object'
""",
    "task_timeline": f"""
SELECT
  e.task_id,
  e.exchange_id,
  e.seq,
  {_ISO.format(_AT)} AS at,
  round(e.offset_ns / 1e6, 3) AS offset_ms,
  round(({_AT} - lag({_AT}) OVER win) / 1e6, 3) AS gap_ms,
  e.kind,
  e.state,
  e.artifact_id,
  e.artifact_type,
  e.append,
  e.last_chunk,
  e.text,
  e.event_id,
  e.complete,
  e.parse_error
FROM events e JOIN exchanges x ON x.id = e.exchange_id
WHERE e.task_id IS NOT NULL
WINDOW win AS (PARTITION BY e.task_id ORDER BY {_AT}, e.exchange_id, e.seq)
ORDER BY e.task_id, {_AT}, e.exchange_id, e.seq
""",
    "task_artifacts": _task_artifacts(TaskViews.APPEND_FLAGS),
    "task_summary": _task_summary(TaskViews.APPEND_FLAGS),
    "exchange_metrics": """
SELECT
  x.id AS exchange_id,
  x.capture_id,
  x.started_at,
  x.method,
  x.path,
  x.status,
  x.binding,
  x.rpc_method,
  x.task_id,
  x.is_sse,
  x.outcome,
  (SELECT count(*) FROM chunks c WHERE c.exchange_id = x.id) AS chunks,
  (SELECT coalesce(sum(length(c.data)), 0) FROM chunks c WHERE c.exchange_id = x.id) AS bytes,
  (SELECT count(*) FROM events e WHERE e.exchange_id = x.id) AS events,
  round(x.ttfb_ns / 1e6, 3) AS ttfb_ms,
  (SELECT round(min(e.offset_ns) / 1e6, 3) FROM events e WHERE e.exchange_id = x.id) AS ttfe_ms,
  round(x.duration_ns / 1e6, 3) AS duration_ms
FROM exchanges x
ORDER BY x.id
""",
}


@_migration("0002_views")
def _views(db: sqlite_utils.Database) -> None:
    for name, sql in VIEWS.items():
        db.create_view(name, sql.strip())


@_migration("0003_body_flags")
def _body_flags(db: sqlite_utils.Database) -> None:
    exchanges = db["exchanges"]
    exchanges.add_column("request_body_truncated", int)
    exchanges.add_column("response_body_truncated", int)
    exchanges.add_column("body_encoding", str)


@_migration("0004_search_and_findings")
def _search_and_findings(db: sqlite_utils.Database) -> None:
    # No triggers: the log writer indexes each batch's text in one statement when it
    # commits (a trigger per row cost over half the ingest rate), so a search still sees
    # events as they are recorded.
    db["events"].enable_fts(["text"], fts_version="FTS5")
    db["findings"].create(
        {
            "id": int,
            "checked_at": str,
            "rule": str,
            "task_id": str,
            "exchange_id": int,
            "seq": int,
            "message": str,
        },
        pk="id",
        foreign_keys=[("exchange_id", "exchanges", "id")],
    )
    db["findings"].create_index(["task_id"], index_name="findings_task")
    db["findings"].create_index(["exchange_id"], index_name="findings_exchange")


@_migration("0005_task_answers")
def _task_answers(db: sqlite_utils.Database) -> None:
    # task_summary now counts tasks answered without a stream too (from task_answers).
    for name in ("task_answers", "task_summary"):
        db.create_view(name, VIEWS[name].strip(), replace=True)


@_migration("0006_request_body_encoding")
def _request_body_encoding(db: sqlite_utils.Database) -> None:
    # The Content-Encoding a stored request body was decoded from (NULL: stored as sent).
    db["exchanges"].add_column("request_body_encoding", str)


STREAM_SUMMARY = """
SELECT
  x.id AS exchange_id,
  x.protocol,
  x.model,
  x.answer,
  x.input_tokens,
  x.output_tokens,
  x.finish,
  (SELECT count(*) FROM events e WHERE e.exchange_id = x.id) AS events,
  round(coalesce(
    (SELECT min(e.offset_ns) FROM events e WHERE e.exchange_id = x.id),
    (SELECT min(c.offset_ns) FROM chunks c WHERE c.exchange_id = x.id)) / 1e6, 3) AS ttfe_ms,
  round(x.duration_ns / 1e6, 3) AS duration_ms
FROM exchanges x
WHERE x.protocol IS NOT NULL
ORDER BY x.id
"""


@_migration("0007_protocols")
def _protocols(db: sqlite_utils.Database) -> None:
    # Which protocol claimed each exchange, the MCP session it belongs to, and what its
    # response comes to (stream_summary). Older logs are read again, protocol by protocol.
    exchanges = db["exchanges"]
    for name, kind in (
        ("protocol", str),
        ("session_id", str),
        ("model", str),
        ("answer", str),
        ("input_tokens", int),
        ("output_tokens", int),
        ("finish", str),
    ):
        exchanges.add_column(name, kind)
    exchanges.create_index(["protocol"], index_name="exchanges_protocol")
    exchanges.create_index(["session_id"], index_name="exchanges_session")
    db.create_view("stream_summary", STREAM_SUMMARY.strip())
    # Here, not at the top: the protocols read the events back, which needs this module.
    from .reread import reread_log  # noqa: PLC0415

    reread_log(db.conn)


@_migration("0008_resumes")
def _resumes(db: sqlite_utils.Database) -> None:
    # What a resuming recorder (tasktape record --resume) did when a side reconnected.
    db["resumes"].create(
        {
            "id": int,
            "exchange_id": int,
            "at": str,
            "at_ns": int,
            "side": str,
            "last_event_id": str,
            "events_from_log": int,
            "new_exchange_id": int,
            "outcome": str,
            "attempts": int,
            "synthesized": str,
            "error": str,
        },
        pk="id",
        foreign_keys=[("exchange_id", "exchanges", "id"), ("new_exchange_id", "exchanges", "id")],
    )
    db["resumes"].create_index(["exchange_id"], index_name="resumes_exchange")


def _written(e: str) -> str:
    """SQL for the bytes of event row ``e`` in the one form its fields write back
    (sse.written)."""
    eol = f"CASE {e}.chunk_crlf WHEN 1 THEN char(13, 10) ELSE char(10) END"
    return (
        f"coalesce('id: ' || {e}.event_id || {eol}, '') || coalesce('event: ' || {e}.event_type || {eol}, '')"
        f" || 'data: ' || {e}.data || {eol} || {eol}"
    )


# Schema version 9's: a chunk that is one event alone, in the form its fields write back,
# is not stored twice: its event row says which chunk it is (chunk_seq) and how its lines
# end (chunk_crlf), and ``chunks`` writes its bytes from that row beside the stored chunks.
_CHUNKS_9 = f"""
SELECT exchange_id, seq, offset_ns, data FROM stored_chunks
UNION ALL
SELECT e.exchange_id, e.chunk_seq, e.offset_ns, CAST({_written("e")} AS BLOB)
FROM events e WHERE e.chunk_seq IS NOT NULL
ORDER BY 1, 2
"""


@_migration("0009_chunks_not_stored_twice")
def _chunks_not_stored_twice(db: sqlite_utils.Database) -> None:
    # chunks becomes a view over the chunks stored as they came and those an event row
    # writes back; the views that read chunks read the view again.
    db.execute("ALTER TABLE chunks RENAME TO stored_chunks")
    db["events"].add_column("chunk_seq", int)
    db["events"].add_column("chunk_crlf", int)
    db.create_view("chunks", _CHUNKS_9.strip())
    db.create_view("exchange_metrics", VIEWS["exchange_metrics"].strip(), replace=True)
    db.create_view("stream_summary", STREAM_SUMMARY.strip(), replace=True)


@_migration("0010_search_without_sizes")
def _search_without_sizes(db: sqlite_utils.Database) -> None:
    # Without the per-document size table (columnsize=0), indexing an event's text takes a
    # sixth fewer of SQLite's instructions; ranking tokenizes the matches' text instead.
    db.execute("DROP TABLE events_fts")
    db.execute('CREATE VIRTUAL TABLE "events_fts" USING FTS5 ("text", content="events", columnsize=0)')
    db.execute("INSERT INTO events_fts(events_fts) VALUES('rebuild')")


@_migration("0011_uids")
def _uids(db: sqlite_utils.Database) -> None:
    # Ids unique across logs (UUIDv7), beside the integer ids that stay local to a file.
    # Rows written before get uids derived from what they hold: every copy of a log upgrades
    # to the same uids, so merging two copies adds nothing twice.
    from .uids import derived_uuid7, iso_ns  # noqa: PLC0415

    db["captures"].add_column("uid", str)
    db["exchanges"].add_column("uid", str)
    captures = {
        row[0]: derived_uuid7(iso_ns(row[1]), "capture", *row)
        for row in db.execute("SELECT id, started_at, source, upstream, tool_version, argv FROM captures")
    }
    db.conn.executemany("UPDATE captures SET uid = ? WHERE id = ?", [(u, c) for c, u in captures.items()])
    db.conn.executemany(
        "UPDATE exchanges SET uid = ? WHERE id = ?",
        (
            (derived_uuid7(ns or 0, "exchange", captures.get(cid), xid, ns, method, path, query), xid)
            for xid, cid, ns, method, path, query in db.execute(
                "SELECT id, capture_id, started_ns, method, path, query FROM exchanges"
            ).fetchall()
        ),
    )
    db.execute("CREATE UNIQUE INDEX captures_uid ON captures (uid)")
    db.execute("CREATE UNIQUE INDEX exchanges_uid ON exchanges (uid)")


@_migration("0012_shipments")
def _shipments(db: sqlite_utils.Database) -> None:
    # How far the log has been shipped to each destination (tasktape record --ship): the
    # outbox cursor, written by the shipper once JetStream has acknowledged the rows.
    db["shipments"].create(
        {
            "sink": str,
            "captures": int,
            "exchanges": int,
            "open_from": int,
            "stored_chunks": int,
            "events": int,
            "resumes": int,
            "rows": int,
            "shipped_at": str,
        },
        pk="sink",
    )


# A chunk of several whole events is not stored twice either: its events' rows share its
# chunk_seq, its first event says how many it holds (chunk_events; 0 on the others), and
# ``chunks`` concatenates their written form in seq order. The window's ORDER BY is what
# orders group_concat (SQLite before 3.44 has no ORDER BY inside an aggregate); it runs
# over one chunk's rows, so the view streams, exchange by exchange, as before.
WRITES_A_CHUNK = "e.chunk_seq IS NOT NULL AND coalesce(e.chunk_events, 1) > 0"  # event row e
CHUNKS = f"""
SELECT exchange_id, seq, offset_ns, data FROM stored_chunks
UNION ALL
SELECT e.exchange_id, e.chunk_seq, e.offset_ns, CAST(CASE WHEN e.chunk_events IS NULL THEN {_written("e")}
  ELSE (SELECT group_concat({_written("f")}, '')
      OVER (ORDER BY f.seq ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)
    FROM events f WHERE f.exchange_id = e.exchange_id AND f.seq >= e.seq AND f.seq < e.seq + e.chunk_events
    ORDER BY f.seq LIMIT 1) END AS BLOB)
FROM events e WHERE {WRITES_A_CHUNK}
ORDER BY 1, 2
"""


@_migration("0013_chunks_of_events_not_stored_twice")
def _chunks_of_events_not_stored_twice(db: sqlite_utils.Database) -> None:
    # The chunks of older logs stay as they were stored; only new ones are written back.
    db["events"].add_column("chunk_events", int)
    db.create_view("chunks", CHUNKS.strip(), replace=True)


@_migration("0014_partial_event_indexes")
def _partial_event_indexes(db: sqlite_utils.Database) -> None:
    # Events without a task or a context (every MCP, OpenAI and Anthropic event, A2A's
    # without a contextId) are left out of those indexes: an event row inserts a third
    # faster on a token stream. A lookup by value (task_id = ?) implies the index's WHERE,
    # so it uses the index as before.
    db.execute("DROP INDEX events_task_event")
    db.execute("DROP INDEX events_context")
    db.execute("CREATE INDEX events_task_event ON events (task_id, event_id) WHERE task_id IS NOT NULL")
    db.execute("CREATE INDEX events_context ON events (context_id) WHERE context_id IS NOT NULL")


# What an exchange's chunks come to, read from the tables, not from ``chunks``: a view
# over a UNION ALL, asked for the exchange of an outer row, is written out whole first
# (SQLite 3.40 pushes no such term into it), for every event of the log. Its events'
# chunks are counted by their first event, and their bytes are their events' written form.
_CHUNK_COUNT = f"""(SELECT count(*) FROM stored_chunks c WHERE c.exchange_id = x.id)
    + (SELECT count(*) FROM events e WHERE e.exchange_id = x.id AND {WRITES_A_CHUNK})"""
_CHUNK_BYTES = f"""(SELECT coalesce(sum(length(c.data)), 0) FROM stored_chunks c WHERE c.exchange_id = x.id)
    + (SELECT coalesce(sum(length(CAST({_written("e")} AS BLOB))), 0)
       FROM events e WHERE e.exchange_id = x.id AND e.chunk_seq IS NOT NULL)"""
_OF_X = "FROM chunks c WHERE c.exchange_id = x.id)"
EXCHANGE_METRICS = (
    VIEWS["exchange_metrics"]
    .replace(f"(SELECT count(*) {_OF_X}", _CHUNK_COUNT)
    .replace(f"(SELECT coalesce(sum(length(c.data)), 0) {_OF_X}", _CHUNK_BYTES)
)
# (Its first chunk is read only for an exchange without events: then all are stored.)
STREAM_SUMMARY_15 = STREAM_SUMMARY.replace("FROM chunks c WHERE", "FROM stored_chunks c WHERE")


@_migration("0015_metrics_without_the_chunks_view")
def _metrics_without_the_chunks_view(db: sqlite_utils.Database) -> None:
    # exchange_metrics took a second for every 200,000 events of the log, however few of
    # its rows were asked for: a Datasette page of it ran past its time limit on big logs.
    db.create_view("exchange_metrics", EXCHANGE_METRICS.strip(), replace=True)
    db.create_view("stream_summary", STREAM_SUMMARY_15.strip(), replace=True)


STREAM_SUMMARY_16 = STREAM_SUMMARY_15.replace("  x.finish,\n", "  x.finish,\n  x.tool_calls,\n")


@_migration("0016_tool_calls")
def _tool_calls(db: sqlite_utils.Database) -> None:
    # The tools an LLM's answer calls (JSON): its answer text alone said nothing of them.
    db["exchanges"].add_column("tool_calls", str)
    db.create_view("stream_summary", STREAM_SUMMARY_16.strip(), replace=True)
    from .reread import reread_log  # noqa: PLC0415 (as in 0007)

    reread_log(db.conn, ("openai", "anthropic"))


STREAM_SUMMARY_17 = STREAM_SUMMARY_16.replace(
    "  x.input_tokens,\n", "  x.input_tokens,\n  x.cached_input_tokens,\n"
)


@_migration("0017_cached_input_tokens")
def _cached_input_tokens(db: sqlite_utils.Database) -> None:
    # Anthropic's input_tokens left out the tokens read from its cache, OpenAI's counted them:
    # input_tokens counts all of them now, and cached_input_tokens those read from a cache.
    # MCP's tool errors, log messages and a client's answers to the server are read anew too.
    db["exchanges"].add_column("cached_input_tokens", int)
    db.create_view("stream_summary", STREAM_SUMMARY_17.strip(), replace=True)
    from .reread import reread_log  # noqa: PLC0415 (as in 0007)

    reread_log(db.conn, ("openai", "anthropic", "mcp"))


@_migration("0018_artifact_text_appended_and_repeats")
def _artifact_text_appended_and_repeats(db: sqlite_utils.Database) -> None:
    # An artifact's text follows its events' append flags (a lastChunk that appends no
    # longer stands for the whole), and an event counts as sent again only on a stream
    # that continues the one that sent it (a task's streams may number events alike).
    for name in ("task_artifacts", "task_summary"):
        db.create_view(name, VIEWS[name].strip(), replace=True)


@_migration("0019_thinking_choices_server_requests")
def _thinking_choices_server_requests(db: sqlite_utils.Database) -> None:
    # A model's thinking (Anthropic's thinking deltas, OpenAI's reasoning) and the choices of
    # a request for several have kinds of their own, their text in the events (searchable);
    # an MCP server's requests have theirs (what an elicitation or a sampling request asks).
    from .reread import reread_log  # noqa: PLC0415 (as in 0007)

    reread_log(db.conn, ("openai", "anthropic", "mcp"))


@_migration("0020_task_views_over_reconnects")
def _task_views_over_reconnects(db: sqlite_utils.Database) -> None:
    # A reconnect the resume gateway answered holds a slice of the stream it held, under the
    # gateway's ids where the agent gave none: its events are left out, not read as new. A
    # rejoin's catch-up (events the gateway made up) is read from the subscribe's snapshot.
    db.create_view("task_artifacts", _task_artifacts(TaskViews.OVER_RECONNECTS).strip(), replace=True)
    db.create_view("task_summary", _task_summary(TaskViews.OVER_RECONNECTS).strip(), replace=True)


# A keep-alive comment is a chunk but no event: a stream's first event is its first event,
# and only a response that is not a stream is timed to its first chunk.
STREAM_SUMMARY_21 = STREAM_SUMMARY_17.replace(
    "    (SELECT min(c.offset_ns) FROM stored_chunks c WHERE c.exchange_id = x.id)) / 1e6, 3) AS ttfe_ms,",
    "    CASE WHEN x.is_sse = 0 THEN\n"
    "      (SELECT min(c.offset_ns) FROM stored_chunks c WHERE c.exchange_id = x.id) END)"
    " / 1e6, 3) AS ttfe_ms,",
)


@_migration("0021_task_views_of_what_was_sent")
def _task_views_of_what_was_sent(db: sqlite_utils.Database) -> None:
    # A task's state, answer and usage come from the events its clients were sent: not an
    # event cut before its blank line, nor (in its times) a reconnect's slice. An artifact
    # closed in one turn and replaced or added to in a later one reads as it ends. A task's
    # time to first event runs from its first request; a keep-alive comment is no first event.
    db.create_view("task_artifacts", _task_artifacts(TaskViews.DELIVERED).strip(), replace=True)
    db.create_view("task_summary", _task_summary(TaskViews.DELIVERED).strip(), replace=True)
    db.create_view("stream_summary", STREAM_SUMMARY_21.strip(), replace=True)


@_migration("0022_a2a_usage_openai_and_mcp_texts")
def _a2a_usage_openai_and_mcp_texts(db: sqlite_utils.Database) -> None:
    # Read again what the readers read otherwise now: an A2A stream's usage in $usage's own
    # camelCase (early schema 7 logs left its token counts empty), and an OpenAI chunk's
    # event text, which holds its reasoning and its other choices' text beside its piece of
    # the answer (searchable); an MCP event that holds a JSON-RPC batch, read message by
    # message.
    from .reread import reread_a2a_usage, reread_log  # noqa: PLC0415 (as in 0007)

    reread_a2a_usage(db.conn)
    reread_log(db.conn, ("openai", "mcp"))


SCHEMA_VERSION = len(KNOWN)

# The writer's catch-up of the full-text index: the text of the events after the last one
# committed (each commit indexes its own events, and a migration that makes the index
# anew indexes all).
INDEXED_THROUGH = "SELECT coalesce(max(rowid), 0) FROM events"
INDEX_TEXT = (
    "INSERT INTO events_fts (rowid, text) SELECT rowid, text FROM events WHERE rowid > ? AND text IS NOT NULL"
)


PAGE_SIZE = 16384  # a new log's; older logs keep theirs
BUSY_MS = 5000  # how long an opener waits for another process's lock on the log
# How long a reader waits for an empty file to become a log: a writer that has just made
# the file (its lock, its connection) has yet to make the log in it, which on a loaded
# machine took more than a second. A file left empty for longer is no log being made, and
# is refused at once.
EMPTY_WAIT_S = 5.0


@cache
def least_log_size() -> int:
    """What an empty log takes, in bytes: the least cap on a log's size (``max_bytes``),
    as a new log is that big before its first row."""
    db = sqlite_utils.Database(sqlite3.connect(":memory:", isolation_level=None))
    try:
        db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
        new_log.create(db, migrations, KNOWN)
        (pages,) = db.execute("PRAGMA page_count").fetchone()
    finally:
        db.close()
    return int(pages) * PAGE_SIZE


def check_log_size(max_bytes: int) -> None:
    """A UsageError for a cap on a log's size below what an empty log takes: the log would
    be past it at once."""
    least = least_log_size()
    if max_bytes < least:
        raise UsageError(
            f"an empty log takes {least:,} bytes, so the log cannot be kept within {max_bytes:,}: "
            f"give {least:,} or more"
        )


def open_db(
    path: str | Path, *, readonly: bool = False, check_same_thread: bool = True
) -> sqlite_utils.Database:
    """Open (creating and upgrading as needed) an event log; refuse what is not one."""
    path = Path(path)
    kind = kind_of(path) if path.is_file() else FileKind.EMPTY
    if kind is FileKind.FLOWS or (kind is FileKind.CASSETTE and is_cassette(path)):
        # (SQLite would say only "file is not a database")
        raise LogError(
            f"{path} is {kind}, not an event log: tasktape import {path} --db LOG reads it into one"
        )
    try:
        if readonly:
            conn = sqlite3.connect(read_only_uri(path), uri=True, check_same_thread=check_same_thread)
        else:
            conn = sqlite3.connect(path, check_same_thread=check_same_thread, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        db = sqlite_utils.Database(conn)
        _check_and_upgrade(db, path, readonly=readonly)
    except sqlite3.DatabaseError as exc:
        note = damage_note(path, exc) or _side_files_note(path, exc)
        raise LogError(f"cannot open {path} as an event log: {exc}{note}") from exc
    return db


def _side_files_note(path: Path, exc: sqlite3.DatabaseError) -> str:
    """What an error writing the log adds when its cause is the log's side files (``-wal``,
    ``-shm``): made by a read of the log as another user (SQLite gives them the log's
    mode), this user cannot write them, and SQLite says only "readonly database"."""
    if result_code(exc) != sqlite3.SQLITE_READONLY:
        return ""
    real = Path(os.path.realpath(path))  # (SQLite makes them beside the file a link names)
    sides = [real.with_name(real.name + suffix) for suffix in ("-wal", "-shm")]
    unwritable = [side for side in sides if side.exists() and not os.access(side, os.W_OK)]
    if not unwritable:
        return ""
    owners = ", ".join(dict.fromkeys(_owner(side) for side in unwritable))
    said = f": its side files {', '.join(str(side) for side in unwritable)} belong to {owners}, "
    wal = sides[0]
    if wal.exists() and wal.stat().st_size:  # it may hold committed rows: never to be removed
        return said + "and this user cannot write them: their owner (or root) can give them to this user"
    return said + (
        "who read the log, and this user cannot write them: once no process has the log open, "
        "they can be removed (the -wal is empty; SQLite makes them anew)"
    )


def _owner(path: Path) -> str:
    uid = path.stat().st_uid
    try:
        return f"the user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:  # (a uid without a name here)
        return f"uid {uid}"


def _check_and_upgrade(db: sqlite_utils.Database, path: Path, *, readonly: bool) -> None:
    applied = _applied(db, path)
    if len(applied) < len(KNOWN):  # (a log of this version, the usual case, is read once)
        if readonly:
            _check_for_reading(db, path, applied)
        else:
            _make_or_upgrade(db, path, applied)
    if not readonly:
        db.enable_wal()
        db.execute("PRAGMA synchronous = NORMAL")


def _applied(db: sqlite_utils.Database, path: Path) -> list[str]:
    """The migrations the log has had; a SchemaTooNew if this version does not know one."""
    applied = [m.name for m in migrations.applied(db)]
    unknown = [name for name in applied if name not in KNOWN]
    if unknown:
        raise SchemaTooNew(
            f"{path} was written by a newer tasktape (schema migrations {', '.join(unknown)} "
            f"are unknown to this version, which knows schema version {SCHEMA_VERSION}); "
            "upgrade tasktape to read it"
        )
    return applied


def _refuse_other_database(db: sqlite_utils.Database, path: Path) -> None:
    if db.table_names():
        raise LogError(f"{path} is an SQLite database but not a tasktape event log")


def _make_or_upgrade(db: sqlite_utils.Database, path: Path, applied: list[str]) -> None:
    """Make the log, or upgrade it, in one exclusive transaction: another process opening it
    meanwhile waits for the lock (its busy timeout), then finds the log made, never half of
    it; and of several at once, one makes it and the others find it made."""
    if not applied:
        # A new log: pages of 16 KiB hold more rows each, so that an event row costs its
        # B-trees about an eighth fewer instructions to insert than with 4 KiB pages. (Set
        # before the transaction, in which SQLite no longer changes it; a database that
        # is not empty keeps its own.)
        db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    else:  # (whoever upgrades it, with the writer lock or before taking it, as merge does)
        refuse_writer_of_0_1_0(path)
    db.execute("BEGIN EXCLUSIVE")
    try:
        applied = _applied(db, path)  # again, under the lock: another may have made it
        if not applied:
            _refuse_other_database(db, path)
            new_log.create(db, migrations, KNOWN)
        elif len(applied) < len(KNOWN):
            migrations.apply(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:
            db.execute("ROLLBACK")
        raise


def _applied_once_made(db: sqlite_utils.Database, path: Path, applied: list[str]) -> list[str]:
    """The migrations of a log opened for reading, once it is made: a file still empty may
    be one a writer has just made (its lock, its connection) and is about to make a log of."""
    deadline = time.monotonic() + EMPTY_WAIT_S
    while not applied and _made_lately(path) and time.monotonic() < deadline:
        # Looked at before the read: a file no longer empty is read once its writer's lock
        # is gone, as the whole log (or whatever else it is), never half of one.
        if not _is_empty(path):
            return _applied(db, path)
        time.sleep(0.02)
        applied = _applied(db, path)
    return applied


def _is_empty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == 0


def _made_lately(path: Path) -> bool:
    """Whether the file was made (or written) within ``EMPTY_WAIT_S``: a log may be being
    made in it."""
    try:
        return time.time() - path.stat().st_mtime < EMPTY_WAIT_S
    except OSError:
        return False


def _check_for_reading(db: sqlite_utils.Database, path: Path, applied: list[str]) -> None:
    """Refuse, for reading, what is no log (yet) or a log older than this version's."""
    applied = _applied_once_made(db, path, applied)
    if not applied:
        _refuse_other_database(db, path)
        raise LogError(f"{path} is empty: not an event log")  # nothing to read, nothing to upgrade
    if len(applied) < len(KNOWN):
        raise SchemaTooOld(
            f"{path} uses schema version {len(applied)}, older than this tasktape's "
            f"{SCHEMA_VERSION}: upgrade it in place with: tasktape upgrade {shlex.quote(str(path))}"
        )


def named_kind(path: Path) -> FileKind:
    """The kind of a file as a message names it: ``kind_of``'s, but an SQLite database
    without tasktape's migrations is another program's, and text that does not begin as a
    cassette is none."""
    kind = kind_of(path)
    if kind is FileKind.LOG and _is_other_database(path):
        return FileKind.DATABASE
    if kind is FileKind.CASSETTE and not is_cassette(path):
        return FileKind.OTHER
    return kind


def _is_other_database(path: Path) -> bool:
    """Whether the SQLite database at ``path`` opens and holds none of tasktape's
    migrations (another program's, or an empty one); not one that fails to open (a log
    cut short or damaged), which reading it tells apart."""
    try:
        with closing(sqlite3.connect(read_only_uri(path), uri=True)) as conn:
            return not list(migrations.applied(sqlite_utils.Database(conn)))
    except (sqlite3.DatabaseError, LogError):
        return False


def schema_version(path: str | Path, *, whole: bool = False) -> int:
    """The schema version of the log at ``path``, read without changing it; a LogError for
    what is no log (another SQLite database, an empty one). ``whole``: every page of it
    read first (``PRAGMA quick_check``), a damaged log refused."""
    path = Path(path)
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
    except sqlite3.DatabaseError as exc:
        raise LogError(f"cannot open {path} as an event log: {exc}") from None
    try:
        if whole:
            _check_whole(conn, path)
        db = sqlite_utils.Database(conn)
        version = len(list(migrations.applied(db)))
        tables = db.table_names()
    except sqlite3.DatabaseError as exc:
        raise LogError(f"cannot open {path} as an event log: {exc}{damage_note(path, exc)}") from None
    finally:
        conn.close()
    if not version:
        what = "an SQLite database but not" if tables else "an empty SQLite database, not"
        raise LogError(f"{path} is {what} a tasktape event log")
    return version


def _check_whole(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a damaged log: SQLite reads every page, as a query may come to."""
    problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise LogError(f"cannot open {path} as an event log: the log is damaged ({problems[0]})")


def upgrade_log(path: str | Path) -> tuple[int, int]:
    """Bring a log of an older tasktape to this version's schema, in place, under its
    writer lock (a recorder still writing it is refused); its versions before and after.
    A log at this version (or a newer one's) is left as it is, without the lock: a
    recorder writing it is no reason to refuse saying so. A damaged log is refused."""
    path = Path(path)
    before = schema_version(path, whole=True)  # (refuses what is no log, or a damaged one)
    if before >= SCHEMA_VERSION:
        return before, SCHEMA_VERSION
    fd = take_writer_lock(path)
    try:
        open_db(path).close()
    finally:
        release_writer_lock(fd)
    return before, SCHEMA_VERSION


if __name__ == "__main__":  # python -m tasktape.eventlog.schema: new_log.sql written again
    new_log.write(migrations)
    print(f"wrote {new_log.NEW_LOG_SQL}")
