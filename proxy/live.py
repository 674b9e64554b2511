"""The streams a resuming recorder holds (``tasktape record --resume``): each upstream SSE
stream as its clients are sent it, event by event, with an id on every event (the
upstream's, or one of the gateway's where it sent none), and the clients following it.

A stream lives on after its clients leave, until its upstream ends (or the hold runs
out): a client that reconnects with ``Last-Event-ID`` follows it again after that event.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from tasktape.eventlog import SSEDecoder, SSEEvent
from tasktape.eventlog.protocols.base import Request

ID_PREFIX = "tg"  # ids the gateway gives: "tg<exchange>.<event>"


@dataclass(frozen=True, slots=True)
class LiveEvent:
    id: str | None  # None: a block no client dispatches (a comment, a keep-alive)
    raw: bytes  # as clients are sent it: the upstream's bytes, and an id line where it had none


@dataclass
class LiveStream:
    """One upstream stream: its events so far, whether it has ended, and how."""

    exchange_id: int
    request_line: str  # "POST /message:stream": what a reconnect repeats
    request_rpc_id: object  # the JSON-RPC id its frames answer (or NO_ID)
    headers: list[tuple[str, str]]  # the response headers clients are sent
    events: list[LiveEvent] = field(default_factory=list)
    outcome: str | None = None  # set once the upstream ended: complete, upstream_disconnected...
    followers: int = 0
    on_followed: Callable[[bool], None] | None = None  # told when the first comes, the last goes
    closed: bool = False  # it ended with the event its protocol closes a stream with
    _positions: dict[str, int] = field(default_factory=dict)
    _dispatched: int = 0
    _decoder: SSEDecoder = field(default_factory=SSEDecoder)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    # A rejoined stream's first event (the agent's snapshot) goes here instead: it says
    # which made-up events clients get, and whether that event itself is sent on.
    _first: Callable[[SSEEvent], bool] | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Bytes from the upstream: the events they complete join the stream (and are returned)."""
        decoder = self._decoder
        events = decoder.feed(data)
        before = len(self.events)
        add = self._add
        for event in events:
            if self._first is not None and event.data:
                first, self._first = self._first, None
                if not first(event):
                    continue
            add(event.id, event.data, event.raw)
        idle = decoder.take_idle()
        if idle:  # a keep-alive goes out at once, as without --resume
            self.events.append(LiveEvent(None, idle))
        if len(self.events) > before:  # followers woken once for all the chunk brought
            self._wake()
        return events

    def rejoin(self, first: Callable[[SSEEvent], bool]) -> None:
        """The upstream broke and is followed anew: what was cut off mid-event is dropped
        (no client was sent any of it), and the new stream's first event goes to ``first``."""
        self._decoder = SSEDecoder()
        self._first = first

    def add_made(self, data: str) -> str:
        """An event the gateway made up (catching clients up after a rejoin): its id."""
        self._dispatched += 1
        event_id = self._next_id()
        end = _line_end(self.events[-1].raw if self.events else b"") or b"\n"  # the agent's line ends
        lines = [b"data: " + line.encode() for line in data.split("\n")]
        raw = end.join([*lines, f"id: {event_id}".encode(), b"", b""])
        self._positions[event_id] = len(self.events)
        self.events.append(LiveEvent(event_id, raw))
        self._wake()
        return event_id

    def answers(self, event_id: str) -> bool:
        """Whether a reconnect after that event is this stream's to answer: while it is
        held, once it closed, or for an id of the gateway's. An agent id on a stream the
        agent ended unfinished goes back to the agent, which may resume it itself (an MCP
        server that closes a stream for its client to poll)."""
        return self.outcome is None or self.closed or event_id.startswith(ID_PREFIX)

    def last_data(self) -> str | None:
        """The data of the last event clients dispatch."""
        last = self._last()
        return None if last is None else next((e.data for e in SSEDecoder().feed(last.raw)), None)

    def sent_data(self) -> list[str]:
        """The data of every event clients are sent (read again from their bytes)."""
        decoder = SSEDecoder()
        return [e.data for e in decoder.feed(b"".join(e.raw for e in self.events)) if e.data]

    def last_id(self) -> str | None:
        last = self._last()
        return None if last is None else last.id

    def _last(self) -> LiveEvent | None:
        """The last event clients dispatch."""
        return next((e for e in reversed(self.events) if e.id is not None), None)

    def end(self, outcome: str, *, closed: bool = False) -> None:
        """The upstream ended (``closed``: with its protocol's closing event): a tail it
        cut off goes out as it came."""
        if self.outcome is not None:
            return
        self.closed = closed
        for event in self._decoder.close():
            if event.raw:
                self.events.append(LiveEvent(None, event.raw))
        self.outcome = outcome
        self._wake()

    def position(self, event_id: str) -> int | None:
        """Where the event of that id is (None: this stream holds none)."""
        return self._positions.get(event_id)

    def ids(self) -> list[str]:
        return [e.id for e in self.events if e.id is not None]

    def attach(self) -> None:
        """One more client follows the stream."""
        self.followers += 1
        if self.followers == 1 and self.on_followed is not None:
            self.on_followed(True)

    def detach(self) -> None:
        self.followers -= 1
        if not self.followers and self.on_followed is not None:
            self.on_followed(False)

    async def follow(self, after: int = -1) -> AsyncIterator[list[LiveEvent]]:
        """The events after position ``after``, then those that come, until the end: as
        many at a time as there are (one write for them all, when a client lags)."""
        self.attach()
        try:
            position = after + 1
            while True:
                if position < len(self.events):
                    batch = self.events[position:]
                    position += len(batch)
                    yield batch
                    continue
                if self.outcome is not None:
                    return
                waiting = self._changed
                await waiting.wait()
        finally:
            self.detach()

    def _add(self, upstream_id: str | None, data: str, raw: bytes) -> None:
        event_id = upstream_id
        if data:
            self._dispatched += 1
            if upstream_id is None:
                event_id = self._next_id()
                raw = with_id(raw, event_id)
        if event_id is not None:  # an id without data (a priming event) is resumed from too
            self._positions.setdefault(event_id, len(self.events))
        self.events.append(LiveEvent(event_id if data else None, raw))

    def _next_id(self) -> str:
        # Numbered by the events clients dispatch, so the ids are the same on every replay.
        return f"{ID_PREFIX}{self.exchange_id}.{self._dispatched}"

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


