"""Where recorded exchanges come from: event logs and cassettes (files, or folders of
``*.jsonl`` cassettes), in the order given."""

from __future__ import annotations

from pathlib import Path

from tasktape.errors import SourceError
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.recorded import Recorded, read_log

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_log(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(16) == SQLITE_MAGIC


def load(paths: list[str | Path]) -> list[Recorded]:
    """Every recorded exchange of the sources, in order."""
    recorded: list[Recorded] = []
    for source in map(Path, paths):
        if source.is_dir():
            cassettes = sorted(source.glob("*.jsonl"))
            if not cassettes:
                raise SourceError(f"{source}: a folder without cassettes (*.jsonl)")
            for cassette in cassettes:
                recorded += read_cassette(cassette)
        elif not source.exists():
            raise SourceError(f"{source}: no such file or folder")
        elif is_log(source):
            recorded += read_log(source)
        else:
            recorded += read_cassette(source)
    return recorded
