"""The writers' lifecycle: what a writer refuses (an exchange it has not open), what it
releases when it fails to start, what it owes a call that raced close(), and a recording
proxy whose log is closed under it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from a2a_frames import completed_run, sse
from aiohttp import web
from conftest import RecordFactory

from tasktape.errors import LogClosed, LogError, UnknownExchange, UsageError, WriterClosed
from tasktape.eventlog import EventLog, ExchangeSummary, LogProducer, LogWriter, ProcessLogWriter
from tasktape.eventlog.exchange_rows import Kept
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide
from tasktape.eventlog.schema import least_log_size

WORKING = b'data: {"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_WORKING"}}}\n\n'
SSE = [("Content-Type", "text/event-stream")]


@pytest.fixture(params=[LogWriter, ProcessLogWriter])
def writer_class(request: pytest.FixtureRequest) -> type[LogProducer]:
    return request.param


def test_calls_for_an_exchange_not_open_are_refused_and_write_nothing(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=1)
        w.chunk(ex, 1, WORKING)
        assert w.end_exchange(ex, duration_ns=5).result(timeout=10).outcome == "complete"
        late = [
            lambda: w.chunk(ex, 3, b"data: late\n\n"),
            lambda: w.chunks(ex, [(3, b"data: late\n\n")]),
            lambda: w.end_exchange(ex, duration_ns=7, outcome="upstream_error", error="again"),
            lambda: w.response_head(ex, status=500, headers=None, is_sse=False, ttfb_ns=2),
            lambda: w.late_request_body(ex, b"{}"),
        ]
        for call in late:
            with pytest.raises(UnknownExchange, match=f"for exchange {ex}, which has ended"):
                call()
        never = f"for exchange {ex + 41}, which was never begun by this writer"
        for call in (lambda: w.chunk(ex + 41, 1, b"x"), lambda: w.end_exchange(ex + 41, duration_ns=1)):
            with pytest.raises(UnknownExchange, match=never):
                call()
    with writer_class(db) as again:  # a later run notes resumes of the streams of earlier ones
        again.resume(Resume(ex, ResumeSide.CLIENT, ResumeOutcome.ENDED, last_event_id="e1"))
        with pytest.raises(UnknownExchange, match="never begun by this writer"):
            again.chunk(ex, 9, b"data: later\n\n")
    with EventLog(db) as log:
        (x,) = log.exchanges()
        assert (x["outcome"], x["duration_ns"], x["error"], x["status"]) == ("complete", 5, None, 200)
        assert [c["seq"] for c in log.chunks(ex)] == [0] and log.body(ex) == WORKING
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == 1
            assert conn.execute("SELECT exchange_id, outcome FROM resumes").fetchall() == [(ex, "ended")]


async def test_closing_the_log_under_the_recorder_does_not_break_its_streams(
    record: RecordFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    frames = sse(completed_run(), ids="e")
    go_on = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(frames[0])
        if request.query.get("wait"):
            await go_on.wait()  # the log is closed meanwhile
        for frame in frames[1:]:
            await response.write(frame)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    rec = await record(app)
    async with rec.session.post(f"{rec.url}/message:stream?wait=1", data=b"{}") as response:
        assert await response.content.readuntil(b"\n\n") == frames[0]
        await rec.writer.aflush()
        await rec.writer.aclose()
        go_on.set()
        rest = await response.content.read()  # no ClientPayloadError: the stream ends whole
    assert frames[0] + rest == b"".join(frames)
    for _ in range(2):  # new requests are forwarded too, unrecorded
        async with rec.session.post(f"{rec.url}/message:stream", data=b"{}") as response:
            assert (response.status, await response.read()) == (200, b"".join(frames))
    await asyncio.wait_for(rec.proxy.wait_idle(), 10)
    assert capsys.readouterr().err.count("no longer recorded") == 1  # said once
    with EventLog(rec.db) as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "log_closed" and log.body(x["id"]) == frames[0]


class FailingTap:
    fds: tuple[int, ...] = ()

    def open(self, conn: sqlite3.Connection) -> None:
        raise RuntimeError("the tap cannot start")

    def committed(self, table: str, columns: object, rows: list[tuple[object, ...]], last: int) -> None:
        pass

    def changed(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_writer_that_fails_to_start_releases_the_log(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(RuntimeError, match="the tap cannot start"):
        LogWriter(db, tap=FailingTap())
    with pytest.raises(UsageError, match="busy_timeout"):
        LogWriter(db, busy_timeout="x")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="busy_timeout"):
        ProcessLogWriter(db, busy_timeout="x")
    assert len(os.listdir("/proc/self/fd")) == fds  # neither the lock nor the connection is left open
    with LogWriter(db) as w:  # not LogBusy
        w.begin_capture(source="test")


# A recorder's process that takes Ctrl-C as a terminal sends it, to its whole process group,
# again and again while its log writer process starts, and stops only when it decides to.
_INTERRUPTED_AS_IT_STARTS = """
import os, signal, sys, threading
from tasktape.eventlog import ProcessLogWriter
signal.signal(signal.SIGINT, lambda *_: None)
ready = threading.Event()
def interrupt():
    while not ready.wait(0.005):
        os.killpg(0, signal.SIGINT)
