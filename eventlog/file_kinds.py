"""What a file given to tasktape is, told by its first bytes: an event log (SQLite), a
mitmproxy flow file (tnetstrings), a cassette (anything else is read as one), or empty."""

from __future__ import annotations

import re
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
    # What ``schema.named_kind`` tells apart, for messages: neither is read as what it is not.
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


def is_log(path: Path) -> bool:
    return kind_of(path) is FileKind.LOG


def is_cassette(path: Path) -> bool:
    """Whether a file begins as a cassette does, with its header (any other text is read
    as one only where a cassette is asked for)."""
    with path.open("rb") as f:
        return _CASSETTE_START.match(f.read(64)) is not None
