"""Merging event logs: the captures of several logs in one, without id collisions.

Integer ids are local to a file, so every row merged gets the output's next ones; what
names a capture or an exchange across logs is its ``uid``. A merge is idempotent: an
exchange whose uid the output holds adds nothing, except what it gained since (a log still
being recorded, merged again: the rest of an exchange that was under way, and its end). One
whose rows differ from the source's at the same seq is another exchange under that uid (a
cassette edited by hand, imported): it is left as the output holds it, and reported.

Each input is merged in one transaction that reads it as one snapshot, so a log a recorder
is still writing can be merged; the output is held as its writer for the whole merge.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tasktape.choices import listed
from tasktape.errors import LogError, LogUnwritable, SchemaTooOld

from .file_kinds import is_damage, read_only_uri, result_code, unreadable
from .frames import renumbered
from .outcomes import Outcome
from .resumes import SAME_RESUME
from .schema import INDEX_TEXT, INDEXED_THROUGH, WRITES_A_CHUNK, open_db
from .writer_lock import release_writer_lock, take_writer_lock

# Every table a log holds rows in (events_fts is indexed from events): a migration that adds
# one must say here how it merges (tests/test_merge_logs.py checks).
MERGED_TABLES = ("captures", "exchanges", "stored_chunks", "events", "findings", "resumes")
LOCAL_TABLES = ("shipments",)  # how far this log was shipped: not the merged log's business
# How SQLite fails to write a file it may write: out of room (SQLITE_FULL), or a write the
# system refused (IOERR: EFBIG past a file size limit, EIO).
_WRITE_FAILURES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


def _fewer(table: str) -> str:
    """Whether the output holds fewer of an exchange's rows in ``table`` than the input."""
    return (
        f"(SELECT count(*) FROM src.{table} WHERE exchange_id = s.id)"
        f" > (SELECT count(*) FROM main.{table} WHERE exchange_id = m.id)"
    )


# An exchange is brought up to date when it is new to the output, or was still under way
# in it; its rows are copied then, and also when the output holds fewer of them (a log
# collected from a fleet may hold an exchange's end before its rows, or without a row too
# big to ship). One the output holds closed with no duration (an import of an export made
# while it was recorded: the log held no end of it then) was under way too, when the
# source holds its end.
def _no_end(row: str) -> str:
    """Whether exchange ``row`` is closed with no duration: its log held no end of it."""
    return f"({row}.outcome = '{Outcome.LOG_CLOSED}' AND {row}.duration_ns IS NULL)"


# The columns that hold a row's bytes, compared to tell a continuation from another exchange
# under the same uid (times are not: an import may hold them otherwise).
_CONTENT = {"stored_chunks": ("data",), "events": ("event_id", "event_type", "data")}


def _differs(table: str) -> str:
    """Whether a row of the output's exchange m differs from source exchange s's at its seq."""
    same = " AND ".join(f"o.{c} IS r.{c}" for c in _CONTENT[table])
    return (
        f"EXISTS (SELECT 1 FROM main.{table} o JOIN src.{table} r ON r.exchange_id = s.id"
        f" AND r.seq = o.seq WHERE o.exchange_id = m.id AND NOT ({same}))"
    )


_UNDER_WAY = (
    f"m.id IS NULL OR m.outcome IS NULL OR ({_no_end('m')} AND s.outcome IS NOT NULL AND NOT {_no_end('s')})"
)
# An exchange's columns set by its request and its response's head: an exchange under way
# has them already, once they came.
_HEAD_COLUMNS = frozenset(
    {
        "started_at",
        "started_ns",
        "method",
        "path",
        "query",
        "request_headers",
        "request_body",
        "request_body_truncated",
        "request_body_encoding",
        "status",
        "response_headers",
        "is_sse",
        "ttfb_ns",
        "body_encoding",
    }
)
# An exchange the output holds whose rows differ from the source's is neither under way
# nor fresh: nothing of the source's is spliced into it.
_DIFFERS = f"m.id IS NOT NULL AND ({_differs('stored_chunks')} OR {_differs('events')})"
_FRESH = (
    "CREATE TEMP TABLE merged_exchanges AS"
    " SELECT src_id, dst_id, differs, NOT differs AND under_way AS under_way,"
    " NOT differs AND (under_way OR fewer) AS fresh FROM ("
    f" SELECT s.id AS src_id, m.id AS dst_id, {_DIFFERS} AS differs, {_UNDER_WAY} AS under_way,"
    f" {_fewer('stored_chunks')} OR {_fewer('events')} AS fewer"
    " FROM src.exchanges s LEFT JOIN main.exchanges m ON m.uid = s.uid)"
)

