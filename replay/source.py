"""Where recorded exchanges come from: event logs and cassettes (files, or folders of
``*.jsonl`` cassettes, their subfolders included), in the order given."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tasktape.errors import SourceError
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.file_kinds import FileKind, is_log, kind_of, kind_of_bytes, read_once
from tasktape.eventlog.recorded import Recorded, read_log


def load(paths: list[str | Path], warn: Callable[[str], None] | None = None) -> list[Recorded]:
    """Every recorded exchange of the sources, in order; ``warn`` is told of each event
    log a folder holds, which is not read (see ``cassettes_in``)."""
    if isinstance(paths, str | Path):  # one source, not a list of them (a str's letters)
        raise SourceError(f"load() takes a list of sources: load([{str(paths)!r}])")
    recorded: list[Recorded] = []
    for source in map(Path, paths):
        if source.is_dir():
            for cassette in cassettes_in(source, warn):
                recorded += read_cassette(source / cassette, cassette.as_posix())
        elif not source.exists():
            raise SourceError(f"{source}: no such file or folder")
        else:
            recorded += _read_file(source)
    return recorded


def cassettes_in(folder: Path, warn: Callable[[str], None] | None = None) -> list[Path]:
    """The cassettes under a folder, as paths relative to it, in order (the pytest plug-in
    keeps one folder of them per test module); hidden folders left out, folders linked to
    followed (each once: a link that loops back is not). A SourceError when there is none.
    Event logs in it are not read (a folder means its cassettes): ``warn`` is told of each,
    and the error names them."""
    found: list[Path] = []
    logs: list[Path] = []
    seen: set[str] = set()
    for where, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(where)
        if real in seen:  # reached again through a link
            folders.clear()
            continue
        seen.add(real)
        folders[:] = [f for f in folders if not f.startswith(".")]
        here = Path(where).relative_to(folder)
        found += [here / f for f in files if f.endswith(".jsonl") and (Path(where) / f).is_file()]
        # Only what is not named as a cassette is looked into: a folder of many stays quick.
        logs += [Path(where) / f for f in files if not f.endswith(".jsonl") and _is_log(Path(where) / f)]
    logs.sort()
    if not found:
        held = f"; it holds {_listed(logs)}, not read: give a log by its path" if logs else ""
        raise SourceError(f"{folder}: a folder without cassettes (*.jsonl, in it or its subfolders){held}")
    for log in logs if warn else ():
        warn(f"{log} is an event log: a folder is read for its cassettes; give a log by its path")
    return sorted(found)


def _is_log(path: Path) -> bool:
    """Whether ``path`` is an event log, told by its first bytes (an unreadable file is not)."""
    try:
        return path.is_file() and is_log(path)
    except OSError:
        return False


_NAMED = 5  # event logs a message names, at most


def _listed(logs: list[Path]) -> str:
    """The event logs a folder holds, for a message: the first few by name."""
    shown = ", ".join(map(str, logs[:_NAMED]))
    more = f" and {len(logs) - _NAMED} more" if len(logs) > _NAMED else ""
    return f"event logs ({shown}{more})" if len(logs) > 1 else f"an event log ({shown})"


def _read_file(source: Path) -> list[Recorded]:
    content = read_once(source)
    kind = kind_of(source) if content is None else kind_of_bytes(content)
    if kind is FileKind.LOG and content is not None:
        raise SourceError(
            f"{source} is {kind} given as a stream: SQLite reads a log from a file; give its path"
        )
    if kind is FileKind.LOG:
        return read_log(source)
    if kind is FileKind.FLOWS:
        raise SourceError(
            f"{source} is {kind}: import it into an event log first (tasktape import {source} --db LOG)"
        )
    if kind is FileKind.EMPTY:
        raise SourceError(f"{source} is empty: neither an event log nor a cassette")
    return read_cassette(source, content=content)
