"""Where a fault lands in a stream: the events it removes, repeats, swaps or spoils (as
edits of the body, so chunk boundaries and offsets stay), and the byte where the
connection breaks or stalls. What could not apply (a stream shorter than N) is said."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from tasktape.eventlog.spans import Chunks, StreamEvent, events_in

from .faults import BREAKS, HEAD_FAULTS, FaultName, Faults
from .streams import Edit, apply_edits

REPLACEMENT = "\ufffd".encode()  # what corrupt=N puts in place of the data's last character
BOM = "\ufeff".encode()  # a stream may begin with one
BLANK_LINES = frozenset({b"\n", b"\r", b"\r\n"})  # each ends an SSE block
NO_BODY = "a HEAD answer has no body"


@dataclass
class Landing:
    """A fault plan for one stream."""

    chunks: Chunks
    break_at: tuple[int, FaultName] | None = None  # byte, and how the connection ends there
    stall_at: int | None = None
    applied: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # faults not made, each with why


def land(chunks: Chunks, is_sse: bool, faults: Faults, closing: Callable[[StreamEvent], bool]) -> Landing:
    """``chunks`` with the event faults made, and where the connection breaks or stalls.
    no-final takes the closing event: another fault on it is not made (and said so)."""
    landing = Landing(chunks)
    if not is_sse or not faults.on_streams:
        _answer_faults(landing, faults)  # nothing to find in the events: they are not read
        return landing
    events = [e for e in events_in(chunks) if e.complete]
    body = b"".join(data for _, data in chunks)
    edits: list[Edit] = []
    final = _closing_event(events, closing) if faults.no_final else None

    def event(name: FaultName, n: int, count: int = 1) -> list[StreamEvent] | None:
        if not (n > 0 and n + count - 1 <= len(events)):
            landing.missed.append(f"{name}={n} (the stream has {len(events)} events)")
        elif final is not None and n <= final < n + count:
            why = f"event {final} is the stream's closing event, which {FaultName.NO_FINAL} leaves out"
            landing.missed.append(f"{name}={n} ({why})")
        else:
            landing.applied.append(f"{name}={n}")
            return [own_block(body, e) for e in events[n - 1 : n - 1 + count]]
        return None

    if faults.no_final:
        if final is None:
            landing.missed.append(f"{FaultName.NO_FINAL} (the stream has no closing event)")
        else:
            landing.applied.append(FaultName.NO_FINAL.value)
            block = own_block(body, events[final - 1])
            edits.append((block.start, block.end - block.start, b""))
    if faults.skip is not None and (hit := event(FaultName.SKIP, faults.skip)):
        edits.append((hit[0].start, hit[0].end - hit[0].start, b""))
    if faults.duplicate is not None and (hit := event(FaultName.DUPLICATE, faults.duplicate)):
        edits.append((hit[0].start, 0, body[hit[0].start : hit[0].end]))
    if faults.swap is not None and (hit := event(FaultName.SWAP, faults.swap, 2)):
        a, b = hit
        edits += [
            (a.start, a.end - a.start, body[b.start : b.end]),
            (b.start, b.end - b.start, body[a.start : a.end]),
        ]
    if faults.corrupt is not None and (hit := event(FaultName.CORRUPT, faults.corrupt)):
        spoilt = _corruption(body, hit[0])
        if spoilt is None:
            landing.applied.pop()
            landing.missed.append(
                f"{FaultName.CORRUPT}={faults.corrupt} (event {faults.corrupt} has no data)"
            )
        else:
            edits.append(spoilt)
    # Each edit has an event of its own (a spec names one fault an event, a later spec's
    # takes an earlier's place, no-final its event): they never overlap.
    landing.chunks = apply_edits(chunks, edits)
    _answer_faults(landing, faults)
    events = [e for e in events_in(landing.chunks) if e.complete]  # the edited stream's
    for name, n in _breaks(faults):
        if n == 0:
            landing.break_at = (0, name)
        elif n <= len(events):
            hit_event = events[n - 1]
            where = hit_event.end
            if name is FaultName.CUT_FRAME:
                edited = b"".join(data for _, data in landing.chunks)
                hit_event = own_block(edited, hit_event)
                where = hit_event.start + max(1, (hit_event.end - hit_event.start) // 2)
            landing.break_at = (where, name)
        else:
            landing.missed.append(f"{name}={n} (the stream has {len(events)} events)")
            continue
        landing.applied.append(f"{name}={n}")
    if faults.stall_after is not None:
        n = faults.stall_after
        if n <= len(events):
            landing.stall_at = events[n - 1].end if n else 0
            landing.applied.append(f"{FaultName.STALL}={n}:{faults.stall_ms:g}")
        else:
            landing.missed.append(
                f"{FaultName.STALL}={n}:{faults.stall_ms:g} (the stream has {len(events)} events)"
            )
    return landing


def land_on_head(chunks: Chunks, faults: Faults) -> Landing:
    """A HEAD's answer: the faults on its head are made; those on a body, which it has
    none of, are not (and said so)."""
    landing = Landing(chunks)
    for item, name in zip(faults.fault_items(), faults.named(), strict=True):
        if name in HEAD_FAULTS:
            landing.applied.append(item)
        else:
            landing.missed.append(f"{item} ({NO_BODY})")
    return landing


def clash(chunks: Chunks, faults: Faults, closing: Callable[[StreamEvent], bool]) -> str | None:
    """Why one spec says nothing clear of this stream: no-final and another fault both take
    its closing event (which only the stream shows). None when they do not."""
    if not faults.no_final:
        return None
    final = _closing_event([e for e in events_in(chunks) if e.complete], closing)
    both = next((name for event, name in faults.edited_events() if event == final), None)
    if both is None:
        return None
    both_change = f"{both} and {FaultName.NO_FINAL} both change event {final}"
    return f"{both_change}, the stream's closing one: give one of them"


def _closing_event(events: list[StreamEvent], closing: Callable[[StreamEvent], bool]) -> int | None:
    """The number (from 1) of the event that closes the stream, its last that its protocol
    says closes it; None for a stream without one."""
    return next((n for n in range(len(events), 0, -1) if closing(events[n - 1])), None)


def own_block(body: bytes, event: StreamEvent) -> StreamEvent:
    """The event's own block: the decoder counts the blocks before it that dispatched
    nothing (a comment such as ``: ping``, a lone ``retry:``) as its bytes, but a fault on
    the event leaves them where they are. (A byte-order mark is the stream's, not its
    first event's.)"""
    start = position = len(BOM) if event.start == 0 and body.startswith(BOM) else event.start
    # The last line is the blank one that ends the event: a blank line before it ends a
    # block of its own.
    for line in body[position : event.end].splitlines(keepends=True)[:-1]:
        position += len(line)
        if line in BLANK_LINES:
            start = position
    return replace(event, start=start)


def _answer_faults(landing: Landing, faults: Faults) -> None:
    """The faults any answer gets (they always apply)."""
    if faults.drip is not None:
        landing.applied.append(f"{FaultName.DRIP}={faults.drip:g}")
    if faults.content_type is not None:
        landing.applied.append(f"{FaultName.CONTENT_TYPE}={faults.content_type}")
    if faults.delay_headers_ms:
        landing.applied.append(f"{FaultName.DELAY_HEADERS}={faults.delay_headers_ms:g}")


def _breaks(faults: Faults) -> list[tuple[FaultName, int]]:
    return [(name, faults.value(name)) for name in BREAKS if faults.value(name) is not None]


def _corruption(body: bytes, event: StreamEvent) -> Edit | None:
    """The edit putting U+FFFD in place of the last character of the event's last data
    line (trailing spaces aside): whatever JSON it held no longer parses, and the data
    stays UTF-8."""
    found = None
    position = event.start
    for line in body[event.start : event.end].splitlines(keepends=True):
        text = line.rstrip(b"\r\n")
        value_at = 6 if text[5:6] == b" " else 5
        if text.startswith(b"data:") and text[value_at:].rstrip():
            found = (position + value_at, text[value_at:].rstrip())
        position += len(line)
    if found is None:
        return None
    start, value = found
    last = value.decode("utf-8", "replace")[-1].encode()
    size = len(last) if value.endswith(last) else 1
    return (start + len(value) - size, size, REPLACEMENT)