# Whether the source holds an exchange the output holds under way further along: ended
# there, answered there, or, answered in both, with more of its rows. Only then is it
# brought up to date: a copy of the log taken earlier, merged after a later one, would set
# it back.
_FURTHER = (
    "s.outcome IS NOT NULL OR (s.status IS NOT NULL AND (m.status IS NULL"
    f" OR {_fewer('stored_chunks')} OR {_fewer('events')}))"
)


@dataclass
class MergeReport:
    """What merging one log added to the output."""

    source: Path
    output: Path | None = None
    captures: int = 0
    ended: int = 0  # captures the output held under way, ended since
    exchanges: int = 0
    continued: int = 0  # exchanges the output held under way, brought up to date
    chunks: int = 0
    events: int = 0
    findings: int = 0
    resumes: int = 0
    # (output's id, source's id) of each exchange under a uid both hold whose rows differ:
    # left as the output holds it
    conflicts: list[tuple[int, int]] = field(default_factory=list)

    @property
    def added(self) -> bool:
        return any((self.captures, self.ended, self.exchanges, self.continued, self.chunks, self.events))

    def describe(self) -> str:
        """One line for the console."""
        return "; ".join((self._what_added(), *self._conflicts_said()))

    def _what_added(self) -> str:
        if not self.added and not self.findings and not self.resumes:
            return f"{self.source}: nothing new"
        counts = (
            (self.captures, "capture"),
            (self.ended, "capture ended"),
            (self.exchanges, "exchange"),
            (self.continued, "exchange continued"),
            (self.chunks, "chunk"),
            (self.events, "event"),
            (self.findings, "finding"),
            (self.resumes, "resume"),
        )
        parts = [f"{n:,} {_plural(what, n)}" for n, what in counts if n]
        return f"{self.source}: added {', '.join(parts)}"

    def _conflicts_said(self) -> list[str]:
        return [
            f"uid conflict: exchange {kept} kept as {self.output} holds it;"
            f" {self.source} exchange {other} differs"
            for kept, other in self.conflicts
        ]


def _plural(what: str, n: int) -> str:
    if n == 1:
        return what
    noun, _, rest = what.partition(" ")
    return f"{noun}s {rest}".rstrip()


def merge_logs(sources: Sequence[str | Path], output: str | Path) -> list[MergeReport]:
    """Merge the logs ``sources`` into the log ``output`` (made when missing), in order;
    what each added. An older source is read through an upgraded copy, left as it is."""
    # One path alone is refused: a string's letters would be taken for the logs.
    output, sources = Path(output), [Path(s) for s in listed(_one_path(sources), "sources")]
    if not output.parent.is_dir():  # (SQLite would say only "unable to open database file")
        raise _no_folder(output)
    for source in sources:  # all checked before anything is written
        if not source.is_file():
            raise LogError(f"{source}: no such log")
        if output.exists() and os.path.samefile(source, output):
            raise LogError(f"{source} is the output: a log cannot be merged into itself")
        with contextlib.suppress(SchemaTooOld):
            open_db(source, readonly=True).close()  # refuses what is not a log, or too new
    try:
        db = open_db(output)  # made or upgraded, before it is held
    except LogError as exc:
        cause = exc.__cause__
        if isinstance(cause, sqlite3.Error) and result_code(cause) in _WRITE_FAILURES:
            raise LogUnwritable(f"cannot write {output}: {cause}") from cause
        raise
    db.close()
    fd = take_writer_lock(output)
    try:
        conn = sqlite3.connect(output.resolve().as_uri(), uri=True, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            return [_merge_one(conn, source, output) for source in sources]
        finally:
            conn.close()
    finally:
        release_writer_lock(fd)


def _no_folder(output: Path) -> LogError:
    """The error for an output whose folder is not there: a file where a folder is meant
    is named, as import and export name it."""
    file = next((p for p in reversed(output.parents) if p.is_file()), None)
    if file is not None:
        return LogError(f"cannot write {output}: {file} is a file, not a folder")
    return LogError(f"cannot open {output} as an event log: its folder {output.parent} does not exist")


def _merge_one(conn: sqlite3.Connection, source: Path, output: Path) -> MergeReport:
    with _readable(source) as readable:
        conn.execute("ATTACH DATABASE ? AS src", (read_only_uri(readable),))
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                report = _copy(conn, MergeReport(source, output))
                conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                _roll_back(conn)
                if is_damage(readable, exc):
                    raise unreadable(source, exc) from None  # (the source: the rows it reads)
                if result_code(exc) in _WRITE_FAILURES:
                    raise LogUnwritable(f"cannot write {output}: {exc}") from exc
                raise
            except BaseException:
                _roll_back(conn)
                raise
            finally:
                conn.execute("DROP TABLE IF EXISTS temp.merged_captures")
                conn.execute("DROP TABLE IF EXISTS temp.merged_exchanges")
        finally:
            conn.execute("DETACH DATABASE src")
    return report


def _roll_back(conn: sqlite3.Connection) -> None:
    # (A COMMIT that failed writing, on a full disk, has been rolled back by SQLite already.)
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _one_path(sources: Sequence[str | Path] | Path) -> Sequence[str | Path] | str:
    """``sources``, a path alone as its string (which ``listed`` refuses, saying so)."""
    return str(sources) if isinstance(sources, Path) else sources


@contextlib.contextmanager
def _readable(source: Path) -> Iterator[Path]:
    """``source``, or an upgraded copy of it when it was written by an older tasktape (its
    rows get the uids any copy of it gets: merging both adds nothing twice)."""
    try:
        open_db(source, readonly=True).close()
    except SchemaTooOld:
        pass
    else:
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="tasktape-merge-") as tmp:
        copy = Path(tmp) / source.name
        old = sqlite3.connect(read_only_uri(source), uri=True)
        with contextlib.closing(old), contextlib.closing(sqlite3.connect(copy)) as new:
            old.backup(new)
        open_db(copy).close()
        yield copy


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA main.table_info({table})")]


