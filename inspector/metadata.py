"""Datasette metadata for an event log: titles and descriptions of every table, view and
column, sorts, facets, label columns, canned queries, full-text search and the dashboards."""

from __future__ import annotations

import itertools
from typing import Any

from datasette.utils import tilde_encode

from tasktape.eventlog.schema import VIEWS as VIEW_SQL

from .display import STATE_COLOURS, UNKNOWN_STATE_COLOUR, short_state

PLUGIN = "tasktape"  # its per-database configuration marks the databases that are event logs
VIEWS = frozenset(VIEW_SQL)

HIDDEN = (
    "_sqlite_migrations",
    "events_fts",
    "events_fts_config",
    "events_fts_data",
    "events_fts_docsize",
    "events_fts_idx",
)

_ORIGIN = "since the request arrived"

TABLES: dict[str, dict[str, Any]] = {
    "captures": {
        "title": "Captures",
        "description": "One row per recording run or import.",
        "label_column": "source",
        "sort_desc": "id",
        "facets": ["source", "upstream"],
        "columns": {
            "id": "Capture id",
            "started_at": "When the run started (UTC ISO 8601)",
            "ended_at": "When the run ended (UTC ISO 8601)",
            "source": "What wrote it: record, import, ...",
            "upstream": "The agent's base URL, when recording",
            "tool_version": "The tasktape version that wrote it",
            "argv": "The command line, as a JSON array",
        },
    },
    "exchanges": {
        "title": "Exchanges",
        "description": "One row per HTTP request and its response, streamed or not.",
        "label_column": "path",
        "facets": ["rpc_method", "binding", "outcome", "is_sse", "status"],
        "columns": {
            "id": "Exchange id",
            "capture_id": "The capture it belongs to",
            "started_at": "When the request arrived (UTC ISO 8601, µs)",
            "started_ns": "The same, as nanoseconds since the Unix epoch",
            "method": "Request method",
            "path": "Request path",
            "query": "Query string, without ?",
            "request_headers": "Request headers: a JSON array of [name, value] pairs, credentials redacted",
            "request_body": "Request body (text when UTF-8)",
            "status": "Response status",
            "response_headers": "Response headers: a JSON array of [name, value] pairs, credentials redacted",
            "response_body": "Body of a response that is not an event stream",
            "is_sse": "1 for a text/event-stream response",
            "binding": "A2A binding: rest or jsonrpc",
            "rpc_method": "The A2A operation (SendStreamingMessage, GetTask, ...)",
            "task_id": "The task, from the request or the stream",
            "context_id": "The context, from the request or the stream",
            "ttfb_ns": "Request arrival to response headers (shown in ms)",
            "duration_ns": "Request arrival to the end of the response (shown in ms)",
            "outcome": "How it ended: complete, client_disconnected, upstream_disconnected, ...",
            "error": "What went wrong, when something did",
            "request_body_truncated": "1 when the request body was longer than the recorder kept",
            "response_body_truncated": "1 when the response body was longer than the recorder kept",
            "body_encoding": "The Content-Encoding the stored response body was decoded from",
        },
    },
    "chunks": {
        "title": "Chunks",
        "description": "Response bodies exactly as received, chunk by chunk, with arrival times.",
        "columns": {
            "exchange_id": "The exchange",
            "seq": "0, 1, 2... in arrival order",
            "offset_ns": f"Arrival {_ORIGIN} (shown in ms)",
            "data": "The bytes",
        },
    },
    "events": {
        "title": "Events",
        "description": "Every Server-Sent Event, decoded and classified as an A2A frame. "
        "Search matches the text of the parts.",
        "facets": ["kind", "state", "artifact_type"],
        "fts_table": "events_fts",
        "fts_pk": "rowid",
        "columns": {
            "exchange_id": "The exchange whose stream carried it",
            "seq": "0, 1, 2... in stream order",
            "offset_ns": f"Arrival of the chunk that completed it, {_ORIGIN} (shown in ms)",
            "event_id": "The SSE id given in its own lines",
            "last_event_id": "The last event id in force: what a client would resume from",
            "event_type": "The SSE event field (empty: message)",
            "data": "The event's data",
            "retry": "The SSE retry field",
            "complete": "0 only for an unterminated tail at the end of a stream",
            "kind": "task, message, statusUpdate, artifactUpdate, error or other",
            "task_id": "The task",
            "context_id": "The context",
            "state": "Task state, for task and status events",
            "artifact_id": "Artifact id, for artifact events",
            "artifact_type": "The artifact's metadata.type, e.g. intermediate-thinking",
            "append": "1: this delta appends to the artifact; 0: it starts or replaces it",
            "last_chunk": "1: this event closes the artifact",
            "text": "Text parts joined",
            "usage": "The $usage metadata: model, tokens, credits",
            "parse_error": "Why the data is not a readable frame",
        },
    },
    "findings": {
        "title": "Findings",
        "description": "Lifecycle rules broken, as saved by tasktape check (the task pages check live).",
        "facets": ["rule"],
        "sort_desc": "id",
        "columns": {
            "id": "Finding id",
            "checked_at": "When the check ran (UTC ISO 8601)",
            "rule": "The rule broken",
            "task_id": "The task",
            "exchange_id": "The exchange where it was seen",
            "seq": "The event's seq in that exchange",
            "message": "What is wrong",
        },
    },
    "task_summary": {
        "title": "Tasks",
        "description": "One row per task, streamed or not, in order of the exchange that first "
        "carried it: final state, timing, the answer reassembled from its deltas, the "
        "intermediate thinking, usage and credits. A task object answered later without a "
        "stream (a GetTask after a dropped stream) wins. A task id opens the task's page.",
        "facets": ["final_state", "model"],
        "columns": {
            "task_id": "The task (opens its page)",
            "context_id": "Its context",
            "first_seen": "Its first event or answer (UTC)",
            "last_seen": "Its last event or answer (UTC)",
            "final_state": "The state it was last seen in",
            "events": "Events recorded",
            "exchanges": "Exchanges that carried its events or answered it",
            "ttfe_ms": "Time to first event: its first request to its first event",
            "duration_ms": "Its first request to the last time it was seen",
            "answer": "The answer artifacts, reassembled",
            "thinking": "The intermediate-thinking artifacts, reassembled",
            "model": "Model, from $usage",
            "input_tokens": "Input tokens, from $usage",
            "output_tokens": "Output tokens, from $usage",
            "cached_input_tokens": "Input tokens served from the prompt cache",
            "total_tokens": "Total tokens billed",
            "credits": "Credits charged",
        },
    },
    "task_answers": {
        "title": "Tasks answered without a stream",
        "description": "One row per task object in an answer that was not streamed: a SendMessage "
        "without streaming, a GetTask, a CancelTask.",
        "facets": ["state"],
        "columns": {
            "exchange_id": "The exchange that answered it",
            "task_id": "The task (opens its page)",
            "context_id": "Its context",
            "at": "When the answer was complete (UTC)",
            "at_ns": "The same, in ns since the epoch",
            "state": "The task's state in the answer",
            "task": "The task object, as answered",
        },
    },
    "task_timeline": {
        "title": "Task timelines",
        "description": "Every event of every task in time order, with the gap since the task's "
        "previous event.",
        "facets": ["kind", "state", "artifact_type"],
        "columns": {
            "task_id": "The task (opens its page)",
            "exchange_id": "The exchange that carried it",
            "seq": "Its seq in that exchange",
            "at": "When it arrived (UTC)",
            "offset_ms": f"Arrival {_ORIGIN} of its exchange",
            "gap_ms": "Time since the task's previous event",
            "kind": "task, message, statusUpdate, artifactUpdate, error or other",
            "state": "Task state, for task and status events",
            "artifact_id": "Artifact id",
            "artifact_type": "The artifact's metadata.type",
            "append": "1: appends to the artifact",
            "last_chunk": "1: closes the artifact",
            "text": "Text parts joined",
            "event_id": "The SSE id",
            "complete": "0 for a cut-off tail",
            "parse_error": "Why the data is not a readable frame",
        },
    },
    "task_artifacts": {
        "title": "Artifacts",
        "description": "One row per artifact of a task, its text reassembled: the last lastChunk "
        "consolidation, else the deltas in order.",
        "facets": ["artifact_type", "closed"],
        "columns": {
            "task_id": "The task (opens its page)",
            "artifact_id": "Artifact id",
            "artifact_type": "metadata.type: intermediate-thinking, or empty for an answer",
            "events": "Events that carried it",
            "closed": "1 when a lastChunk event closed it",
            "first_seen": "Its first event (UTC)",
            "text": "Its text, reassembled",
        },
    },
    "exchange_metrics": {
        "title": "Exchange metrics",
        "description": "One row per exchange: chunks, bytes, events, time to first byte, time to "
        "first event and duration.",
        "facets": ["rpc_method", "binding", "outcome", "is_sse"],
        "columns": {
            "exchange_id": "The exchange",
            "capture_id": "Its capture",
            "started_at": "When the request arrived (UTC)",
            "method": "Request method",
            "path": "Request path",
            "status": "Response status",
            "binding": "rest or jsonrpc",
            "rpc_method": "The A2A operation",
            "task_id": "The task (opens its page)",
            "is_sse": "1 for an event stream",
            "outcome": "How it ended",
            "chunks": "Chunks received",
            "bytes": "Bytes received",
            "events": "Events decoded",
            "ttfb_ms": "Time to first byte (response headers)",
            "ttfe_ms": "Time to first event",
            "duration_ms": "Request arrival to the end of the response",
        },
    },
}

