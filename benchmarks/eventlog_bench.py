"""The event log: ingest through the writer (raw SSE bytes in; decoded, classified and
committed rows out), and task lookups on a large log."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tasktape.eventlog import EventLog, LogWriter, SSEDecoder, classify

from .harness import Section, percentiles

EVENTS_PER_TASK = 200


def task_stream(n: int) -> list[bytes]:
    """One A2A run of EVENTS_PER_TASK events, shaped like the lifecycle document:
    task, WORKING, thinking deltas + lastChunk, answer deltas + lastChunk, COMPLETED."""
    tid, ctx = f"task.{n:012d}", f"ctx.{n:012d}"
    frames: list[dict] = [
        {"task": {"id": tid, "contextId": ctx, "status": {"state": "TASK_STATE_WORKING"}}},
        {"statusUpdate": {"taskId": tid, "contextId": ctx, "status": {"state": "TASK_STATE_WORKING"}}},
    ]
    for art, kind, count in (("think", "intermediate-thinking", 40), ("answer", None, EVENTS_PER_TASK - 45)):
        meta = {"metadata": {"type": kind}} if kind else {}
        for i in range(count):
            frames.append(
                {
                    "artifactUpdate": {
                        "taskId": tid,
                        "contextId": ctx,
                        "append": i > 0,
                        "artifact": {
                            "artifactId": f"art.{art}.{n}",
                            **meta,
                            "parts": [{"text": f" token{i}"}],
                        },
                    }
                }
            )
        frames.append(
            {
                "artifactUpdate": {
                    "taskId": tid,
                    "contextId": ctx,
                    "lastChunk": True,
                    "artifact": {
                        "artifactId": f"art.{art}.{n}",
                        **meta,
                        "parts": [{"text": "".join(f" token{i}" for i in range(count))}],
                    },
                }
            }
        )
    frames.append(
        {
            "statusUpdate": {
                "taskId": tid,
                "contextId": ctx,
                "status": {"state": "TASK_STATE_COMPLETED"},
                "metadata": {"$usage": {"model": "m", "totalTokens": 120, "credits": 1.2}},
            }
        }
    )
    assert len(frames) == EVENTS_PER_TASK
    return [
        f"id: {n}-{i}\ndata: {json.dumps(f, separators=(',', ':'))}\n\n".encode()
        for i, f in enumerate(frames)
    ]


def ingest(path: Path, n_tasks: int, *, bulk: bool, first_task: int = 0) -> float:
    """Feed n_tasks streams through one writer; return events/s from the first chunk
    handed over to the last row committed."""
    streams = []
    for n in range(first_task, first_task + n_tasks):
        events = task_stream(n)
        if bulk:
            body = b"".join(events)
            events = [body[i : i + 65536] for i in range(0, len(body), 65536)]
        streams.append(events)
    with LogWriter(path) as w:
        cap = w.begin_capture(source="benchmark")
        start = time.perf_counter()
        for chunks in streams:
            ex = w.begin_exchange(cap, method="POST", path="/message:stream")
            w.response_head(ex, status=200, headers=None, is_sse=True, ttfb_ns=1)
            for i, chunk in enumerate(chunks):
                w.chunk(ex, i, chunk)
            w.end_exchange(ex, duration_ns=len(chunks))
        w.flush()
        elapsed = time.perf_counter() - start
        assert w.stats.rows_lost == 0
    return n_tasks * EVENTS_PER_TASK / elapsed


# A short exchange as an agent makes many: an MCP tool call (JSON-RPC request, JSON answer).
MCP_REQUEST_HEADERS = [
    ("host", "127.0.0.1:8000"),
    ("accept", "application/json, text/event-stream"),
    ("content-type", "application/json"),
    ("mcp-protocol-version", "2025-06-18"),
    ("mcp-session-id", "5f1c0b2a9d8e4f7a"),
    ("user-agent", "python-httpx/0.28"),
]
MCP_RESPONSE_HEADERS = [
    ("content-type", "application/json"),
    ("mcp-session-id", "5f1c0b2a9d8e4f7a"),
    ("date", "Sun, 06 Dec 2026 15:00:00 GMT"),
    ("server", "uvicorn"),
]


def tool_calls(path: Path, n: int) -> tuple[float, float]:
    """Feed ``n`` MCP tool calls through one writer: exchanges/s from the first handed over
    to the last committed, and the process's CPU µs per exchange meanwhile."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="benchmark")
        start, cpu = time.perf_counter(), time.process_time()
        for k in range(n):
            call = {"name": "lookup", "arguments": {"code": f"J45.{k}"}}
            body = json.dumps({"jsonrpc": "2.0", "id": k, "method": "tools/call", "params": call})
            answer = {"content": [{"type": "text", "text": "Unspecified asthma"}], "isError": False}
            ex = w.begin_exchange(
                cap,
                method="POST",
                path="/mcp",
                request_headers=MCP_REQUEST_HEADERS,
                request_body=body.encode(),
            )
            w.response_head(ex, status=200, headers=MCP_RESPONSE_HEADERS, is_sse=False, ttfb_ns=1)
            w.chunk(ex, 2, json.dumps({"jsonrpc": "2.0", "id": k, "result": answer}).encode())
            w.end_exchange(ex, duration_ns=3)
        w.flush()
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
        assert w.stats.rows_lost == 0
    return n / elapsed, used / n * 1e6


