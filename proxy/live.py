"""The streams a resuming recorder holds (``tasktape record --resume``): each upstream SSE
stream as its clients are sent it, with an id on every event (the upstream's, or one of
the recorder's where it sent none), and the clients following it.

A stream lives on after its clients leave, until its upstream ends (or the hold runs
out): a client that reconnects with ``Last-Event-ID`` follows it again after that event.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from typing import NamedTuple

from tasktape.eventlog import SSEDecoder, SSEEvent
from tasktape.eventlog.jsonrpc_ids import rpc_id
from tasktape.eventlog.protocols.base import Request

from .credentials import KEY_DIGITS, same, stream_key
from .reconnects import Opener, line_of, opener, same_line
from .stamper import Stamper, line_end, numbered

ID_PREFIX = "tg"  # ids the recorder gives: "tg<exchange>-<key>.<event>" (see credentials)


def recorders_exchange(event_id: str) -> int | None:
    """The exchange that opened the stream of one of the recorder's ids (None: not one;
    its key is checked by the stream)."""
    head, dot, number = event_id.partition(".")
    exchange, dash, key = head.removeprefix(ID_PREFIX).partition("-")
    if not (
        event_id.startswith(ID_PREFIX) and dot and dash and event_id.isascii() and len(key) == KEY_DIGITS
    ):
        return None
    return numbered(exchange) if numbered(number) is not None else None


@dataclass
class LiveStream:
    """One upstream stream: the bytes its clients are sent so far, where each event ends
    in them, whether it has ended, and how. Positions are byte offsets."""

    exchange_id: int
    request_line: str  # "POST /message:stream", "GET /events?topic=a": what a reconnect repeats
    request_body: bytes | None  # the request that opened it (read for its JSON-RPC id when asked)
    headers: list[tuple[str, str]]  # the response headers clients are sent
    key: str  # in the recorder's ids of its events, which no client of another stream can guess
    # The digest of the credentials it was opened with (see credentials); None: unknown
    # (rebuilt from the log, which keeps none), until a client the agent let in wakes it.
    credentials: bytes | None = b""
    outcome: str | None = None  # set once the upstream ended: complete, upstream_disconnected...
    followers: int = 0
    on_followed: Callable[[bool], None] | None = None  # told when the first comes, the last goes
    request_headers: Sequence[tuple[str, str]] = ()  # of the request that opened it
    letting_go: bool = False  # its hold ran out: its upstream is being closed
    # Taken up from the log, asleep: why its agent's stream is not read (None: the recorder
    # restarted), what its wake's rejoin says instead of a break.
    asleep_because: str | None = None
    # Whether it ended with the event its protocol closes a stream with: known, or asked
    # once a reconnect needs it (most streams end whole and are never asked).
    _closed: bool | Callable[[LiveStream], bool] = False
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _waiting: int = 0  # followers waiting for more: none, while the first client's handler reads
    _stamper: Stamper = field(init=False)
    # Bytes from the upstream: what they complete for clients joins the stream (and is
    # returned). The stamper's own method, a call less for every chunk: it wakes the
    # followers waiting, once for all a chunk brought.
    feed: Callable[[bytes], bytes] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Numbered by the events clients dispatch, so the ids are the same on every replay.
        self._stamper = Stamper(f"{ID_PREFIX}{self.exchange_id}-{self.key}.")
        self.feed = self._stamper.feed

    @cached_property
    def request_rpc_id(self) -> object:
        """The JSON-RPC id its frames answer (or NO_ID): only a reconnect asks."""
        return rpc_id(self.request_body)

    def opened(self) -> Request:
        """The request that opened it (as far as a reconnect is compared with it)."""
        method, _, path = self.request_line.partition(" ")
        return Request(method, path, self.request_headers, self.request_body)

    @property
    def closed(self) -> bool:
        if not isinstance(self._closed, bool):
            self._closed = self._closed(self)
        return self._closed

    @property
    def size(self) -> int:
        """The bytes clients are sent so far."""
        return self._stamper.size

    def rejoin(self, first: Callable[[SSEEvent], bool]) -> None:
        """The upstream broke and is followed anew: what was cut off mid-event is dropped
        (no client was sent any of it), and the new stream's first event goes to ``first``,
        which says whether it is sent on."""
        self._stamper.restart(first)

    def add_made(self, data: str) -> str:
        """An event the recorder made up (catching clients up after a rejoin): its id."""
        segments = self._stamper.segments
        end = line_end(segments[-1]) if segments else b""
        event_id = self._stamper.made(data, end or b"\n")  # the agent's line ends
        self._wake()
        return event_id

    def answers(self, event_id: str) -> bool:
        """Whether a reconnect after that event is this stream's to answer whatever its
        protocol: while it is held, once it closed, or for an id of the recorder's. An
        agent id on a stream the agent ended unfinished is answered only where the agent
        would not take the stream up itself (the recorder asks the protocol: an MCP server
        may close a stream for its client to poll)."""
        return self.outcome is None or self.closed or event_id.startswith(ID_PREFIX)

    def admits(self, credentials: bytes) -> bool:
        """Whether a reconnect with these credentials (their digest) may follow it."""
        return self.credentials is not None and same(self.credentials, credentials)

    def last_data(self) -> str | None:
        """The data of the last event clients dispatch."""
        ends = self._stamper.ends
        if not ends:
            return None
        events = SSEDecoder().feed(self.since(ends[-2] if len(ends) > 1 else 0, ends[-1]))
        return events[-1].data if events else None

    def sent_data(self) -> list[str]:
        """The data of every event clients are sent (read again from their bytes)."""
        return [e.data for e in SSEDecoder().feed(self.since(0)) if e.data]

    def first_id(self) -> str | None:
        return self._stamper.id_of(1) if self._stamper.count else None

    def last_id(self) -> str | None:
        count = self._stamper.count
        return self._stamper.id_of(count) if count else None

    def ids(self) -> list[str]:
        return self._stamper.ids()

    def last_agent_id(self) -> str | None:
        """The id the agent gave the last event clients are sent (None: it gave none)."""
        return self._stamper.last_own()

    def position(self, event_id: str) -> int | None:
        """Where the event of that id ends (None: this stream holds none)."""
        return self._stamper.position(event_id)

    def times_given(self, event_id: str) -> int:
        """How many events the agent gave that id (more than one: a reconnect after it
        cannot be placed)."""
        return self._stamper.times_given(event_id)

    def events_after(self, position: int) -> int:
        """How many events end after ``position``."""
        ends = self._stamper.ends
        return len(ends) - bisect_right(ends, position)

    def events_in(self, data: bytes, position: int) -> list[bytes]:
        """``data``, the bytes from ``position`` on, cut where its events end (what
        follows the last is a piece of its own)."""
        ends = self._stamper.ends
        pieces, at, i = [], 0, bisect_right(ends, position)
        while i < len(ends) and ends[i] - position <= len(data):
            pieces.append(data[at : ends[i] - position])
            at, i = ends[i] - position, i + 1
        if at < len(data):
            pieces.append(data[at:])
        return pieces

    def since(self, start: int, end: int | None = None) -> bytes:
        """The bytes clients are sent from ``start`` (to ``end``)."""
        segments, starts = self._stamper.segments, self._stamper.starts
        if not segments:
            return b""
        if end is None and starts[-1] == start:
            return segments[-1]
        i = max(bisect_right(starts, start) - 1, 0)
        j = len(segments) if end is None else bisect_left(starts, end)
        joined = b"".join(segments[i:j])
        return joined[start - starts[i] : None if end is None else end - starts[i]]

    def end(self, outcome: str, *, closed: bool | Callable[[LiveStream], bool] = False) -> None:
        """The upstream ended (``closed``: with its protocol's closing event, or what
        tells whether it did): a tail it cut off goes out as it came."""
        if self.outcome is not None:
            return
        self._closed = closed
        self._stamper.close()
        self.outcome = outcome
        self.on_followed = None  # (its hold's: nothing more to hold it for)
        self._wake()

    def attach(self) -> None:
        """One more client follows the stream."""
        self.followers += 1
        if self.followers == 1 and self.on_followed is not None:
            self.on_followed(True)

    def detach(self) -> None:
        self.followers -= 1
        if not self.followers and self.on_followed is not None:
            self.on_followed(False)

    async def follow(self, position: int = 0) -> AsyncIterator[list[bytes]]:
        """The bytes from ``position`` on, then those that come, until the end: as many
        segments at a time as there are (one write for them all, when a client lags)."""
        self.attach()
        try:
            segments, starts = self._stamper.segments, self._stamper.starts
            i = max(bisect_right(starts, position) - 1, 0)
            cut = position - starts[i] if segments else 0
            if segments and cut >= len(segments[i]):  # at a segment's end
                i, cut = i + 1, 0
            while True:
                if i < len(segments):
                    batch = segments[i:]
                    i += len(batch)
                    if cut:
                        batch[0], cut = batch[0][cut:], 0
                    yield batch
                    continue
                if self.outcome is not None:
                    return
                self._waiting += 1
                self._stamper.on_new = self._wake
                try:
                    await self._changed.wait()
                finally:
                    self._waiting -= 1
                    if not self._waiting:
                        self._stamper.on_new = None
        finally:
            self.detach()

    async def until_ended(self) -> None:
        """Wait for the upstream's end (of a stream being let go)."""
        while self.outcome is None:
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1

    def _wake(self) -> None:
        if self._waiting:
            self._changed.set()
            self._changed = asyncio.Event()


