"""A recorded response body, chunks ``(offset_ns, bytes)``, read back as SSE events with
the byte span each one takes in the whole body (what replay cuts at and the checker reads)."""

from __future__ import annotations

from dataclasses import dataclass

from .sse import SSEDecoder, SSEEvent

Chunks = list[tuple[int, bytes]]


@dataclass(frozen=True)
class StreamEvent:
    start: int  # byte span of the event in the whole body
    end: int
    id: str | None
    data: str
    complete: bool
    offset_ns: int  # when the chunk that completed it arrived

    @property
    def terminator(self) -> bytes:
        return b"\r\n" if self.raw_end == b"\r\n" else self.raw_end[-1:]

    raw_end: bytes = b"\n"
    event: str | None = None  # the SSE event field


def events_in(chunks: Chunks) -> list[StreamEvent]:
    """The SSE events of a recorded body, with their byte spans."""
    decoder = SSEDecoder()
    events: list[StreamEvent] = []
    position = 0
    last_offset = 0
    for offset, data in chunks:
        last_offset = offset
        for event in decoder.feed(data):
            events.append(_span(event, position, offset))
            position += len(event.raw)
    events += [_span(e, position, last_offset) for e in decoder.close()]
    return events


def _span(event: SSEEvent, start: int, offset_ns: int) -> StreamEvent:
    raw = event.raw
    return StreamEvent(
        start, start + len(raw), event.id, event.data, event.complete, offset_ns, raw[-2:], event.event
    )
