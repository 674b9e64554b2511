"""What a file given to tasktape is, told by its first bytes: an event log (SQLite), a
mitmproxy flow file (tnetstrings), a cassette (anything else is read as one), or empty."""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from enum import StrEnum
from pathlib import Path

SQLITE_MAGIC = b"SQLite format 3\x00"
_FLOW_START = re.compile(rb"\d{1,12}:")  # a tnetstring: its length, then a colon
_CASSETTE_START = re.compile(rb'\s*\{\s*"tasktape_cassette"')


class FileKind(StrEnum):
    LOG = "an event log"
    FLOWS = "a mitmproxy flow file"
    CASSETTE = "a cassette"
    EMPTY = "empty"
    # What ``named_kind`` tells apart, for messages: neither is read as what it is not.
    DATABASE = "an SQLite database that is not a tasktape event log"
    OTHER = "a file that is neither an event log nor a cassette"


def kind_of(path: Path) -> FileKind:
    with path.open("rb") as f:
        return kind_of_bytes(f.read(16))


def kind_of_bytes(head: bytes) -> FileKind:
    """The kind of a file that begins with ``head`` (its first 16 bytes or more)."""
    head = head[:16]
    if not head:
        return FileKind.EMPTY
    if head == SQLITE_MAGIC:
        return FileKind.LOG
    return FileKind.FLOWS if _FLOW_START.match(head) else FileKind.CASSETTE


def read_once(path: Path) -> bytes | None:
    """The whole of a file that can be read only once (a pipe, /dev/stdin, the shell's
    ``<(...)``), read here so that its kind and its content are told from the same bytes;
    None for a regular file, which is read where it is needed."""
    return None if path.is_file() else path.read_bytes()


def named_kind(path: Path) -> FileKind:
    """The kind of a file as a message names it: ``kind_of``'s, but an SQLite database
    without tasktape's migrations is another program's, and text that does not begin as a
    cassette is none."""
    kind = kind_of(path)
    if kind is FileKind.LOG and not _has_tasktape_schema(path):
        return FileKind.DATABASE
    if kind is FileKind.CASSETTE and not is_cassette(path):
        return FileKind.OTHER
    return kind


def _has_tasktape_schema(path: Path) -> bool:
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            found = conn.execute(
                "SELECT 1 FROM _sqlite_migrations WHERE migration_set = 'tasktape' LIMIT 1"
            ).fetchone()
    except sqlite3.DatabaseError:  # (no such table, or no database at all)
        return False
    return found is not None


def is_log(path: Path) -> bool:
    return kind_of(path) is FileKind.LOG


def is_cassette(path: Path) -> bool:
    """Whether a file begins as a cassette does, with its header (any other text is read
    as one only where a cassette is asked for)."""
    with path.open("rb") as f:
        return _CASSETTE_START.match(f.read(64)) is not None
