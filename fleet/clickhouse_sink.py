"""A fleet's rows into ClickHouse: a networked server (``http://HOST:8123[/DATABASE]``) or
the embedded engine (``chdb:///ABS/PATH``, ``chdb://REL``), through the same
clickhouse-connect client.

The tables mirror the log's, keyed by uid instead of integer ids: ``captures`` and
``exchanges`` by their uid, ``stored_chunks`` (the chunks stored as they came), ``events``
and ``resumes`` by their exchange's uid. They are ReplacingMergeTree tables: a row written
twice (a redelivery) or again in a later version (an exchange once it ended) is one row
once ClickHouse has merged them, and at once for a query that says ``FINAL``, as the views
here do. Inserts are batched as ClickHouse asks: a collector gathers about a second of
messages into one insert per table.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from tasktape.errors import UsageError
from tasktape.eventlog.redact import Redactor
from tasktape.eventlog.schema import open_db

from .names import own_consumer
from .sqlite_sink import Applied
from .wire import Rows, Table, refuse_unknown, wire_columns

DATABASE = "tasktape"  # where the tables are, unless a server's URL names a database

# The ClickHouse table of each log table: its name, what orders (and so deduplicates) it,
# and the column that, once set, makes a row's later version replace its earlier one.
TABLES = {
    Table.CAPTURES: ("captures", ("uid",), "ended_at"),
    Table.EXCHANGES: ("exchanges", ("uid",), "outcome"),
    Table.STORED_CHUNKS: ("stored_chunks", ("exchange_uid", "seq"), None),
    Table.EVENTS: ("events", ("exchange_uid", "seq"), None),
    Table.RESUMES: ("resumes", ("exchange_uid", "at_ns", "side", "outcome"), None),
}

# The log's views, over the deduplicated rows (FINAL).
_EOL = "if(e.chunk_crlf = 1, '\\r\\n', '\\n')"
VIEWS = {
    # Every byte of every response, as the log's chunks view: the chunks stored as they
    # came, and those the rows of their events write back (all of a chunk's events carry its
    # chunk_seq: their written form, concatenated in seq order).
    "chunks": f"""
SELECT exchange_uid, seq, offset_ns, data FROM {{db}}.stored_chunks FINAL
UNION ALL
SELECT exchange_uid, chunk AS seq, offset_ns, data FROM (
  SELECT e.exchange_uid, assumeNotNull(e.chunk_seq) AS chunk, min(e.offset_ns) AS offset_ns,
    arrayStringConcat(arrayMap(p -> p.2, arraySort(groupArray((e.seq, concat(
      if(e.event_id IS NULL, '', concat('id: ', assumeNotNull(e.event_id), {_EOL})),
      if(e.event_type IS NULL, '', concat('event: ', assumeNotNull(e.event_type), {_EOL})),
      'data: ', ifNull(e.data, ''), {_EOL}, {_EOL})))))) AS data
  FROM {{db}}.events AS e FINAL WHERE e.chunk_seq IS NOT NULL GROUP BY e.exchange_uid, chunk)""",
    "exchange_metrics": """
SELECT x.uid AS exchange_uid, x.capture_uid, x.started_at, x.method, x.path, x.status, x.protocol,
  x.binding, x.rpc_method, x.task_id, x.is_sse, x.outcome,
  round(x.ttfb_ns / 1e6, 3) AS ttfb_ms, round(x.duration_ns / 1e6, 3) AS duration_ms
FROM {db}.exchanges AS x FINAL""",
    "task_timeline": """
SELECT e.task_id, e.exchange_uid, e.seq,
  toDateTime64((x.started_ns + e.offset_ns) / 1e9, 6, 'UTC') AS at,
  round(e.offset_ns / 1e6, 3) AS offset_ms, e.kind, e.state, e.artifact_id, e.artifact_type,
  e.append, e.last_chunk, e.text, e.event_id
FROM {db}.events AS e FINAL JOIN {db}.exchanges AS x FINAL ON x.uid = e.exchange_uid
WHERE e.task_id IS NOT NULL""",
    "task_summary": """
SELECT e.task_id, any(e.context_id) AS context_id,
  toDateTime64(min(x.started_ns + e.offset_ns) / 1e9, 6, 'UTC') AS first_seen,
  toDateTime64(max(x.started_ns + e.offset_ns) / 1e9, 6, 'UTC') AS last_seen,
  argMaxIf(e.state, x.started_ns + e.offset_ns, e.state IS NOT NULL) AS final_state,
  count() AS events, uniqExact(e.exchange_uid) AS exchanges