threading.Thread(target=interrupt).start()
try:
    with ProcessLogWriter(sys.argv[1]) as w:
        w.begin_capture(source="test")
finally:
    ready.set()
"""


def test_ctrl_c_to_the_process_group_as_the_writer_process_starts_leaves_stopping_to_the_recorder(
    tmp_path: Path,
) -> None:
    """The writer process ignored Ctrl-C only once its imports were done: one among them was
    a KeyboardInterrupt traceback, and the recorder's "the log writer process failed to start"."""
    db = tmp_path / "log.db"
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AS_IT_STARTS, str(db)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        start_new_session=True,  # (its Ctrl-Cs reach it and its child, not the tests)
    )
    assert (done.returncode, done.stderr) == (0, "")
    with EventLog(db) as log:
        assert len(log.captures()) == 1


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_bytes", "10MB"),
        ("max_bytes", 0),
        ("max_body", 1.5),
        ("max_decoded", -1),
        ("max_backlog", True),
        ("max_batch_seconds", float("nan")),
        ("busy_timeout", -1),
    ],
)
def test_a_bound_that_is_no_number_is_refused_naming_it(
    tmp_path: Path, writer_class: type[LogProducer], option: str, value: object
) -> None:
    # Taken as given, these failed later (a TypeError deep in the writer's thread, a log
    # that took no row) or never (a NaN batch time).
    with pytest.raises(UsageError, match=f"^{option} is a (whole )?number"):
        writer_class(tmp_path / "log.db", **{option: value})
    with writer_class(tmp_path / "log.db", max_bytes=None) as w:  # None: no cap
        w.begin_capture(source="test")


def test_a_closed_event_log_says_so(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "log.db") as w:
        w.begin_capture(source="test")
    log = EventLog(tmp_path / "log.db")
    assert len(log.captures()) == 1
    log.close()
    for read in (log.captures, log.exchanges, log.reconnects_answered, lambda: log.task_events("t1")):
        with pytest.raises(LogClosed, match="was closed"):
            read()


def test_an_event_log_is_usable_from_any_thread(tmp_path: Path) -> None:
    """Opened in one thread, it raised sqlite3's ProgrammingError in any other (a web
    handler's, asyncio.to_thread), and could not be closed there."""
    with LogWriter(tmp_path / "log.db") as w:
        ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=1)
        w.chunks(ex, [(i, WORKING) for i in range(20)])
        w.end_exchange(ex, duration_ns=21)
    log = EventLog(tmp_path / "log.db")
    assert asyncio.run(asyncio.to_thread(log.body, ex)) == WORKING * 20
    read: list[tuple[int, int]] = []

    def read_over_and_over() -> None:  # several threads at once, one call at a time
        for _ in range(50):
            read.append((len(log.body(ex)), len(log.events(ex))))

    readers = [threading.Thread(target=read_over_and_over) for _ in range(4)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert read == [(len(WORKING) * 20, 20)] * 200
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join()
    with pytest.raises(LogClosed, match="was closed"):
        log.exchanges()
    with pytest.raises(sqlite3.ProgrammingError, match="closed database"):  # closed, not only said to be
        log.db.execute("SELECT 1")


def chunk_until_closed(w: LogProducer, ex: int, accepted: list[int], started: threading.Event) -> None:
    """Chunk after chunk, counting those that returned, until the writer says it is closed."""
    started.set()
    while True:
        try:
            w.chunk(ex, len(accepted), b"x")
        except WriterClosed:
            return
        accepted.append(1)


def test_a_chunk_that_raced_close_is_written(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    # Before, about every other run lost the chunk queued between close()'s STOP and its flag.
    for trial in range(20 if writer_class is LogWriter else 6):
        db = tmp_path / f"race{trial}.db"
        w = writer_class(db)
        ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
        w.response_head(ex, status=200, headers=None, is_sse=False, ttfb_ns=1)
        accepted: list[int] = []
        started = threading.Event()
        producer = threading.Thread(target=chunk_until_closed, args=(w, ex, accepted, started))
        producer.start()
        started.wait()
        time.sleep(0.02)
        w.close()
        producer.join()
        with EventLog(db) as log:
            stored = len(log.body(ex))
        assert (w.stats.rows_lost, stored) == (0, len(accepted)), f"trial {trial}"


def one_exchange(
    w: LogProducer, cap: int, path: str, head: list[tuple[str, str]] | None, chunks: list[bytes]
) -> concurrent.futures.Future[ExchangeSummary]:
    """An exchange whose chunks are committed as they come (a flush after each)."""
    ex = w.begin_exchange(cap, method="GET", path=path)
    w.response_head(ex, status=200, headers=head, is_sse=head is SSE, ttfb_ns=1)
    for i, data in enumerate(chunks):
        w.chunk(ex, i, data)
        w.flush()
    return w.end_exchange(ex, duration_ns=len(chunks) + 1)


def test_a_full_log_stays_true_to_itself(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    """Once the log reaches its size cap it takes nothing new: the exchange that filled it
    is kept without its body and says so, later ones are not recorded and their waiters
    are told, and no chunk or event is ever written without its exchange."""
    db = tmp_path / "log.db"
    w = writer_class(db, max_bytes=1024 * 1024, on_error=lambda exc, rows: None)
    cap = w.begin_capture(source="test")
    ends = [
        one_exchange(w, cap, "/plain", None, [b"hello\n"]),
        one_exchange(w, cap, "/huge", None, [os.urandom(3 * 1024 * 1024)]),
        one_exchange(w, cap, "/sse", SSE, [WORKING] * 20),
        one_exchange(w, cap, "/plain", None, [b"hello\n"]),
    ]
    said = [end.result(timeout=30) for end in ends]
    w.close()
    assert said[0].kept is None
    assert (said[1].kept, said[1].lost) == (Kept.ROW, "the log is full")
    for late in said[2:]:
        assert (late.kept, late.lost) == (Kept.NOTHING, "the log is full")
    assert w.stats.rows_lost >= 2 + 20  # the body, the stream's events, the two rows
    with EventLog(db) as log:
        assert log.db.execute("PRAGMA foreign_key_check").fetchall() == []
        rows = log.db.execute(
            "SELECT path, outcome, response_body IS NULL, response_body_truncated, error FROM exchanges"
        ).fetchall()
    assert [tuple(row) for row in rows] == [
        ("/plain", "complete", 0, 0, None),
        ("/huge", "complete", 1, 1, "the log is full: its bytes are not all in it"),
    ]
    assert db.stat().st_size <= 1024 * 1024


def fail_once(w: LogProducer, cap: int, where: str) -> list[concurrent.futures.Future[ExchangeSummary]]:
    """Make ``w`` report a loss to on_error: from the thread that commits (a full log),
    the one that builds rows (a start that is no time) or the producer's (a chunk past
    the backlog). Returns the futures of the exchanges ended."""
    ends = []
    if where == "commit":
        for _ in range(50):
            try:
                ex = w.begin_exchange(cap, method="GET", path="/big")
                w.response_head(ex, status=200, headers=None, is_sse=False, ttfb_ns=1)
                w.chunk(ex, 1, os.urandom(200_000))
                ends.append(w.end_exchange(ex, duration_ns=2))
            except WriterClosed:
                break
    elif where == "rows":
        ex = w.begin_exchange(cap, method="GET", path="/", started_ns="soon")  # type: ignore[arg-type]
        ends.append(w.end_exchange(ex, duration_ns=2))
    else:
        ex = w.begin_exchange(cap, method="GET", path="/")
        with contextlib.suppress(WriterClosed):
            for i in range(1000):
                w.chunk(ex, i, b"x" * 1000)
    return ends


@pytest.mark.parametrize("where", ["commit", "rows", "producer"])
def test_an_on_error_that_closes_the_writer_stops_it(
    tmp_path: Path, writer_class: type[LogProducer], where: str
) -> None:
    """close() in on_error deadlocked the writer when called from the thread that commits
    (no exchange's future ever resolved) or a producer's, and left the log locked from
    the thread that builds rows (LogBusy for as long as the process lived)."""
    db = tmp_path / "log.db"
    holder: list[LogProducer] = []
    told = threading.Event()

    def on_error(exc: BaseException, rows: int) -> None:
        told.set()
        holder[0].close()

    options = {"max_bytes": least_log_size() + 64 * 1024} if where == "commit" else {}
    if where == "producer":
        options = {"max_backlog": 0}
    w = writer_class(db, on_error=on_error, **options)
    holder.append(w)
    cap = w.begin_capture(source="test")
    ends: list[concurrent.futures.Future[ExchangeSummary]] = []
    failing = threading.Thread(target=lambda: ends.extend(fail_once(w, cap, where)), daemon=True)
    failing.start()
    failing.join(timeout=30)
    assert not failing.is_alive()
    assert told.wait(timeout=30)
    for end in ends:  # each resolves, one way or the other
        with contextlib.suppress(LogError):
            end.result(timeout=30)
    closing = threading.Thread(target=w.close, daemon=True)
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive() and w.closed
    with writer_class(db) as again:  # the log was released, not LogBusy
        again.begin_capture(source="again")
    with EventLog(db) as log:
        assert [c["source"] for c in log.captures()] == ["test", "again"]