def with_id(raw: bytes, event_id: str) -> bytes:
    """The event's bytes with an id line last in its block, before the blank line, ended
    as the line before it is (a block may end in any of CR, LF and CRLF, mixed)."""
    blank = _line_end(raw)
    before = _line_end(raw[: -len(blank)]) if blank else b""
    if not blank or not before:
        return raw  # not a whole event: it cannot be given an id
    return raw[: -len(blank)] + f"id: {event_id}".encode() + before + blank


def _line_end(raw: bytes) -> bytes:
    """The line end ``raw`` ends with (b"" if none)."""
    if raw.endswith(b"\r\n"):
        return b"\r\n"
    return raw[-1:] if raw[-1:] in (b"\r", b"\n") else b""


@dataclass(frozen=True)
class Gone:
    """A stream let go: which, and the first and last ids it held."""

    exchange_id: int
    first: str | None
    last: str | None


KEPT_GONE = 10_000  # request lines whose last stream let go is remembered


class LiveStreams:
    """The streams a resuming recorder holds, found by an event id they hold."""

    def __init__(self) -> None:
        self._streams: dict[int, LiveStream] = {}
        self._asleep: dict[int, Request] = {}  # streams of an earlier run, and what opened them
        # The last stream let go of each request line (a few): a reconnect to it is refused,
        # not taken for a new request.
        self._gone: OrderedDict[str, Gone] = OrderedDict()

    def open(
        self, exchange_id: int, request_line: str, request_rpc_id: object, headers: list[tuple[str, str]]
    ) -> LiveStream:
        stream = LiveStream(exchange_id, request_line, request_rpc_id, headers)
        self._streams[exchange_id] = stream
        return stream

    def hold_asleep(self, stream: LiveStream, original: Request) -> None:
        """A stream rebuilt from the log (its upstream not read) until a client wakes it."""
        self._streams[stream.exchange_id] = stream
        self._asleep[stream.exchange_id] = original

    def wake(self, stream: LiveStream) -> Request | None:
        """The request that opened a stream asleep, once (None: it is awake)."""
        return self._asleep.pop(stream.exchange_id, None)

    def forget(self, exchange_id: int) -> None:
        """Let an ended stream go (what it held stays in the log)."""
        stream = self._streams.pop(exchange_id, None)
        self._asleep.pop(exchange_id, None)
        if stream is not None:
            ids = stream.ids()
            self._gone.pop(stream.request_line, None)
            self._gone[stream.request_line] = Gone(
                exchange_id, ids[0] if ids else None, ids[-1] if ids else None
            )
            if len(self._gone) > KEPT_GONE:
                self._gone.popitem(last=False)

    def gone(self, request_line: str) -> Gone | None:
        """The last stream of a request like this one that was let go, if it is not held."""
        return None if self.newest(request_line) else self._gone.get(request_line)

    def __len__(self) -> int:
        return len(self._streams)

    def newest(self, request_line: str) -> LiveStream | None:
        """The newest stream a request like this one opened."""
        return next((s for s in reversed(self._streams.values()) if s.request_line == request_line), None)

    def find(self, event_id: str) -> tuple[LiveStream, int] | None:
        """The newest stream holding an event of that id, and where it is in it."""
        for stream in reversed(self._streams.values()):
            position = stream.position(event_id)
            if position is not None:
                return stream, position
        return None