FROM {db}.events AS e FINAL JOIN {db}.exchanges AS x FINAL ON x.uid = e.exchange_uid
WHERE e.task_id IS NOT NULL GROUP BY e.task_id""",
}
# What a database is named by here: it goes into SQL as it is.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TYPES = {"INTEGER": "Int64", "TEXT": "String", "BLOB": "String", "FLOAT": "Float64", "REAL": "Float64"}
# What the client takes from a server URL's scheme, user, password, host, port and path: named
# in its query as well, the client would be given it twice (and a password there would be
# shown wherever the URL is).
_NOT_IN_QUERY = frozenset({"interface", "host", "port", "username", "password", "database", "access_token"})


def connect(url: str, *, create: bool = True) -> tuple[Any, str]:
    """A clickhouse-connect client of ``url`` and the database tasktape's tables are in:
    ``http(s)://HOST:PORT[/DATABASE]``, or ``chdb:///ABS/PATH`` / ``chdb://REL`` for the
    embedded engine (its database ``tasktape``). Unless ``create``, an embedded store that
    is not there yet is a UsageError, not made."""
    check_url(url)
    clickhouse_connect = client_library()
    # Its client logs a warning of its own beside each error it raises, which Python would
    # print, unasked, as a second line: an application that sets up logging still sees it.
    logging.getLogger("clickhouse_connect").addHandler(logging.NullHandler())
    if url.startswith("chdb://"):
        rest = url.removeprefix("chdb://")
        path = Path(rest) if rest.startswith("/") else Path.cwd() / rest
        if not create and not (path / "metadata").is_dir():  # (chDB's own, made with the store)
            raise UsageError(f"nothing in {url}: there is no ClickHouse store at {path}")
        path.mkdir(parents=True, exist_ok=True)
        return _engine_client(clickhouse_connect, url, path), DATABASE
    return _server_client(clickhouse_connect, url)


def client_library() -> ModuleType:
    """clickhouse-connect, the extra tasktape[clickhouse]; a UsageError that says how to
    install it where it is not."""
    try:
        import clickhouse_connect  # noqa: PLC0415 - an extra: tasktape[clickhouse]
    except ImportError:
        raise UsageError("ClickHouse needs an extra: pip install 'tasktape[clickhouse]'") from None
    return clickhouse_connect


def check_url(url: str) -> str:
    """``url`` if it can name a ClickHouse, as told before anything is reached (which the
    client checks of its options is its own): ``http(s)://HOST:PORT[/DATABASE]``, its
    database a plain name and no credentials in its query, or ``chdb:///ABS/PATH`` /
    ``chdb://REL``; else a UsageError."""
    if url.startswith(("http://", "https://")):
        try:
            urlsplit(url).port  # noqa: B018 - read to be checked: out of range, a broken [IPv6]
        except ValueError as exc:  # (not echoed: a URL that does not parse cannot be redacted)
            raise UsageError(f"the ClickHouse URL does not parse: {exc}") from None
        _server_database(url)
    elif not url.startswith("chdb://"):
        raise UsageError(
            f"{shown(url)!r} is not a ClickHouse URL: http://HOST:8123, chdb:///ABS/PATH or chdb://REL"
        )
    return url


def _engine_client(clickhouse_connect: Any, url: str, path: Path) -> Any:
    """The client of the embedded store at ``path``, which one process at a time can open:
    one open elsewhere is a UsageError (chDB's refusal is a traceback, its reason printed
    apart), as is one chDB cannot open."""
    from clickhouse_connect.driver.exceptions import ProgrammingError  # noqa: PLC0415 - an extra

    if _held(path / "status"):
        raise UsageError(
            f"the ClickHouse store {url} is open in another process (a running tasktape collect?):"
            " one process at a time can open it, stop that one first"
        )
    try:
        return clickhouse_connect.get_client(dsn=f"chdb://{path}")
    except ProgrammingError as exc:
        raise UsageError(f"cannot open the ClickHouse store {url}: {exc}") from None


