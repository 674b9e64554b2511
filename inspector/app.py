"""What ``tasktape inspect`` serves: Datasette over one event log, read-only, with
tasktape's metadata (the plugin itself is loaded through its entry point), under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import math
import os
import re
import signal
import socket
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from datasette.app import Datasette
from datasette.database import Database

from tasktape.eventlog.file_kinds import read_only_uri

from .metadata import metadata

SETTINGS = {
    # Views such as task_summary aggregate per task: give them time on big logs.
    "sql_time_limit_ms": 5000,
    "facet_time_limit_ms": 1000,
    # Suggesting facets runs a query per column over the whole table or view: seconds on a
    # big log's views, for facets their metadata already names.
    "suggest_facets": False,
    # Answers and raw frames are long: tables show their start, row and task pages all of it.
    "truncate_cells_html": 240,
}


class ReadOnlyLog(Database):
    """A log opened read-only for every connection, writes included: nothing Datasette or a
    plugin does can change it. Not immutable, so rows a recorder is still writing show up
    (but where nothing can write it: ``read_only_uri``). Opened by its URI, in which the
    path is escaped: Datasette's own would read a ``#`` or ``?`` in a name as the URI's."""

    def connect(self, write: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(read_only_uri(Path(self.path)), uri=True, check_same_thread=False)
        self._all_file_connections.append(conn)  # (as Datasette's own: closed with it)
        return conn


def create_datasette(path: str | Path) -> Datasette:
    """Datasette over the log at ``path``, served as the database named after its file
    (see ``served_name``); its pages' title names the file as it is."""
    path = Path(path).resolve()
    name = served_name(path.stem)
    ds = Datasette(metadata=_titled(metadata(name), name, path.stem), settings=SETTINGS)
    ds.add_database(ReadOnlyLog(ds, path=str(path)), name=name)
    return ds


def _titled(described: dict[str, Any], name: str, stem: str) -> dict[str, Any]:
    """``described`` (the metadata of the log served as ``name``), its title naming the
    file's ``stem`` in place of ``name`` (its bytes that are not UTF-8 as "?")."""
    database = described["databases"][name]
    database["title"] = database["title"].removesuffix(name) + stem.encode(errors="replace").decode()
    return described


# What a served name may hold: Datasette 0.65 writes it unescaped into the href of a
# foreign key's link on table pages, where a quote would end the attribute and what follows
# would be markup. Letters (of any script), digits, "_", "-", "." and space are no markup
# and start no other part of a URL than its path: names as logs are usually named.
_UNSAFE = re.compile(r"[^\w .-]")


def served_name(stem: str) -> str:
    """The name a log whose file is named ``stem`` is served as: ``stem``, its characters
    ``_UNSAFE`` matches (if any) each as ``_``, then a hash of ``stem`` (two names that
    differ only there are served as two); numbered, as Datasette numbers a name already
    taken (``_memory_2``), if one of Datasette's own databases (``_memory``, ``_internal``)
    has it: Datasette would rename the log, and metadata and URLs made for it would name
    nothing."""
    safe = stem
    if _UNSAFE.search(stem):
        digest = hashlib.sha256(os.fsencode(stem)).hexdigest()[:8]
        safe = f"{_UNSAFE.sub('_', stem)}_{digest}"
    taken = Datasette(settings=SETTINGS).databases
    numbered = (f"{safe}_{n}" for n in itertools.count(2))
    return next(name for name in itertools.chain([safe], numbered) if name not in taken)


def log_name(ds: Datasette) -> str:
    """The name the log is served as by ``ds`` (made by create_datasette)."""
    return next(db.name for db in ds.databases.values() if isinstance(db, ReadOnlyLog))


class Server(uvicorn.Server):
    """uvicorn, stopped the way tasktape's other servers are: a first of ``signals`` stops
    it gracefully and ``serve`` returns (uvicorn would re-raise the signal once done,
    killing the process), a second one stops it at once."""

    def __init__(self, config: uvicorn.Config, signals: Sequence[signal.Signals]) -> None:
        super().__init__(config)
        self.signals = signals

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop, signals = asyncio.get_running_loop(), self.signals
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        try:
            yield
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def stop(self) -> None:
        self.force_exit = self.should_exit
        self.should_exit = True


async def serve(
    ds: Datasette,
    sock: socket.socket,
    ready: Callable[[], None],
    grace: float,
    signals: Sequence[signal.Signals],
    wrap: Callable[[Any], Any] = lambda app: app,
) -> None:
    """Serve ``ds`` (as ``wrap`` wraps its ASGI application) on the listening socket
    ``sock`` until one of ``signals``; call ``ready`` once it answers; give requests in
    flight ``grace`` seconds to finish."""
    config = uvicorn.Config(
        wrap(ds.app()), log_level="warning", access_log=False, timeout_graceful_shutdown=math.ceil(grace)
    )
    server = Server(config, signals)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        ready()
    await serving
