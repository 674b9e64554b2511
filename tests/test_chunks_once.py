"""A chunk of whole events (one or several) is stored once: in its events' rows, from
which the ``chunks`` view writes its bytes back. Every chunk reads back exactly as it came,
however the stream was cut or grouped, and logs from before are upgraded without a byte
changing."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import sqlite_utils
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.schema import migrations
from tasktape.eventlog.sse import written

# Blocks a stream is made of: the form the log writes back, and every near miss of it
# (no space after a field name, retry, a comment, two data lines, invalid UTF-8, CR alone).
BLOCKS = [
    b"data: x\n\n",
    b'data: {"task":1}\n\n',
    b"data: \n\n",
    "data: é\n\n".encode(),
    b"id: 7\ndata: x\n\n",
    b"id: \ndata: x\n\n",
    b"event: delta\ndata: x\n\n",
    b"id: 8\nevent: delta\ndata: x\n\n",
    b"event: delta\nid: 8\ndata: x\n\n",
    b"data: x\r\n\r\n",
    b"id: 9\r\ndata: x\r\n\r\n",
    b"data:x\n\n",
    b"id:7\ndata: x\n\n",
    b"retry: 5\ndata: x\n\n",
    b": ping\n\n",
    b": ping\ndata: x\n\n",
    b"data: a\ndata: b\n\n",
    b"data: \xff\n\n",
    b"data: x\r\r",
    b"data: x\n\r\n",
    b"id: a\x00b\ndata: x\n\n",
    b"data: x",
]


def record_each(streams: list[list[bytes]]) -> list[tuple[list[dict], int]]:
    """For each stream of chunks, the chunks of an SSE exchange recorded from it, and how
    many of them were stored."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.db"
        with LogWriter(path) as w:
            capture = w.begin_capture(source="test")
            exchanges = []
            for chunks in streams:
                ex = w.begin_exchange(capture, method="POST", path="/message:stream")
                w.response_head(
                    ex, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=1
                )
                for i, chunk in enumerate(chunks):
                    w.chunk(ex, 1000 * i, chunk)
                w.end_exchange(ex, duration_ns=1000 * len(chunks)).result()
                exchanges.append(ex)
        with EventLog(path) as log:
            count = "SELECT count(*) FROM stored_chunks WHERE exchange_id = ?"
            recorded = [(log.chunks(ex), log.db.execute(count, (ex,)).fetchone()[0]) for ex in exchanges]
            # exchange_metrics, which reads the tables, counts what the chunks view reads back
            metrics = log.db.execute("SELECT chunks, bytes FROM exchange_metrics ORDER BY exchange_id")
            for (chunks, _), counted in zip(recorded, metrics, strict=True):
                assert counted == (len(chunks), sum(len(c["data"]) for c in chunks))
            return recorded


def record(chunks: list[bytes]) -> tuple[list[dict], int]:
    """The chunks of an SSE exchange recorded from these, and how many were stored."""
    return record_each([chunks])[0]


@settings(max_examples=150, deadline=None)
@given(blocks=st.lists(st.sampled_from(BLOCKS), max_size=10), cuts=st.lists(st.integers(0, 400), max_size=6))
@example(blocks=[b"id: 9\r\ndata: x\r\n\r\n", b"data: \xff\n\n"], cuts=[])
def test_every_chunk_reads_back_as_it_came(blocks: list[bytes], cuts: list[int]) -> None:
    # A block a chunk, and the stream cut anywhere.
    stream = b"".join(blocks)
    points = sorted({c % (len(stream) + 1) for c in cuts})
    cut = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    grouped = [stream[a:b] for a, b in _block_groups(blocks, cuts)]
    streams = [blocks, [c for c in cut if c], [c for c in grouped if c]]
    for chunks, (got, _) in zip(streams, record_each(streams), strict=True):
        assert [(r["seq"], r["offset_ns"], r["data"]) for r in got] == [
            (i, 1000 * i, c) for i, c in enumerate(chunks)
        ]
        assert all(type(r["data"]) is bytes for r in got)


def _block_groups(blocks: list[bytes], cuts: list[int]) -> list[tuple[int, int]]:
    """The stream of these blocks cut only between blocks: several blocks a chunk."""
    ends = [sum(map(len, blocks[: i + 1])) for i in range(len(blocks))]
    points = sorted({ends[c % len(ends)] for c in cuts} | {ends[-1]}) if ends else []
    return list(zip([0, *points], points, strict=False))