def _held(status: Path) -> bool:
    """Whether a process has the store of this status file open: ClickHouse holds the
    file's lock (flock) while it runs."""
    try:
        fd = os.open(status, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (the lock, if taken, goes with it)
    return False


def _server_client(clickhouse_connect: Any, url: str) -> tuple[Any, str]:
    """The client of a server's ``http(s)://`` URL, whose query gives the client's options
    (``?compress=zstd``); an option it cannot take is a UsageError."""
    from clickhouse_connect.driver.exceptions import ProgrammingError  # noqa: PLC0415 - an extra

    parts = urlsplit(url)
    database = _server_database(url)
    server = urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))
    try:
        client = clickhouse_connect.get_client(dsn=server)
    except (TypeError, ValueError, ProgrammingError) as exc:  # an option unknown, or its value
        raise UsageError(f"{shown(url)}: the ClickHouse client takes no such URL: {exc}") from None
    return client, database


def _server_database(url: str) -> str:
    """The database a server's URL names (tasktape's own unless its path names one); a
    UsageError for credentials in its query or a database that is no plain name."""
    parts = urlsplit(url)
    named = sorted({name.lower() for name, _ in parse_qsl(parts.query)} & _NOT_IN_QUERY)
    if named:
        raise UsageError(
            f"{shown(url)}: a ClickHouse URL gives {' and '.join(named)} in its user, host and path "
            "(http://USER:PASSWORD@HOST:PORT/DATABASE), not in its query"
        )
    database = parts.path.strip("/") or DATABASE
    if not _PLAIN_NAME.fullmatch(database):
        raise UsageError(
            f"{shown(url)}: {database!r} cannot name the database: tasktape's takes letters, digits "
            "and '_', not a digit first (as tasktape, team_a)"
        )
    return database


def shown(url: str) -> str:
    """``url`` as said to the user: without the user and password it may carry, and with
    the values of its query's credentials (``password``, ``access_token``...) redacted."""
    return Redactor().url(url)


@contextlib.contextmanager
def answered(url: str) -> Iterator[None]:
    """What ClickHouse refuses (a query it cannot run, a right the user lacks) as one line
    that names it, with the first line of ClickHouse's own words; one it cannot reach as
    ``reaching`` says it."""
    client_library()  # (without the extra, said as connect says it, not a traceback)
    from clickhouse_connect.driver.exceptions import DatabaseError  # noqa: PLC0415 - an extra

    try:
        with reaching(url):
            yield
    except DatabaseError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = next((line for line in lines if "DB::Exception" in line), lines[0] if lines else "")
        raise UsageError(f"ClickHouse at {shown(url)} refused: {said or type(exc).__name__}") from None


@contextlib.contextmanager
def reaching(url: str) -> Iterator[None]:
    """A server that does not answer (refused, unknown, gone) as one line that names it."""
    from clickhouse_connect.driver.exceptions import OperationalError  # noqa: PLC0415 - an extra

    try:
        yield
    except OperationalError as exc:
        cause: BaseException = exc
        while cause.__cause__ is not None:  # the socket's own error says it best: "Connection refused"
            cause = cause.__cause__
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        raise UsageError(f"cannot reach ClickHouse at {shown(url)}: {why}") from None


def blob_columns(columns: Sequence[tuple[str, str]]) -> list[str]:
    """The columns a log keeps bytes in (a body, a chunk): read back from ClickHouse as bytes."""
    return [c for c, t in columns if t == "BLOB"]


