"""The views people read: task_summary, task_timeline, task_artifacts, exchange_metrics;
and the readers: events of a task in order, and after a given event id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from a2a_frames import USAGE, artifact, completed_run, sse, status, streamed, task

from eventlog import EventLog, LogWriter, UnknownEventId

MS = 1_000_000
T0 = 1_800_000_000_000_000_000


def record(
    w: LogWriter,
    cap: int,
    frames_bytes: list[bytes],
    *,
    start_ns: int,
    step_ms: int = 10,
    outcome: str = "complete",
    path: str = "/message:stream",
) -> int:
    """One SSE exchange: event n arrives (n + 1) * step_ms after the request."""
    ex = w.begin_exchange(cap, method="POST", path=path, started_ns=start_ns)
    w.response_head(ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, frame in enumerate(frames_bytes):
        w.chunk(ex, (n + 1) * step_ms * MS, frame)
    w.end_exchange(ex, duration_ns=(len(frames_bytes) + 1) * step_ms * MS, outcome=outcome)
    return ex


@pytest.fixture
def log(tmp_path: Path) -> Any:
    path = tmp_path / "log.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        # A: a completed run with thinking, an answer and usage.
        record(w, cap, sse(completed_run("task.A", "ctx.1"), ids="a"), start_ns=T0)
        # B: the upstream dropped mid-answer: deltas only, and a cut-off last event.
        frames = [
            task("task.B", "ctx.1"),
            *streamed("task.B", "ctx.1", "art.b", ["one ", "two ", "three"], close=False),
        ]
        record(
            w,
            cap,
            [*sse(frames), b'data: {"artifactUpdate": {"taskId": "task.B", "art'],
            start_ns=T0 + 5 * MS,
            step_ms=20,
            outcome="upstream_disconnected",
        )
        # C: a stream cut after 3 events, then a resubscribe that sends events 3.. again.
        frames = [
            task("task.C", "ctx.2"),
            *streamed("task.C", "ctx.2", "art.c", ["al", "pha", "bet"], close=False),
            status("task.C", "ctx.2", "TASK_STATE_INPUT_REQUIRED"),
        ]
        framed = sse(frames, ids="c")
        record(w, cap, framed[:3], start_ns=T0 + 1000 * MS, outcome="upstream_disconnected")
        record(w, cap, framed[2:], start_ns=T0 + 2000 * MS, path="/tasks/task.C:subscribe")
    with EventLog(path) as opened:
        yield opened


def rows(log: EventLog, sql: str, *params: Any) -> list[dict[str, Any]]:
    return list(log.db.query(sql, params))


def test_task_summary(log: EventLog) -> None:
    by_id = {r["task_id"]: r for r in rows(log, "SELECT * FROM task_summary")}
    assert list(by_id) == ["task.A", "task.B", "task.C"]  # in order of first event
    a, b, c = by_id["task.A"], by_id["task.B"], by_id["task.C"]
    assert (a["context_id"], a["final_state"], a["events"], a["exchanges"]) == (
        "ctx.1",
        "TASK_STATE_COMPLETED",
        10,
        1,
    )
    assert a["answer"] == "J45.909 — mild intermittent asthma." and a["thinking"] == "Looking it up."
    assert (a["ttfe_ms"], a["duration_ms"]) == (10.0, 100.0)
    assert a["first_seen"] == "2027-01-15T08:00:00.010Z" and a["last_seen"] == "2027-01-15T08:00:00.100Z"
    assert (
        a["model"],
        a["input_tokens"],
        a["output_tokens"],
        a["cached_input_tokens"],
        a["total_tokens"],
        a["credits"],
    ) == ("corti-default", 100, 20, 64, 120, USAGE["credits"])
    # No lastChunk: the answer is the deltas in order; the cut-off tail is not an event of B.
    assert (b["final_state"], b["answer"], b["thinking"], b["events"]) == (
        "TASK_STATE_WORKING",
        "one two three",
        None,
        4,
    )
    assert b["model"] is None and b["ttfe_ms"] == 20.0
    # C spans two exchanges; the repeated event (same SSE id) is counted once in the answer.
    assert (c["final_state"], c["exchanges"], c["events"], c["answer"]) == (
        "TASK_STATE_INPUT_REQUIRED",
        2,
        6,
        "alphabet",
    )
    assert c["duration_ms"] == 1030.0


def test_task_timeline_gaps(log: EventLog) -> None:
    a = rows(log, "SELECT * FROM task_timeline WHERE task_id = ?", "task.A")
    assert [r["seq"] for r in a] == list(range(10))
    assert [r["offset_ms"] for r in a] == [10.0 * n for n in range(1, 11)]
    assert [r["gap_ms"] for r in a] == [None] + [10.0] * 9
    assert [r["kind"] for r in a][:2] == ["task", "statusUpdate"] and a[-1]["state"] == "TASK_STATE_COMPLETED"
    c = rows(log, "SELECT * FROM task_timeline WHERE task_id = ?", "task.C")
    assert [(r["exchange_id"], r["event_id"]) for r in c] == [
        (3, "c1"),
        (3, "c2"),
        (3, "c3"),
        (4, "c3"),
        (4, "c4"),
        (4, "c5"),
    ]
    assert c[3]["gap_ms"] == 1010.0 - 30.0


def test_task_artifacts(log: EventLog) -> None:
    arts = rows(log, "SELECT * FROM task_artifacts WHERE task_id = ?", "task.A")
    assert [(r["artifact_id"], r["artifact_type"], r["events"], r["closed"], r["text"]) for r in arts] == [
        ("art.think", "intermediate-thinking", 3, 1, "Looking it up."),
        ("art.answer", None, 4, 1, "J45.909 — mild intermittent asthma."),
    ]


def test_lastchunk_text_wins_over_deltas(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    frames = [
        *streamed("t", "c", "a", ["draft ", "text"], close=False),
        artifact("t", "c", "a", "Final text.", last_chunk=True),
    ]
    with LogWriter(path) as w:
        record(w, w.begin_capture(source="test"), sse(frames), start_ns=T0)
    with EventLog(path) as log:
        assert rows(log, "SELECT answer FROM task_summary")[0]["answer"] == "Final text."


def test_exchange_metrics(log: EventLog) -> None:
    m = rows(log, "SELECT * FROM exchange_metrics")
    assert [r["exchange_id"] for r in m] == [1, 2, 3, 4]
    assert [r["events"] for r in m] == [10, 5, 3, 3]  # B: 4 events + the cut-off tail
    assert [r["chunks"] for r in m] == [10, 5, 3, 3]
    assert m[0]["bytes"] == len(b"".join(sse(completed_run("task.A", "ctx.1"), ids="a")))
    assert (m[0]["ttfb_ms"], m[0]["ttfe_ms"], m[0]["duration_ms"], m[0]["outcome"]) == (
        1.0,
        10.0,
        110.0,
        "complete",
    )
    assert m[1]["outcome"] == "upstream_disconnected"


def test_tail_event_is_kept_and_flagged(log: EventLog) -> None:
    tail = log.events(2)[-1]
    assert (tail["complete"], tail["kind"], tail["task_id"]) == (0, "other", None)
    assert tail["data"] == '{"artifactUpdate": {"taskId": "task.B", "art' and tail["parse_error"]


def test_readers(log: EventLog) -> None:
    assert [x["id"] for x in log.exchanges(1)] == [1, 2, 3, 4] and log.exchanges(99) == []
    events = log.task_events("task.C")
    assert [(e["exchange_id"], e["seq"]) for e in events] == [(3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2)]
    # What a client resuming after c2 has not seen: c3 once, though it was sent twice.
    assert [e["event_id"] for e in log.task_events_after("task.C", "c2")] == ["c3", "c4", "c5"]
    assert [e["event_id"] for e in log.task_events_after("task.C", "c3")] == ["c4", "c5"]
    assert log.task_events_after("task.C", "c5") == []
    with pytest.raises(UnknownEventId, match=r"'c9'.*6 events; its ids run from 'c1' to 'c5'"):
        log.task_events_after("task.C", "c9")
    with pytest.raises(UnknownEventId, match="no event ids"):
        log.task_events_after("task.B", "1")
    with pytest.raises(KeyError):
        log.exchange(42)
    assert set(log.task_ids()) == {"task.A", "task.B", "task.C"}
