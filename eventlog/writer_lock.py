"""One writer per log: integer ids are handed out in memory (by a ``LogWriter``, or by a
merge), so two writers on one log would clash."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from tasktape.errors import LogBusy, LogError


def take_writer_lock(path: Path, *, shared: bool = False) -> int:
    """An exclusive lock on the log file itself, held for the writer's lifetime, so a second
    writer is refused however it names the file (a symlink, a hard link, another path to
    it). SQLite's own locks are of another kind (fcntl), which this one does not touch.

    ``shared``: for writers that let SQLite number their rows (fleet collectors), which may
    write side by side, but never beside a writer that numbers them itself."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        where = f": its folder {path.parent} does not exist" if not path.parent.is_dir() else ""
        raise LogError(f"cannot open {path} as an event log ({exc.strerror}){where}") from None
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogBusy(
            f"{path} is being written by another tasktape writer (by this name or another)"
        ) from None
    return fd


def release_writer_lock(fd: int) -> None:
    os.close(fd)  # after the database is closed: see take_writer_lock
