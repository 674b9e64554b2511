"""How a task's answer is assembled from its artifact events, and which events count as
sent again: only those on a stream that continues an earlier one (a subscribe, a request
carrying Last-Event-ID) with the id of an event that stream sent. Streams that each number
their events from 1 are not repeats of each other: the views, the session page and the
checker all read them as new."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from a2a_frames import artifact, sse, status, task
from click.testing import CliRunner
from datasette.app import Datasette
from inspector_log import page

from tasktape.cli import main
from tasktape.eventlog import SCHEMA_VERSION, EventLog, LogWriter
from tasktape.inspector.app import create_datasette

MS = 1_000_000
T0 = 1_800_000_000_000_000_000
Headers = list[tuple[str, str]]


def record(
    w: LogWriter,
    cap: int,
    chunks: list[bytes],
    *,
    start_ms: int,
    path: str = "/message:stream",
    body: bytes = b"{}",
    headers: Headers | None = None,
) -> int:
    """One SSE exchange starting ``start_ms`` after T0, its events 10 ms apart."""
    ex = w.begin_exchange(
        cap,
        method="POST",
        path=path,
        request_headers=[("content-type", "application/json"), *(headers or [])],
        request_body=body,
        started_ns=T0 + start_ms * MS,
    )
    w.response_head(ex, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS)
    for n, chunk in enumerate(chunks, 1):
        w.chunk(ex, n * 10 * MS, chunk)
    w.end_exchange(ex, duration_ns=(len(chunks) + 1) * 10 * MS)
    return ex


def streamed(path: Path, *streams: list[dict[str, Any]]) -> None:
    """A log of one capture: each of ``streams`` (A2A frames) an exchange a second after the
    one before, its event ids lettered a, b..."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        for n, frames in enumerate(streams):
            record(w, cap, sse(frames, ids="abcdefgh"[n]), start_ms=1000 * n)


def answers(path: Path) -> dict[str, tuple[str | None, list[str | None]]]:
    """Each task's task_summary answer, and its artifacts' task_artifacts texts."""
    with EventLog(path) as log:
        summary = {
            r["task_id"]: r["answer"] for r in log.db.query("SELECT task_id, answer FROM task_summary")
        }
        return {
            t: (
                a,
                [r["text"] for r in log.db.query("SELECT text FROM task_artifacts WHERE task_id = ?", [t])],
            )
            for t, a in summary.items()
        }


# -- an artifact's text ---------------------------------------------------------------------


def test_a_last_chunk_that_appends_adds_its_piece_to_the_text(tmp_path: Path) -> None:
    """A closing lastChunk with append true is the last piece, not the whole text."""
    path = tmp_path / "log.db"
    streamed(
        path,
        [
            task("t.appended", "c"),
            artifact("t.appended", "c", "a", "Hello "),
            artifact("t.appended", "c", "a", "world", append=True, last_chunk=True),
            status("t.appended", "c", "TASK_STATE_COMPLETED"),
        ],
    )
    assert answers(path) == {"t.appended": ("Hello world", ["Hello world"])}


def test_append_false_replaces_the_text_so_far(tmp_path: Path) -> None:
    """An event with append false starts the text again (the spec's replace), whether it
    closes the artifact or not; the appends after it add to it."""
    path = tmp_path / "log.db"
    streamed(
        path,
        [
            task("t.again", "c"),
            artifact("t.again", "c", "a", "draft "),
            artifact("t.again", "c", "a", "one", append=True),
            artifact("t.again", "c", "a", "Final "),
            artifact("t.again", "c", "a", "text", append=True),
            status("t.again", "c", "TASK_STATE_COMPLETED"),
        ],
        [
            task("t.closed", "c"),
            artifact("t.closed", "c", "a", "Hel"),
            artifact("t.closed", "c", "a", "lo", append=True),
            artifact("t.closed", "c", "a", "Hello", last_chunk=True),
            status("t.closed", "c", "TASK_STATE_COMPLETED"),
        ],
    )
    assert answers(path) == {"t.again": ("Final text", ["Final text"]), "t.closed": ("Hello", ["Hello"])}


def test_an_older_log_reads_its_artifacts_anew_once_upgraded(tmp_path: Path) -> None:
    """A log of schema version 17 has the views that took an appending lastChunk for the
    whole text: upgrading it makes them anew."""
    path = tmp_path / "log.db"
    streamed(
        path,
        [
            task("t.old", "c"),
            artifact("t.old", "c", "a", "Hello "),
            artifact("t.old", "c", "a", "world", append=True, last_chunk=True),
        ],
    )
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DELETE FROM _sqlite_migrations WHERE name >= '0018'")
        conn.execute("DROP VIEW task_artifacts")
        conn.execute("CREATE VIEW task_artifacts AS SELECT 't.old' AS task_id, 'world' AS text")
        conn.execute("PRAGMA user_version = 17")
    result = CliRunner().invoke(main, ["upgrade", str(path)])
    assert f"schema version 17 went to {SCHEMA_VERSION}" in result.output, result.output
    assert answers(path) == {"t.old": ("Hello world", ["Hello world"])}


