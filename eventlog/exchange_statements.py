"""The statements that write an exchange's row: its INSERT when the request comes, an
UPDATE for each of what follows (the response's head, a request body read late, the end),
and ``fold``, which applies such an UPDATE to an INSERT not yet run (an exchange that
begins and ends within one transaction is one statement, not three: each UPDATE seeks the
row, rewrites it and its index entries)."""

from __future__ import annotations

from functools import cache
from typing import Any

Statement = tuple[str, tuple[Any, ...]]

REQUEST_COLUMNS = (
    *("id", "uid", "capture_id", "started_at", "started_ns", "method", "path", "query"),
    *("request_headers", "request_body", "request_body_truncated", "request_body_encoding"),
    *("binding", "rpc_method", "task_id", "context_id", "protocol", "session_id"),
)
HEAD_COLUMNS = ("status", "response_headers", "is_sse", "ttfb_ns", "body_encoding")
BODY_COLUMNS = (
    *("request_body", "request_body_truncated", "request_body_encoding", "binding", "rpc_method"),
    *("task_id", "context_id", "protocol", "session_id"),
)
END_COLUMNS = (
    *("duration_ns", "outcome", "error", "response_body", "response_body_truncated", "binding"),
    *("task_id", "context_id", "protocol", "session_id", "model", "answer", "input_tokens"),
    *("output_tokens", "finish", "tool_calls", "cached_input_tokens"),
)
# What the end does not overwrite: what the request already said (a column set before is
# kept, else the end's value), and what only a value sets (the end's, unless it has none).
_KEPT = frozenset({"binding", "task_id", "context_id"})
_IF_ANY = frozenset({"duration_ns", "error"})


def _set(column: str) -> str:
    if column in _KEPT:
        return f"{column} = coalesce({column}, ?)"
    if column in _IF_ANY:
        return f"{column} = coalesce(?, {column})"
    return f"{column} = ?"


@cache
def _insert(columns: tuple[str, ...]) -> str:
    return f"INSERT INTO exchanges ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


INSERT_EXCHANGE = _insert(REQUEST_COLUMNS)
UPDATE_HEAD = f"UPDATE exchanges SET {', '.join(f'{c} = ?' for c in HEAD_COLUMNS)} WHERE id = ?"
UPDATE_BODY = f"UPDATE exchanges SET {', '.join(f'{c} = ?' for c in BODY_COLUMNS)} WHERE id = ?"
UPDATE_END = f"UPDATE exchanges SET {', '.join(map(_set, END_COLUMNS))} WHERE id = ?"

# Each UPDATE's columns, in the order of its parameters (the last, the row's id, follows),
# and those it keeps when set before. (Those it sets only to a value, nothing before the
# end sets: there, a value or none is what the end says.)
_UPDATED = {
    UPDATE_HEAD: (HEAD_COLUMNS, frozenset()),
    UPDATE_BODY: (BODY_COLUMNS, frozenset()),
    UPDATE_END: (END_COLUMNS, _KEPT),
}
_COLUMNS = {INSERT_EXCHANGE: REQUEST_COLUMNS}  # each INSERT's columns, by its text


def fold(insert: Statement, update: Statement) -> Statement:
    """The INSERT of an exchange's row with an UPDATE of that row applied: the row the two
    leave, in one statement."""
    sql, values = insert
    update_sql, updates = update
    folded, overlaps, added = _plan(sql, update_sql)
    row = list(values)
    for i, j, keep in overlaps:
        if not keep or row[i] is None:
            row[i] = updates[j]
    return folded, (*row, *(updates[j] for j in added))


@cache
def _plan(sql: str, update_sql: str) -> tuple[str, tuple[tuple[int, int, bool], ...], tuple[int, ...]]:
    """How an UPDATE folds into an INSERT: the INSERT it makes, the UPDATE's parameters
    that replace the INSERT's (where, which, and whether only a NULL), and those added."""
    columns = _COLUMNS[sql]
    updated, kept = _UPDATED[update_sql]
    at = {column: i for i, column in enumerate(columns)}
    overlaps = tuple((at[c], j, c in kept) for j, c in enumerate(updated) if c in at)
    added = tuple(j for j, c in enumerate(updated) if c not in at)
    folded_columns = columns + tuple(updated[j] for j in added)
    folded = _insert(folded_columns)
    _COLUMNS[folded] = folded_columns
    return folded, overlaps, added
