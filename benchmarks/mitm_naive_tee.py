"""A naive recording tee for mitmdump, the proxy benchmark's yardstick: each chunk of an
event stream is inserted into SQLite and committed on mitmproxy's event loop before it
is passed on (WAL, synchronous=NORMAL), which the tasktape addon avoids by handing
chunks to a writer process.

``mitmdump -s benchmarks/mitm_naive_tee.py --set naive_tee_db=FILE``
"""

from __future__ import annotations

import itertools
import sqlite3
import time

from mitmproxy import ctx, http
from mitmproxy.addonmanager import Loader


class NaiveTee:
    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None

    def load(self, loader: Loader) -> None:
        loader.add_option("naive_tee_db", str, "", "SQLite file every event-stream chunk is committed to.")

    def configure(self, updated: set[str]) -> None:
        if "naive_tee_db" in updated and ctx.options.naive_tee_db:
            self.db = sqlite3.connect(ctx.options.naive_tee_db)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS chunks (flow TEXT, seq INT, offset_ns INT, data BLOB)"
            )

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        if self.db is None or "text/event-stream" not in flow.response.headers.get("content-type", ""):
            return
        db, seq, t0 = self.db, itertools.count(), time.perf_counter_ns()

        def tee(data: bytes) -> bytes:
            if data:
                db.execute(
                    "INSERT INTO chunks VALUES (?, ?, ?, ?)",
                    (flow.id, next(seq), time.perf_counter_ns() - t0, data),
                )
                db.commit()
            return data

        flow.response.stream = tee


addons = [NaiveTee()]