def _copy(conn: sqlite3.Connection, report: MergeReport) -> MergeReport:
    # Captures: new ones get the next ids; one that ended since gets its end.
    cols = [c for c in _columns(conn, "captures") if c != "id"]
    report.captures = conn.execute(
        f"INSERT INTO main.captures ({', '.join(cols)}) SELECT {', '.join(f's.{c}' for c in cols)}"
        " FROM src.captures s WHERE s.uid NOT IN (SELECT uid FROM main.captures) ORDER BY s.id"
    ).rowcount
    report.ended = conn.execute(
        "UPDATE main.captures AS m SET ended_at = s.ended_at FROM src.captures s"
        " WHERE s.uid = m.uid AND m.ended_at IS NULL AND s.ended_at IS NOT NULL"
    ).rowcount
    conn.execute(
        "CREATE TEMP TABLE merged_captures AS SELECT s.id AS src_id, m.id AS dst_id"
        " FROM src.captures s JOIN main.captures m ON m.uid = s.uid"
    )

    # Exchanges: which are new or were under way, then the new ones, then the others' progress.
    conn.execute(_FRESH)
    cols = [c for c in _columns(conn, "exchanges") if c != "id"]
    picked = ", ".join(
        "(SELECT dst_id FROM merged_captures WHERE src_id = s.capture_id)" if c == "capture_id" else f"s.{c}"
        for c in cols
    )
    report.exchanges = conn.execute(
        f"INSERT INTO main.exchanges ({', '.join(cols)}) SELECT {picked} FROM src.exchanges s"
        " JOIN merged_exchanges f ON f.src_id = s.id WHERE f.dst_id IS NULL ORDER BY s.id"
    ).rowcount
    kept = [c for c in cols if c not in ("uid", "capture_id")]
    # What its request and response head said stays as the output holds it: a copy imported
    # with values redacted keeps them redacted (the source's progress is its end and rows).
    taken = [f"coalesce(m.{c}, s.{c})" if c in _HEAD_COLUMNS else f"s.{c}" for c in kept]
    report.continued = conn.execute(
        f"UPDATE main.exchanges AS m SET ({', '.join(kept)}) = ({', '.join(taken)})"
        " FROM src.exchanges s JOIN merged_exchanges f ON f.src_id = s.id"
        f" WHERE f.under_way AND f.dst_id = m.id AND ({_FURTHER})"
    ).rowcount
    conn.execute(
        "UPDATE temp.merged_exchanges SET dst_id = (SELECT m.id FROM main.exchanges m"
        " JOIN src.exchanges s ON s.uid = m.uid WHERE s.id = src_id) WHERE dst_id IS NULL"
    )
    conn.execute("CREATE UNIQUE INDEX temp.merged_exchanges_src ON merged_exchanges (src_id)")
    report.conflicts = [
        (dst, src)
        for src, dst in conn.execute(
            "SELECT src_id, dst_id FROM temp.merged_exchanges WHERE differs ORDER BY dst_id"
        )
    ]

    # The rows of fresh exchanges, in the order they were written (rowids follow arrival).
    stored = _copy_rows(conn, "stored_chunks")
    (indexed,) = conn.execute(INDEXED_THROUGH).fetchone()
    report.events = _copy_rows(conn, "events")
    conn.execute(INDEX_TEXT, (indexed,))
    (written_back,) = conn.execute(
        f"SELECT count(*) FROM main.events e WHERE e.rowid > ? AND {WRITES_A_CHUNK}", (indexed,)
    ).fetchone()
    report.chunks = stored + written_back  # as the chunks view counts them

    report.findings = _copy_findings(conn)
    report.resumes = _copy_resumes(conn)
    return report


