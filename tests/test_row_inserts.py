"""Rows inserted many to a statement: every row, in order, whatever their number and
whatever the SQLite build lets a statement bind."""

from __future__ import annotations

import sqlite3

import pytest

from tasktape.eventlog.row_inserts import RowInserts

COLUMNS = tuple(f"c{i}" for i in range(24))


def table() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(f"CREATE TABLE t ({', '.join(COLUMNS)})")
    return conn


def rows(count: int) -> list[tuple[object, ...]]:
    return [(n, f"text {n}", b"\x00\xff", None, float("nan"), *range(19)) for n in range(count)]


@pytest.mark.parametrize("count", [0, 1, 2, 63, 64, 65, 127, 200])
def test_every_row_is_inserted_in_order(count: int) -> None:
    conn = table()
    RowInserts(conn, "t", COLUMNS)(rows(count))
    stored = conn.execute("SELECT * FROM t ORDER BY rowid").fetchall()
    # NaN is stored as NULL, as executemany stores it.
    assert stored == [(*row[:4], None, *row[5:]) for row in rows(count)]


def test_rows_inserted_together_take_rowids_in_their_order() -> None:
    conn = table()
    conn.execute("INSERT INTO t (c0) VALUES (-1)")
    RowInserts(conn, "t", COLUMNS)(rows(100))
    ids = conn.execute("SELECT rowid, c0 FROM t ORDER BY rowid").fetchall()
    assert [c0 for _, c0 in ids] == [-1, *range(100)]
    assert [rowid for rowid, _ in ids] == list(range(1, 102))


def test_a_build_that_binds_few_parameters_gets_statements_of_fewer_rows() -> None:
    conn = table()
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 3 * len(COLUMNS) - 1)
    insert = RowInserts(conn, "t", COLUMNS)
    insert(rows(7))
    assert conn.execute("SELECT c0 FROM t ORDER BY rowid").fetchall() == [(n,) for n in range(7)]


def test_a_row_sqlite_refuses_fails_its_statement_whole_and_stops_the_rest() -> None:
    conn = table()
    conn.execute("CREATE UNIQUE INDEX one_each ON t (c0)")
    refused = rows(11)
    refused[5] = refused[0]  # in the first statement, of eight rows
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.IntegrityError):
        RowInserts(conn, "t", COLUMNS)(refused)
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
