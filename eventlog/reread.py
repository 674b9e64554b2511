"""A log's exchanges read again with the protocols known now: which protocol each one
speaks, its events classified by that protocol, and what its response comes to. The
schema migration that brought protocols runs it over older logs."""

from __future__ import annotations

import copy
import sqlite3
from typing import Any

from .exchange_rows import event_columns
from .protocols import ProtocolName, recognise_exchange
from .protocols.base import Request, RequestInfo
from .recorded import headers_from_json

_UPDATE_EVENT = (
    "UPDATE events SET kind = ?, task_id = ?, context_id = ?, state = ?, artifact_id = ?,"
    " artifact_type = ?, append = ?, last_chunk = ?, text = ?, usage = ?, parse_error = ?"
    " WHERE exchange_id = ? AND seq = ?"
)
_UPDATE_EXCHANGE = (
    "UPDATE exchanges SET protocol = ?, session_id = ?, binding = ?, rpc_method = ?, model = ?,"
    " answer = ?, input_tokens = ?, output_tokens = ?, finish = ?{} WHERE id = ?"
)

# Summary columns later migrations added: each is written where the log has it.
_LATER_COLUMNS = ("tool_calls", "cached_input_tokens")


_SELECT_EXCHANGES = (
    "SELECT id, method, path, request_headers, request_body, response_headers, response_body, is_sse,"
    " binding, rpc_method FROM exchanges"
)
# A2A exchanges whose events carry usage that their summary has no token count of: the
# writers of early schema 7 logs read only snake_case keys, not $usage's camelCase ones.
_A2A_USAGE_UNREAD = (
    " WHERE protocol = 'a2a' AND (input_tokens IS NULL OR output_tokens IS NULL)"
    " AND EXISTS (SELECT 1 FROM events e WHERE e.exchange_id = exchanges.id AND e.usage IS NOT NULL)"
)


def reread_log(conn: sqlite3.Connection, protocols: tuple[str, ...] = ()) -> None:
    """Read every exchange of the log again (in the caller's transaction); or only those
    of ``protocols``. What it writes of the summary is what the log has columns for (a
    migration runs it on the schema of its time)."""
    only = f" WHERE protocol IN ({', '.join('?' * len(protocols))})" if protocols else ""
    _reread(conn, conn.execute(f"{_SELECT_EXCHANGES}{only} ORDER BY id", protocols).fetchall())


def reread_a2a_usage(conn: sqlite3.Connection) -> None:
    """Read again the A2A exchanges whose token counts their events' usage was not read
    for (the others are left as they are: most A2A streams carry no usage)."""
    _reread(conn, conn.execute(f"{_SELECT_EXCHANGES}{_A2A_USAGE_UNREAD} ORDER BY id").fetchall())


def _reread(conn: sqlite3.Connection, exchanges: list[tuple[Any, ...]]) -> None:
    texts_changed = False
    columns = {row[1] for row in conn.execute("PRAGMA table_info(exchanges)")}
    later = [c for c in _LATER_COLUMNS if c in columns]
    update_exchange = _UPDATE_EXCHANGE.format("".join(f", {c} = ?" for c in later))
    for (
        x_id,
        method,
        path,
        req_headers,
        req_body,
        resp_headers,
        resp_body,
        is_sse,
        binding,
        rpc_method,
    ) in exchanges:
        request = Request(method or "", path or "", headers_from_json(req_headers), req_body)
        events = conn.execute(
            "SELECT seq, event_type, data, complete FROM events WHERE exchange_id = ? ORDER BY seq", (x_id,)
        ).fetchall()
        first = next(((data, event_type) for _, event_type, data, _ in events if data), None)
        body = resp_body.decode("utf-8", "replace") if isinstance(resp_body, bytes) else resp_body
        protocol = recognise_exchange(request, first if is_sse else (body, None) if body else None)
        a2a = protocol is not None and protocol.name == ProtocolName.A2A
        info = protocol.request_info(request) if protocol is not None else RequestInfo()
        reader = protocol.reader() if protocol is not None else None
        updates = []
        sent = None  # what the reader made of the events before a tail no client was sent
        for seq, event_type, data, complete in events:
            if reader is None:
                updates.append(("other", *(None,) * 10, x_id, seq))
                continue
            if not complete and sent is None:
                sent = copy.copy(reader.finished())
            c = reader.event(data or "", event_type)
            if not a2a:  # A2A events were classified as they are now when they were written
                updates.append((*event_columns(c), x_id, seq))
        if updates:
            conn.executemany(_UPDATE_EVENT, updates)
            texts_changed = True
        if reader is not None and not is_sse and resp_body:
            reader.body(resp_body)
        read = sent or (reader.finished() if reader is not None else None)
        session = info.session_id or (protocol.session(headers_from_json(resp_headers)) if protocol else None)
        conn.execute(
            update_exchange,
            (
                None if protocol is None else protocol.name,
                session,
                binding if a2a else None,
                rpc_method if a2a else info.rpc_method,
                *(
                    (read.model, read.answer, read.input_tokens, read.output_tokens, read.finish)
                    if read
                    else (None,) * 5
                ),
                *(getattr(read, c) if read else None for c in later),
                x_id,
            ),
        )
    if texts_changed:
        conn.execute("INSERT INTO events_fts (events_fts) VALUES ('rebuild')")