def decode_and_classify(n_tasks: int) -> float:
    """events/s of the writer's CPU work alone: decoding and classifying, no SQLite."""
    streams = [task_stream(n) for n in range(n_tasks)]
    start = time.perf_counter()
    for chunks in streams:
        dec = SSEDecoder()
        for chunk in chunks:
            for event in dec.feed(chunk):
                classify(event.data)
    return n_tasks * EVENTS_PER_TASK / (time.perf_counter() - start)


def import_seconds(cassette: Path, tmp: Path) -> float:
    """Wall seconds of ``tasktape import`` of ``cassette`` into a new log, best of 3."""
    best = float("inf")
    for i in range(3):
        db = tmp / f"imported-{cassette.stem}-{i}.db"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "tasktape", "import", str(cassette), "--db", str(db)],
            check=True,
            capture_output=True,
        )
        best = min(best, time.perf_counter() - start)
    return best


def timed_ms(fn, samples: int) -> tuple[float, float, float]:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return percentiles(times)


def run(quick: bool) -> list[Section]:
    big_tasks = 500 if quick else 5_000
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        ing = Section("Log ingest through the writer", ["stream shape", "events/s", "rows/s"])
        for name, bulk in (
            ("one event per chunk (live streams)", False),
            ("64 KiB chunks (bulk import)", True),
        ):
            rate = max(
                ingest(Path(tmp) / f"ingest-{bulk}-{i}.db", 100 if quick else 250, bulk=bulk)
                for i in range(3)
            )
            with sqlite3.connect(Path(tmp) / f"ingest-{bulk}-0.db") as conn:
                rows = sum(
                    conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("chunks", "events")
                )
                events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            ing.add(name, rate, rate * rows / events)
        # Each log as a cassette, read back by the command that imports one: its chunks as
        # they were (an import keeps them), so the streams' shape is the cassette's.
        empty = Path(tmp) / "empty.jsonl"
        empty.write_text('{"tasktape_cassette": 1}\n')
        start_up = import_seconds(empty, Path(tmp))
        for bulk, shape in ((False, "one event a chunk"), (True, "64 KiB chunks")):
            log, cassette = Path(tmp) / f"ingest-{bulk}-0.db", Path(tmp) / f"ingest-{bulk}.jsonl"
            subprocess.run(
                [sys.executable, "-m", "tasktape", "export", str(log), "-o", str(cassette)],
                check=True,
                capture_output=True,
            )
            with sqlite3.connect(log) as conn:
                events = conn.execute("SELECT count(*) FROM events").fetchone()[0]
            whole = import_seconds(cassette, Path(tmp))
            ing.add(
                f"`tasktape import` of their cassette ({events:,} events, {shape}), the whole command",
                events / whole,
                "",
            )
            ing.add(
                f"the same, after its start-up ({start_up:.2f} s for an empty cassette)",
                events / (whole - start_up),
                "",
            )
        ing.add(
            "decode + classify only, no SQLite (one event per chunk)",
            max(decode_and_classify(100 if quick else 250) for _ in range(3)),
            "",
        )
        ing.notes.append(
            "Each event is decoded, classified and written as an `events` row beside its raw "
            "`chunks` row; best of 3 runs, from the first chunk handed over to the last commit. "
            "`tasktape import` is timed from its start to its exit (reading and checking the whole "
            "cassette, then writing it), best of 3."
        )
        sections.append(ing)

        calls = Section("Short exchanges through the writer", ["exchange", "exchanges/s", "CPU µs each"])
        n_calls = 1_000 if quick else 5_000
        rate, cpu = max(tool_calls(Path(tmp) / f"calls-{i}.db", n_calls) for i in range(3))
        calls.add("an MCP tool call (a JSON-RPC request, its JSON answer)", rate, cpu)
        calls.notes.append(
            f"{n_calls:,} exchanges fed to one writer as the recorder hands them over (the request "
            "with its headers, the response's head, its body, the end), best of 3: from the first to "
            "the last committed, and the CPU of the whole process (the feeding thread's too) meanwhile. "
            "Each is one exchanges row (request and response headers, bodies, protocol, method, "
            "session) and the body's chunk."
        )
        sections.append(calls)

        path = Path(tmp) / "big.db"
        rate = ingest(path, big_tasks, bulk=True)
        n_events = big_tasks * EVENTS_PER_TASK
        look = Section(
            f"Lookups on a {n_events:,}-event log ({big_tasks:,} tasks, "
            f"{path.stat().st_size / n_events:.0f} bytes/event on disk)",
            ["query", "p50 ms", "p99 ms", "max ms"],
        )
        rng = random.Random(7)
        tasks = [f"task.{rng.randrange(big_tasks):012d}" for _ in range(200)]
        with EventLog(path) as log:
            it = iter(tasks * 10)
            look.add(
                "EventLog.task_events(task) — 200 events", *timed_ms(lambda: log.task_events(next(it)), 200)
            )
            it = iter(tasks * 10)
            look.add(
                "EventLog.task_events_after(task, id)",
                *timed_ms(lambda: (t := next(it), log.task_events_after(t, f"{int(t[5:])}-100")), 200),
            )
            # A word every task has (in two of its events): the first page of 50 matches.
            words = iter([f"token{rng.randrange(40, EVENTS_PER_TASK - 45)}" for _ in range(200)])
            search = (
                "SELECT e.task_id, e.seq, e.text FROM events_fts JOIN events e ON e.rowid = events_fts.rowid"
                " WHERE events_fts MATCH ? LIMIT 50"
            )
            look.add(
                "full-text search (events_fts), first 50 matches",
                *timed_ms(lambda: list(log.db.query(search, [next(words)])), 200),
            )
            # The best 500 by rank (bm25), which reads every match and tokenizes its text.
            ranked = (
                "SELECT e.task_id, snippet(events_fts, 0, '[', ']', '…', 16) FROM events_fts"
                " JOIN events e ON e.rowid = events_fts.rowid WHERE events_fts MATCH ?"
                " ORDER BY events_fts.rank LIMIT 500"
            )
            words = iter([f"token{rng.randrange(40, EVENTS_PER_TASK - 45)}" for _ in range(20)])
            look.add(
                f"ranked search, the best 500 of {2 * big_tasks:,} matches",
                *timed_ms(lambda: list(log.db.query(ranked, [next(words)])), 20),
            )
            for view in ("task_timeline", "task_summary", "task_artifacts"):
                sql = f"SELECT * FROM {view} WHERE task_id = ?"
                ids = iter(tasks * 10)
                look.add(sql, *timed_ms(lambda q=sql, i=ids: list(log.db.query(q, [next(i)])), 20))
        look.notes.append(f"The log was built through the writer at {rate:,.0f} events/s (64 KiB chunks).")
        sections.append(look)
    return sections