QUERIES: dict[str, dict[str, Any]] = {
    "task_timeline_of": {
        "title": "Timeline of a task",
        "description": "Every event of one task in time order, with the gap since its previous "
        "event. Task ids are listed under Tasks.",
        "sql": """SELECT task_id, exchange_id, seq, offset_ms, gap_ms, kind, state, artifact_type,
  append, last_chunk, text, event_id, complete
FROM task_timeline
WHERE task_id = :task_id""",
    },
    "tasks_by_final_state": {
        "title": "Tasks by final state",
        "description": "Tasks that ended in a state: COMPLETED, FAILED, CANCELED, REJECTED, "
        "INPUT_REQUIRED, AUTH_REQUIRED, WORKING... (any case, with or without TASK_STATE_).",
        "sql": """SELECT task_id, final_state, first_seen, events, ttfe_ms, duration_ms, credits,
  substr(answer, 1, 200) AS answer
FROM task_summary
WHERE final_state = 'TASK_STATE_' || upper(replace(replace(trim(:state), ' ', '_'), 'TASK_STATE_', ''))
   OR final_state = upper(trim(:state))
ORDER BY first_seen""",
    },
    "slowest_first_event": {
        "title": "Slowest time to first event",
        "description": "Streams by time from the request to their first event, slowest first; "
        "only those that took at least :at_least_ms ms (empty: all).",
        "sql": """SELECT exchange_id, task_id, started_at, rpc_method, binding, ttfb_ms, ttfe_ms,
  duration_ms, events, outcome
FROM exchange_metrics
WHERE is_sse = 1 AND ttfe_ms >= CAST(:at_least_ms AS REAL)
ORDER BY ttfe_ms DESC
LIMIT 100""",
    },
    "search_event_text": {
        "title": "Search event text",
        "description": "Events whose text holds these words, as a phrase (full-text search; "
        "deltas, consolidated artifacts and status messages alike).",
        "sql": """SELECT e.task_id, e.exchange_id, e.seq, e.kind, e.state, e.artifact_type,
  snippet(events_fts, 0, '[', ']', '…', 16) AS matched
FROM events_fts JOIN events e ON e.rowid = events_fts.rowid
WHERE events_fts MATCH '"' || replace(:text, '"', '""') || '"'
ORDER BY events_fts.rank
LIMIT 500""",
    },
}