def test_an_event_a_chunk_stores_no_chunk() -> None:
    chunks = [b"id: 1\ndata: a\n\n", b"data: b\r\n\r\n", b"event: e\ndata: c\n\n", b": ping\n\n"]
    got, stored = record(chunks)
    assert [r["data"] for r in got] == chunks
    assert stored == 1  # the comment, which no event writes back


def test_a_chunk_of_several_events_stores_no_chunk() -> None:
    several = b"id: 1\ndata: a\n\nevent: e\ndata: b\n\ndata: c\n\n"
    crlf = b"data: d\r\n\r\nid: 2\r\ndata: e\r\n\r\n"
    mixed = b"data: f\n\ndata: g\r\n\r\n"  # line ends of both kinds: stored
    torn = [b"data: h\n\ndata: i", b"\n\ndata: j\n\n"]  # the second begins mid-event: stored
    chunks = [several, crlf, mixed, *torn, b"data: k\n\n"]
    got, stored = record(chunks)
    assert [(r["seq"], r["data"]) for r in got] == list(enumerate(chunks))
    assert stored == 3
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.db"
        with LogWriter(path) as w:
            ex = w.begin_exchange(w.begin_capture(source="test"), method="POST", path="/s")
            w.response_head(
                ex, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=1
            )
            w.chunk(ex, 5, several)
            w.end_exchange(ex, duration_ns=9).result()
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT seq, chunk_seq, chunk_crlf, chunk_events FROM events").fetchall() == [
            (0, 0, 0, 3),
            (1, 0, 0, 0),
            (2, 0, 0, 0),
        ]
        assert conn.execute("SELECT chunks, bytes FROM exchange_metrics").fetchone() == (1, len(several))
        conn.close()


def test_the_form_written_back() -> None:
    assert written("x", None, None, False) == b"data: x\n\n"
    assert written("é", "7", "delta", True) == "id: 7\r\nevent: delta\r\ndata: é\r\n\r\n".encode()


def test_an_older_log_keeps_its_chunks(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = sqlite_utils.Database(path)
    migrations.apply(db, stop_before="0009_chunks_not_stored_twice")
    db["captures"].insert({"id": 1, "source": "old"})
    db["exchanges"].insert({"id": 1, "capture_id": 1, "started_ns": 0, "method": "POST", "path": "/s"})
    old = [b"data: a\n\n", b"id: 2\ndata: b\n\n"]
    for seq, data in enumerate(old):
        db["chunks"].insert({"exchange_id": 1, "seq": seq, "offset_ns": seq, "data": data})
    db.close()
    with LogWriter(path):
        pass
    with EventLog(path) as log:
        assert log.body(1) == b"".join(old)
        assert [r["seq"] for r in log.chunks(1)] == [0, 1]
        stats = log.db.execute("SELECT * FROM exchange_metrics").fetchone()
        assert stats is not None
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT type FROM sqlite_master WHERE name = 'chunks'").fetchone() == ("view",)
    assert conn.execute("SELECT count(*) FROM stored_chunks").fetchone() == (2,)
    assert conn.execute("SELECT chunks, bytes FROM exchange_metrics").fetchone() == (2, len(b"".join(old)))
    conn.close()


def test_bytes_after_the_last_event_that_dispatch_nothing_are_no_event(tmp_path: Path) -> None:
    """A comment after the last event, or the LF of a CRLF cut from its CR, is kept in the
    chunks, byte for byte, and makes no event row; a tail cut off after its data began does."""
    tails = {"comment": [b": bye\n\n"], "split": [b"\n"], "cut": [b'data: {"par']}
    with LogWriter(tmp_path / "log.db") as w:
        capture = w.begin_capture(source="test")
        ids = {}
        for name, tail in tails.items():
            first = b"data: x\r\n\r" if name == "split" else b"data: x\n\n"
            x = ids[name] = w.begin_exchange(capture, method="GET", path=f"/{name}")
            w.response_head(
                x, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=1
            )
            for i, chunk in enumerate([first, *tail]):
                w.chunk(x, i, chunk)
            w.end_exchange(x, duration_ns=9).result()
    with EventLog(tmp_path / "log.db") as log:
        got = {name: [(e["data"], e["complete"]) for e in log.events(x)] for name, x in ids.items()}
        chunks = {name: b"".join(c["data"] for c in log.chunks(x)) for name, x in ids.items()}
    assert got == {"comment": [("x", 1)], "split": [("x", 1)], "cut": [("x", 1), ('{"par', 0)]}
    assert chunks == {
        "comment": b"data: x\n\n: bye\n\n",
        "split": b"data: x\r\n\r\n",
        "cut": b'data: x\n\ndata: {"par',
    }