# -- a task's streams ------------------------------------------------------------------------


def test_a_tasks_second_stream_numbering_its_events_from_1_is_read_whole(tmp_path: Path) -> None:
    """INPUT_REQUIRED, then a new message resumes the task on a stream whose event ids
    start at 1 again: its events are new, not the first stream's sent again. A reconnect
    with Last-Event-ID that repeats the events after it still counts them once."""
    path = tmp_path / "log.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        first = [
            task("t.resumed", "c"),
            artifact("t.resumed", "c", "a", "Hello "),
            status("t.resumed", "c", "TASK_STATE_INPUT_REQUIRED"),
        ]
        record(w, cap, sse(first, ids=""), start_ms=0)
        second = [
            status("t.resumed", "c", "TASK_STATE_WORKING"),
            artifact("t.resumed", "c", "a", "wor", append=True),
            artifact("t.resumed", "c", "a", "ld", append=True),
            status("t.resumed", "c", "TASK_STATE_COMPLETED"),
        ]
        framed = sse(second, ids="")
        record(w, cap, framed[:2], start_ms=1000)
        # The client came back after event 1: the agent sends events 2.. again.
        record(w, cap, framed[1:], start_ms=2000, headers=[("Last-Event-ID", "1")])
    assert answers(path) == {"t.resumed": ("Hello world", ["Hello world"])}


# -- an MCP session --------------------------------------------------------------------------


def mcp_call(w: LogWriter, cap: int, rpc_id: int, tool: str, result: dict[str, Any], start_ms: int) -> None:
    """A tools/call whose POST stream numbers its events from 1: a progress, the result."""
    messages = [
        {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": rpc_id, "progress": 1},
        },
        {"jsonrpc": "2.0", "id": rpc_id, "result": result},
    ]
    chunks = [
        f"id: {n}\nevent: message\ndata: {json.dumps(m)}\n\n".encode() for n, m in enumerate(messages, 1)
    ]
    request = {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {}, "_meta": {"progressToken": rpc_id}},
    }
    record(
        w,
        cap,
        chunks,
        start_ms=start_ms,
        path="/mcp",
        body=json.dumps(request).encode(),
        headers=[("mcp-session-id", "S")],
    )


def mcp_log(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.db"
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        mcp_call(w, cap, 1, "fine", {"content": [{"type": "text", "text": "all well"}]}, 0)
        mcp_call(
            w, cap, 2, "broken", {"content": [{"type": "text", "text": "it broke"}], "isError": True}, 1000
        )
    return path


async def test_a_session_whose_streams_number_events_alike_shows_every_result(tmp_path: Path) -> None:
    """The second call's progress and result have the ids of the first call's: they are
    its own, and the page shows them (and its error)."""
    ds: Datasette = create_datasette(mcp_log(tmp_path))
    data = json.loads(await page(ds, "/mcp/-/session/S.json"))
    got = [(x["tool"], x["answer"] and x["answer"]["finish"], len(x["progress"])) for x in data["exchanges"]]
    assert got == [("fine", "result", 1), ("broken", "tool_error", 1)]
    html = await page(ds, "/mcp/-/session/S")
    assert "No answer was recorded for this call" not in html and "it broke" in html


def test_check_finds_no_fault_in_streams_that_number_events_alike(tmp_path: Path) -> None:
    """Each call was answered on its own stream: no "got no response"."""
    result = CliRunner().invoke(main, ["check", "--no-save", str(mcp_log(tmp_path))])
    assert result.exit_code == 0, result.output
    assert "no rule broken" in result.output


def test_ids_used_again_in_a_session_once_answered_are_new_requests(tmp_path: Path) -> None:
    """A client that numbers each round of calls from 1 again, in one session, sends new
    requests (ids need be unique only among requests under way): each answered once breaks
    no rule. A response no waiting request accounts for is reported once, with where the
    request's first answer came, and saved once."""
    path = tmp_path / "rounds.db"
    ok = {"content": [{"type": "text", "text": "ok"}]}
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        # A GET opened before the calls answers request 2 once more after the last round.
        get = w.begin_exchange(
            cap, method="GET", path="/mcp", request_headers=[("mcp-session-id", "S")], started_ns=T0
        )
        for round_ in range(3):
            for rpc_id in (1, 2, 3):
                mcp_call(w, cap, rpc_id, "fine", ok, (round_ * 3 + rpc_id) * 1000)
        w.response_head(
            get, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=MS
        )
        again = {"jsonrpc": "2.0", "id": 2, "result": ok}
        w.chunk(get, 20_000 * MS, f"id: g1\nevent: message\ndata: {json.dumps(again)}\n\n".encode())
        w.end_exchange(get, duration_ns=20_010 * MS)
    result = CliRunner().invoke(main, ["check", str(path)])
    lines = [line for line in result.output.splitlines() if line.startswith("-  ")]
    assert lines == [
        f"-  {path} exchange 1 event 0  mcp-one-response: "
        "a second response to request 2 (the first: exchange 9 event 1)"
    ], result.output
    with EventLog(path) as log:
        assert [r["exchange_id"] for r in log.db.query("SELECT exchange_id FROM findings")] == [1]
