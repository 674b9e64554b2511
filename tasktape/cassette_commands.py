"""``tasktape export`` and ``tasktape import``: between event logs and cassettes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import click

from tasktape.counted import counted
from tasktape.errors import CassetteError, FlowFileError, LogBusy, LogError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import (
    CassetteReader,
    cassette_lines,
    digest_uid,
    hashed_lines,
    imported_uid,
    load_into,
    read_cassette,
    read_header,
    replace_with,
)
from tasktape.eventlog.console_text import shown
from tasktape.eventlog.file_kinds import FileKind, kind_of, kind_of_bytes, read_once, unreadable
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.recorded import Recorded, each_from_log
from tasktape.eventlog.redact import Redactor
from tasktape.eventlog.schema import named_kind
from tasktape.eventlog.sqlite_settings import stop_counting_memory
from tasktape.eventlog.writer import LOG_FULL, take_back

from .option_checks import bad_input
from .redaction_options import redaction_options


@contextlib.contextmanager
def read_as_input(log: Path) -> Iterator[None]:
    """A log that fails as it is read (a damaged one): bad input, as one that fails to open."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        raise bad_input(str(unreadable(log, exc))) from None
    except LogError as exc:
        raise bad_input(str(exc)) from None


@click.command("export")
@click.argument("log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="The cassette to write, its folder created if needed (- for standard output).",
)
@click.option("--task", "tasks", multiple=True, metavar="ID", help="The exchanges of this task (repeatable).")
@click.option(
    "--context", "contexts", multiple=True, metavar="ID", help="The exchanges of this context (repeatable)."
)
@click.option(
    "--exchange", "exchanges", multiple=True, type=int, metavar="N", help="This exchange (repeatable)."
)
@click.option("--no-cards", is_flag=True, help="Leave out the agent card read before the chosen exchanges.")
def export(
    log: Path,
    output: str,
    tasks: tuple[str, ...],
    contexts: tuple[str, ...],
    exchanges: tuple[int, ...],
    no_cards: bool,
) -> None:
    """Write exchanges of an event log as a cassette (all of them unless some are chosen).

    A cassette is JSON Lines: a versioned header, then each exchange with its request,
    response head, and every chunk with its offset (text when UTF-8, else base64).
    Redacted values stay redacted. Unless --no-cards, the last agent card read before the
    chosen exchanges is included, so a client replaying them can start by reading it. A
    reconnect or subscribe chosen brings the stream it resumed along.
    Each choice must match something. An exchange the log holds no end of yet (its
    recorder still writing it) is written cut short there, as log_closed.
    Exit status: 0 written, 1 not written (nothing to export, a choice matching nothing, a
    write that failed), 2 bad input (LOG no event log this tasktape reads, -o a file that is
    no cassette, or a name the system refuses).
    """
    target = Path(output)
    if output != "-":
        _check_output(target)
    try:
        opened = EventLog(log)
    except LogError as exc:  # what is no log this tasktape reads: bad input
        raise bad_input(str(exc)) from None
    with opened, read_as_input(log):
        capture_of = dict(opened.db.execute("SELECT id, capture_id FROM exchanges").fetchall())
        _check_choices(opened, tasks, contexts, [n for n in exchanges if n not in capture_of])
        ids = _with_streams_resumed(
            opened,
            set(opened.select(tasks=tasks, contexts=contexts, exchanges=exchanges, with_cards=not no_cards)),
        )
        if not ids:
            raise click.ClickException(shown(f"{log} has no exchanges: there is nothing to export"))
        upstream_of = {c["id"]: c["upstream"] for c in opened.captures()}
        # The header names the upstream of the captures the exported exchanges come from.
        upstreams = sorted({upstream_of[capture_of[i]] for i in ids} - {None})
        upstream = upstreams[0] if len(upstreams) == 1 else None
        # Exchanges are read and written one at a time: a log of gigabytes is never in
        # memory whole. One the log holds no end of is cut short where the log stops.
        under_way: list[Recorded] = []
        recorded = (_at_log_end(r, under_way) for r in each_from_log(opened, ids))
        lines = (
            f"{line}\n"
            for line in cassette_lines(recorded, carries_uids=True, source=log.name, upstream=upstream)
        )
        if output == "-":
            if sys.stdout is None:  # (started with its standard output closed)
                raise click.ClickException("cannot write standard output: it is closed")
            sys.stdout.writelines(lines)
        else:
            folder_for(target)  # cassettes/ as tests name it
            try:
                replace_with(target, lines)
            except CassetteError as exc:  # (it may name what an exchange holds)
                raise click.ClickException(shown(str(exc))) from None
            _say(f"tasktape export: {counted(len(ids), 'exchange')} from {log} -> {output}")
    for r in under_way:
        _say(
            f"tasktape export: {r.origin} ({_request_line(r)}) has no end in the log yet: exported as "
            f"cut short ({Outcome.LOG_CLOSED})"
        )