class ClickHouseSink:
    """The ClickHouse at ``url`` as a fleet's sink (its database, tables and views made if
    missing), or, not ``create``, as what a collector made there, to read (nothing made:
    a UsageError if nothing was)."""

    gather = 1.0  # seconds of messages in one insert: ClickHouse takes few, big inserts
    nan_nulls = False  # NULLs as None: its columns of text and integers take no NaN
    waits: tuple[type[Exception], ...] = ()  # (a server busy is one not reached: see reaching)

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = url
        self.columns = wire_columns_now()
        with answered(url):
            self.client, self.database = connect(url, create=create)
            if create:
                self._create()
            else:
                self._read_as_is()
        from clickhouse_connect.driver import exceptions  # noqa: PLC0415 - an extra, there by now

        # A value the client cannot send, or the server will not take (one it cannot reach
        # is a UsageError: see reaching).
        self.refuses: tuple[type[Exception], ...] = (
            exceptions.DataError,
            exceptions.ProgrammingError,
            exceptions.IntegrityError,
            TypeError,
            ValueError,
            OverflowError,
        )

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ClickHouseSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def consumer(self) -> str:
        """The durable consumer this database is collected through unless told: its own,
        named after the UUID ClickHouse gave it when it was made. A collector started again
        on it takes up where it stopped; another database, or one made again, starts from
        the stream's first message."""
        with answered(self.url):
            found = self.client.query(
                "SELECT uuid FROM system.databases WHERE name = {d:String}", parameters={"d": self.database}
            )
        return own_consumer("clickhouse", self.database, str(found.result_rows[0][0]))

    def _present(self) -> set[tuple[str, str]]:
        """(table, column) of each column the database has."""
        sql = "SELECT table, name FROM system.columns WHERE database = {d:String}"
        return set(self.client.query(sql, parameters={"d": self.database}).result_rows)

    def _read_as_is(self) -> None:
        present = self._present()
        missing = sorted({name for name, _, _ in TABLES.values()} - {table for table, _ in present})
        if missing:
            raise UsageError(
                f"nothing in {shown(self.url)}: tasktape collect never wrote there (no table "
                f"{self.database}.{missing[0]})"
            )
        # A database an earlier version made lacks the columns the log has gained since: what
        # it has is read, and the rest stays NULL.
        self.columns = {
            t: [(c, kind) for c, kind in columns if (TABLES[t][0], c) in present]
            for t, columns in self.columns.items()
        }

    def _create(self) -> None:
        self.client.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
        present = self._present()
        made_before = {table for table, _ in present}
        for table, (name, order, version) in TABLES.items():
            columns = ", ".join(f"{c} {_type(c, t, order)}" for c, t in self.columns[table])
            versioned = ", _version UInt8" if version else ""
            engine = "ReplacingMergeTree(_version)" if version else "ReplacingMergeTree"
            self.client.command(
                f"CREATE TABLE IF NOT EXISTS {self.database}.{name} ({columns}{versioned})"
                f" ENGINE = {engine} ORDER BY ({', '.join(order)})"
            )
            # A table an earlier version made lacks the columns the log has gained since.
            for c, t in self.columns[table]:
                if name in made_before and (name, c) not in present:
                    self.client.command(
                        f"ALTER TABLE {self.database}.{name} ADD COLUMN {c} {_type(c, t, order)}"
                    )
        for name, sql in VIEWS.items():
            view = sql.format(db=self.database)
            self.client.command(f"CREATE OR REPLACE VIEW {self.database}.{name} AS {view}")

    def apply(self, messages: Sequence[Rows]) -> Applied:
        """One insert per table for all the messages' rows."""
        applied = Applied(messages=len(messages))
        by_table: dict[Table, list[Rows]] = {}
        for m in messages:
            by_table.setdefault(m.table, []).append(m)
            applied.rows += len(m.rows)
        for table, own in by_table.items():
            name, _, version = TABLES[table]
            wanted = [c for c, _ in self.columns[table]]
            blobs = [i for i, (_, t) in enumerate(self.columns[table]) if t == "BLOB"]
            rows = []
            for m in own:
                refuse_unknown(m, wanted, f"ClickHouse database {self.database}")
                at = {c: i for i, c in enumerate(m.columns)}
                for row in m.rows:
                    values = [row[at[c]] if c in at else None for c in wanted]
                    for i in blobs:  # text where it was UTF-8: its bytes, as ClickHouse keeps them
                        if isinstance(values[i], str):
                            values[i] = values[i].encode()
                    if version:  # (a row without the column is a version under way)
                        values.append(int(version in at and row[at[version]] is not None))
                    rows.append(values)
            names = [*wanted, "_version"] if version else wanted
            with reaching(self.url):  # (what was not written is handed out again)
                self.client.insert(f"{self.database}.{name}", rows, column_names=names)
        applied.written = applied.rows  # what ClickHouse held already, it merges away
        return applied


def _type(column: str, sqlite_type: str, order: tuple[str, ...]) -> str:
    kind = _TYPES.get(sqlite_type.upper(), "String")
    return kind if column in order else f"Nullable({kind})"


def wire_columns_now() -> dict[Table, list[tuple[str, str]]]:
    """Each table's columns as its rows travel, with their SQLite types, from the schema a
    log has now."""
    db = open_db(":memory:")
    try:
        local = {t: [(r[1], r[2]) for r in db.execute(f"PRAGMA table_info({t})")] for t in Table}
    finally:
        db.close()
    return {t: wire_columns(columns) for t, columns in local.items()}
