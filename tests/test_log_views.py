"""The views people read: task_summary, task_timeline, task_artifacts, exchange_metrics;
and the readers: events of a task in order, and after a given event id."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from a2a_frames import USAGE, artifact, completed_run, sse, status, streamed, task

from tasktape.errors import UnknownEventId
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.reread import reread_log
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide

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


# -- tasks answered without a stream -------------------------------------------------------


def answer(
    w: LogWriter, cap: int, body: Any, *, start_ns: int, path: str = "/message:send", took_ms: int = 20
) -> int:
    """One exchange answered with a whole body (JSON unless given as bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    ex = w.begin_exchange(cap, method="POST", path=path, started_ns=start_ns)
    w.response_head(ex, status=200, headers={"content-type": "application/json"}, is_sse=False, ttfb_ns=MS)
    w.chunk(ex, took_ms * MS, data)
    w.end_exchange(ex, duration_ns=took_ms * MS)
    return ex


def task_object(task_id: str, state: str, artifacts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": task_id, "contextId": "ctx.9", "status": {"state": state}, "artifacts": artifacts, **extra}


THINKING = {
    "artifactId": "t",
    "parts": [{"text": "Looking it up."}],
    "metadata": {"type": "intermediate-thinking"},
}


@pytest.fixture
def answered(tmp_path: Path) -> Any:
    path = tmp_path / "answered.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        # N: a SendMessage answered without streaming (REST: the task wrapped in "task").
        parts = [{"text": "J45.909 — "}, {"data": {"code": "J45.909"}}, {"text": "asthma."}]
        n = task_object(
            "task.N",
            "TASK_STATE_COMPLETED",
            [THINKING, {"artifactId": "a", "parts": parts}],
            metadata={"$usage": USAGE},
        )
        answer(w, cap, {"task": n}, start_ns=T0)
        # D: a stream dropped while WORKING, then a JSON-RPC GetTask (A2A 0.3 spelling).
        frames = [
            task("task.D", "ctx.9"),
            *streamed("task.D", "ctx.9", "a", ["Partial ", "ans"], close=False),
        ]
        record(w, cap, sse(frames), start_ns=T0 + 100 * MS, outcome="upstream_disconnected")
        got = task_object(
            "task.D", "completed", [{"artifactId": "a", "parts": [{"text": "Partial answer."}]}]
        )
        answer(w, cap, {"jsonrpc": "2.0", "id": 1, "result": got}, start_ns=T0 + 1000 * MS, path="/")
        # Answers that carry no task object are not tasks: a message, an error, not JSON.
        message = {"message": {"messageId": "m", "role": "ROLE_AGENT", "taskId": "task.M", "parts": []}}
        answer(w, cap, message, start_ns=T0 + 2000 * MS)
        error = {"jsonrpc": "2.0", "id": 2, "error": {"code": -32001, "message": "Task not found"}}
        answer(w, cap, error, start_ns=T0 + 2100 * MS, path="/tasks/task.X")
        answer(w, cap, b"<html>502</html>", start_ns=T0 + 2200 * MS, path="/tasks/task.Y")
    with EventLog(path) as opened:
        yield opened


def test_tasks_answered_without_a_stream_are_summarised(answered: EventLog) -> None:
    by_id = {r["task_id"]: r for r in rows(answered, "SELECT * FROM task_summary")}
    assert list(by_id) == ["task.N", "task.D"]  # in order of their first exchange
    n, d = by_id["task.N"], by_id["task.D"]
    assert (n["context_id"], n["final_state"], n["events"], n["exchanges"], n["ttfe_ms"]) == (
        "ctx.9",
        "TASK_STATE_COMPLETED",
        0,
        1,
        None,
    )
    assert (n["answer"], n["thinking"]) == ("J45.909 — asthma.", "Looking it up.")
    assert (n["model"], n["total_tokens"], n["credits"]) == ("corti-default", 120, USAGE["credits"])
    # Seen when the answer arrived: 20 ms after the request.
    assert n["first_seen"] == n["last_seen"] == "2027-01-15T08:00:00.020Z" and n["duration_ms"] == 20.0
    # D: the later GetTask wins over the dropped stream, for the state and the answer.
    assert (d["final_state"], d["events"], d["exchanges"], d["answer"]) == (
        "TASK_STATE_COMPLETED",
        3,
        2,
        "Partial answer.",
    )
    assert d["ttfe_ms"] == 10.0 and d["duration_ms"] == 920.0  # from the stream's start to the GetTask's end
    assert (d["first_seen"], d["last_seen"]) == ("2027-01-15T08:00:00.110Z", "2027-01-15T08:00:01.020Z")
    assert set(answered.task_ids()) == {"task.N", "task.D"}


def test_task_answers(answered: EventLog) -> None:
    got = rows(answered, "SELECT exchange_id, task_id, context_id, at, state, task FROM task_answers")
    assert [(r["exchange_id"], r["task_id"], r["state"], r["at"]) for r in got] == [
        (1, "task.N", "TASK_STATE_COMPLETED", "2027-01-15T08:00:00.020Z"),
        (3, "task.D", "TASK_STATE_COMPLETED", "2027-01-15T08:00:01.020Z"),
    ]
    assert json.loads(got[1]["task"])["status"] == {"state": "completed"}  # as answered


def test_a_stream_after_an_answer_wins(tmp_path: Path) -> None:
    path = tmp_path / "log.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        answer(w, cap, {"task": task_object("t", "TASK_STATE_INPUT_REQUIRED", [])}, start_ns=T0)
        frames = [status("t", "ctx.9", "TASK_STATE_WORKING"), *streamed("t", "ctx.9", "a", ["Go", "ne"])]
        record(w, cap, [*sse(frames), *sse([status("t", "ctx.9", "TASK_STATE_COMPLETED")])], start_ns=T0 + MS)
    with EventLog(path) as log:
        (t,) = rows(log, "SELECT * FROM task_summary")
        assert (t["final_state"], t["answer"], t["events"], t["exchanges"]) == (
            "TASK_STATE_COMPLETED",
            "Gone",
            5,
            2,
        )


def test_an_older_log_lists_its_answered_tasks_once_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with LogWriter(path) as w:
        answer(
            w,
            w.begin_capture(source="test"),
            {"task": task_object("task.N", "TASK_STATE_FAILED", [])},
            start_ns=T0,
        )
    with sqlite3.connect(path) as conn:  # back to schema 4: task_summary knew only streamed tasks
        conn.execute("DROP VIEW task_answers")
        conn.execute("DROP VIEW task_summary")
        conn.execute("CREATE VIEW task_summary AS SELECT task_id FROM events WHERE task_id IS NOT NULL")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0005_task_answers'")
    with LogWriter(path):  # a writer upgrades it
        pass
    with EventLog(path) as log:
        assert [(r["task_id"], r["final_state"]) for r in rows(log, "SELECT * FROM task_summary")] == [
            ("task.N", "TASK_STATE_FAILED")
        ]


# -- what a task's clients were sent ---------------------------------------------------------


def two_turns(tmp_path: Path, first: list[dict[str, Any]], second: list[dict[str, Any]]) -> EventLog:
    """A task in two turns: a stream ending INPUT_REQUIRED, then the next message's stream."""
    path = tmp_path / "log.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        record(w, cap, sse([*first, status("t", "c", "TASK_STATE_INPUT_REQUIRED")]), start_ns=T0)
        turn = [status("t", "c", "TASK_STATE_WORKING"), *second, status("t", "c", "TASK_STATE_COMPLETED")]
        record(w, cap, sse(turn), start_ns=T0 + 1000 * MS)
    return EventLog(path)


@pytest.mark.parametrize(
    ("second", "text"),
    [
        # Replaced in the second turn: its new deltas, not the first turn's consolidation.
        (
            [artifact("t", "c", "a", "Second"), artifact("t", "c", "a", " version", append=True)],
            "Second version",
        ),
        # Added to in the second turn: the consolidation, then what was appended to it.
        ([artifact("t", "c", "a", " Plus more.", append=True)], "Draft one. Plus more."),
    ],
)
def test_an_artifact_closed_in_one_turn_reads_as_a_later_turn_left_it(
    tmp_path: Path, second: list[dict[str, Any]], text: str
) -> None:
    first = [*streamed("t", "c", "a", ["Draft", " one."], close=False)]
    first.append(artifact("t", "c", "a", "Draft one.", last_chunk=True))
    with two_turns(tmp_path, first, second) as log:
        assert rows(log, "SELECT text FROM task_artifacts")[0]["text"] == text
        assert rows(log, "SELECT answer FROM task_summary")[0]["answer"] == text


def test_an_event_never_sent_decides_nothing(tmp_path: Path) -> None:
    """A stream cut after a whole data: line but before its blank line: the event is kept
    (complete 0), but no client dispatched it, so it gives no state, text or finish."""
    path = tmp_path / "log.db"
    frames = [task("t", "c", "TASK_STATE_SUBMITTED"), artifact("t", "c", "a", "partial")]
    unsent = [artifact("t", "c", "a", " and more", append=True), status("t", "c", "TASK_STATE_COMPLETED")]
    tail = b"".join(sse(unsent)).rstrip(b"\n") + b"\n"  # the last event's blank line never came
    with LogWriter(path) as w:
        record(
            w,
            w.begin_capture(source="test"),
            [*sse(frames), tail],
            start_ns=T0,
            outcome="upstream_disconnected",
        )
    with EventLog(path) as log:
        assert [(e["kind"], e["complete"]) for e in log.events(1)][-1] == ("statusUpdate", 0)
        (t,) = rows(log, "SELECT final_state, answer FROM task_summary")
        assert (t["final_state"], t["answer"]) == ("TASK_STATE_SUBMITTED", "partial and more")
        (a,) = rows(log, "SELECT text, events FROM task_artifacts")
        assert (a["text"], a["events"]) == ("partial and more", 2)
        (x,) = rows(log, "SELECT finish, answer FROM stream_summary")
        assert (x["finish"], x["answer"]) == ("TASK_STATE_SUBMITTED", "partial and more")


def test_a_log_read_again_takes_no_finish_from_an_event_never_sent(tmp_path: Path) -> None:
    """Read again (as migrations read older logs with the protocols known now), an LLM
    stream cut before its last event's blank line took that event's finish."""
    path = tmp_path / "log.db"
    chunk = {"object": "chat.completion.chunk", "model": "gpt-x"}
    said = {**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}
    stop = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        x = w.begin_exchange(cap, method="POST", path="/v1/chat/completions", request_body=b"{}")
        w.response_head(
            x, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=1
        )
        w.chunk(x, 2, f"data: {json.dumps(said)}\n\ndata: {json.dumps(stop)}\n".encode())
        w.end_exchange(x, duration_ns=3, outcome="upstream_disconnected")
    with sqlite3.connect(path) as conn:
        written = conn.execute("SELECT finish, answer FROM exchanges").fetchone()
        reread_log(conn, ("openai",))
        again = conn.execute("SELECT finish, answer FROM exchanges").fetchone()
    assert written == again == (None, "Hi")


def test_a_reconnect_the_gateway_answered_does_not_stretch_the_task(tmp_path: Path) -> None:
    """A client reconnecting 3 s later is sent again what the stream held: the task still
    took the stream's 50 ms."""
    path = tmp_path / "log.db"
    framed = sse(
        [task("t", "c"), *streamed("t", "c", "a", ["Do", "ne"]), status("t", "c", "TASK_STATE_COMPLETED")],
        ids="e",
    )
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        stream = record(w, cap, framed, start_ns=T0)
        again = record(w, cap, framed[2:], start_ns=T0 + 3000 * MS)
        w.resume(Resume(stream, ResumeSide.CLIENT, ResumeOutcome.RESUMED, "e2", 3, new_exchange_id=again))
    with EventLog(path) as log:
        (t,) = rows(log, "SELECT * FROM task_summary")
        assert (t["last_seen"], t["duration_ms"], t["exchanges"]) == ("2027-01-15T08:00:00.050Z", 50.0, 2)
        assert (t["final_state"], t["answer"]) == ("TASK_STATE_COMPLETED", "Done")


def test_a_tasks_time_to_first_event_runs_from_its_first_request(tmp_path: Path) -> None:
    """A SendMessage answered without a stream at 200 ms, then a subscribe whose first
    event comes at 1202 ms: 1002 ms, not the subscribe's 2."""
    path = tmp_path / "log.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        answer(w, cap, {"task": task_object("t", "TASK_STATE_WORKING", [])}, start_ns=T0 + 200 * MS)
        frames = sse([status("t", "ctx.9", "TASK_STATE_COMPLETED")])
        record(w, cap, frames, start_ns=T0 + 1200 * MS, step_ms=2, path="/tasks/t:subscribe")
    with EventLog(path) as log:
        (t,) = rows(log, "SELECT ttfe_ms, duration_ms FROM task_summary")
        assert (t["ttfe_ms"], t["duration_ms"]) == (1002.0, 1002.0)  # its one event, its last


def test_a_keep_alive_comment_is_no_first_event(tmp_path: Path) -> None:
    """An event stream that sent only comments has no time to first event; a response
    that is not a stream is timed to its first chunk."""
    path = tmp_path / "log.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        headers = [
            ("accept", "text/event-stream"),
            ("mcp-session-id", "s1"),
            ("mcp-protocol-version", "2025-06-18"),
        ]
        ex = w.begin_exchange(cap, method="GET", path="/mcp", request_headers=headers, started_ns=T0)
        w.response_head(
            ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS
        )
        w.chunk(ex, 5 * MS, b": keepalive\n\n")
        w.end_exchange(ex, duration_ns=30 * MS, outcome="client_disconnected")
        answer(
            w, cap, {"task": task_object("t", "TASK_STATE_COMPLETED", [])}, start_ns=T0 + 100 * MS, took_ms=7
        )
    with EventLog(path) as log:
        assert [(r["exchange_id"], r["ttfe_ms"]) for r in rows(log, "SELECT * FROM stream_summary")] == [
            (1, None),
            (2, 7.0),
        ]
