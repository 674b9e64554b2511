"""``tasktape export`` and ``tasktape import``: between event logs and cassettes."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from tasktape.counted import counted
from tasktape.errors import CassetteError, FlowFileError, LogBusy, LogError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import (
    cassette_lines,
    imported_uid,
    load_into,
    read_cassette,
    read_header,
    replace_with,
)
from tasktape.eventlog.file_kinds import FileKind, kind_of, kind_of_bytes
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.recorded import Recorded, each_from_log
from tasktape.eventlog.redact import Redactor
from tasktape.eventlog.schema import named_kind
from tasktape.eventlog.sqlite_settings import stop_counting_memory

from .redaction_options import redaction_options


def bad_input(message: str) -> click.ClickException:
    """A file that is not what the command takes: a usage error (exit status 2, as click's
    own), said on one line."""
    error = click.ClickException(message)
    error.exit_code = 2
    return error


@click.command("export")
@click.argument("log", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="The cassette to write (- for standard output).",
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
    chosen exchanges is included, so a client replaying them can start by reading it.
    Each choice must match something. An exchange the log holds no end of yet (its
    recorder still writing it) is written cut short there, as log_closed.
    Exit status: 0 written, 1 not written (nothing to export, a choice matching nothing, a
    write that failed), 2 bad input (LOG no event log this tasktape reads, -o a log).
    """
    target = Path(output)
    if output != "-" and target.is_file() and kind_of(target) is FileKind.LOG:
        # A log (this one, most likely: `-o` where `--db` was meant) is never written over.
        raise bad_input(f"{output} is {FileKind.LOG}: a cassette is not written over it")
    try:
        opened = EventLog(log)
    except LogError as exc:  # what is no log this tasktape reads: bad input
        raise bad_input(str(exc)) from None
    with opened:
        capture_of = dict(opened.db.execute("SELECT id, capture_id FROM exchanges").fetchall())
        _check_choices(opened, tasks, contexts, [n for n in exchanges if n not in capture_of])
        ids = sorted(
            set(opened.select(tasks=tasks, contexts=contexts, exchanges=exchanges, with_cards=not no_cards))
        )
        if not ids:
            raise click.ClickException(f"{log} has no exchanges: there is nothing to export")
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
            sys.stdout.writelines(lines)
        else:
            folder_for(target)  # cassettes/ as tests name it
            try:
                replace_with(target, lines)
            except CassetteError as exc:
                raise click.ClickException(str(exc)) from None
            click.echo(f"tasktape export: {counted(len(ids), 'exchange')} from {log} -> {output}", err=True)
    for r in under_way:
        click.echo(
            f"tasktape export: {r.origin} ({r.request_line}) has no end in the log yet: exported as "
            f"cut short ({Outcome.LOG_CLOSED})",
            err=True,
        )


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
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None


