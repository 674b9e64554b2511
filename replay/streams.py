"""Recorded response bodies as chunks ``(offset_ns, bytes)``, and the few changes replay
makes to them: resuming after an event, adding SSE ids, answering with the JSON-RPC id
of the request at hand. Chunk boundaries and offsets are kept wherever bytes are kept."""

from __future__ import annotations

from tasktape.eventlog.jsonrpc_ids import Edit
from tasktape.eventlog.spans import Chunks, StreamEvent


def apply_edits(chunks: Chunks, edits: list[Edit]) -> Chunks:
    """The chunks with ``edits`` made (non-overlapping): each chunk keeps its offset and
    its share of the bytes; an edit belongs to the chunk it starts in, and a chunk whose
    bytes all went disappears."""
    if not edits:
        return chunks
    edits = sorted(edits)
    body = b"".join(data for _, data in chunks)
    pieces, last = [], 0
    for at, removed, inserted in edits:
        pieces += [body[last:at], inserted]
        last = at + removed
    edited = b"".join([*pieces, body[last:]])

    out: Chunks = []
    start, new_start = 0, 0
    moving = _Boundaries(edits)
    for n, (offset, data) in enumerate(chunks):
        end = start + len(data)
        new_end = len(edited) if n == len(chunks) - 1 else moving.moved(end)
        piece = edited[new_start:new_end]
        if piece or not data:
            out.append((offset, piece))
        start, new_start = end, max(new_start, new_end)
    return out


class _Boundaries:
    """Where chunk boundaries go once sorted edits are made. Boundaries are asked for in
    order, so one pass over the edits does for all of them (a stream of thousands of
    events with an edit in each would otherwise take a quadratic time)."""

    def __init__(self, edits: list[Edit]) -> None:
        self._edits = edits
        self._next = 0  # the first edit not wholly before the last boundary asked for
        self._shift = 0  # how far the edits before it moved what follows them

    def moved(self, boundary: int) -> int:
        while self._next < len(self._edits):
            at, removed, inserted = self._edits[self._next]
            if at >= boundary:
                break
            if at + removed > boundary:  # the boundary fell inside what this edit removed
                return at + self._shift + len(inserted)
            self._shift += len(inserted) - removed
            self._next += 1
        return boundary + self._shift


def with_ids(events: list[StreamEvent], prefix: str) -> list[Edit]:
    """Edits giving every complete event without an SSE id a stable one, ``prefix`` and
    its number."""
    return [
        id_edit(event, f"{prefix}{n}")
        for n, event in enumerate(events, 1)
        if event.complete and event.id is None
    ]


def outside(edits: list[Edit], cuts: list[Edit]) -> list[Edit]:
    """``edits`` but those falling within what ``cuts`` remove (an id for an event left out)."""
    return [e for e in edits if not any(at <= e[0] < at + removed for at, removed, _ in cuts)]


def id_edit(event: StreamEvent, event_id: str) -> Edit:
    """The edit giving ``event`` the id line ``event_id``: last in the event's block, so it
    is the event's own id."""
    terminator = event.terminator
    return (event.end - len(terminator), 0, f"id: {event_id}".encode() + terminator)


def after(chunks: Chunks, end: int, since_ns: int) -> Chunks:
    """What comes after byte ``end``, with offsets counted from ``since_ns`` (so the rest
    keeps its own pacing)."""
    out: Chunks = []
    position = 0
    for offset, data in chunks:
        start, position = position, position + len(data)
        if position <= end:
            continue
        out.append((max(0, offset - since_ns), data[max(0, end - start) :]))
    return out


def split_at(chunks: Chunks, position: int) -> tuple[Chunks, Chunks]:
    """The chunks before byte ``position`` and from it on (a chunk across it is cut)."""
    before: Chunks = []
    rest: Chunks = []
    start = 0
    for offset, data in chunks:
        end = start + len(data)
        if end <= position:
            before.append((offset, data))
        elif start >= position:
            rest.append((offset, data))
        else:
            before.append((offset, data[: position - start]))
            rest.append((offset, data[position - start :]))
        start = end
    return before, rest
