"""A resuming recorder that restarts takes up the streams its log shows still running:
those whose task had not ended, whose last bytes came within ``--hold``. Each is rebuilt
from the log as its clients were sent it (the same ids, the same made-up events) and
held asleep; the first client that reconnects to one with ``Last-Event-ID`` is answered
from it, and wakes it: the stream goes on through a subscribe to the agent, which carries
that client's headers (the log keeps no credentials). One nobody wakes within ``--hold``
is let go.

A stream that ended and was let go is rebuilt the same way when a reconnect names an id
in it (``ended_in_log``): one of the recorder's names its stream, and the log says which
holds one of the agent's (``holding``). So is one of an earlier run that ended within
``--hold`` of the restart (``ended_before``): it would still be held had the recorder not
stopped, so a reconnect to it is answered, not sent to the agent as a new request.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasktape.errors import LogError
from tasktape.eventlog import SSEEvent
from tasktape.eventlog.exchange_rows import utc_iso
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.protocols import recognise
from tasktape.eventlog.protocols.base import Protocol, Request
from tasktape.eventlog.resumes import ResumeOutcome, ResumeSide

from .credentials import stream_key
from .headers import end_to_end
from .live import LiveStream
from .reconnects import line_of
from .rejoin import caught_up, ends_closed

# Whatever ended the recording of a stream that was still running: the recorder stopped
# (proxy_stopped), its writer closed first (log_closed), or nothing did (it was killed).
_CUT_SHORT = (Outcome.PROXY_STOPPED, Outcome.LOG_CLOSED)
_REJOINED = (str(ResumeOutcome.REJOINED), str(ResumeOutcome.GAP))

# What the key of a stream is made from (see credentials.stream_key).
_CAPTURE_UID = "(SELECT uid FROM captures c WHERE c.id = capture_id) AS capture_uid"

# When an exchange's last bytes came: its end, or for one the log never saw end, its last
# chunk (from the tables: the chunks view, asked for an exchange of the outer query, would
# be read whole).
_LAST_BYTES = """x.started_ns + coalesce(x.duration_ns, max(
  coalesce((SELECT max(offset_ns) FROM stored_chunks WHERE exchange_id = x.id), 0),
  coalesce((SELECT max(offset_ns) FROM events WHERE exchange_id = x.id), 0)))"""

# Only the runs that can hold a stream still running: those killed (never ended) or ended
# within the hold; and of their streams, those cut short, or broken (and perhaps rejoined).
_ROOTS = f"""
SELECT id, method, path, query, request_headers, request_body, response_headers, {_CAPTURE_UID}
FROM exchanges
WHERE capture_id IN (SELECT id FROM captures WHERE id < ? AND (ended_at IS NULL OR ended_at >= ?))
  AND is_sse = 1 AND status = 200
  AND (outcome IS NULL OR outcome IN ({", ".join("?" * (len(_CUT_SHORT) + 1))}))
  AND id NOT IN (SELECT new_exchange_id FROM resumes WHERE new_exchange_id IS NOT NULL)
ORDER BY id
"""
_CHAIN = f"""
SELECT new_exchange_id FROM resumes
WHERE exchange_id = ? AND side = '{ResumeSide.UPSTREAM}' AND outcome IN ({", ".join("?" * len(_REJOINED))})
ORDER BY id
"""


def asleep_in_log(path: Path, capture_id: int, hold: float) -> Iterator[tuple[LiveStream, Request]]:
    """The streams of earlier runs still running when they ended, rebuilt, each with the
    request that opened it."""
    since = time.time_ns() - int(hold * 1e9)
    with _read_only(path) as conn:
        runs = (capture_id, utc_iso(since), *_CUT_SHORT, Outcome.UPSTREAM_DISCONNECTED)
        for root in conn.execute(_ROOTS, runs).fetchall():
            chain = _chain(conn, root["id"])
            last = conn.execute(
                f"SELECT outcome, {_LAST_BYTES} FROM exchanges x WHERE id = ?", (chain[-1],)
            ).fetchone()
            if last is None or (last[0] is not None and last[0] not in _CUT_SHORT) or last[1] < since:
                continue
            going_on = _going_on(conn, root, chain)
            if going_on is not None:
                yield going_on


# The streams of earlier runs whose last bytes came within the hold (the latest first):
# the exchanges that opened them, and their request lines.
_ENDED = f"""
SELECT id, method, path, query FROM exchanges x
WHERE capture_id IN (SELECT id FROM captures WHERE id < ? AND (ended_at IS NULL OR ended_at >= ?))
  AND is_sse = 1 AND status = 200
  AND id NOT IN (SELECT new_exchange_id FROM resumes WHERE new_exchange_id IS NOT NULL)
  AND {_LAST_BYTES} >= ?
