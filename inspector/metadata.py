"""Datasette metadata for an event log: titles and descriptions of every table, view and
column, sorts, facets, label columns, canned queries, full-text search and the dashboards."""

from __future__ import annotations

import itertools
from typing import Any

from datasette.utils import tilde_encode

from tasktape.eventlog.protocols import ProtocolName
from tasktape.eventlog.protocols.mcp import FAILED as MCP_FAILED
from tasktape.eventlog.resumes import ResumeOutcome
from tasktape.eventlog.schema import VIEWS as VIEW_SQL

from .display import PROTOCOL_COLOURS, STATE_COLOURS, UNKNOWN_STATE_COLOUR, short_state
from .session_page import SESSION_OF_X
from .stream_page import LLM_PROTOCOLS, NOT_TOKENS

PLUGIN = "tasktape"  # its per-database configuration marks the databases that are event logs
VIEWS = frozenset({*VIEW_SQL, "stream_summary", "chunks"})

HIDDEN = (
    "_sqlite_migrations",
    "events_fts",
    "events_fts_config",
    "events_fts_data",
    "events_fts_idx",
    "shipments",  # tasktape record --ship's cursor, per destination
)

_ORIGIN = "since the request arrived"
_SESSION = SESSION_OF_X  # an MCP exchange's session, as its page names it
_LLM = ", ".join(f"'{p}'" for p in sorted(LLM_PROTOCOLS))  # the protocols with a stream page
_NOT_TOKENS = ", ".join(f"'{k}'" for k in sorted(NOT_TOKENS))  # events whose text is no token
_MCP_FAILED = ", ".join(f"'{f}'" for f in sorted(MCP_FAILED))  # the finishes of a request that failed

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
            "uid": "The capture's id across logs (a UUIDv7): the same in every log it is merged into",
        },
    },
    "exchanges": {
        "title": "Exchanges",
        "description": "One row per HTTP request and its response, streamed or not, with the "
        "protocol that claimed it and what its response came to. A session id opens its MCP session.",
        "label_column": "path",
        "facets": ["protocol", "rpc_method", "binding", "outcome", "is_sse", "status"],
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
            "rpc_method": "The operation: A2A's (SendStreamingMessage, GetTask, ...), MCP's JSON-RPC "
            "method (tools/call, ...; GET, DELETE), the LLM API call (chat.completions, responses, messages)",
            "task_id": "The task, from the request or the stream",
            "context_id": "The context, from the request or the stream",
            "ttfb_ns": "Request arrival to response headers (shown in ms)",
            "duration_ns": "Request arrival to the end of the response (shown in ms)",
            "outcome": "How it ended: complete, client_disconnected, upstream_disconnected, ...",
            "error": "What went wrong, when something did",
            "request_body_truncated": "1 when the request body was longer than the recorder kept",
            "response_body_truncated": "1 when the response body was longer than the recorder kept",
            "body_encoding": "The Content-Encoding the stored response body was decoded from",
            "request_body_encoding": "The Content-Encoding the stored request body was decoded from",
            "protocol": "The protocol that claimed it: a2a, mcp, openai, anthropic",
            "session_id": "MCP's Mcp-Session-Id (opens the session's page)",
            "model": "The model the response reported",
            "answer": "What the response comes to: the answer reassembled, a tool result's text",
            "input_tokens": "Input tokens, the cached ones too, as the response counted them",
            "cached_input_tokens": "Of the input tokens, those read from the API's prompt cache",
            "output_tokens": "Output tokens, as the response counted them",
            "finish": "How it finished: finish_reason, stop_reason, a Responses status, an A2A state, "
            "MCP's result, tool_error (a tool that failed: isError) or error",
            "tool_calls": "The tools an LLM's answer calls (JSON: id, name, arguments as written)",
            "uid": "The exchange's id across logs: a UUIDv7 of the moment the request arrived",
        },
    },
    "chunks": {
        "title": "Chunks",
        "description": "Response bodies exactly as received, chunk by chunk, with arrival times: "
        "the stored chunks, and the chunks of whole events, written back from their rows.",
        "columns": {
            "exchange_id": "The exchange",
            "seq": "0, 1, 2... in arrival order",
            "offset_ns": f"Arrival {_ORIGIN} (shown in ms)",
            "data": "The bytes",
        },
    },
    "stored_chunks": {
        "title": "Stored chunks",
        "description": "The chunks stored as they came: all but those of whole events "
        "(read chunks for every one).",
        "columns": {
            "exchange_id": "The exchange",
            "seq": "Its place among all the exchange's chunks",
            "offset_ns": f"Arrival {_ORIGIN} (shown in ms)",
            "data": "The bytes",
        },
    },
    "events": {
        "title": "Events",
        "description": "Every Server-Sent Event, decoded and classified by its exchange's protocol. "
        "Search matches the text each event adds.",
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
            "chunk_seq": "The chunk of whole events it is in, written back from their rows (else empty: "
            "its bytes are in stored_chunks)",
            "chunk_crlf": "1: that chunk's lines end in CRLF",
            "chunk_events": "On the first event of a chunk of several: how many it holds (0 on the others)",
            "kind": "What it is, in its protocol's terms: A2A's task, statusUpdate, artifactUpdate...; "
            "MCP's request, response, notification, log, error, priming; OpenAI's delta, refusal, finish, "
            "usage, done; Anthropic's event types",
            "task_id": "The task",
            "context_id": "The context",
            "state": "A2A task state; OpenAI finish_reason or Responses status; Anthropic stop_reason; "
            "MCP result, tool_error or error",
            "artifact_id": "Artifact id, for artifact events",
            "artifact_type": "The artifact's metadata.type, e.g. intermediate-thinking",
            "append": "1: this delta appends to the artifact; 0: it starts or replaces it",
            "last_chunk": "1: this event closes the artifact",
            "text": "What it adds: A2A text parts joined, a token delta or refusal, an MCP progress "
            "message, log message (its level, then its data) or result",
            "usage": "Model and tokens: A2A's $usage (with credits), an LLM stream's counts",
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
    "resumes": {
        "title": "Reconnects",
        "description": "What a resuming recorder (tasktape record --resume) did when a side of a "
        "stream reconnected: a client coming back with Last-Event-ID, or the agent's stream "
        "subscribed to again after it broke. The task pages mark them on their time axis.",
        "facets": ["side", "outcome"],
        "sort_desc": "id",
        "columns": {
            "id": "Reconnect id",
            "exchange_id": "The stream resumed",
            "at": "When (UTC ISO 8601)",
            "at_ns": "The same, as nanoseconds since the Unix epoch",
            "side": "client: a client reconnected; upstream: the recorder subscribed to the agent again",
            "last_event_id": "The client's Last-Event-ID, or the last event clients had been sent",
            "events_from_log": "Events sent from the log (client), or caught up against (upstream)",
            "new_exchange_id": "The reconnecting request's exchange, or the subscribe's",
            "outcome": f"How it went: {', '.join(ResumeOutcome)}",
            "attempts": "Subscribes sent (upstream)",
            "synthesized": "Ids of the events the recorder made up to catch clients up, a JSON array",
            "error": "Why it was refused or gave up, or what the gap lacked",
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
            "duration_ms": "Its first request to the last time it was seen (a reconnect sent "
            "again what a stream held does not count)",
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
        # No facets: each would compute the view's gaps over the whole log (seconds on a
        # big one); the events table facets the same columns from its own rows.
        "description": "Every event of every task in time order, with the gap since the task's "
        "previous event. Events has the same kinds, states and artifact types as facets.",
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
        "description": "One row per artifact a task's streams carried, its text reassembled as "
        "its events left it: the last that does not append (a first delta, a lastChunk "
        "consolidation, a later turn's new text), then those that append after it. An artifact "
        "only a task object answered without a stream holds is in that answer (Tasks answered "
        "without a stream).",
        "facets": ["artifact_type", "closed"],
        "columns": {
            "task_id": "The task (opens its page)",
            "artifact_id": "Artifact id",
            "artifact_type": "metadata.type: intermediate-thinking, or empty for an answer",
            "events": "Events that carried it to a client",
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
    "stream_summary": {
        "title": "Stream summaries",
        "description": "One row per exchange of a known protocol: what its response came to (the "
        "model, the answer, tokens, how it finished) and how fast. An exchange id opens its LLM "
        "stream's page, or its MCP session's.",
        "facets": ["protocol", "model", "finish"],
        "columns": {
            "exchange_id": "The exchange (opens its stream or session page)",
            "protocol": "a2a, mcp, openai or anthropic",
            "model": "The model the response reported (not the alias asked for)",
            "answer": "The answer reassembled from the deltas, a tool result's text, an error",
            "input_tokens": "Input tokens, the cached ones too, as the response counted them",
            "cached_input_tokens": "Of the input tokens, those read from the API's prompt cache",
            "output_tokens": "Output tokens, as the response counted them",
            "finish": "finish_reason, stop_reason, a Responses status, an A2A state, MCP result, "
            "tool_error or error",
            "tool_calls": "The tools an LLM's answer calls (JSON: id, name, arguments as written)",
            "events": "Events in its stream",
            "ttfe_ms": "Time to first event (or first byte of a body that is not a stream)",
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
        "INPUT_REQUIRED, AUTH_REQUIRED, WORKING... (any case, with or without TASK_STATE_, words "
        "joined by _, - as A2A 0.3 spells them, or a space).",
        # Spelt as the log spells states: upper case, words joined by _, TASK_STATE_ first.
        "sql": """SELECT task_id, final_state, first_seen, events, ttfe_ms, duration_ms, credits,
  substr(answer, 1, 200) AS answer
FROM task_summary
WHERE final_state = 'TASK_STATE_' || replace(
    upper(replace(replace(trim(:state), ' ', '_'), '-', '_')), 'TASK_STATE_', '')
   OR final_state = upper(trim(:state))
ORDER BY first_seen""",
    },
    "slowest_first_event": {
        "title": "Slowest time to first event",
        "description": "Streams by time from the request to their first event, slowest first; "
        "only those that took at least :at_least_ms ms (a number; empty: all, streams without an "
        "event too; anything else: none).",
        # CAST reads the number a text starts with ('100abc' as 100, 'abc' as 0): the text is
        # a number only when it equals its CAST, compared as a number.
        "sql": """SELECT exchange_id, task_id, started_at, rpc_method, binding, ttfb_ms, ttfe_ms,
  duration_ms, events, outcome
FROM exchange_metrics
WHERE is_sse = 1 AND (
  trim(:at_least_ms) = ''
  OR (CAST(trim(:at_least_ms) AS REAL) = trim(:at_least_ms) AND ttfe_ms >= CAST(trim(:at_least_ms) AS REAL)))
ORDER BY ttfe_ms DESC
LIMIT 100""",
    },
    "mcp_sessions": {
        "title": "MCP sessions",
        "description": "One row per MCP session: its exchanges, the tools it called, errors (JSON-RPC "
        "errors and failed tool calls) and the "
        "findings saved about it. Exchanges without a session id (the stateless revision) are "
        "grouped per capture, as capture-<id> (no name, when a session id takes it). A session id "
        "opens the session's page.",
        "sql": f"""SELECT {_SESSION} AS session_id,
  min(x.started_at) AS started_at,
  count(*) AS exchanges,
  sum(x.rpc_method = 'tools/call') AS tool_calls,
  group_concat(DISTINCT CASE WHEN x.rpc_method = 'tools/call' AND json_valid(x.request_body)
    THEN json_extract(x.request_body, '$.params.name') END) AS tools,
  sum(x.finish IN ({_MCP_FAILED})) AS errors,
  sum((SELECT count(*) FROM findings f WHERE f.exchange_id = x.id)) AS findings,
  round((max(x.started_ns + coalesce(x.duration_ns, x.ttfb_ns, 0)) - min(x.started_ns)) / 1e6, 3)
    AS duration_ms
FROM exchanges x
WHERE x.protocol = '{ProtocolName.MCP}'
GROUP BY 1
ORDER BY min(x.started_ns)""",
    },
    "llm_streams": {
        "title": "LLM streams",
        "description": "One row per OpenAI or Anthropic exchange: the model the stream reported, "
        "tokens, how it finished, time to first token (its first event with text) and the answer. "
        "An exchange id opens the stream's page.",
        "sql": f"""SELECT s.exchange_id, s.protocol, x.rpc_method AS call, x.started_at, s.model, s.finish,
  s.input_tokens, s.output_tokens, s.events,
  (SELECT round(min(e.offset_ns) / 1e6, 3) FROM events e
   WHERE e.exchange_id = s.exchange_id AND e.text <> '' AND e.kind NOT IN ({_NOT_TOKENS})) AS ttft_ms,
  s.duration_ms, substr(s.answer, 1, 200) AS answer
FROM stream_summary s JOIN exchanges x ON x.id = s.exchange_id
WHERE s.protocol IN ({_LLM})
ORDER BY s.exchange_id""",
    },
    "search_event_text": {
        "title": "Search event text",
        "description": "Events whose text holds these words, as a phrase (full-text search; "
        "deltas, consolidated artifacts and status messages alike), the first 500 in the order "
        "they were recorded.",
        # FTS5 reads its query up to a NUL, and an unterminated phrase is an error: text that
        # holds one matches nothing.
        "sql": """SELECT e.task_id, e.exchange_id, e.seq, e.kind, e.state, e.artifact_type,
  snippet(events_fts, 0, '[', ']', '…', 16) AS matched
FROM events_fts JOIN events e ON e.rowid = events_fts.rowid
WHERE events_fts MATCH '"' || replace(CASE WHEN instr(CAST(:text AS BLOB), x'00') THEN '' ELSE :text END,
  '"', '""') || '"'
ORDER BY events_fts.rowid
LIMIT 500""",
    },
}

# Charts (datasette-dashboards: Vega-Lite, bundled, so they draw offline).
_STATE_SCALE = {
    "domain": [*map(short_state, STATE_COLOURS), "none"],
    "range": [*STATE_COLOURS.values(), UNKNOWN_STATE_COLOUR],
}
_SHORT_STATE = "coalesce(replace(final_state, 'TASK_STATE_', ''), 'none') AS state"
_PROTOCOL_SCALE = {
    "domain": [*PROTOCOL_COLOURS, "other"],
    "range": [*PROTOCOL_COLOURS.values(), UNKNOWN_STATE_COLOUR],
}
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
    protocol_colour = {"field": "protocol", "type": "nominal", "title": "protocol", "scale": _PROTOCOL_SCALE}
    return {
        "streams": {
            "title": "Streams at a glance",
            "description": "Every protocol in the log: time to first event, the gaps between a "
            "stream's events and the tokens per model; then A2A's tasks, their events and final "
            "states. Hover a mark for its figures.",
            "layout": [
                ["tasks", "sessions", "llm_streams", "streams", "events", "credits"],
                ["ttfe", "ttfe", "ttfe", "gaps", "gaps", "gaps"],
                ["protocol_ttfe", "protocol_ttfe", "protocol_ttfe", "tokens", "tokens", "tokens"],
                ["per_task", "per_task", "per_task", "per_task", "states", "states"],
            ],
            "charts": {
                "tasks": _metric("A2A tasks", db, "SELECT count(*) AS n FROM task_summary"),
                "sessions": _metric(
                    "MCP sessions",
                    db,
                    f"SELECT count(DISTINCT {_SESSION}) AS n FROM exchanges x "
                    f"WHERE x.protocol = '{ProtocolName.MCP}'",
                ),
                "llm_streams": _metric(
                    "LLM streams",
                    db,
                    f"SELECT count(*) AS n FROM exchanges WHERE protocol IN ({_LLM}) AND is_sse = 1",
                ),
                "streams": _metric(
                    "Streams, every protocol", db, "SELECT count(*) AS n FROM exchanges WHERE is_sse = 1"
                ),
                "events": _metric("Events", db, "SELECT count(*) AS n FROM events"),
                "credits": _metric(
                    "A2A credits",
                    db,
                    # (total(), as the tokens chart has it: integer credits may add up past 64 bits)
                    "SELECT round(total(credits), 2) AS n FROM task_summary",
                ),
                "ttfe": _chart(
                    "Time to first event: the slowest 30 streams",
                    db,
                    """SELECT '#' || m.exchange_id || ' ' || coalesce(m.rpc_method, m.path) AS stream,
  m.ttfe_ms, m.ttfb_ms, coalesce(x.protocol, 'other') AS protocol, m.task_id
FROM exchange_metrics m JOIN exchanges x ON x.id = m.exchange_id
WHERE m.is_sse = 1 AND m.ttfe_ms IS NOT NULL
ORDER BY m.ttfe_ms DESC LIMIT 30""",
                    "bar",
                    y={"field": "stream", "type": "nominal", "sort": "-x", "title": None},
                    x={"field": "ttfe_ms", "type": "quantitative", "title": "ms from the request"},
                    color=protocol_colour,
                ),
                "gaps": _chart(
                    "Gaps between a stream's events",
                    db,
                    f"""SELECT {_GAP_BIN} AS gap, protocol, count(*) AS events
FROM (SELECT coalesce(x.protocol, 'other') AS protocol,
        (e.offset_ns - lag(e.offset_ns) OVER (PARTITION BY e.exchange_id ORDER BY e.seq)) / 1e6 AS gap_ms
      FROM events e JOIN exchanges x ON x.id = e.exchange_id)
WHERE gap_ms IS NOT NULL
GROUP BY 1, 2""",
                    "bar",
                    x={
                        "field": "gap",
                        "type": "ordinal",
                        "sort": _GAP_LABELS,
                        "title": "gap before the event",
                    },
                    y={"field": "events", "type": "quantitative", "title": "events"},
                    color=protocol_colour,
                ),
                "protocol_ttfe": _chart(
                    "Time to first event, per protocol",
                    db,
                    """SELECT protocol, exchange_id, ttfe_ms, duration_ms, model
FROM stream_summary WHERE ttfe_ms IS NOT NULL""",
                    "tick",
                    y={"field": "protocol", "type": "nominal", "title": None},
                    x={"field": "ttfe_ms", "type": "quantitative", "title": "ms from the request"},
                    color={**protocol_colour, "legend": None},
                ),
                "tokens": _chart(
                    "Tokens per model, as the responses counted them",
                    db,
                    # total(), not sum(): counts each within 64 bits may add up past them,
                    # where sum() fails the query ("integer overflow") and the chart with it.
                    """SELECT model, protocol, 'input' AS tokens_of, total(input_tokens) AS tokens
FROM stream_summary WHERE model IS NOT NULL GROUP BY model, protocol
UNION ALL
SELECT model, protocol, 'output', total(output_tokens)
FROM stream_summary WHERE model IS NOT NULL GROUP BY model, protocol""",
                    "bar",
                    y={"field": "model", "type": "nominal", "sort": "-x", "title": None},
                    x={"field": "tokens", "type": "quantitative", "title": "tokens", "stack": True},
                    color={"field": "tokens_of", "type": "nominal", "title": "tokens"},
                ),
                "per_task": _chart(
                    "Events per A2A task: the busiest 40",
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
                    "Final states of A2A tasks",
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
    path = tilde_encode(db)
    return {
        "title": "tasktape inspector",
        "description_html": (
            "Recorded agent traffic: A2A tasks, MCP sessions, OpenAI and Anthropic token streams. "
            f"Start with <a href='/{path}/task_summary'>Tasks</a> (a task id opens its whole run), "
            f"<a href='/{path}/mcp_sessions'>MCP sessions</a> (a session id opens its tool calls), "
            f"<a href='/{path}/llm_streams'>LLM streams</a> (an exchange id opens its stream), "
            "the <a href='/-/dashboards/streams'>charts</a>, or "
            f"the <a href='/{path}'>tables and canned queries</a>."
        ),
        "databases": {
            db: {
                "title": f"Event log {db}",
                "description": "Captured exchanges, their chunks and events, and views that read "
                "like the protocols. Tasks opens each A2A task's whole run, MCP sessions each "
                "session's tool calls, LLM streams each OpenAI or Anthropic stream.",
                "tables": tables,
                "queries": QUERIES,
                "plugins": {PLUGIN: {}},
            }
        },
        "plugins": {"datasette-dashboards": dashboards(db)},
    }