@dataclass(frozen=True)
class Gone:
    """A stream let go: which, the first and last ids it held, when it was let go, and
    what opened it (what a reconnect to it repeats; None: unknown, of an earlier run)."""

    exchange_id: int
    first: str | None
    last: str | None
    when: str  # "300 s after it ended...": what let it go
    opener: Opener | None = None
    key: str | None = None  # in the recorder's ids of its events


def keyed(event_id: str, exchange_id: int, key: str | None) -> bool:
    """Whether an id is one of the recorder's of that stream, its key right (one only
    its clients were sent, or may have been)."""
    return key is not None and event_id.startswith(f"{ID_PREFIX}{exchange_id}-{key}.")


class LetGo(NamedTuple):
    """A stream let go: the digest of its credentials (None: unknown, it was opened in an
    earlier run), and the request line that opened it."""

    credentials: bytes | None
    request_line: str


KEPT_GONE = 10_000  # request lines whose last stream let go is remembered
HOLD_BYTES = 64 * 1024 * 1024  # the default of --hold-bytes


class LiveStreams:
    """The streams a resuming recorder holds, found by an event id they hold.

    A stream that ended is still held for ``hold`` seconds (a client that dropped just
    before its end comes back for the rest), or less while the streams that ended hold
    more than ``hold_bytes``: then the earliest to end are let go first. A stream asleep
    (read back from the log, its agent not read) is held the same way from when it was
    put to sleep, until a client wakes it. Memory stays bounded however fast streams come
    and go, and is used again rather than grown."""

    def __init__(self, hold: float = 0.0, hold_bytes: int = HOLD_BYTES) -> None:
        self.hold, self.hold_bytes = hold, hold_bytes
        self._streams: dict[int, LiveStream] = {}
        self._asleep: dict[int, Request] = {}  # streams of an earlier run, and what opened them
        # The last stream let go of each request line (a few): a reconnect to it is refused,
        # not taken for a new request.
        self._gone: OrderedDict[str, Gone] = OrderedDict()
        # The streams let go (the last KEPT_GONE), by the exchange that opened each: a
        # reconnect to one is answered from the log. No other stream of the log is.
        self._let_go: OrderedDict[int, LetGo] = OrderedDict()
        # Streams taken up from the log that a client is waking: whether the agent let it.
        self.waking: dict[int, asyncio.Future[bool]] = {}
        # What the keys of this run's streams are made from: its capture's uid, once known.
        self.capture_uid: str | None = None
        # The streams nothing reads (ended, or asleep), in the order they came to be so: when
        # each is let go, and its bytes.
        self._ended: OrderedDict[int, tuple[float, int]] = OrderedDict()
        self._ended_bytes = 0
        self._sweep: asyncio.TimerHandle | None = None

    def open(
        self,
        exchange_id: int,
        request_line: str,
        request_body: bytes | None,
        headers: list[tuple[str, str]],
        credentials: bytes,
        request_headers: Sequence[tuple[str, str]] = (),
    ) -> LiveStream:
        assert self.capture_uid, "the capture's uid makes the streams' keys"
        key = stream_key(self.capture_uid, exchange_id)
        stream = LiveStream(exchange_id, request_line, request_body, headers, key, credentials)
        stream.request_headers = request_headers
        self._streams[exchange_id] = stream
        return stream

    def hold_asleep(self, stream: LiveStream, original: Request) -> None:
        """A stream rebuilt from the log (its upstream not read) until a client wakes it:
        nothing reads it, so it is held as one that ended (``hold``, ``hold_bytes``)."""
        self._sleep(stream, original)
        self._bound()

    def _sleep(self, stream: LiveStream, original: Request) -> None:
        stream.request_headers = original.headers  # (a reconnect is compared with them)
        self._streams[stream.exchange_id] = stream
        self._asleep[stream.exchange_id] = original
        self._hold_for(stream)

    def revive(self, stream: LiveStream, original: Request) -> None:
        """A stream let go before its task ended, rebuilt from the log: asleep again, in
        place of its ended self, until a client wakes it (its agent subscribed to anew)."""
        self._let_go.pop(stream.exchange_id, None)
        self._sleep(stream, original)
        self._bound(spared=stream.exchange_id)  # (its client wakes it next)

    def wake(self, stream: LiveStream) -> Request | None:
        """The request that opened a stream asleep, once (None: it is awake): read again,
        it is no longer held as if ended."""
        original = self._asleep.pop(stream.exchange_id, None)
        if original is not None:
            self._unhold(stream.exchange_id)
        return original

    def ended(self, stream: LiveStream) -> None:
        """A stream's upstream ended (or was let go): it is let go after the hold, or as
        soon as the streams that ended hold more than ``hold_bytes``, the earliest first."""
        if stream.exchange_id in self._ended or stream.exchange_id not in self._streams:
            return
        self._hold_for(stream)
        self._bound()

    def _hold_for(self, stream: LiveStream) -> None:
        """Let a stream nothing reads go after the hold (its bytes count toward
        ``hold_bytes`` meanwhile), its hold begun anew if it had one."""
        self._unhold(stream.exchange_id)
        loop = asyncio.get_running_loop()
        self._ended[stream.exchange_id] = (loop.time() + self.hold, stream.size)
        self._ended_bytes += stream.size
        if self._sweep is None:
            self._sweep = loop.call_at(next(iter(self._ended.values()))[0], self._let_go_due)

    def _unhold(self, exchange_id: int) -> None:
        ended = self._ended.pop(exchange_id, None)
        if ended is not None:
            self._ended_bytes -= ended[1]

    def _bound(self, spared: int | None = None) -> None:
        """Let go the streams held past ``hold_bytes``, the earliest first (never
        ``spared``: a client is waking it)."""
        while self._ended_bytes > self.hold_bytes and (first := next(iter(self._ended))) != spared:
            self.forget(first, f"as streams held after it filled --hold-bytes ({self.hold_bytes:,} bytes)")

    def _let_go_due(self) -> None:
        """Let go the streams whose hold ran out; wake again for the next."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._ended:
            exchange_id, (due, _) = next(iter(self._ended.items()))
            if due > now:
                self._sweep = loop.call_at(due, self._let_go_due)
                return
            self.forget(exchange_id)

    def forget(self, exchange_id: int, when: str | None = None) -> None:
        """Let a stream go (what it held stays in the log); ``when`` says what let it go."""
        stream = self._streams.pop(exchange_id, None)
        self._asleep.pop(exchange_id, None)
        self._unhold(exchange_id)
        if stream is not None:
            when = when or f"{self.hold:g} s after it ended or was left (--hold)"
            first, last, opened = stream.first_id(), stream.last_id(), opener(stream.opened())
            gone = Gone(exchange_id, first, last, when, opened, stream.key)
            self._remember(LetGo(stream.credentials, stream.request_line), gone)

    def ended_before(self, exchange_id: int, request_line: str) -> None:
        """A stream of an earlier run that ended within the hold: let go, as it would have
        been had the recorder not stopped (whoever may follow it is asked when one does)."""
        self._remember(LetGo(None, request_line), Gone(exchange_id, None, None, "in an earlier run"))

    def _remember(self, let_go: LetGo, gone: Gone) -> None:
        self._let_go[gone.exchange_id] = let_go
        if len(self._let_go) > KEPT_GONE:
            self._let_go.popitem(last=False)
        self._gone.pop(let_go.request_line, None)
        self._gone[let_go.request_line] = gone
        if len(self._gone) > KEPT_GONE:
            self._gone.popitem(last=False)

    def let_go(self, exchange_id: int) -> LetGo | None:
        """The stream that exchange opened, if it was held here and let go."""
        return self._let_go.get(exchange_id)

    def let_go_alike(self, request_line: str, most: int) -> list[int]:
        """The streams let go that a request like this one opened (at most ``most``), the
        latest first: the exchanges that opened them."""
        alike = (
            e for e, held in reversed(self._let_go.items()) if same_line(held.request_line, request_line)
        )
        return list(islice(alike, most))

    def let_go_ids(self) -> frozenset[int]:
        """The exchanges that opened the streams let go."""
        return frozenset(self._let_go)

    def gone(self, resuming: Request) -> Gone | None:
        """The last stream let go that a request like this one opened (the same line, and
        as far as it is known the same operation), if no such stream is held."""
        line = line_of(resuming.method, resuming.path)
        gone = self._gone.get(line)
        alike = gone is not None and (gone.opener is None or gone.opener.repeated_by(opener(resuming)))
        return gone if alike and not self.newest(line) else None

    def __len__(self) -> int:
        return len(self._streams)

    def newest(self, request_line: str) -> LiveStream | None:
        """The newest stream a request like this one opened."""
        return self.latest(lambda s: same_line(s.request_line, request_line))

    def latest(self, continued: Callable[[LiveStream], bool]) -> LiveStream | None:
        """The newest stream a request continues (``continued`` says which do)."""
        return next((s for s in reversed(self._streams.values()) if continued(s)), None)

    def find(
        self,
        event_id: str,
        request_line: str = "",
        credentials: bytes | None = None,
        continued: Callable[[LiveStream], bool] = lambda _: True,
    ) -> tuple[LiveStream, int] | None:
        """The stream holding an event of that id, and where it is in it. One of the
        recorder's ids names its stream. An agent's may be in several (agents number each
        stream's events alike): the newest a request like this one opened, with these
        credentials, is taken first; then the newest these credentials may follow; then the
        newest of all (which refuses them). Only streams the request ``continued`` are
        taken (a request that is no reconnect to a stream is not answered from it). Each
        stream's ids are read as it is looked in (the first look, once for all it holds)."""
        exchange_id = recorders_exchange(event_id)
        if exchange_id is None:
            streams: Iterable[LiveStream] = reversed(self._streams.values())
        else:
            streams = [self._streams[exchange_id]] if exchange_id in self._streams else []
        holding = [
            (stream, position)
            for stream in streams
            if (position := stream.position(event_id)) is not None and continued(stream)
        ]
        admitted = [found for found in holding if credentials is None or found[0].admits(credentials)]
        repeated = [found for found in admitted if same_line(found[0].request_line, request_line)]
        return next(iter(repeated or admitted or holding), None)