def _check_choices(
    log: EventLog, tasks: tuple[str, ...], contexts: tuple[str, ...], missing: list[int]
) -> None:
    """Each task and context chosen must match something, and no exchange be ``missing``:
    one mistyped among others would otherwise leave its exchanges out unnoticed."""
    unmatched = [f"task {t}" for t in tasks if not log.select(tasks=[t], with_cards=False)]
    unmatched += [f"context {c}" for c in contexts if not log.select(contexts=[c], with_cards=False)]
    unmatched += [f"exchange {n}" for n in missing]
    if unmatched:
        raise click.ClickException(f"{log.path}: nothing matches {', '.join(unmatched)}; nothing written")


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
@redaction_options()
def import_(
    files: tuple[Path, ...],
    db: Path,
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
    Exit status: 0 imported, 1 not (the log busy with another writer, rows not written), 2 bad
    input (a file no cassette or flow file, --db no event log).
    """
    try:
        # Every file is read and checked before anything is written.
        loaded = [_read(f, db) for f in files]
    except (CassetteError, FlowFileError) as exc:
        raise bad_input(str(exc)) from None
    stop_counting_memory()
    folder_for(db)
    try:
        # What a file holds is kept whole: a body is as long as its recorder kept it, and
        # nothing waits on the writer but bytes already in memory (so none is dropped).
        redactor = Redactor(headers=redact_header, json_pointers=redact_json, query=redact_query)
        writer = LogWriter(db, redactor=redactor, max_body=sys.maxsize, max_backlog=sys.maxsize)
    except LogBusy as exc:  # another writer holds it: a failure, not bad input
        raise click.ClickException(str(exc)) from None
    except LogError as exc:
        raise bad_input(str(exc)) from None
    held, held_exchanges = _imported(db, [r.uid for one in loaded for r in one.exchanges if r.uid])
    with writer:
        for one in loaded:
            path, content, uid = one.path, one.content, one.uid
            if uid in held:
                click.echo(
                    f"tasktape import: {path} is in {db} already (capture {held[uid]}): nothing added",
                    err=True,
                )
                continue
            if isinstance(content, _Flows):
                held[uid] = _import_flows(writer, path, content, db, uid)
                continue
            # An exchange exported from a log keeps its uid: one the log holds (this cassette
            # exported from it, or imported or merged before) is not added again.
            skipped = _held(one.exchanges, held_exchanges)
            if skipped == len(content) and content:
                click.echo(
                    f"tasktape import: {path}: {skipped} of {counted(len(content), 'exchange')} already"
                    f" in {db}: nothing added",
                    err=True,
                )
                continue
            capture = held[uid] = writer.begin_capture(
                source="import", upstream=one.upstream, argv=[str(path)], uid=uid
            )
            load_into(writer, content, capture, uid, held_exchanges)
            writer.end_capture(capture)
            said = f"tasktape import: {counted(len(content) - skipped, 'exchange')} from {path} -> {db}"
            if skipped:
                said += f" ({skipped} of {counted(len(content), 'exchange')} already in {db}: skipped)"
            click.echo(said, err=True)
    if writer.stats.rows_lost:
        raise click.ClickException(
            f"{writer.stats.rows_lost} rows could not be written: {writer.stats.last_error}"
        )


def _imported(db: Path, uids: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """The log's captures by uid (an imported cassette's follows from its bytes), and
    those of its exchanges whose uid is among ``uids``."""
    with EventLog(db) as log:
        captures = {c["uid"]: c["id"] for c in log.captures()}
        exchanges: dict[str, int] = {}
        for start in range(0, len(uids), _UIDS_A_QUERY):
            some = uids[start : start + _UIDS_A_QUERY]
            marks = ", ".join("?" * len(some))
            query = f"SELECT uid, id FROM exchanges WHERE uid IN ({marks})"
            exchanges.update(log.db.execute(query, some).fetchall())
    return captures, exchanges


def _held(exchanges: list[Recorded], held: dict[str, int]) -> int:
    """How many of a cassette's exchanges ``load_into`` leaves out: their uid held, or given
    to one before them."""
    seen: set[str] = set()
    count = 0
    for uid in filter(None, (r.uid for r in exchanges)):
        count += uid in held or uid in seen
        seen.add(uid)
    return count


# Uids looked up in one query (SQLite's bound on a query's parameters is 32766).
_UIDS_A_QUERY = 10_000


def _read(path: Path, db: Path) -> _Loaded:
    """A cassette's exchanges, or a flow file's flows, and the capture they make; a log is
    not imported but merged."""
    content = path.read_bytes()  # once: a pipe (export -o - | import /dev/stdin) is read only once
    kind = kind_of_bytes(content)
    if kind is FileKind.LOG and path.is_file() and named_kind(path) is FileKind.DATABASE:
        raise CassetteError(f"{path} is {FileKind.DATABASE}, nor a cassette: there is nothing to import")
    if kind is FileKind.LOG:
        raise CassetteError(
            f"{path} is {kind}, not a cassette: tasktape merge {path} -o {db} adds its rows to another log"
        )
    if kind is FileKind.FLOWS and not path.is_file():  # (mitmproxy reads the file again)
        raise CassetteError(f"{path} is {kind} given as a stream: give the flow file's path")
    if kind is FileKind.FLOWS:
        return _Loaded(path, _read_flows(path), imported_uid(content))
    recorded = read_cassette(path, content=content)
    header = read_header(path, content=content)  # checked as read_cassette read it
    uid = imported_uid(content, header.get("created_at"))
    return _Loaded(path, recorded, uid, header.get("upstream"))


@dataclass
class _Flows:
    flows: list[Any]  # mitmproxy HTTPFlows
    others: int  # TCP, UDP and DNS flows, which have no place in the log


@dataclass
class _Loaded:
    """A file read and checked for import: what it holds, and its capture's uid (which
    follows from its bytes) and upstream (a cassette's header names it)."""

    path: Path
    content: list[Recorded] | _Flows
    uid: str
    upstream: str | None = None

    @property
    def exchanges(self) -> list[Recorded]:
        """A cassette's exchanges (a flow file's flows are read as they are imported)."""
        return self.content if isinstance(self.content, list) else []


def _read_flows(path: Path) -> _Flows:
    # Here, not at the top: mitm_command loads the proxy (aiohttp), which a cassette's import
    # has no use for.
    from .mitm_command import INSTALL_HINT, mitmproxy_missing  # noqa: PLC0415

    if mitmproxy_missing():
        raise click.ClickException(f"{path} is a mitmproxy flow file, and {INSTALL_HINT}")
    from tasktape.proxy.mitm_flows import read_flow_file  # noqa: PLC0415 - mitmproxy is optional

    return _Flows(*read_flow_file(path))


def _import_flows(writer: LogWriter, path: Path, content: _Flows, db: Path, uid: str) -> int:
    """A flow file's flows into the log, as one capture (its id); each exchange's uid
    follows from the capture's and its flow's id."""
    from tasktape.proxy.mitm_flows import record_saved_flow  # noqa: PLC0415 - see _read_flows

    capture = writer.begin_capture(source="mitm-import", upstream=None, argv=[str(path)], uid=uid)
    untimed = sum(record_saved_flow(writer, capture, flow, capture_uid=uid) for flow in content.flows)
    writer.end_capture(capture)
    notes = [f"{untimed} event streams without per-event timing"] if untimed else []
    if content.others:
        notes.append(f"{content.others} non-HTTP flows skipped")
    extra = f" ({'; '.join(notes)})" if notes else ""
    click.echo(
        f"tasktape import: {counted(len(content.flows), 'exchange')} from {path} -> {db}{extra}", err=True
    )
    return capture
