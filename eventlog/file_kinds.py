"""What a file given to tasktape is, told by its first bytes: an event log (SQLite), a
mitmproxy flow file (tnetstrings), a cassette (anything else is read as one), or empty;
and how SQLite reads one where it is (a read-only folder) or says it cannot (damaged)."""

from __future__ import annotations

import os
import re
import sqlite3
from contextlib import closing
from enum import StrEnum
from pathlib import Path

from tasktape.errors import LogError

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


def read_only_uri(path: Path) -> str:
    """The URI to read the SQLite database at ``path`` with: ``mode=ro``, or, where SQLite
    cannot open it so (a log in WAL mode needs its ``-shm`` file beside it, which a folder
    this user cannot write cannot get), ``immutable=1`` too when the log is finished (no
    ``-wal`` file) and nothing can write it (:func:`_unwritable`): read as immutable, a
    log another user's writer still changes would read stale, then damaged. (Beside the
    file itself: a symlink's target, as SQLite follows it.)"""
    real = path.resolve()
    uri = f"{real.as_uri()}?mode=ro"
    if os.access(real.parent, os.W_OK) or _opens(uri):
        return uri
    wal = Path(f"{real}-wal")
    if wal.exists():
        raise LogError(
            f"cannot open {path} as an event log: its folder {real.parent} is read-only, and SQLite "
            f"reads its write-ahead log {wal.name} only with a {real.name}-shm file it makes there: "
            "copy both files into a folder that can be written to read them"
        )
    if not _unwritable(real):
        raise LogError(
            f"cannot open {path} as an event log: SQLite reads a log only with a {real.name}-shm file"
            f" beside it, which it cannot make in {real.parent} (read-only for this user), and the log"
            " may still be written by another: copy it into a folder you can write to read it, or, if"
            f" nothing writes it any more, make it read-only (chmod a-w {real})"
        )
    return f"{uri}&immutable=1"


def _unwritable(path: Path) -> bool:
    """Whether nothing can write the file: it is on a read-only mount, or no one may write
    it (no write permission at all, as an archive's read-only copy)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY) or not path.stat().st_mode & 0o222
    except OSError:
        return False


# How SQLite fails to read a log in WAL mode without its -shm file: it cannot open one (a
# log the user may write), or could only by writing (one the user may not).
_NO_SHM = (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY)


def _opens(uri: str) -> bool:
    """Whether SQLite reads the database at ``uri`` (False only when it cannot for want of
    its -shm file: other errors are the reader's to report)."""
    try:
        with closing(sqlite3.connect(uri, uri=True)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        return result_code(exc) not in _NO_SHM
    return True


def is_damage(path: Path, exc: sqlite3.Error) -> bool:
    """Whether SQLite failed on ``path`` because the log is damaged (pages overwritten, the
    file cut short), not because it is no database at all."""
    code = result_code(exc)
    if code == sqlite3.SQLITE_NOTADB:  # (of a file that begins as SQLite's do: damaged after that)
        return path.is_file() and is_log(path)
    return code == sqlite3.SQLITE_CORRUPT


def damage_note(path: Path, exc: sqlite3.Error) -> str:
    """What an error about reading ``path`` adds when the log is damaged."""
    return " (the log is damaged)" if is_damage(path, exc) else ""


def unreadable(path: Path, exc: sqlite3.Error) -> LogError:
    """The error for a log SQLite fails to read, naming the file."""
    return LogError(f"cannot read {path}: {exc}{damage_note(path, exc)}")


def result_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code for ``exc`` (its extended code carries it in the low
    byte); None for an error of the module's own."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF
