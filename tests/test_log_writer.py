"""The log writer: rows from many producers, batched commits, flush/close, failures."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest
from a2a_frames import completed_run, sse
from multidict import CIMultiDict, CIMultiDictProxy

from tasktape import Redactor, read_cassette, read_log, write_cassette
from tasktape.errors import LogBusy, LogError, UsageError, WriterClosed
from tasktape.eventlog import EventLog, LogProducer, LogWriter, ProcessLogWriter
from tasktape.eventlog.exchange_rows import Kept, utc_iso
from tasktape.eventlog.producer import CHUNK
from tasktape.eventlog.schema import least_log_size


@pytest.fixture(params=[LogWriter, ProcessLogWriter])
def writer_class(request: pytest.FixtureRequest) -> type[LogProducer]:
    """The same tests for the writer in this process and the one in a child process."""
    return request.param


def count(path: Path, table: str) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_one_exchange_round_trip(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    stream = b"".join(sse(completed_run(), ids="e"))
    with writer_class(db) as w:
        cap = w.begin_capture(source="test", upstream="http://agent", argv=["tasktape", "record"])
        ex = w.begin_exchange(
            cap,
            method="POST",
            path="/message:stream",
            query="a=1",
            request_headers=[("content-type", "application/json"), ("a2a-version", "1.0")],
            request_body=b'{"message": {}}',
            started_ns=1_700_000_000_000_000_000,
        )
        w.response_head(
            ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=5_000_000
        )
        for i in range(0, len(stream), 100):
            w.chunk(ex, 10_000_000 + i, stream[i : i + 100])
        summary = w.end_exchange(ex, duration_ns=90_000_000).result(timeout=5)
        w.end_capture(cap)
    assert (summary.task_id, summary.context_id, summary.binding, summary.final_state) == (
        "task.1",
        "ctx.1",
        "rest",
        "TASK_STATE_COMPLETED",
    )
    assert (summary.events, summary.bytes, summary.outcome) == (10, len(stream), "complete")

    with EventLog(db) as log:
        (capture,) = log.captures()
        assert (
            capture["source"] == "test"
            and capture["ended_at"]
            and json.loads(capture["argv"]) == ["tasktape", "record"]
        )
        (x,) = log.exchanges(cap)
        assert x["started_at"] == "2023-11-14T22:13:20.000000Z"
        assert (x["method"], x["path"], x["query"], x["status"], x["is_sse"], x["binding"]) == (
            "POST",
            "/message:stream",
            "a=1",
            200,
            1,
            "rest",
        )
        assert json.loads(x["request_headers"]) == [
            ["content-type", "application/json"],
            ["a2a-version", "1.0"],
        ]
        assert x["request_body"] == '{"message": {}}'
        assert (x["task_id"], x["context_id"], x["ttfb_ns"], x["duration_ns"], x["outcome"]) == (
            "task.1",
            "ctx.1",
            5_000_000,
            90_000_000,
            "complete",
        )
        assert log.body(ex) == stream
        events = log.events(ex)
        assert [e["seq"] for e in events] == list(range(10))
        assert [e["event_id"] for e in events] == [f"e{n}" for n in range(1, 11)]
        assert events[-1]["state"] == "TASK_STATE_COMPLETED"
        assert json.loads(events[-1]["usage"])["credits"] == 1.2
        assert all(e["complete"] == 1 and e["parse_error"] is None for e in events)
        # Each event carries the offset of the chunk that completed it.
        ends, total = [], 0
        for frame in sse(completed_run(), ids="e"):
            total += len(frame)
            ends.append(10_000_000 + (total - 1) // 100 * 100)
        assert [e["offset_ns"] for e in events] == ends
        assert summary.first_event_ns == ends[0]


def test_binary_and_text_bodies_round_trip(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        cap = w.begin_capture(source="test")
        a = w.begin_exchange(cap, method="POST", path="/bin", request_body=b"\xff\x00\xfe")
        w.response_head(a, status=200, headers=None, is_sse=False, ttfb_ns=1)
        w.chunk(a, 1, b"\x89PNG")
        w.chunk(a, 2, b"\r\n")
        w.end_exchange(a, duration_ns=3)
        b = w.begin_exchange(cap, method="POST", path="/text", request_body="héllo".encode())
        w.response_head(b, status=200, headers=None, is_sse=False, ttfb_ns=1)
        w.chunk(b, 1, b'{"ok": true}')
        w.end_exchange(b, duration_ns=2)
    with EventLog(db) as log:
        x, y = log.exchanges()
        assert [c["data"] for c in log.chunks(a)] == [b"\x89PNG", b"\r\n"]
    assert (x["request_body"], x["response_body"], x["response_body_truncated"]) == (
        b"\xff\x00\xfe",
        b"\x89PNG\r\n",
        0,
    )
    assert (y["request_body"], y["response_body"]) == ("héllo", '{"ok": true}')


async def test_concurrent_producers_lose_and_reorder_nothing(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    """50 streams from the event loop and 4 from threads, fed in random chunk sizes."""
    db = tmp_path / "log.db"
    w = writer_class(db)
    cap = w.begin_capture(source="test")
    streams: dict[int, bytes] = {}

    def produce(n: int, rng: random.Random) -> tuple[int, bytes, list[bytes]]:
        frames = completed_run(f"task.{n}", f"ctx.{n}") * 16  # 160 events
        stream = b"".join(sse(frames, ids=f"{n}-"))
        ex = w.begin_exchange(cap, method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
        cuts = sorted(rng.sample(range(1, len(stream)), 300))
        return ex, stream, [stream[a:b] for a, b in pairwise([0, *cuts, len(stream)])]

    async def loop_producer(n: int) -> None:
        ex, stream, pieces = produce(n, random.Random(n))
        streams[ex] = stream
        for i, piece in enumerate(pieces):
            w.chunk(ex, i, piece)
            if i % 10 == 0:
                await asyncio.sleep(0)
        w.end_exchange(ex, duration_ns=len(pieces))

    def thread_producer(n: int) -> None:
        ex, stream, pieces = produce(n, random.Random(n))
        streams[ex] = stream
        for i, piece in enumerate(pieces):
            w.chunk(ex, i, piece)
        w.end_exchange(ex, duration_ns=len(pieces))

    threads = [threading.Thread(target=thread_producer, args=(1000 + n,)) for n in range(4)]
    for t in threads:
        t.start()
    await asyncio.gather(*(loop_producer(n) for n in range(50)))
    await asyncio.to_thread(lambda: [t.join() for t in threads])
    await w.aflush()
    await w.aclose()
    assert w.stats.rows_lost == 0 and w.stats.failed_batches == 0

    with EventLog(db) as log:
        exchanges = log.exchanges()
        assert len(exchanges) == 54
        for x in exchanges:
            chunks = log.chunks(x["id"])
            assert [c["seq"] for c in chunks] == list(range(len(chunks))) == [c["offset_ns"] for c in chunks]
            assert b"".join(c["data"] for c in chunks) == streams[x["id"]]
            events = log.events(x["id"])
            assert len(events) == 160 and [e["seq"] for e in events] == list(range(160))
            n = x["task_id"].removeprefix("task.")
            assert [e["event_id"] for e in events] == [f"{n}-{i}" for i in range(1, 161)]
            assert x["outcome"] == "complete" and x["duration_ns"] == len(chunks)


def test_rows_are_committed_without_flush(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="GET", path="/")
        w.chunk(ex, 0, b"hello")
        deadline = time.monotonic() + 5
        while count(db, "chunks") == 0:
            assert time.monotonic() < deadline, "the chunk was never committed"
            time.sleep(0.005)


def test_close_finishes_open_exchanges_and_loses_nothing(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    db = tmp_path / "log.db"
    w = writer_class(db)
    cap = w.begin_capture(source="test")
    ex = w.begin_exchange(cap, method="POST", path="/message:stream")
    w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
    for i in range(20_000):
        w.chunk(ex, i, b"data: {}\n\n")
    w.chunk(ex, 20_000, b'id: 9\ndata: {"par')
    w.close()
    w.close()  # twice is fine
    with pytest.raises(WriterClosed):
        w.chunk(ex, 1, b"late")
    with EventLog(db) as log:
        (x,) = log.exchanges()
        events = log.events(ex)
    assert (x["outcome"], x["error"]) == ("log_closed", "the log was closed before the exchange ended")
    assert count(db, "chunks") == 20_001 and len(events) == 20_001
    assert (events[-1]["complete"], events[-1]["data"], events[-1]["event_id"]) == (0, '{"par', "9")
    assert events[-1]["parse_error"].startswith("not JSON")


def test_one_writer_per_log(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    with writer_class(db):
        with pytest.raises(LogBusy, match="another tasktape writer"):
            writer_class(db)
        with EventLog(db) as log:  # readers are welcome meanwhile
            assert log.exchanges() == []
    writer_class(db).close()


@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_one_writer_per_log_file_whatever_its_name(
    tmp_path: Path, writer_class: type[LogProducer], link: str
) -> None:
    """A second writer through another name of the same file is refused too: two would
    hand out the same exchange ids."""
    db = tmp_path / "log.db"
    other = tmp_path / "other-name.db"
    with writer_class(db) as w:
        w.begin_capture(source="test")
        w.flush()
        (other.symlink_to if link == "symlink" else other.hardlink_to)(db)
        with pytest.raises(LogBusy, match="another tasktape writer"):
            writer_class(other)
    with writer_class(other) as w:  # once the first is gone, any name will do
        assert w.begin_capture(source="test") == 2


def test_ids_continue_after_reopening(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        a = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    with writer_class(db) as w:
        cap = w.begin_capture(source="test")
        b = w.begin_exchange(cap, method="GET", path="/")
    assert (a, cap, b) == (1, 2, 2)


def write_while_locked(w: LogProducer, db: Path, exchange_id: int, data: bytes) -> None:
    """Queue one chunk while another process holds the log longer than the writer waits."""
    w.flush()
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    w.chunk(exchange_id, 0, data)
    w.flush()
    blocker.rollback()
    blocker.close()


def test_an_operation_that_cannot_become_rows_loses_only_its_own(tmp_path: Path) -> None:
    failures: list[tuple[str, int]] = []
    w = LogWriter(tmp_path / "log.db", on_error=lambda exc, rows: failures.append((type(exc).__name__, rows)))
    cap = w.begin_capture(source="test")
    ex = w.begin_exchange(cap, method="GET", path="/stream")
    w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
    # Chunks as another process's producer hands them over, all at once; one of them
    # text where bytes belong (a bug of a producer's).
    chunks = [b"data: 1\n\n", "data: 2\n\n", b"data: 3\n\n"]
    w.put_many([(CHUNK, ex, i, data) for i, data in enumerate(chunks)])
    w.end_exchange(ex, duration_ns=4).result(timeout=5)
    w.close()
    assert failures == [("UsageError", 1)] and w.stats.rows_lost == 1
    assert (w.stats.last_error or "").startswith("UsageError while recording: SSEDecoder.feed takes bytes")
    with EventLog(tmp_path / "log.db") as log:
        assert [e["data"] for e in log.events(ex)] == ["1", "3"]
        assert log.exchange(ex)["outcome"] == "complete"


def test_a_failing_log_is_reported_and_the_writer_keeps_going(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    db = tmp_path / "log.db"
    failures: list[tuple[str, int]] = []
    w = writer_class(db, busy_timeout=0.05, on_error=lambda exc, rows: failures.append((str(exc), rows)))
    cap = w.begin_capture(source="test")
    ex = w.begin_exchange(cap, method="GET", path="/")
    write_while_locked(w, db, ex, b"lost")
    w.chunk(ex, 1, b"kept")
    w.end_exchange(ex, duration_ns=2).result(timeout=5)
    w.close()
    assert failures and "locked" in failures[0][0] and failures[0][1] == 1
    assert (w.stats.rows_lost, w.stats.failed_batches) == (1, 1)
    with EventLog(db) as log:
        assert [c["data"] for c in log.chunks(ex)] == [b"kept"]
        assert log.exchange(ex)["outcome"] == "complete"


def test_failure_without_handler_is_loud(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], writer_class: type[LogProducer]
) -> None:
    db = tmp_path / "log.db"
    w = writer_class(db, busy_timeout=0.05)
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    write_while_locked(w, db, ex, b"x")
    w.close()
    err = capsys.readouterr().err
    assert "WRITING THE LOG FAILED" in err and "1 rows lost" in err and "Traffic is not affected" in err


def test_size_cap_stops_writing_not_traffic(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    failures: list[int] = []
    w = writer_class(db, max_bytes=1024 * 1024, on_error=lambda exc, rows: failures.append(rows))
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    for i in range(400):
        w.chunk(ex, i, bytes(4096))
        if i % 20 == 0:
            w.flush()
    w.close()
    assert failures and w.stats.rows_lost == sum(failures) and "full" in (w.stats.last_error or "")
    written = count(db, "chunks")
    assert 0 < written < 400 and written + w.stats.rows_lost == 400
    assert db.stat().st_size <= 1024 * 1024


def test_a_size_cap_below_an_empty_log_is_refused_saying_the_least(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    """The log was past such a cap before its first row, and grew on; a cap of what an
    empty log takes holds."""
    least = least_log_size()
    with pytest.raises(UsageError, match=f"an empty log takes {least:,} bytes.*give {least:,} or more"):
        writer_class(tmp_path / "small.db", max_bytes=least - 1)
    assert not (tmp_path / "small.db").exists()
    db = tmp_path / "least.db"
    w = writer_class(db, max_bytes=least, on_error=lambda exc, rows: None)
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    for i in range(50):
        w.chunk(ex, i, bytes(4096))
    assert w.end_exchange(ex, duration_ns=51).result(timeout=10).kept == Kept.ROW
    w.close()
    assert db.stat().st_size <= least


def test_rows_of_a_lost_exchange_say_its_error_once(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    """Batch after batch, the error of rows whose exchange is not in the log wrapped the one
    before it, until the line on stderr nested it eighteen times."""
    db = tmp_path / "log.db"
    errors: list[str] = []
    w = writer_class(db, busy_timeout=0.05, on_error=lambda exc, rows: errors.append(str(exc)))
    cap = w.begin_capture(source="test")
    w.flush()
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")
    ex = w.begin_exchange(cap, method="GET", path="/")  # its row is lost with this batch
    w.flush()
    blocker.rollback()
    blocker.close()
    for i in range(4):
        w.chunk(ex, i, b"x")
        w.flush()
    w.close()
    said = "rows of exchanges not in the log: the log could not be written (OperationalError: database is "
    assert len(errors) == 5 and all(error.endswith(said + "locked)") for error in errors[1:]), errors


def test_a_full_log_keeps_what_the_exchange_is_though_its_bytes_are_lost(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    db = tmp_path / "log.db"
    w = writer_class(db, max_bytes=1024 * 1024, on_error=lambda exc, rows: None)
    # A stream's request, head, events and end in one batch, more than the log has room for.
    ex = w.begin_exchange(w.begin_capture(source="test"), method="POST", path="/message:stream")
    w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
    for i in range(200):
        w.chunk(ex, i, b"data: " + b"x" * 4096 + b"\n\n")
    w.end_exchange(ex, duration_ns=101)
    w.close()
    assert w.stats.rows_lost > 0  # its chunks and events, all or some
    with EventLog(db) as log:
        (x,) = log.exchanges()
        assert (x["path"], x["status"], x["is_sse"], x["outcome"]) == ("/message:stream", 200, 1, "complete")


def test_a_writer_left_open_is_closed_at_exit(tmp_path: Path, writer_class: type[LogProducer]) -> None:
    db = tmp_path / "log.db"
    code = (
        "from tasktape.eventlog import LogWriter, ProcessLogWriter\n"
        f"w = {writer_class.__name__}({str(db)!r})\n"
        "ex = w.begin_exchange(w.begin_capture(source='test'), method='GET', path='/')\n"
        "for i in range(5000):\n"
        "    w.chunk(ex, i, b'x')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert count(db, "chunks") == 5000
    with EventLog(db) as log:
        assert log.exchanges()[0]["outcome"] == "log_closed"


def test_a_writer_far_behind_drops_chunks_instead_of_growing(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    lost: list[int] = []
    w = LogWriter(db, max_backlog=10_000, busy_timeout=5, on_error=lambda exc, rows: lost.append(rows))
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    w.flush()
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # the writer stalls on its next commit
    w.chunk(ex, 0, b"a" * 1000)
    time.sleep(0.2)  # the stalled batch holds this one; the next ones pile up
    for i in range(1, 100):
        w.chunk(ex, i, b"b" * 1000)
    blocker.rollback()
    blocker.close()
    w.end_exchange(ex, duration_ns=1).result(timeout=10)
    w.close()
    assert sum(lost) == w.stats.rows_lost > 0 and "behind" in (w.stats.last_error or "")
    with EventLog(db) as log:
        recorded = len(log.chunks(ex))
        assert recorded + w.stats.rows_lost == 100 and recorded <= 12
        assert "chunks were not recorded: the log writer fell behind" in log.exchange(ex)["error"]


def test_chunks_at_once_are_recorded_as_one_at_a_time(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    """``chunks()`` (one hand-over) and ``chunk()`` for each make the same rows."""
    stream = sse(completed_run("t1", "c1"), ids="e")
    pieces = [(n * 1000, piece) for n, piece in enumerate([*stream, stream[0][:7], stream[0][7:], b""])]
    rows = []
    for name in ("each", "at-once"):
        db = tmp_path / f"{name}.db"
        with writer_class(db) as w:
            ex = w.begin_exchange(w.begin_capture(source="test"), method="POST", path="/message:stream")
            w.response_head(
                ex, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=1
            )
            if name == "each":
                for offset, data in pieces:
                    w.chunk(ex, offset, data)
            else:
                w.chunks(ex, pieces)
            w.end_exchange(ex, duration_ns=len(pieces) * 1000).result(timeout=10)
        with EventLog(db) as log:
            rows.append(
                (log.chunks(ex), [{k: v for k, v in e.items() if k != "rowid"} for e in log.events(ex)])
            )
    assert rows[0] == rows[1] and len(rows[0][1]) == len(stream) + 1
    with pytest.raises(WriterClosed):
        w.chunks(ex, pieces)


def test_chunks_at_once_past_the_backlog_bound_are_dropped_one_by_one(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    w = LogWriter(db, max_backlog=10_000, busy_timeout=5, on_error=lambda exc, rows: None)
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    w.flush()
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # the writer stalls on its next commit
    w.chunks(ex, [(0, b"a" * 1000)])
    time.sleep(0.2)  # the stalled batch holds this one; the next ones pile up
    w.chunks(ex, [(i, b"b" * 1000) for i in range(1, 100)])
    blocker.rollback()
    blocker.close()
    w.end_exchange(ex, duration_ns=1).result(timeout=10)
    w.close()
    with EventLog(db) as log:
        recorded = len(log.chunks(ex))
        assert recorded + w.stats.chunks_dropped == 100 and 1 < recorded <= 12
        assert "chunks were not recorded: the log writer fell behind" in log.exchange(ex)["error"]


@pytest.mark.parametrize("late", [False, True], ids=["read whole", "streamed"])
def test_request_bodies_count_against_the_backlog_bound(
    tmp_path: Path, writer_class: type[LogProducer], late: bool
) -> None:
    """With the writer stalled, request bodies queue against the same bound as chunks:
    past it they are not recorded (the exchange says so) rather than held in memory."""
    db = tmp_path / "log.db"
    w = writer_class(db, max_backlog=1_000_000, busy_timeout=5, on_error=lambda exc, rows: None)
    cap = w.begin_capture(source="test")
    w.flush()
    blocker = sqlite3.connect(db, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # the writer stalls on its next commit
    body = b"u" * 300_000
    ids, peak = [], 0
    for i in range(20):
        if i == 1:
            time.sleep(0.2)  # the stalled batch holds the first; the next ones pile up
        if late:
            ids.append(w.begin_exchange(cap, method="POST", path="/upload"))
            w.late_request_body(ids[-1], body)
        else:
            ids.append(w.begin_exchange(cap, method="POST", path="/upload", request_body=body))
        peak = max(peak, w.backlog)
    assert peak <= 1_000_000 + len(body) * 2  # what the stalled writer had taken, plus the bound
    blocker.rollback()
    blocker.close()
    for x in ids:
        w.end_exchange(x, duration_ns=1, outcome="complete")
    w.close()
    with EventLog(db) as log:
        kept = [log.exchange(x)["request_body"] is not None for x in ids]
        notes = [log.exchange(x)["error"] or "" for x in ids]
    assert 0 < kept.count(True) < 20 and kept.count(False) == w.stats.rows_lost
    assert all(("request body was not recorded" in n) == (not k) for k, n in zip(kept, notes, strict=True))


def test_a_log_whose_folder_is_not_there_is_refused_by_name(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    with pytest.raises(LogError, match=r"its folder .* does not exist"):
        writer_class(tmp_path / "nope" / "x.db")
    assert not (tmp_path / "nope").exists()


def test_a_dead_writer_process_is_reported_and_never_hangs(tmp_path: Path) -> None:
    errors: list[str] = []
    w = ProcessLogWriter(tmp_path / "log.db", on_error=lambda exc, rows: errors.append(str(exc)))
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    w.flush()
    w._process.kill()
    w._process.wait()
    w.chunk(ex, 0, b"lost")
    done = w.end_exchange(ex, duration_ns=1)
    with pytest.raises(LogError, match="log writer"):
        w.flush(timeout=10)
    with pytest.raises(LogError, match="process is gone"):
        done.result(timeout=10)
    w.close()
    assert errors and "process is gone" in errors[0]


def test_a_dead_writer_process_is_said_without_a_count_of_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the process had not written is lost with it, uncounted: the first line said
    "0 rows lost, 0 in all so far" while every row from then on was lost."""
    w = ProcessLogWriter(tmp_path / "log.db")
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    w.flush()
    w._process.kill()
    w._process.wait()
    for i in range(20):
        w.chunk(ex, i, b"lost")
    w.end_exchange(ex, duration_ns=1)
    w.close()
    (first, *_) = [line for line in capsys.readouterr().err.splitlines() if "WRITING THE LOG FAILED" in line]
    assert "0 rows lost" not in first and "every row from now on" in first, first
    assert w.stats.rows_lost > 0


def test_content_nothing_expected_never_stops_the_writer(tmp_path: Path) -> None:
    """A lone surrogate (a JSON escape) in a task id and in $usage, beside a good exchange
    in the same batch: both are stored, the writer lives on, every future resolves."""
    db = tmp_path / "log.db"
    frame = (
        b'data: {"statusUpdate": {"taskId": "t\\ud800", "metadata": {"$usage": {"model": "m\\ud800"}}}}\n\n'
    )
    with LogWriter(db) as w:
        cap = w.begin_capture(source="test")
        bad = w.begin_exchange(
            cap, method="POST", path="/message:stream", request_headers=[("X-Note", "caf\udce9")]
        )  # undecodable header bytes
        good = w.begin_exchange(cap, method="GET", path="/ok")
        w.response_head(bad, status=200, headers=None, is_sse=True, ttfb_ns=1)
        w.chunk(bad, 1, frame)
        done = [w.end_exchange(bad, duration_ns=2), w.end_exchange(good, duration_ns=2)]
        assert [f.result(timeout=10).exchange_id for f in done] == [bad, good]
        w.flush(timeout=10)
    assert w.stats.rows_lost == 0
    with EventLog(db) as log:
        (event,) = log.events(bad)
        assert event["task_id"] == "t\ufffd" and json.loads(event["usage"]) == {"model": "m\ud800"}
        assert json.loads(log.exchange(bad)["request_headers"]) == [["X-Note", "café"]]
        assert log.exchange(good)["outcome"] == "complete"


def test_headers_of_any_mapping_travel_to_the_writer_process(tmp_path: Path) -> None:
    headers = CIMultiDictProxy(CIMultiDict([("A2A-Version", "1.0"), ("Accept", "text/event-stream")]))
    with ProcessLogWriter(tmp_path / "log.db") as w:
        ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/", request_headers=headers)
        w.end_exchange(ex, duration_ns=1).result(timeout=10)
    with EventLog(tmp_path / "log.db") as log:
        assert json.loads(log.exchange(ex)["request_headers"]) == [
            ["A2A-Version", "1.0"],
            ["Accept", "text/event-stream"],
        ]


def test_the_writer_process_loads_neither_numpy_nor_pandas(tmp_path: Path) -> None:
    """sqlite-utils would import them when installed (numpy is: the test extras bring it):
    the writer never needs them, and they cost the child memory and BLAS threads."""
    import numpy  # noqa: F401, PLC0415 - installed, or this proves nothing

    with ProcessLogWriter(tmp_path / "log.db") as w:
        w.flush(timeout=10)
        maps = Path(f"/proc/{w._process.pid}/maps").read_text()
        assert "sqlite3" in maps and "numpy" not in maps and "pandas" not in maps


def test_the_log_file_alone_holds_everything_once_the_writer_stops(tmp_path: Path) -> None:
    """Even while a reader (tasktape inspect) keeps the log open: nothing stays in -wal."""
    db = tmp_path / "log.db"
    reader = sqlite3.connect(db)
    with LogWriter(db) as w:
        cap = w.begin_capture(source="test")
        for _ in range(3):
            w.end_exchange(w.begin_exchange(cap, method="GET", path="/"), duration_ns=1, outcome="complete")
        w.flush()
        assert reader.execute("SELECT count(*) FROM exchanges").fetchone() == (3,)
    copy = tmp_path / "copy.db"
    shutil.copy(db, copy)  # the log file alone, as a user copies it
    assert sqlite3.connect(copy).execute("SELECT count(*) FROM exchanges").fetchone() == (3,)
    reader.close()


def test_a_reader_that_keeps_the_wal_is_named(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "log.db"
    LogWriter(db).close()
    reader = sqlite3.connect(db, isolation_level=None)
    with LogWriter(db, busy_timeout=0.2) as w:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM exchanges").fetchone()  # a read transaction, held
        w.begin_capture(source="test")
        w.flush()
    reader.close()
    err = capfd.readouterr().err
    assert "still in log.db-wal" in err and "copy log.db and log.db-wal together" in err


def test_exchanges_ending_back_to_back_share_transactions(tmp_path: Path) -> None:
    """An exchange's end commits at once when it is the last thing queued (here, long
    before the batch time is up), and does not cost a transaction of its own when more
    exchanges come right behind it (an import)."""
    with LogWriter(tmp_path / "log.db", max_batch_seconds=60) as w:
        cap = w.begin_capture(source="test")
        ex = w.begin_exchange(cap, method="GET", path="/")
        assert w.end_exchange(ex, duration_ns=1).result(timeout=10).exchange_id == ex
        before = w.stats.batches
        ends = []
        for _ in range(1000):
            ex = w.begin_exchange(cap, method="GET", path="/")
            w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
            w.chunk(ex, 0, b"data: {}\n\n")
            ends.append(w.end_exchange(ex, duration_ns=1))
        assert [end.result(timeout=10).events for end in ends] == [1] * 1000
        assert w.stats.batches - before < 100


def test_times_are_spelled_as_datetime_spells_them_from_any_thread() -> None:
    """utc_iso makes the text of a second once; threads asking for other seconds meanwhile
    each get their own."""

    def spelled(ns: int) -> str:
        seconds, rest = divmod(ns, 1_000_000_000)
        moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=rest // 1000)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    wrong: list[int] = []

    def ask(seed: int) -> None:
        rng = random.Random(seed)
        base = rng.randrange(0, 4 * 10**18)
        for _ in range(20_000):
            ns = base + rng.randrange(0, 3 * 10**9)  # the same few seconds as other threads, often
            if utc_iso(ns) != spelled(ns):
                wrong.append(ns)

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong


def test_an_exchange_that_cannot_be_recorded_fails_its_future_in_either_writer(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    """The writer process's future hung forever where LogWriter's raised: now both raise,
    the exchange is not in the log, and the writer carries on."""
    db = tmp_path / "log.db"
    w = writer_class(db, on_error=lambda exc, rows: None)
    cap = w.begin_capture(source="test")
    # A start that is no time: the writer's thread cannot make the exchange's row of it.
    ex = w.begin_exchange(cap, method="GET", path="/", started_ns="soon")  # type: ignore[arg-type]
    w.response_head(ex, status=200, headers=None, is_sse=False, ttfb_ns=1)
    w.chunk(ex, 1, b"never stored")
    done = w.end_exchange(ex, duration_ns=1)
    with pytest.raises(LogError, match=f"exchange {ex} could not be recorded"):
        done.result(timeout=10)
    after = w.begin_exchange(cap, method="GET", path="/after")
    assert w.end_exchange(after, duration_ns=1).result(timeout=10).path == "/after"
    w.close()
    with EventLog(db) as log:
        assert [x["path"] for x in log.exchanges()] == ["/after"]
        assert not log.db.execute("SELECT 1 FROM chunks WHERE exchange_id = ?", (ex,)).fetchall()


@pytest.mark.parametrize(
    ("offset_ns", "data", "said"),
    [
        (10, "text", "data is bytes .* not str"),
        (None, b"x", "offset_ns is a whole number, at least 0, not None"),
        (-5_000_000, b"x", "offset_ns is a whole number, at least 0, not -5000000"),
        (True, b"x", "offset_ns is a whole number, at least 0, not True"),
        (1.5, b"x", "offset_ns is a whole number, at least 0, not 1.5"),
    ],
)
def test_a_chunk_that_is_no_bytes_at_a_whole_offset_is_refused_at_the_call(
    tmp_path: Path, writer_class: type[LogProducer], offset_ns: object, data: object, said: str
) -> None:
    """Taken as given, these lost the exchange, or stored a chunk that broke body(),
    read_log() and export, or that export wrote into a cassette no reader takes."""
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
        w.response_head(ex, status=200, headers=None, is_sse=False, ttfb_ns=1)
        with pytest.raises(UsageError, match=said):
            w.chunk(ex, offset_ns, data)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match=said):  # and none of the pieces is queued
            w.chunks(ex, [(1, b"never"), (offset_ns, data)])  # type: ignore[list-item]
        # Any bytes-like data is taken (a memoryview cannot travel to the writer process
        # as it is: it lost the whole batch there).
        w.chunk(ex, 2, bytearray(b"kept "))
        w.chunks(ex, [(3, memoryview(b"whole"))])
        assert w.end_exchange(ex, duration_ns=4).result(timeout=10).bytes == 10
    assert w.stats.rows_lost == 0
    with EventLog(db) as log:
        assert [(c["offset_ns"], c["data"]) for c in log.chunks(ex)] == [(2, b"kept "), (3, b"whole")]
    (recorded,) = read_log(db)
    assert recorded.body == b"kept whole"


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        (
            "redactor",
            ["X-Secret"],
            r"^redactor must be a tasktape Redactor \(Redactor\(headers=\[...\]\)\), not list$",
        ),
        ("tap", 5, r"^tap must be a CommitTap \(with fds, open\(\), .*\), not int$"),
    ],
)
def test_a_redactor_or_tap_of_another_kind_is_refused_naming_it(
    tmp_path: Path, writer_class: type[LogProducer], option: str, value: object, said: str
) -> None:
    """Taken as given, a redactor that is no Redactor lost every exchange (and hung the
    writer process's futures), and a tap of 5 raised a bare AttributeError."""
    with pytest.raises(UsageError, match=said):
        writer_class(tmp_path / "log.db", **{option: value})
    with writer_class(tmp_path / "log.db", redactor=Redactor(headers=["X-Secret"])) as w:  # not LogBusy
        w.begin_capture(source="test")


def test_a_capture_keeps_no_credential_of_its_upstream_or_command_line(
    tmp_path: Path, writer_class: type[LogProducer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redactor covers the capture's row as the rest: the query of the upstream URL,
    and the values of credential options in argv, the host program's by default."""
    monkeypatch.setattr(sys, "argv", ["agent.py", "--api-key", "sk-live-123", "--password=hunter2"])
    db = tmp_path / "log.db"
    with writer_class(db, redactor=Redactor(query=["session"])) as w:
        w.begin_capture(source="lib", upstream="http://u:pw@h/?api_key=sk-live&x=1&session=s1")
        argv = [
            *("tasktape", "record", "--upstream=http://h/?token=t1", "--openai-api-key=sk-o"),
            *("--apiToken", "tk", "OPENAI_API_KEY=sk-e", "--session", "s2", "--max-tokens", "100"),
            *("-H", "Authorization: Bearer sk-h", "--listen", "127.0.0.1:8080"),
        ]
        w.begin_capture(source="record", upstream="http://h:9999", argv=argv)
    with EventLog(db) as log:
        rows = [(c["upstream"], json.loads(c["argv"])) for c in log.captures()]
    assert rows == [
        (
            "http://h/?api_key=[REDACTED]&x=1&session=[REDACTED]",
            ["agent.py", "--api-key", "[REDACTED]", "--password=[REDACTED]"],
        ),
        (
            "http://h:9999",
            [
                *(
                    "tasktape",
                    "record",
                    "--upstream=http://h/?token=[REDACTED]",
                    "--openai-api-key=[REDACTED]",
                ),
                *("--apiToken", "[REDACTED]", "OPENAI_API_KEY=[REDACTED]", "--session", "[REDACTED]"),
                *("--max-tokens", "100", "-H", "Authorization: [REDACTED]", "--listen", "127.0.0.1:8080"),
            ],
        ),
    ]
    assert "sk-" not in db.read_bytes().decode("latin-1")


def test_select_takes_lists_of_tasks_and_contexts_not_one_string(tmp_path: Path) -> None:
    """One string was read as its letters, and selected nothing, silently."""
    db = tmp_path / "log.db"
    stream = b"".join(sse(completed_run(), ids="e"))
    with LogWriter(db) as w:
        ex = w.begin_exchange(w.begin_capture(source="test"), method="POST", path="/message:stream")
        w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
        w.chunk(ex, 1, stream)
        w.end_exchange(ex, duration_ns=2)
    with EventLog(db) as log:
        for option, name in (("tasks", "task.1"), ("contexts", "ctx.1")):
            with pytest.raises(
                UsageError, match=f"^{option} is a list of names, not one string: write \\['{name}'\\]$"
            ):
                log.select(**{option: name})
            assert log.select(**{option: [name]}) == [ex]


class _FailingQuery(Redactor):
    """A redactor with a bug: a request with the query "boom" cannot be turned into rows."""

    def query(self, raw: str | None) -> str | None:
        if raw == "boom":
            raise RuntimeError("a bug")
        return super().query(raw)


def test_a_request_that_cannot_become_rows_lends_nothing_to_the_next_exchange(tmp_path: Path) -> None:
    """The next exchange begun in the same batch took the failed one's status and headers,
    and the failed one's future resolved as if it were in the log."""
    db = tmp_path / "log.db"
    w = LogWriter(db, max_batch_seconds=1.0, redactor=_FailingQuery(), on_error=lambda exc, rows: None)
    cap = w.begin_capture(source="test")
    failed = w.begin_exchange(cap, method="POST", path="/failed", query="boom")
    other = w.begin_exchange(cap, method="GET", path="/other")
    w.response_head(failed, status=503, headers=[("X-From", "failed")], is_sse=False, ttfb_ns=1)
    w.chunk(failed, 2, b"never stored")
    failed_end = w.end_exchange(failed, duration_ns=10)
    other_end = w.end_exchange(other, duration_ns=20, outcome="upstream_error", error="connect failed")
    with pytest.raises(LogError, match=f"exchange {failed} could not be recorded: RuntimeError: a bug"):
        failed_end.result(timeout=10)
    assert other_end.result(timeout=10).status is None
    w.close()
    with EventLog(db) as log:
        rows = [(x["path"], x["status"], x["response_headers"], x["outcome"]) for x in log.exchanges()]
        assert rows == [("/other", None, None, "upstream_error")]
        assert not log.db.execute("SELECT 1 FROM chunks WHERE exchange_id = ?", (failed,)).fetchall()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"request_body": '{"message": {}}'}, r"^a request body is bytes .*, not str: encode it$"),
        ({"request_body": 5}, r"^a request body is bytes .*, not int$"),
        ({"query": {"q": "1"}}, r"^query is the URL's query string \(str\) or None, not dict$"),
        ({"method": None}, r"^method is the request's method, such as 'GET' \(str\), not NoneType$"),
        ({"path": None}, r"^path is the request's path, such as '/' \(str\), not NoneType$"),
        ({"path": b"/b"}, r"^path is the request's path, such as '/' \(str\), not bytes$"),
        (
            {"request_headers": [(b"X-N", b"v")]},
            r"^request_headers are \(name, value\) pairs of strings, not \(b'X-N', b'v'\)$",
        ),
        (
            {"request_headers": [("X-N", "v", "w")]},
            r"^request_headers are \(name, value\) pairs of strings, not \('X-N', 'v', 'w'\)$",
        ),
    ],
)
def test_a_request_the_writer_cannot_store_is_refused_at_the_call(
    tmp_path: Path, writer_class: type[LogProducer], given: dict[str, object], said: str
) -> None:
    """Taken as given, such a request was lost in the writer's thread, and lent its
    response to the next exchange begun in the same batch; or (a method or path that is no
    text) stored, and the log then crashed replay and exported a cassette tasktape refused;
    or (headers as bytes, a pair of three) stored as Python's writing of them, "b'X-N'"."""
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        cap = w.begin_capture(source="test")
        with pytest.raises(UsageError, match=said):
            w.begin_exchange(cap, **{"method": "POST", "path": "/refused", **given})  # type: ignore[arg-type]
        ex = w.begin_exchange(cap, method="GET", path="/next")
        w.response_head(ex, status=200, headers=None, is_sse=False, ttfb_ns=1)
        assert w.end_exchange(ex, duration_ns=2).result(timeout=10).status == 200
    with EventLog(db) as log:
        assert [(x["path"], x["status"]) for x in log.exchanges()] == [("/next", 200)]


def test_a_request_body_of_any_bytes_like_kind_is_stored(
    tmp_path: Path, writer_class: type[LogProducer]
) -> None:
    """A memoryview body lost its exchange in LogWriter, and every operation of its batch
    (the other exchanges', the capture's) in the writer process, whose futures said done."""
    db = tmp_path / "log.db"
    with writer_class(db) as w:
        cap = w.begin_capture(source="test")
        a = w.begin_exchange(cap, method="GET", path="/a")
        w.response_head(a, status=200, headers=None, is_sse=False, ttfb_ns=1)
        w.chunk(a, 1, b"hello A")
        b = w.begin_exchange(cap, method="POST", path="/b", request_body=memoryview(b"body B"))
        w.late_request_body(a, bytearray(b"late A"))
        ends = [w.end_exchange(a, duration_ns=2), w.end_exchange(b, duration_ns=2)]
        assert [end.result(timeout=10).path for end in ends] == ["/a", "/b"]
    assert w.stats.rows_lost == 0
    with EventLog(db) as log:
        assert [(x["path"], x["request_body"]) for x in log.exchanges()] == [
            ("/a", "late A"),
            ("/b", "body B"),
        ]
        assert log.body(a) == b"hello A"


def test_an_operation_that_cannot_travel_to_the_writer_process_is_lost_alone(tmp_path: Path) -> None:
    """One value that could not be pickled lost every operation of its batch, the other
    exchanges' and the capture's, and their futures all said done."""
    db = tmp_path / "log.db"
    failures: list[int] = []
    w = ProcessLogWriter(db, on_error=lambda exc, rows: failures.append(rows))
    cap = w.begin_capture(source="test")
    a = w.begin_exchange(cap, method="GET", path="/a")
    w.response_head(a, status=200, headers=None, is_sse=False, ttfb_ns=1)
    w.chunk(a, 1, b"hello A")
    b = w.begin_exchange(cap, method="POST", path="/b", uid=threading.Lock())  # type: ignore[arg-type]
    w.response_head(b, status=200, headers=None, is_sse=False, ttfb_ns=1)
    w.chunk(b, 1, b"never stored")
    a_end, b_end = w.end_exchange(a, duration_ns=2), w.end_exchange(b, duration_ns=2)
    assert a_end.result(timeout=10).bytes == 7
    with pytest.raises(
        LogError, match=f"exchange {b} could not be recorded: cannot send it to the log writer"
    ):
        b_end.result(timeout=10)
    w.close()
    assert failures == [1]
    with EventLog(db) as log:
        assert len(log.captures()) == 1
        assert [x["path"] for x in log.exchanges()] == ["/a"]
        assert log.body(a) == b"hello A"
        assert not log.db.execute("SELECT 1 FROM chunks WHERE exchange_id = ?", (b,)).fetchall()


@pytest.mark.parametrize(
    ("call", "given", "said"),
    [
        ("end", {"duration_ns": -5}, r"^duration_ns is a whole number, at least 0, not -5$"),
        ("end", {"duration_ns": "5"}, r"^duration_ns is a whole number, at least 0, not '5'$"),
        ("end", {"outcome": "bogus"}, r"^outcome is one of complete, client_disconnected, .*, not 'bogus'$"),
        ("end", {"error": 5}, r"^error is text \(str\) or None, not int$"),
        ("head", {"status": "200"}, r"^status is an HTTP status, 100 to 999, not '200'$"),
        ("head", {"status": 42}, r"^status is an HTTP status, 100 to 999, not 42$"),
        ("head", {"status": True}, r"^status is an HTTP status, 100 to 999, not True$"),
        ("head", {"ttfb_ns": None}, r"^ttfb_ns is a whole number, at least 0, not None$"),
        ("head", {"is_sse": None}, r"^is_sse is True or False, not None$"),
        ("head", {"is_sse": "false"}, r"^is_sse is True or False, not 'false'$"),
        (
            "head",
            {"headers": [("X-N", None)]},
            r"^the response headers are \(name, value\) pairs of strings, not \('X-N', None\)$",
        ),
        (
            "head",
            {"headers": [(b"X-N", b"v")]},
            r"^the response headers are \(name, value\) pairs of strings, not \(b'X-N', b'v'\)$",
        ),
    ],
)
def test_what_no_reader_could_read_back_is_refused_at_the_call(
    tmp_path: Path, writer_class: type[LogProducer], call: str, given: dict[str, object], said: str
) -> None:
    """Taken as given, these were stored and the log then refused to become a cassette
    (or, an error that is no text, its exchange was left looking under way; an is_sse that
    is no bool lost the head in the writer's thread, while the future said complete; headers
    as bytes or None values were kept as Python's writing of them, "b'X-N'"); refused,
    the exchange stays open for the call meant."""
    db = tmp_path / "log.db"
    head = {"status": 200, "headers": None, "is_sse": False, "ttfb_ns": 1}
    with writer_class(db) as w:
        ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
        with pytest.raises(UsageError, match=said):
            if call == "head":
                w.response_head(ex, **{**head, **given})  # type: ignore[arg-type]
            else:
                w.end_exchange(ex, **{"duration_ns": 5, **given})  # type: ignore[arg-type]
        w.response_head(ex, **head)  # type: ignore[arg-type]
        assert w.end_exchange(ex, duration_ns=5, outcome="refused").result(timeout=10).outcome == "refused"
    write_cassette(tmp_path / "c.jsonl", read_log(db))
    (back,) = read_cassette(tmp_path / "c.jsonl")
    assert (back.status, back.outcome) == (200, "refused")


def test_an_on_error_that_raises_leaves_the_loss_said_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], writer_class: type[LogProducer]
) -> None:
    """It was suppressed, and the loss said nowhere; one that is no function was taken."""
    with pytest.raises(UsageError, match=r"^on_error is called as on_error\(exc, rows_lost\), not str$"):
        writer_class(tmp_path / "log.db", on_error="print")  # type: ignore[arg-type]

    def on_error(exc: BaseException, rows: int) -> None:
        raise RuntimeError("the handler's own bug")

    db = tmp_path / "log.db"
    w = writer_class(db, busy_timeout=0.05, on_error=on_error)
    ex = w.begin_exchange(w.begin_capture(source="test"), method="GET", path="/")
    write_while_locked(w, db, ex, b"x")
    w.close()
    err = capsys.readouterr().err
    assert "WRITING THE LOG FAILED" in err and "1 rows lost" in err
    assert "(on_error raised RuntimeError: the handler's own bug)" in err
