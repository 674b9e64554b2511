"""An exchange's UPDATEs folded into its INSERT leave the row the statements one by one
leave: checked on the log's own schema, over random values (None among them) and every
order in which the writer may see a head, a late request body and an end."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tasktape.eventlog import exchange_statements as xs
from tasktape.eventlog.exchange_statements import fold
from tasktape.eventlog.new_log import NEW_LOG_SQL

UPDATES = {
    "head": (xs.UPDATE_HEAD, xs.HEAD_COLUMNS),
    "body": (xs.UPDATE_BODY, xs.BODY_COLUMNS),
    "end": (xs.UPDATE_END, xs.END_COLUMNS),
}
# The orders the writer produces: a head before the end; a late body any time before it.
ORDERS = [
    ["end"],
    ["head", "end"],
    ["head"],
    ["body"],
    ["body", "head", "end"],
    ["head", "body", "end"],
    ["body", "end"],
]


def log() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.executescript(Path(NEW_LOG_SQL).read_text())
    return conn


def value(rng: random.Random, column: str) -> Any:
    if rng.random() < 0.4:
        return None
    if column in ("id", "capture_id"):
        return 1
    if column.endswith(("_ns", "_truncated", "tokens")) or column in ("status", "is_sse"):
        return rng.randint(0, 10**9)
    return rng.choice(["a", "b", "rest", "jsonrpc", "x" * 30])


def row(conn: sqlite3.Connection, exchange_id: int) -> tuple[Any, ...]:
    return conn.execute("SELECT * FROM exchanges WHERE id = ?", (exchange_id,)).fetchone()


@pytest.mark.parametrize("order", ORDERS, ids="-".join)
def test_folded_statements_leave_the_row_the_statements_leave(order: list[str]) -> None:
    rng = random.Random(7)
    one_by_one, folded_log = log(), log()
    for i in range(1, 301):
        values = tuple(value(rng, c) for c in xs.REQUEST_COLUMNS)
        insert = (xs.INSERT_EXCHANGE, (i, f"uid-{i}", *values[2:]))  # (uids are unique)
        updates = [(UPDATES[name][0], (*(value(rng, c) for c in UPDATES[name][1]), i)) for name in order]
        for sql, params in [insert, *updates]:
            one_by_one.execute(sql, params)
        folded = insert
        for update in updates:
            folded = fold(folded, update)
        folded_log.execute(*folded)
        assert row(folded_log, i) == row(one_by_one, i), (order, insert, updates)


def test_an_insert_folded_is_an_insert_of_the_columns_set() -> None:
    insert = (xs.INSERT_EXCHANGE, (1, *[None] * (len(xs.REQUEST_COLUMNS) - 1)))
    sql, params = fold(insert, (xs.UPDATE_HEAD, (200, "[]", 1, 5, None, 1)))
    assert sql.startswith("INSERT INTO exchanges (id, uid,") and "status, response_headers" in sql
    assert params[-5:] == (200, "[]", 1, 5, None)
