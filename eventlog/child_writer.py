"""The child side of ``ProcessLogWriter``: ``main(FD)`` runs a ``LogWriter`` on the
operations received over the socket FD, and answers there."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import os
import pickle
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from .producer import END, FLUSH, STOP
from .sqlite_settings import stop_counting_memory
from .writer import LogWriter


def main(fd: int) -> None:
    """Run the writer; the process ignores SIGINT, SIGTERM and SIGHUP already (see
    ``process_writer``): the recorder decides when it stops."""
    stop_counting_memory()  # this process only writes the log: before any connection opens
    conn = Connection(fd)
    try:
        path, options = conn.recv()
    except (EOFError, OSError):  # the recorder stopped (Ctrl-C) before it said which log
        return
    # When the CPU is short, forwarding goes first and the log catches up after.
    with contextlib.suppress(OSError):
        os.nice(10)
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        # If the recorder is gone, nobody hears the answer; the rows still get committed.
        with send_lock, contextlib.suppress(OSError):
            conn.send(message)

    try:
        writer = LogWriter(
            path,
            on_error=lambda exc, rows: send(("failed_batch", f"{type(exc).__name__}: {exc}", rows)),
            **options,
        )
    except BaseException as exc:  # reported to the recorder, which raises it
        send(("failed", exc))
        return
    # What start-up left (modules, the schema) lives as long as the process: out of the
    # collector's sight, its full collections traverse only the rows being built.
    gc.freeze()
    send(("ready", *writer.first_ids))
    while True:
        try:
            ops = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            writer.close()  # the recorder died: keep what it sent
            return
        # Hold the pipe (and so the recorder's own backlog check) back rather than
        # queue without bound here.
        while writer.backlog > writer.max_backlog // 2:
            time.sleep(0.002)
        stop = False
        for i, op in enumerate(ops):
            code = op[0]
            if code == END:
                done: concurrent.futures.Future[Any] = concurrent.futures.Future()
                done.add_done_callback(lambda f, token=op[5]: send(_answer(token, f)))
                ops[i] = (*op[:5], done)
            elif code == FLUSH:
                ops[i] = (FLUSH, lambda token=op[1]: send(("flushed", token)))
            elif code == STOP:
                del ops[i:]
                stop = True
                break
        writer.put_many(ops)
        if stop:
            writer.close()
            send(("closed", writer.stats))
            return


def _answer(token: int, done: concurrent.futures.Future[Any]) -> tuple[Any, ...]:
    """What the recorder hears of an exchange ended: its summary, or why it could not be
    recorded (its future raises that, as a ``LogWriter``'s would)."""
    exc = done.exception()
    return ("done", token, done.result()) if exc is None else ("not_done", token, str(exc))
