"""Chunks and events a log writer commits, encoded as shipping messages right then and
handed to the shipper over a pipe, so that shipping never reads them back from the log
(reading a row back costs more than recording it does).

A hint is an offer: the rows of ``table`` with rowids ``first`` to ``last``, as committed,
are these messages. The shipper takes the hints that start where its cursor stands and
reads the log for anything else (rows committed before it started, or whose hints were
dropped). A commit that wrote other rows (captures, exchanges, resumes) says so first
(``Changed``): the shipper reads those from the log. Neither side waits for the other: the
writer writes to the pipe what it takes and leaves the rest to a thread of its own,
dropping hints while too many wait; the shipper drops them while it holds too many itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import os
import select
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from .wire import MESSAGE_ROWS, Message, Rows, Table, encoded

_PIPE_BYTES = 1 << 20  # asked of the kernel for the pipe (Linux's default cap)
_WRITER_HOLDS = 32 << 20  # bytes of hints the writer keeps while the pipe is full
_SHIPPER_HOLDS = 64 << 20  # bytes of hints the shipper keeps ahead of its cursor
_UIDS_KEPT = 100_000  # exchanges whose uids the writer remembers
_LENGTH = 4  # bytes of a frame's length, before the frame


class Hint(msgspec.Struct, array_like=True, frozen=True, tag=True):
    table: Table
    first: int  # rowids
    last: int
    messages: list[Message]


class Changed(msgspec.Struct, array_like=True, frozen=True, tag=True):
    """A commit wrote captures, exchanges or resumes (which the shipper reads from the log)."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Hint | Changed)