def _say(line: str) -> None:
    """A line of what the command did, on standard error: the files it names as the console
    shows them."""
    click.echo(shown(line), err=True)


def _request_line(recorded: Recorded) -> str:
    """``recorded``'s request line as a replay's miss shows it: a log of tasktape 0.1.0 holds
    the values of defaults' names it did not have yet (``refresh_token``, ``id_token``)."""
    # (Imported here: matching loads the protocols, which import has no use for.)
    from tasktape.replay.matching import Shown  # noqa: PLC0415

    return Shown.of(Redactor()).request_line(recorded)


def _check_output(target: Path) -> None:
    """Refuse an output a cassette is not written over: a log (this one, most likely: `-o`
    where `--db` was meant), a file of another kind (notes), a name the system refuses (too
    long). A cassette is replaced; a pipe or a device is written to."""
    try:
        regular = stat.S_ISREG(target.stat().st_mode)
        kind = named_kind(target) if regular else None
    except (FileNotFoundError, NotADirectoryError):
        return  # (made, and its folder: folder_for)
    except OSError as exc:
        raise bad_input(f"cannot write {target}: {exc.strerror or exc}") from None
    if kind is FileKind.LOG:
        raise bad_input(f"{target} is {kind}: a cassette is not written over it")
    if kind not in (None, FileKind.CASSETTE, FileKind.EMPTY):
        raise bad_input(f"{target} is {kind}: export writes a cassette, not over it")


def _at_log_end(recorded: Recorded, under_way: list[Recorded]) -> Recorded:
    """``recorded`` cut short where the log stops if the log holds no end of it (its
    recorder still writing it), noted in ``under_way``."""
    # (Imported here: the checker's frames load the protocols, which import has no use for.)
    from tasktape.eventlog.frames import at_log_end  # noqa: PLC0415

    under_way += at_log_end([recorded])
    return recorded