# Charts (datasette-dashboards: Vega-Lite, bundled, so they draw offline).
_STATE_SCALE = {
    "domain": [*map(short_state, STATE_COLOURS), "none"],
    "range": [*STATE_COLOURS.values(), UNKNOWN_STATE_COLOUR],
}
_SHORT_STATE = "coalesce(replace(final_state, 'TASK_STATE_', ''), 'none') AS state"
_HEIGHT = 240
_GAP_BINS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


_GAP_LABELS = [f"{lo}-{hi} ms" for lo, hi in itertools.pairwise((0, *_GAP_BINS))] + [f"{_GAP_BINS[-1]}+ ms"]
_GAP_BIN = (
    "CASE "
    + " ".join(
        f"WHEN gap_ms < {hi} THEN '{label}'" for hi, label in zip(_GAP_BINS, _GAP_LABELS, strict=False)
    )
    + f" ELSE '{_GAP_LABELS[-1]}' END"
)


def _metric(title: str, db: str, sql: str) -> dict[str, Any]:
    return {"title": title, "db": db, "query": sql, "library": "metric", "display": {"field": "n"}}


def _chart(title: str, db: str, sql: str, mark: str, **encoding: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": title,
        "db": db,
        "query": sql,
        "library": "vega-lite",
        "display": {"mark": {"type": mark, "tooltip": True}, "height": _HEIGHT, "encoding": encoding},
    }


