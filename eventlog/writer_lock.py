"""One writer per log: integer ids are handed out in memory (by a ``LogWriter``, or by a
merge), so two writers on one log would clash."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from tasktape.errors import LogBusy, LogError

# The locks this process holds, by descriptor: the file each is on, and the process that
# took it (a child forked since inherits this table; the writers in it are its parent's).
_HELD: dict[int, tuple[tuple[int, int], int]] = {}


def take_writer_lock(path: Path, *, shared: bool = False) -> int:
    """An exclusive lock on the log file itself, held for the writer's lifetime, so a second
    writer is refused however it names the file (a symlink, a hard link, another path to
    it). SQLite's own locks are of another kind (fcntl), which this one does not touch.

    ``shared``: for writers that let SQLite number their rows (fleet collectors), which may
    write side by side, but never beside a writer that numbers them itself."""
    refuse_unless_file(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise cannot_open(path, exc) from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise LogBusy(f"{path} is being written by {holder}") from None
    try:
        refuse_writer_of_0_1_0(path)
    except LogError:
        os.close(fd)
        raise
    _HELD[fd] = (_file_id(fd), os.getpid())
    return fd


def refuse_writer_of_0_1_0(path: Path) -> None:
    """A LogBusy while a writer of tasktape 0.1.0 (schema versions 5 and 6) writes the log:
    it locked ``<log>-lock`` (flock, exclusive), not the log, so this writer would write
    beside it, or upgrade the log under it (after which it loses every later exchange).
    Only a file that is there is looked at (none is made), and only for a moment: such a
    writer cannot open a log once it is upgraded."""
    for lock_path in dict.fromkeys((_lock_of_0_1_0(path), _lock_of_0_1_0(path.resolve()))):
        _refuse_if_held(path, lock_path)


def _refuse_if_held(path: Path, lock_path: Path) -> None:
    try:
        fd = os.open(lock_path, os.O_RDONLY)  # (flock needs no write access)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LogError(
            f"cannot open {lock_path}, the lock of tasktape 0.1.0's writers of {path} "
            f"({exc.strerror}): remove it if no such writer is running"
        ) from None
    try:
        # Shared: others looking at once do not refuse each other; the writer's exclusive
        # lock refuses them all.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LogBusy(
            f"{path} is being written by another tasktape writer (of tasktape 0.1.0, which holds {lock_path})"
        ) from None
    finally:
        os.close(fd)


def _lock_of_0_1_0(path: Path) -> Path:
    """The file tasktape 0.1.0's writer of the log named ``path`` locked: named after the
    path it was given (a link's beside the link)."""
    return path.with_name(path.name + "-lock")


def _file_id(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _holder(fd: int) -> str:
    """Who holds the lock the descriptor ``fd`` was refused: a writer this process left
    open (one dropped without close() keeps it until the process ends) is named as such."""
    if (_file_id(fd), os.getpid()) in _HELD.values():
        return f"another tasktape writer in this process (pid {os.getpid()}): close() the first"
    return "another tasktape writer (by this name or another)"


def cannot_open(path: Path, exc: OSError) -> LogError:
    """The error for a log that cannot be opened or made at ``path``, as every command that
    writes one says it: naming its folder when that is what is missing."""
    where = f": its folder {path.parent} does not exist" if not path.parent.is_dir() else ""
    return LogError(f"cannot open {path} as an event log ({exc.strerror}){where}")


def refuse_unless_file(path: Path) -> None:
    """Refuse a log at ``path`` that exists and is no regular file (/dev/null, a pipe): SQLite
    would write its journal beside it (/dev/null-journal), and the log would be nowhere. (A
    folder is left to ``os.open``, which says so.)"""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # (made as a file)
    except OSError as exc:  # (a name too long, a folder that is a file)
        raise cannot_open(path, exc) from None
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise LogError(
            f"cannot open {path} as an event log: it is a device or a pipe, not a file "
            "(SQLite writes a log, and its journal beside it, as files)"
        )


def release_writer_lock(fd: int) -> None:
    _HELD.pop(fd, None)
    os.close(fd)  # after the database is closed: see take_writer_lock
