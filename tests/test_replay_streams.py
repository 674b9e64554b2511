"""Byte edits on recorded chunks: the same bytes as editing the whole body, boundaries
and offsets kept; resume and split points."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tasktape.eventlog.jsonrpc_ids import jsonrpc_id_edits
from tasktape.eventlog.spans import events_in
from tasktape.replay.streams import after, apply_edits, split_at, with_ids

bodies = st.binary(min_size=1, max_size=60)


@st.composite
def chunked_with_edits(draw: st.DrawFn) -> tuple[list[tuple[int, bytes]], list[tuple[int, int, bytes]]]:
    body = draw(bodies)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=6))))
    bounds = [0, *[c for c in cuts if c < len(body)], len(body)]
    chunks = [(i * 10, body[a:b]) for i, (a, b) in enumerate(itertools.pairwise(bounds))]
    edits, at = [], 0
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(at, len(body)))
        removed = draw(st.integers(0, len(body) - at))
        edits.append((at, removed, draw(st.binary(max_size=5))))
        at += removed
    return chunks, edits


def edit_whole(body: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    for at, removed, inserted in sorted(edits, reverse=True):
        body = body[:at] + inserted + body[at + removed :]
    return body


@settings(max_examples=500, deadline=None)
@given(chunked_with_edits())
def test_edits_on_chunks_equal_edits_on_the_body(case: tuple) -> None:
    chunks, edits = case
    edited = apply_edits(chunks, edits)
    assert b"".join(d for _, d in edited) == edit_whole(b"".join(d for _, d in chunks), edits)
    offsets = [o for o, _ in edited]
    assert offsets == sorted(offsets) and set(offsets) <= {o for o, _ in chunks}
    if not edits:
        assert edited == chunks


def test_ids_go_last_in_each_block_and_resume_points() -> None:
    chunks = [(5, b": hi\ndata: a\n\n"), (9, b"data: b\r\n\r"), (12, b"\nid: x\ndata: c\n\n")]
    events = events_in(chunks)
    assert [(e.id, e.offset_ns) for e in events] == [(None, 5), (None, 9), ("x", 12)]
    body = b"".join(d for _, d in apply_edits(chunks, with_ids(events, "tt1.")))
    assert body == b": hi\ndata: a\nid: tt1.1\n\ndata: b\r\nid: tt1.2\r\r\nid: x\ndata: c\n\n"
    assert [e.id for e in events_in([(0, body)])] == ["tt1.1", "tt1.2", "x"]
    assert after(chunks, events[0].end, events[0].offset_ns) == [
        (4, b"data: b\r\n\r"),
        (7, b"\nid: x\ndata: c\n\n"),
    ]
    assert split_at(chunks, 3) == ([(5, b": h")], [(5, b"i\ndata: a\n\n"), *chunks[1:]])


def test_jsonrpc_ids_are_replaced_at_the_top_level_only() -> None:
    frame = b'data: {"result": {"task": {"id": 1}}, "id": 1, "jsonrpc": "2.0"}\n\n'
    chunks = [(0, frame), (1, frame)]
    edited = apply_edits(chunks, jsonrpc_id_edits(chunks, events_in(chunks), 1, "r-2"))
    assert [d for _, d in edited] == [frame.replace(b'"id": 1, "j', b'"id": "r-2", "j')] * 2
    body = [(0, b'{"jsonrpc":"2.0","id":7,"result":{"id":7}}')]
    assert apply_edits(body, jsonrpc_id_edits(body, None, 7, 8)) == [
        (0, b'{"jsonrpc":"2.0","id":8,"result":{"id":7}}')
    ]


def test_only_the_answers_to_the_request_get_its_new_id() -> None:
    """An MCP POST stream: a progress notification, a request of the server's own (id 0
    of its numbering), then the response to the client's request 3."""
    frames = [
        b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":3}}\n\n',
        b'data: {"jsonrpc":"2.0","id":0,"method":"sampling/createMessage"}\n\n',
        b'data: {"jsonrpc":"2.0","id":"3","result":{}}\n\n',  # "3" is not 3
        b'data: {"jsonrpc":"2.0","id":3,"result":{}}\n\n',
    ]
    chunks = [(i, f) for i, f in enumerate(frames)]
    edited = apply_edits(chunks, jsonrpc_id_edits(chunks, events_in(chunks), 3, 9))
    assert [d for _, d in edited] == [*frames[:3], frames[3].replace(b'"id":3', b'"id":9')]