def _widen(fd: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


class HintSender:
    """The writer's end, a log writer's ``CommitTap``: ``committed`` after each commit,
    from the thread that commits, which writes the hints to the pipe ``fd`` itself while
    the pipe takes them; what it cannot take, a thread of its own writes once it can."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.fds = (fd,)

    def open(self, conn: sqlite3.Connection) -> None:
        os.set_blocking(self._fd, False)
        _widen(self._fd)
        self._conn = conn
        self._uids: dict[int, tuple[str, str]] = {}  # exchange id -> (its capture's uid, its uid)
        self._frames: collections.deque[bytes | bytearray | None] = collections.deque()
        self._queued = 0  # bytes in _frames
        self._ready = threading.Condition()
        self._open = True
        self._thread = threading.Thread(target=self._send, name="tasktape-writer:hints", daemon=True)
        self._thread.start()

    def committed(self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]], last: int) -> None:
        """``rows`` (their first value their exchange's id) were committed, ending at rowid ``last``."""
        if not rows:
            return
        first = last - len(rows) + 1
        # A hint a message's worth of rows at most: a writer that fell behind commits
        # tens of thousands at once, which would be one frame of megabytes.
        for at in range(0, len(rows), MESSAGE_ROWS):
            if not self._open or self._queued > _WRITER_HOLDS:
                return  # the shipper reads these rows from the log
            part = rows[at : at + MESSAGE_ROWS]
            start = first + at
            messages = self._messages(Table(table), columns, part, start)
            self._send_or_queue(_frame(Hint(Table(table), start, start + len(part) - 1, messages)))

    def changed(self) -> None:
        if self._open:
            self._send_or_queue(_frame(Changed()))

    def _send_or_queue(self, frame: bytearray) -> None:
        with self._ready:
            if not self._frames:  # nothing before it: this thread writes what the pipe takes
                try:
                    sent = os.write(self._fd, frame)
                except BlockingIOError:
                    sent = 0
                except OSError:  # the shipper is gone: it reads the log when it is back
                    self._open = False
                    return
                if sent == len(frame):
                    return
                del frame[:sent]
            self._frames.append(frame)
            self._queued += len(frame)
            self._ready.notify()

    def _messages(
        self, table: Table, columns: Sequence[str], rows: list[tuple[Any, ...]], first: int
    ) -> list[Message]:
        """The messages of rows from rowid ``first`` on: one capture's rows per message."""
        uids = self._uids_of({row[0] for row in rows})
        captures = {cap for cap, _ in uids.values()}
        if len(captures) == 1:
            groups = [(captures.pop(), rows, range(first, first + len(rows)))]
        else:
            groups = _by_capture(rows, first, uids)
        messages: list[Message] = []
        for capture, part, rowids in groups:
            exchanges = {x: uid for x, (cap, uid) in uids.items() if cap == capture}
            messages += encoded(Rows(table, capture, tuple(columns), part, exchanges), rowids)
        return messages

    def _uids_of(self, ids: Iterable[int]) -> dict[int, tuple[str, str]]:
        wanted = set(ids)
        missing = sorted(wanted - self._uids.keys())
        if missing:
            if len(self._uids) > _UIDS_KEPT:
                self._uids.clear()
            marks = ", ".join("?" * len(missing))
            found = self._conn.execute(
                "SELECT x.id, c.uid, x.uid FROM exchanges x JOIN captures c ON c.id = x.capture_id"
                f" WHERE x.id IN ({marks})",
                missing,
            )
            self._uids.update((x, (cap, uid)) for x, cap, uid in found)
        return {x: self._uids[x] for x in wanted}

    def _send(self) -> None:
        """Write the frames queued, each as the pipe takes it; a frame leaves the queue
        once written, so that none is written before it meanwhile."""
        while True:
            with self._ready:
                while not self._frames:
                    self._ready.wait()
                frame = self._frames[0]
            if frame is None:
                break
            try:
                view = memoryview(frame)
                while view:
                    select.select([], [self._fd], [])
                    with contextlib.suppress(BlockingIOError):
                        view = view[os.write(self._fd, view) :]
            except OSError:  # the shipper is gone: it reads the log when it is back
                self._open = False
                break
            finally:
                with self._ready:
                    self._frames.popleft()
                    self._queued -= len(frame)
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def close(self, timeout: float = 2.0) -> None:
        """Stop, once the hints queued are sent (for at most ``timeout`` seconds)."""
        if self._open:
            self._open = False
            with self._ready:
                self._frames.append(None)
                self._ready.notify()
        self._thread.join(timeout)


def _frame(hint: Hint | Changed) -> bytearray:
    frame = bytearray(_LENGTH)
    _encoder.encode_into(hint, frame, _LENGTH)
    frame[:_LENGTH] = (len(frame) - _LENGTH).to_bytes(_LENGTH, "big")
    return frame


def _by_capture(
    rows: list[tuple[Any, ...]], first: int, uids: dict[int, tuple[str, str]]
) -> list[tuple[str, list[tuple[Any, ...]], list[int]]]:
    groups: dict[str, tuple[list[tuple[Any, ...]], list[int]]] = {}
    for rowid, row in enumerate(rows, first):
        part, rowids = groups.setdefault(uids[row[0]][0], ([], []))
        part.append(row)
        rowids.append(rowid)
    return [(capture, part, rowids) for capture, (part, rowids) in groups.items()]


class HintReader:
    """The shipper's end, read on its event loop."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        _widen(fd)
        self._fd = fd
        self._buffer = bytearray()
        self._hints: dict[tuple[Table, int], Hint] = {}
        self._held = 0  # payload bytes
        self.arrived = asyncio.Event()  # set when a hint comes; the shipper clears it
        self.changed = False  # whether other rows were written since the shipper last looked
        self.open = True  # until the writer closes its end
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, _PIPE_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the writer closed its end
            self.close()
            return
        buffer = self._buffer
        buffer += data
        at = 0
        while len(buffer) - at >= _LENGTH:
            size = int.from_bytes(buffer[at : at + _LENGTH], "big")
            if len(buffer) - at - _LENGTH < size:
                break
            self._hold(_decoder.decode(memoryview(buffer)[at + _LENGTH : at + _LENGTH + size]))
            at += _LENGTH + size
        del buffer[:at]

    def _hold(self, hint: Hint | Changed) -> None:
        if isinstance(hint, Changed):
            self.changed = True
            self.arrived.set()
            return
        size = sum(len(m.payload) for m in hint.messages)
        if self._held + size > _SHIPPER_HOLDS:
            return
        self._hints[(hint.table, hint.first)] = hint
        self._held += size
        self.arrived.set()

    def take(self, table: Table, first: int) -> Hint | None:
        """The hint of the rows from rowid ``first`` on, if there is one."""
        hint = self._hints.pop((table, first), None)
        if hint is not None:
            self._held -= sum(len(m.payload) for m in hint.messages)
        return hint

    def next_first(self, table: Table, after: int) -> int | None:
        """Where the first hint of ``table`` past rowid ``after`` starts."""
        return min((first for t, first in self._hints if t is table and first > after), default=None)

    def forget(self, table: Table, through: int) -> None:
        """Drop the hints of rows already shipped (read from the log instead)."""
        for key in [k for k, h in self._hints.items() if k[0] is table and h.last <= through]:
            self.take(*key)

    def close(self) -> None:
        self.open = False
        if self._loop is not None:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._fd)
            self._loop = None
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