ORDER BY id DESC LIMIT ?
"""


def ended_before(path: Path, capture_id: int, hold: float, most: int) -> list[tuple[int, str]]:
    """The streams of earlier runs that ended (or were cut short) within ``hold`` seconds
    of now, at most ``most``, the latest first: the exchange that opened each, and its
    request line ("POST /message:stream", "GET /events?topic=a")."""
    since = time.time_ns() - int(hold * 1e9)
    with _read_only(path) as conn:
        rows = conn.execute(_ENDED, (capture_id, utc_iso(since), since, most)).fetchall()
    return [(row["id"], line_of(row["method"], _target(row))) for row in rows]


# A stream's first exchange (not a reconnect's, nor a rejoin's subscribe).
_ROOT = f"""
SELECT id, method, path, query, request_headers, request_body, response_headers, capture_id, {_CAPTURE_UID}
FROM exchanges
WHERE id = ? AND is_sse = 1 AND status = 200
  AND id NOT IN (SELECT new_exchange_id FROM resumes WHERE new_exchange_id IS NOT NULL)
"""


def ended_in_log(path: Path, exchange_id: int, capture_id: int) -> tuple[LiveStream, Request] | None:
    """The stream exchange ``exchange_id`` opened, rebuilt as its clients were sent it,
    ended as it did, and the request that opened it; None if the log does not hold it,
    or not yet to its end. One of an earlier run than ``capture_id`` (this run's) that the
    log never saw end was cut short when that run was killed."""
    with _read_only(path) as conn:
        root = conn.execute(_ROOT, (exchange_id,)).fetchone()
        if root is None:
            return None
        chain = _chain(conn, root["id"])
        outcome = _outcome(conn, chain)
        if outcome is None and root["capture_id"] != capture_id:
            outcome = Outcome.PROXY_STOPPED
        original = _request(root)
        protocol = recognise(original)
        if outcome is None or (protocol is None and len(chain) > 1):
            return None  # still being written (or rejoined by a protocol no longer known)
        stream = _rebuilt(conn, root, chain, protocol)
        stream.end(outcome, closed=ends_closed(stream, protocol))
        return stream, original


# How a stream let go before it ended was left: --hold let its agent go with nobody
# following, or a recorder stopped (or was killed, leaving no outcome) while it held it.
UNFINISHED = (Outcome.CLIENT_DISCONNECTED, *_CUT_SHORT)


def let_go_unfinished(path: Path, exchange_id: int) -> tuple[LiveStream, Request] | None:
    """The stream exchange ``exchange_id`` opened, when it was let go before its task
    ended (``UNFINISHED``; a bound let go one taken up from the log after a restart):
    rebuilt as its clients were sent it, not ended (it goes on through a subscribe to its
    agent), and the request that opened it; None for any other, one whose closing event
    was sent, or one its protocol cannot follow again."""
    with _read_only(path) as conn:
        root = conn.execute(_ROOT, (exchange_id,)).fetchone()
        if root is None:
            return None
        chain = _chain(conn, root["id"])
        if _outcome(conn, chain) not in (*UNFINISHED, None):
            return None
        going_on = _going_on(conn, root, chain)
        closed = going_on is not None and ends_closed(going_on[0], recognise(going_on[1]))
        return None if closed else going_on


def _going_on(
    conn: sqlite3.Connection, root: sqlite3.Row, chain: list[int]
) -> tuple[LiveStream, Request] | None:
    """The stream ``root`` opened, rebuilt, and that request, when its protocol can follow
    it on (a subscribe to its agent); None when it cannot."""
    original = _request(root)
    protocol = recognise(original)
    if protocol is None:
        return None
    stream = _rebuilt(conn, root, chain, protocol)
    if protocol.resubscription(original, stream.sent_data(), stream.last_agent_id()) is None:
        return None
    return stream, original


def _outcome(conn: sqlite3.Connection, chain: list[int]) -> str | None:
    """How a stream's last exchange (its first, or its latest rejoin's) ended."""
    (outcome,) = conn.execute("SELECT outcome FROM exchanges WHERE id = ?", (chain[-1],)).fetchone()
    return outcome


def holding(
    path: Path, event_id: str, alike: list[int], task: tuple[str | None, str | None], let_go: frozenset[int]
) -> int | None:
    """Which stream let go holds an event of that id (one of the agent's): of the streams
    ``alike`` (opened by requests like the reconnect), then those of the task and session
    the reconnect names (``task``), the latest first, the first whose events (its rejoins'
    included) have one; the exchange that opened it. None: none does. At most LOOKED_IN
    streams of each are looked in."""
    task_id, session_id = task
    with _read_only(path) as conn:
        named: list[int] = []
        for column, value in (("task_id", task_id), ("session_id", session_id)):
            if value is not None:
                rows = conn.execute(_NAMED.format(column=column), (value, LOOKED_IN * 4))
                named += [e for (e,) in rows if e in let_go][:LOOKED_IN]
        for root in dict.fromkeys([*alike, *sorted(named, reverse=True)]):
            chain = _chain(conn, root)
            if conn.execute(_HOLDS.format(chain=", ".join("?" * len(chain))), (event_id, *chain)).fetchone():
                return root
    return None


# A reconnect after an agent's id to a stream let go: the streams looked in, the exchanges
# of a task or session named, and whether a stream's exchanges hold an event of that id.
LOOKED_IN = 64
_NAMED = "SELECT id FROM exchanges WHERE {column} = ? ORDER BY id DESC LIMIT ?"
_HOLDS = "SELECT 1 FROM events WHERE event_id = ? AND exchange_id IN ({chain}) LIMIT 1"


def capture_uid(path: Path, capture_id: int) -> str:
    """The uid of a capture the log holds (one begun by another writer of it)."""
    with _read_only(path) as conn:
        row = conn.execute("SELECT uid FROM captures WHERE id = ?", (capture_id,)).fetchone()
    if row is None:
        raise LogError(f"{path} holds no capture {capture_id}")
    return row[0]


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        yield conn
    finally:
        conn.close()


def _chain(conn: sqlite3.Connection, root_id: int) -> list[int]:
    """A stream's exchanges: its first, then each rejoin's subscribe."""
    return [root_id, *(r[0] for r in conn.execute(_CHAIN, (root_id, *_REJOINED)))]


def _request(row: sqlite3.Row) -> Request:
    body = row["request_body"]
    headers = [tuple(pair) for pair in json.loads(row["request_headers"] or "[]")]
    return Request(row["method"], _target(row), headers, body.encode() if isinstance(body, str) else body)


def _target(row: sqlite3.Row) -> str:
    """A request's target as the log keeps it: its path, and its query (redacted)."""
    return row["path"] + (f"?{row['query']}" if row["query"] else "")


def _rebuilt(
    conn: sqlite3.Connection, root: sqlite3.Row, chain: list[int], protocol: Protocol | None
) -> LiveStream:
    """The stream as its clients were sent it: the first exchange's events, then for
    each rejoin the events made up to catch them up and its subscribe's events."""
    headers = end_to_end(tuple(p) for p in json.loads(root["response_headers"] or "[]"))
    headers.popall("Content-Length", None)
    body: Any = root["request_body"]
    stream = LiveStream(
        root["id"],
        line_of(root["method"], _target(root)),
        body.encode() if isinstance(body, str) else body,
        list(headers.items()),
        stream_key(root["capture_uid"], root["id"]),
        None,  # the log keeps no credentials
    )
    for n, exchange_id in enumerate(chain):
        if n:
            sent = stream.sent_data()

            def first(event: SSEEvent, sent: list[str] = sent) -> bool:
                assert protocol is not None  # (a rejoin is its protocol's)
                return caught_up(stream, protocol, sent, event)[0].send_first

            stream.rejoin(first)
        chunks = conn.execute("SELECT data FROM chunks WHERE exchange_id = ? ORDER BY seq", (exchange_id,))
        for (data,) in chunks:
            stream.feed(data if isinstance(data, bytes) else data.encode())
    return stream