def _copy_rows(conn: sqlite3.Connection, table: str) -> int:
    """The rows of the fresh exchanges in a table keyed by ``(exchange_id, seq)``: those
    the output lacks."""
    cols = [c for c in _columns(conn, table) if c != "exchange_id"]
    return conn.execute(
        f"INSERT OR IGNORE INTO main.{table} (exchange_id, {', '.join(cols)})"
        f" SELECT f.dst_id, {', '.join(f'r.{c}' for c in cols)} FROM src.{table} r"
        " JOIN merged_exchanges f ON f.src_id = r.exchange_id WHERE f.fresh ORDER BY r.rowid"
    ).rowcount


def _copy_findings(conn: sqlite3.Connection) -> int:
    """The findings of each exchange checked later in the source than in the output: a
    check replaces an exchange's earlier findings, in a merge as in its own log. A message
    that names another exchange (``transition``: the state before, there) names it by the
    output's id."""
    conn.execute(
        "CREATE TEMP TABLE merged_checks AS SELECT f.src_id, f.dst_id FROM src.findings r"
        " JOIN merged_exchanges f ON f.src_id = r.exchange_id WHERE NOT f.differs GROUP BY f.src_id"
        " HAVING max(r.checked_at) > coalesce((SELECT max(o.checked_at) FROM main.findings o"
        " WHERE o.exchange_id = f.dst_id), '')"
    )
    try:
        conn.execute("DELETE FROM main.findings WHERE exchange_id IN (SELECT dst_id FROM merged_checks)")
        ids = dict(conn.execute("SELECT src_id, dst_id FROM temp.merged_exchanges"))
        conn.create_function("renumbered", 1, partial(_renumbered, ids=ids), deterministic=True)
        return conn.execute(
            "INSERT INTO main.findings (checked_at, rule, task_id, exchange_id, seq, message)"
            " SELECT r.checked_at, r.rule, r.task_id, c.dst_id, r.seq, renumbered(r.message)"
            " FROM src.findings r"
            " JOIN merged_checks c ON c.src_id = r.exchange_id ORDER BY r.id"
        ).rowcount
    finally:
        conn.execute("DROP TABLE temp.merged_checks")


def _renumbered(message: str | None, ids: dict[int, int]) -> str | None:
    """A finding's message as the output names its exchanges (a row's may be NULL)."""
    return None if message is None else renumbered(message, ids)


def _copy_resumes(conn: sqlite3.Connection) -> int:
    """The resumes the output lacks, their exchange ids the output's. A resume is told
    apart by what it was: its stream and new exchange, side, outcome and the event it
    resumed after; not by its time, which a log imported from a cassette of it may hold
    otherwise."""
    cols = [c for c in _columns(conn, "resumes") if c != "id"]
    mapped = {
        c: f"(SELECT dst_id FROM merged_exchanges WHERE src_id = r.{c})"
        for c in ("exchange_id", "new_exchange_id")
    }
    same = " AND ".join(f"o.{c} IS {mapped.get(c, f'r.{c}')}" for c in SAME_RESUME)
    picked = ", ".join(mapped.get(c, f"r.{c}") for c in cols)
    return conn.execute(
        f"INSERT INTO main.resumes ({', '.join(cols)}) SELECT {picked}"
        f" FROM src.resumes r WHERE NOT EXISTS (SELECT 1 FROM main.resumes o WHERE {same}) ORDER BY r.id"
    ).rowcount