def folder_for(path: Path) -> None:
    """The folder a file is written in, made if missing (export, import and merge alike);
    a file where a folder is meant is bad input."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        file = next(p for p in reversed(path.parents) if p.is_file())
        raise bad_input(f"cannot write {path}: {file} is a file, not a folder") from None
    except OSError as exc:
        raise click.ClickException(shown(f"cannot write {path}: {exc.strerror or exc}")) from None


def _with_streams_resumed(log: EventLog, ids: set[int]) -> list[int]:
    """``ids`` in order, with the stream each reconnect or subscribe among them resumed: a
    cassette says which it is, and without it the reconnect would be an ordinary stream
    (and its events, a slice of the stream's, checked as one)."""
    resumed = dict(
        log.db.execute("SELECT new_exchange_id, exchange_id FROM resumes WHERE new_exchange_id IS NOT NULL")
    )
    while True:  # (a stream may itself have resumed another)
        more = {resumed[i] for i in ids if i in resumed} - ids
        if not more:
            return sorted(ids)
        ids |= more


def _check_choices(
    log: EventLog, tasks: tuple[str, ...], contexts: tuple[str, ...], missing: list[int]
) -> None:
    """Each task and context chosen must match something, and no exchange be ``missing``:
    one mistyped among others would otherwise leave its exchanges out unnoticed."""
    unmatched = [f"task {t}" for t in tasks if not log.select(tasks=[t], with_cards=False)]
    unmatched += [f"context {c}" for c in contexts if not log.select(contexts=[c], with_cards=False)]
    unmatched += [f"exchange {n}" for n in missing]
    if unmatched:
        said = f"{log.path}: nothing matches {', '.join(unmatched)}; nothing written"
        raise click.ClickException(shown(said))


@click.command("import")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option(
    "--db",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The event log to add them to (created if needed, its folder too).",
)
@click.option(
    "--replace-unfinished",
    is_flag=True,
    help="Replace an import of the same file left unfinished when the file held other content.",
)
@redaction_options()
def import_(
    files: tuple[Path, ...],
    db: Path,
    replace_unfinished: bool,
    redact_header: tuple[str, ...],
    redact_query: tuple[str, ...],
    redact_json: tuple[str, ...],
) -> None:
    """Read cassettes, or mitmproxy flow files (`mitmdump -w`), into an event log (each
    file becomes one capture).

    A flow file is told by its content, whatever its name. Event streams that mitmproxy
    buffered whole keep their events but not their pace: every chunk and event gets the
    offset of the response's end, and the exchange's `error` says so. What a file holds
    is kept whole: bodies past the 16 MiB a recorder keeps are not cut. Everything is
    redacted as a recorder redacts it (the --redact-* options add to what always is).
    An import stopped part-way (interrupted, killed) is finished by importing the file
    again; one of the same file when it held other content is refused unless
    --replace-unfinished.
    Rows that cannot be written stop the import, its capture left unfinished: when the
    log was full (a full disk), importing the file again, with room, finishes it.
    Exit status: 0 imported, 1 not (the log busy with another writer, rows not written, an
    unfinished import of other content), 2 bad input (a file no cassette or flow file, --db
    no event log).
    """
    try:
        # Every file is read and checked before anything is written.
        loaded = [_read(f, db) for f in files]
    except (CassetteError, FlowFileError) as exc:  # (what is wrong names what the file holds)
        raise bad_input(shown(str(exc))) from None
    stop_counting_memory()
    folder_for(db)
    try:
        _take_back_unfinished(db, loaded, replace_unfinished)
        # What a file holds is kept whole: a body is as long as its recorder kept it, and
        # nothing waits on the writer but bytes already in memory (so none is dropped).
        redactor = Redactor(headers=redact_header, json_pointers=redact_json, query=redact_query)
        writer = LogWriter(
            db, redactor=redactor, max_body=sys.maxsize, max_backlog=sys.maxsize, on_error=_said_at_the_end
        )
    except LogBusy as exc:  # another writer holds it: a failure, not bad input
        raise click.ClickException(shown(str(exc))) from None
    except LogError as exc:
        raise bad_input(str(exc)) from None
    held, held_exchanges = _imported(db, [uid for one in loaded for uid in one.uids])
    stopped = None
    with writer:
        for one in loaded:
            if (stopped := _import_one(writer, one, db, held, held_exchanges)) is not None:
                break
    if isinstance(stopped, _Changed):
        raise click.ClickException(shown(stopped.taken_back(db, writer.first_ids[1])))
    if writer.stats.rows_lost:
        lost = f"{writer.stats.rows_lost} rows could not be written to {db} ({writer.stats.last_error})"
        if stopped is not None:
            lost += f": {stopped.told(db)}"
        raise click.ClickException(shown(lost))


def _said_at_the_end(exc: BaseException, rows: int) -> None:
    """Rows the writer could not write: the import stops once it sees it (``_paced``), and
    says so at its end, as an import's failure (not as a recorder's, whose traffic goes on)."""


def _import_one(
    writer: LogWriter, one: _Loaded, db: Path, held: dict[str, _Capture], held_exchanges: dict[str, int]
) -> _Stopped | None:
    """One file into the log, as a capture of its own, or into the capture an import of it
    left unfinished (``held`` by its uid); nothing when it is in the log already. A file
    found changed as it is written, or rows that could not be written: what stopped it."""
    path, content, uid = one.path, one.content, one.uid
    capture = held.get(uid)
    if capture is not None and capture.ended:
        said = f"{path} is in {db} already (capture {capture.id}): nothing added"
        _say(f"tasktape import: {said}")
        return None
    if isinstance(content, _Flows):  # (one left unfinished was taken back whole)
        made = writer.begin_capture(source="mitm-import", upstream=None, argv=[str(path.absolute())], uid=uid)
        held[uid] = _Capture(made, ended=True)
        return _import_flows(writer, path, content, made, db)
    if capture is not None:
        return _finish(writer, one, content, capture.id, db, held_exchanges)
    # An exchange exported from a log keeps its uid: one the log holds (this cassette
    # exported from it, or imported or merged before) is not added again.
    skipped, count = _held(content.uids, held_exchanges), content.count
    if skipped == count and count:
        said = f"{path}: {skipped} of {counted(count, 'exchange')} already in {db}: nothing added"
        _say(f"tasktape import: {said}")
        return None
    exchanges = _again(content)
    # (its file named wholly: an import of it left unfinished is told from another folder's)
    made = writer.begin_capture(source="import", upstream=one.upstream, argv=[str(path.absolute())], uid=uid)
    held[uid] = _Capture(made, ended=True)
    if (stopped := _load(writer, exchanges, made, one, held_exchanges, whole=True)) is not None:
        return stopped
    said = f"tasktape import: {counted(count - skipped, 'exchange')} from {path} -> {db}"
    if skipped:
        said += f" ({skipped} of {counted(count, 'exchange')} already in {db}: skipped)"
    _say(said)
    return None


def _finish(
    writer: LogWriter,
    one: _Loaded,
    content: _Cassette,
    capture: int,
    db: Path,
    held_exchanges: dict[str, int],
) -> _Stopped | None:
    """The capture an import of this cassette left unfinished, finished: the exchanges it
    holds (those it wrote whole: ``take_back`` took out the one it may not have) are
    skipped by their uids, the rest written."""
    exchanges = _again(content)
    kept = _exchanges_of(db, capture)
    held_exchanges.update(kept)
    if (stopped := _load(writer, exchanges, capture, one, held_exchanges, whole=False)) is not None:
        return stopped
    _say(
        f"tasktape import: {one.path}: capture {capture} in {db} was left unfinished ({len(kept)} of"
        f" {counted(content.count, 'exchange')}): the rest added"
    )
    return None


def _again(content: _Cassette) -> Iterator[Recorded]:
    """A cassette's exchanges read again, to be written; one found changed already is not
    imported."""
    try:
        return content.again()
    except CassetteError as exc:
        raise click.ClickException(f"{shown(str(exc))}: not imported") from None


def _load(
    writer: LogWriter,
    exchanges: Iterator[Recorded],
    capture: int,
    one: _Loaded,
    held_exchanges: dict[str, int],
    *,
    whole: bool,
) -> _Stopped | None:
    """A cassette's exchanges written into ``capture`` (``whole``: made for them), which is
    then ended; a cassette found changed as it is read is not: what was written of it is
    taken back once the writer is closed. Nor is one whose rows were not all written."""
    try:
        load_into(writer, _paced(writer, exchanges), capture, one.uid, held_exchanges)
    except CassetteError as exc:
        return _Changed(shown(str(exc)), capture, whole)
    return _ended(writer, capture, one.path)


def _ended(writer: LogWriter, capture: int, path: Path) -> _Lost | None:
    """``capture`` ended, once all it holds is written; if rows of it could not be, it is
    left unfinished (as an import stopped part-way), for importing the file again to finish."""
    writer.flush()
    if writer.stats.rows_lost:
        return _Lost(path, capture)
    writer.end_capture(capture)
    return None


@dataclass(frozen=True)
class _Changed:
    """A cassette found changed as it was read again, some of it written already into
    ``capture`` (``whole``: made for it)."""

    error: str
    capture: int
    whole: bool

    def taken_back(self, db: Path, first_written: int) -> str:
        """What was written of it taken out of the log (once its writer is closed), and what
        the import says of it: the rest of an unfinished capture stays, to be finished."""
        try:
            take_back(db, [(self.capture, None if self.whole else first_written)])
        except LogError:  # (another writer came in between: what was read stays, said)
            held = f"capture {self.capture} in {db} holds what was read of it, not what was checked"
            return f"{self.error}: {held}"
        return f"{self.error}: not imported (what was written of it is taken out of {db} again)"


@dataclass(frozen=True)
class _Lost:
    """Rows of a file's import that could not be written (a full disk, a row SQLite
    refused): its ``capture``, left unfinished."""

    path: Path
    capture: int

    def told(self, db: Path) -> str:
        """What the import says of the file: importing it again finishes it once there is
        room, when the log was full (the writer then marks what it kept without its bytes);
        room does not help rows SQLite refused."""
        said = f"{self.path} is in it in part, as capture {self.capture}, left unfinished"
        with EventLog(db) as log:
            cut = log.db.execute(_CUT_FOR_ROOM, (self.capture, LOG_FULL)).fetchone()
        return said if cut is None else f"{said}; importing it again, with room, finishes it"


_CUT_FOR_ROOM = "SELECT 1 FROM exchanges WHERE capture_id = ? AND instr(error, ?) LIMIT 1"


_Stopped = _Changed | _Lost


@dataclass
class _Capture:
    """A capture an import may add to: its id, and whether it was ended (else an import of
    the same file was stopped part-way, and finishes it)."""

    id: int
    ended: bool


def _imported(db: Path, uids: list[str]) -> tuple[dict[str, _Capture], dict[str, int]]:
    """The log's captures by uid (an imported cassette's follows from its bytes), and
    those of its exchanges whose uid is among ``uids``."""
    with EventLog(db) as log:
        captures = {c["uid"]: _Capture(c["id"], c["ended_at"] is not None) for c in log.captures()}
        exchanges: dict[str, int] = {}
        for start in range(0, len(uids), _UIDS_A_QUERY):
            some = uids[start : start + _UIDS_A_QUERY]
            marks = ", ".join("?" * len(some))
            query = f"SELECT uid, id FROM exchanges WHERE uid IN ({marks})"
            exchanges.update(log.db.execute(query, some).fetchall())
    return captures, exchanges


def _exchanges_of(db: Path, capture: int) -> dict[str, int]:
    """The exchanges of a capture, by uid."""
    with EventLog(db) as log:
        return dict(log.db.execute("SELECT uid, id FROM exchanges WHERE capture_id = ?", (capture,)))


@dataclass(frozen=True)
class _Unfinished:
    """A capture an import left unfinished: stopped part-way (interrupted, killed, out of
    room)."""

    id: int
    uid: str
    file: str  # the file it was imported from, its whole path ("" when unknown)
    exchanges: int
    last: int | None  # its last exchange's id
    first_cut: int | None  # the first of its exchanges a full log kept without their bytes


_UNFINISHED = (
    "SELECT c.id, c.uid, c.argv, count(x.id), max(x.id), min(CASE WHEN instr(x.error, :full) THEN x.id END)"
    " FROM captures c LEFT JOIN exchanges x ON x.capture_id = c.id"
    " WHERE c.ended_at IS NULL AND c.source IN ('import', 'mitm-import') GROUP BY c.id"
)


def _unfinished(db: Path) -> list[_Unfinished]:
    """The captures imports left unfinished in ``db`` (none in what is no log yet: the
    writer opening it says what is wrong with it)."""
    try:
        if not db.is_file() or kind_of(db) is not FileKind.LOG:
            return []
        with EventLog(db) as log:
            rows = log.db.execute(_UNFINISHED, {"full": LOG_FULL}).fetchall()
    except (OSError, LogError, sqlite3.DatabaseError):
        return []
    return [_Unfinished(i, uid, _file_of(argv), n, last, cut) for i, uid, argv, n, last, cut in rows]


def _file_of(argv: str | None) -> str:
    """The file an import's capture was made of: its argv's only word ("" when the argv is
    no list of words: another program's writing)."""
    try:
        words = json.loads(argv or "[]")
    except ValueError:
        return ""
    return words[0] if type(words) is list and words and type(words[0]) is str else ""


def _take_back_unfinished(db: Path, loaded: list[_Loaded], replace: bool) -> None:
    """Before the log is written, what imports of these files left unfinished is taken
    back: the last exchange of a cassette's capture (finished after), a flow file's capture
    whole (imported again), and with ``replace`` the capture of a file that held other
    content then. Without ``replace``, such a capture is an error, and nothing is written."""
    unfinished = _unfinished(db)
    taken: list[tuple[int, int | None]] = []
    other: list[str] = []
    for one in loaded:
        for capture in unfinished:
            if capture.uid == one.uid and isinstance(one.content, _Flows):
                taken.append((capture.id, None))  # (a flow file is imported again whole)
            elif capture.uid == one.uid:
                # The exchange its writer may have left half written, and from the first a
                # full log cut on (the rest were cut, or not written at all).
                first = min((i for i in (capture.last, capture.first_cut) if i is not None), default=None)
                if first is not None:
                    taken.append((capture.id, first))
            elif _same_file(capture.file, one.path):
                taken.append((capture.id, None))
                other.append(
                    f"capture {capture.id} in {db} ({counted(capture.exchanges, 'exchange')}) is an import of"
                    f" {capture.file} left unfinished, when it held other content than {one.path} holds now"
                )
    if other and not replace:
        how = "--replace-unfinished replaces it with what the file holds now"
        raise click.ClickException(shown(f"{'; '.join(other)}: nothing imported ({how})"))
    if taken:
        take_back(db, taken)


def _same_file(named: str, path: Path) -> bool:
    """Whether a capture's file (named wholly; a name relative to a folder no longer known
    is no file's) is ``path``, a file (a pipe's content is another each time)."""
    try:
        return path.is_file() and Path(named).is_absolute() and Path(named).resolve() == path.resolve()
    except OSError:
        return False


def _held(uids: list[str], held: dict[str, int]) -> int:
    """How many of a cassette's exchanges ``load_into`` leaves out (of those with ``uids``):
    their uid held, or given to one before them."""
    seen: set[str] = set()
    count = 0
    for uid in uids:
        count += uid in held or uid in seen
        seen.add(uid)
    return count


# Uids looked up in one query (SQLite's bound on a query's parameters is 32766).
_UIDS_A_QUERY = 10_000
# How far an import lets the writer fall behind, in chunk bytes and in exchanges: it reads
# exchanges faster than they are written, and what waits is in memory.
_BEHIND = 16 * 2**20
_EXCHANGES_BEHIND = 1000


def _paced(writer: LogWriter, exchanges: Iterable[Recorded]) -> Iterator[Recorded]:
    """``exchanges``, handed on no further ahead of the writer than ``_BEHIND`` bytes and
    ``_EXCHANGES_BEHIND`` exchanges; none once rows could not be written (a full disk takes
    no more)."""
    for n, r in enumerate(exchanges, 1):
        if writer.backlog > _BEHIND or n % _EXCHANGES_BEHIND == 0:
            writer.flush()
        if writer.stats.rows_lost:
            return
        yield r


def _read(path: Path, db: Path) -> _Loaded:
    """A cassette's exchanges, or a flow file's flows, and the capture they make; a log is
    not imported but merged."""
    content = read_once(path)  # a pipe (export -o - | import /dev/stdin) is read only once, whole
    kind = kind_of(path) if content is None else kind_of_bytes(content)
    if kind is FileKind.LOG and path.is_file() and named_kind(path) is FileKind.DATABASE:
        raise CassetteError(f"{path} is {FileKind.DATABASE}, nor a cassette: there is nothing to import")
    if kind is FileKind.LOG and _same(path, db):
        raise CassetteError(f"{path} is the event log --db names: a log is not imported into itself")
    if kind is FileKind.LOG:
        raise CassetteError(
            f"{path} is {kind}, not a cassette: tasktape merge {path} -o {db} adds its rows to another log"
        )
    if kind is FileKind.FLOWS and content is not None:  # (mitmproxy reads the file again)
        raise CassetteError(f"{path} is {kind} given as a stream: give the flow file's path")
    if kind is FileKind.FLOWS:
        return _Loaded(path, _read_flows(path), imported_uid(path.read_bytes()))
    if content is None:
        return _checked(path)
    recorded = read_cassette(path, content=content)
    header = read_header(path, content=content)  # checked as read_cassette read it
    uid = imported_uid(content, header.get("created_at"))
    exchanges = _Cassette(len(recorded), [r.uid for r in recorded if r.uid], lambda: iter(recorded))
    return _Loaded(path, exchanges, uid, header.get("upstream"))


def _same(path: Path, db: Path) -> bool:
    """Whether ``path`` and ``db`` are one file (however each is named)."""
    try:
        return path.samefile(db)
    except OSError:  # (no log at db yet)
        return False


def _checked(path: Path) -> _Loaded:
    """A cassette file read through and checked, of which only its exchanges' count and
    uids are kept: it is read again as it is written, an exchange at a time (a file of
    gigabytes is never in memory whole)."""
    reader, digest, count, uids = CassetteReader(path), hashlib.sha256(), 0, []
    with path.open("rb") as file:
        # Checked as they are read again, line for line, but nothing made of them is kept.
        for uid in reader.uids(hashed_lines(file, digest.update)):
            count += 1
            if uid:
                uids.append(uid)
        read = _Version.of(file, digest.hexdigest())
    exchanges = _Cassette(count, uids, lambda: _read_again(path, read))
    return _Loaded(
        path,
        exchanges,
        digest_uid(read.sha256, reader.header.get("created_at")),
        reader.header.get("upstream"),
    )


@dataclass(frozen=True)
class _Version:
    """Which file was read, and what it held: read again, it must be the same."""

    file: tuple[int, int]  # its device and inode
    size: int
    modified_ns: int
    sha256: str  # of its bytes

    @classmethod
    def of(cls, file: BinaryIO, sha256: str) -> _Version:
        st = os.fstat(file.fileno())
        return cls((st.st_dev, st.st_ino), st.st_size, st.st_mtime_ns, sha256)


def _read_again(path: Path, read: _Version) -> Iterator[Recorded]:
    """The exchanges of a cassette file checked before (``read``), read again. It is opened
    at once: found changed already (another file, another size or time), it is an error
    before any exchange is written."""
    try:
        file = path.open("rb")
    except OSError:
        raise _changed(path) from None
    if _Version.of(file, read.sha256) != read:
        file.close()
        raise _changed(path)
    return _each_again(path, file, read.sha256)


def _each_again(path: Path, file: BinaryIO, sha256: str) -> Iterator[Recorded]:
    """``_read_again``'s exchanges, one at a time; the file's bytes must hash as they did."""
    digest = hashlib.sha256()
    with file:
        try:
            yield from CassetteReader(path).exchanges(hashed_lines(file, digest.update))
        except (CassetteError, OSError):
            raise _changed(path) from None
    if digest.hexdigest() != sha256:
        raise _changed(path)


def _changed(path: Path) -> CassetteError:
    return CassetteError(f"{path} changed after it was checked")


@dataclass
class _Cassette:
    """A cassette checked for import: how many exchanges it holds, the uids they give (to
    leave out those the log holds), and its exchanges read again, to write them."""

    count: int
    uids: list[str]
    again: Callable[[], Iterator[Recorded]]


@dataclass
class _Flows:
    flows: list[Any]  # mitmproxy HTTPFlows
    others: int  # TCP, UDP and DNS flows, which have no place in the log


@dataclass
class _Loaded:
    """A file read and checked for import: what it holds, and its capture's uid (which
    follows from its bytes) and upstream (a cassette's header names it)."""

    path: Path
    content: _Cassette | _Flows
    uid: str
    upstream: str | None = None

    @property
    def uids(self) -> list[str]:
        """The uids a cassette's exchanges give (a flow file's flows are read as they are
        imported)."""
        return self.content.uids if isinstance(self.content, _Cassette) else []


def _read_flows(path: Path) -> _Flows:
    # Here, not at the top: mitm_command loads the proxy (aiohttp), which a cassette's import
    # has no use for.
    from .mitm_command import INSTALL_HINT, mitmproxy_missing  # noqa: PLC0415

    if mitmproxy_missing():
        raise click.ClickException(shown(f"{path} is a mitmproxy flow file, and {INSTALL_HINT}"))
    from tasktape.proxy.mitm_flows import read_flow_file  # noqa: PLC0415 - mitmproxy is optional

    return _Flows(*read_flow_file(path))


def _import_flows(writer: LogWriter, path: Path, content: _Flows, capture: int, db: Path) -> _Lost | None:
    """A flow file's flows into the log, as ``capture``; each exchange's uid follows from
    the capture's and its flow's id. Rows that could not be written: the capture left
    unfinished (importing the file again takes it back whole)."""
    from tasktape.proxy.mitm_flows import record_saved_flow  # noqa: PLC0415 - see _read_flows

    uid = writer.capture_uids[capture]
    untimed = sum(record_saved_flow(writer, capture, flow, capture_uid=uid) for flow in content.flows)
    if (lost := _ended(writer, capture, path)) is not None:
        return lost
    notes = [f"{untimed} event streams without per-event timing"] if untimed else []
    if content.others:
        notes.append(f"{content.others} non-HTTP flows skipped")
    extra = f" ({'; '.join(notes)})" if notes else ""
    _say(f"tasktape import: {counted(len(content.flows), 'exchange')} from {path} -> {db}{extra}")
    return None