def dashboards(db: str) -> dict[str, Any]:
    """The datasette-dashboards configuration: one dashboard of the streams in ``db``."""
    state_colour = {"field": "state", "type": "nominal", "title": "final state", "scale": _STATE_SCALE}
    return {
        "streams": {
            "title": "Streams at a glance",
            "description": "Time to first event, the gaps between events, and events per task, "
            "across the whole log. Hover a bar for its figures.",
            "layout": [
                ["tasks", "events", "streams", "credits"],
                ["ttfe", "ttfe", "gaps", "gaps"],
                ["per_task", "per_task", "per_task", "states"],
            ],
            "charts": {
                "tasks": _metric("Tasks", db, "SELECT count(*) AS n FROM task_summary"),
                "events": _metric("Events", db, "SELECT count(*) AS n FROM events"),
                "streams": _metric("Streams", db, "SELECT count(*) AS n FROM exchanges WHERE is_sse = 1"),
                "credits": _metric(
                    "Credits", db, "SELECT round(coalesce(sum(credits), 0), 2) AS n FROM task_summary"
                ),
                "ttfe": _chart(
                    "Time to first event: the slowest 30 streams",
                    db,
                    """SELECT '#' || exchange_id || ' ' || coalesce(rpc_method, path) AS stream,
  ttfe_ms, ttfb_ms, coalesce(binding, 'other') AS binding, task_id
FROM exchange_metrics WHERE is_sse = 1 AND ttfe_ms IS NOT NULL
ORDER BY ttfe_ms DESC LIMIT 30""",
                    "bar",
                    y={"field": "stream", "type": "nominal", "sort": "-x", "title": None},
                    x={"field": "ttfe_ms", "type": "quantitative", "title": "ms from the request"},
                    color={"field": "binding", "type": "nominal", "title": "binding"},
                ),
                "gaps": _chart(
                    "Gaps between a task's events",
                    db,
                    f"""SELECT {_GAP_BIN} AS gap, kind, count(*) AS events
FROM task_timeline WHERE gap_ms IS NOT NULL
GROUP BY 1, 2""",
                    "bar",
                    x={
                        "field": "gap",
                        "type": "ordinal",
                        "sort": _GAP_LABELS,
                        "title": "gap before the event",
                    },
                    y={"field": "events", "type": "quantitative", "title": "events"},
                    color={"field": "kind", "type": "nominal", "title": "event kind"},
                ),
                "per_task": _chart(
                    "Events per task: the busiest 40",
                    db,
                    f"""SELECT substr(task_id, -12) AS task, task_id, events, exchanges, {_SHORT_STATE},
  duration_ms
FROM task_summary ORDER BY events DESC LIMIT 40""",
                    "bar",
                    x={"field": "task", "type": "nominal", "sort": "-y", "title": "task (end of its id)"},
                    y={"field": "events", "type": "quantitative", "title": "events"},
                    color=state_colour,
                ),
                "states": _chart(
                    "Final states",
                    db,
                    f"SELECT {_SHORT_STATE}, count(*) AS tasks FROM task_summary GROUP BY 1",
                    "bar",
                    y={"field": "state", "type": "nominal", "sort": "-x", "title": None},
                    x={"field": "tasks", "type": "quantitative", "title": "tasks"},
                    color={**state_colour, "legend": None},
                ),
            },
        }
    }


def metadata(db: str) -> dict[str, Any]:
    """Datasette metadata for the event log served as database ``db``."""
    tables: dict[str, dict[str, Any]] = {name: dict(meta) for name, meta in TABLES.items()}
    tables.update({name: {"hidden": True} for name in HIDDEN})
    return {
        "title": "tasktape inspector",
        "description_html": (
            f"Recorded A2A traffic. Start with <a href='/{tilde_encode(db)}/task_summary'>Tasks</a> "
            "(a task id opens its whole run), the <a href='/-/dashboards/streams'>charts</a>, or "
            f"the <a href='/{tilde_encode(db)}'>tables and canned queries</a>."
        ),
        "databases": {
            db: {
                "title": f"Event log {db}",
                "description": "Captured exchanges, their chunks and events, and views that read "
                "like the protocol. Tasks opens each task's whole run.",
                "tables": tables,
                "queries": QUERIES,
                "plugins": {PLUGIN: {}},
            }
        },
        "plugins": {"datasette-dashboards": dashboards(db)},
    }
