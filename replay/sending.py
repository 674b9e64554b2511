"""Sending one answer: status and headers at the recorded time to first byte, each chunk
on an absolute schedule (``start + offset / speed``: no drift builds up), with the faults
it was given, noting in its fidelity record what went out and how late."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import HttpVersion11, web
from multidict import CIMultiDict

from tasktape.eventlog.spans import Chunks, events_in
from tasktape.proxy.headers import Relayed

from .fault_edits import Landing
from .faults import FaultName, Faults
from .fidelity import Divergence, Served
from .streams import split_at

DRIP_SLICE_S = 0.02  # a dripping body goes out in pieces this far apart
DRAIN_TIMEOUT_S = 2.0  # how long a reset waits for the client to have every byte before it
GONE_POLL_S = 0.05  # how often a stream kept open looks whether its client has left


@dataclass
class Stopping:
    """Whether the server is being stopped: an answer cut from then on was cut by the stop
    (aiohttp cancels its handler as it does when the client leaves)."""

    now: bool = False


STOPPING = web.AppKey("tasktape_replay_stopping", Stopping)


def cut_short(app: web.Application, served: Served) -> None:
    """Note why an answer did not go out whole: the server stopping, or the client leaving."""
    why = Divergence.STOPPED if app[STOPPING].now else Divergence.CLIENT_LEFT
    served.because(why, f"after {served.bytes_sent} bytes")


@dataclass
class Message:
    """A message in an outbox: due at a loop time, ``offset_ns`` into the answer that gave
    it (whose later chunks wait for it to go out)."""

    when: float
    data: bytes
    offset_ns: int
    outbox: Outbox
    carried_by: str  # the recording of the stream that carried it ("c.db exchange 3")
    label: str  # what a report calls it
    out: asyncio.Event = field(default_factory=asyncio.Event)

    async def gone_out(self) -> None:
        """Until it has gone out, while a stream that sends it is open (with none open, it
        waits for one in the outbox: the answer that gave it goes on)."""
        while not self.out.is_set() and self.outbox.streams:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.out.wait(), GONE_POLL_S)


class Outbox:
    """Messages other answers give a stream to send, each due at a loop time of its own (an
    MCP call's requests, on its session's GET stream, timed from the call's start)."""

    def __init__(self) -> None:
        self._due: list[Message] = []
        self._put = asyncio.Event()
        self.streams = 0  # the streams open that send its messages

    def put(self, when: float, data: bytes, offset_ns: int, carried_by: str, label: str) -> Message:
        message = Message(when, data, offset_ns, self, carried_by, label)
        self._due.append(message)
        self._due.sort(key=lambda m: m.when)
        self._put.set()
        return message

    def first_due(self) -> float | None:
        return self._due[0].when if self._due else None

    def take(self, now: float) -> list[Message]:
        """The messages due by ``now``, taken out."""
        n = next((i for i, m in enumerate(self._due) if m.when > now), len(self._due))
        taken, self._due = self._due[:n], self._due[n:]
        return taken

    async def wait(self, timeout: float) -> None:
        """Until a message is put, or ``timeout`` seconds have passed."""
        self._put.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._put.wait(), max(0.0, timeout))


@dataclass
class Joined:
    """What a stream sends besides its own recorded chunks: ``outbox``'s messages, between
    its events. ``staying``: whether more may still come (it stays open past its recorded
    end until none may); ``held_back``: what it never got to send, as the report says it."""

    outbox: Outbox
    staying: Callable[[], bool]
    held_back: Callable[[], list[str]]
    origin: str  # its own recording: a message another carried is said to be sent here


@dataclass
class Answer:
    """What to send, and when: offsets count from ``start`` (loop time)."""

    status: int
    headers: Any
    ttfb_ns: int
    chunks: Chunks
    is_sse: bool
    start: float
    cut_ns: int | None = None  # the recording broke off here: so does the replay
    end_ns: int | None = None  # a stream ends here (its server closed it some time after its last event)
    hold: bool = False  # the stream stays open until the client leaves (its recorded client ended it)
    framed: bool = False  # recorded with its length, which an edit changed: sent with the new one
    joined: Joined | None = None  # messages other answers give it to send
    # Messages it gave another stream: its chunks recorded after one wait for it to go out
    # (an MCP tool's result never overtakes the sampling request that it followed).
    gave: list[Message] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        """Whether the recording has its body's end (it broke off nowhere, nor is held open)."""
        return self.cut_ns is None and not self.hold


def due(start: float, offset_ns: float, speed: float) -> float:
    """When something recorded ``offset_ns`` after a start is due, in loop time."""
    return start + (offset_ns / 1e9 / speed if speed else 0)


async def send(
    request: web.Request, answer: Answer, faults: Faults, landing: Landing, served: Served, speed: float
) -> web.StreamResponse:
    """Send ``answer`` with its faults, as ``landing`` places them in its body."""
    loop = asyncio.get_running_loop()
    shift = faults.delay_headers_ms / 1000
    headers = CIMultiDict(answer.headers)
    if faults.content_type is not None:
        headers["Content-Type"] = faults.content_type
    if landing.chunks is not answer.chunks:  # a fault changed bytes
        headers.popall("Content-Length", None)
    if answer.framed and answer.whole and "Content-Length" not in headers:
        headers["Content-Length"] = str(_size(landing.chunks))  # the edited body's
    if landing.break_at is not None and "Content-Length" in headers:
        _broken_framing(headers, answer, landing.chunks, landing.break_at[0])
    response = Relayed(status=answer.status, headers=headers)  # the recorded headers: no Server added
    if "Content-Length" not in headers and request.version < HttpVersion11:
        # An HTTP/1.0 body of unknown length ends with the connection: aiohttp would keep a
        # keep-alive client's open (it decides before it sees there is no length).
        response.force_close()
    sent_all = False
    outbox = answer.joined.outbox if answer.joined is not None else None
    if outbox is not None:
        outbox.streams += 1
    try:
        await _until(loop, due(answer.start, answer.ttfb_ns, speed) + shift)
        await response.prepare(request)
        marks = sorted(
            {m for m in (landing.stall_at, landing.break_at and landing.break_at[0]) if m is not None}
        )
        pieces = _cut(landing.chunks, marks)
        position = 0
        drip = _Drip(faults.drip) if faults.drip else None
        begin, scale, late = answer.start, (1 / 1e9 / speed if speed else 0.0), served.late_s.append
        served.body = []  # what goes out, in order: its own chunks and what it is given to send
        between = _event_ends(pieces) if answer.joined is not None else set()
        for offset, data in [*pieces, (None, b"")]:
            if position == landing.stall_at:
                shift += faults.stall_ms / 1000
                await asyncio.sleep(faults.stall_ms / 1000)
                landing.stall_at = None
            if landing.break_at is not None and position == landing.break_at[0]:
                await _break(request, landing.break_at[1])
                return response
            if offset is None:
                break
            when = begin + offset * scale + shift
            if answer.joined is not None and position in between:
                await _mingle(request, response, answer.joined, served, when)
            for message in answer.gave:
                if message.offset_ns <= offset:
                    await message.gone_out()
            served.body.append((offset, data))
            if drip is None:
                now = loop.time()
                if when > now:
                    await asyncio.sleep(when - now)
                    now = loop.time()
                await response.write(data)
                served.bytes_sent += len(data)
                late(now - when)
            else:
                for piece in drip.slices(data):
                    when = max(when, drip.next_at(loop.time()))
                    await _until(loop, when)
                    behind = loop.time() - when
                    await response.write(piece)
                    served.bytes_sent += len(piece)
                    late(behind)
                    drip.sent(len(piece), loop.time())
            position += len(data)
        if answer.joined is not None and not await _mingled_to_end(
            request, response, answer, served, speed, shift
        ):
            if not answer.hold:
                _left(request.app, served, sent_all)
            return response  # the client left a stream kept open for it
        if answer.hold:
            await _until_gone(request)
            return response
        if answer.cut_ns is not None:
            await _until(loop, due(answer.start, answer.cut_ns, speed) + shift)
            request.protocol.force_close()
            return response
        # Every byte is out: a client that leaves from here on got the whole answer, as
        # the recorder counts one that leaves after the last (an OpenAI client leaves as
        # it reads [DONE], before the body's end).
        sent_all = True
        if answer.end_ns is not None:
            await _until(loop, due(answer.start, answer.end_ns, speed) + shift)
        await response.write_eof()
        served.finished = True
        return response
    except ConnectionError:
        # The client left (it stopped reading, as clients do): the answer ends here, which
        # is no error of the server's.
        _left(request.app, served, sent_all)
        return response
    except asyncio.CancelledError:
        _left(request.app, served, sent_all)
        raise
    finally:
        if outbox is not None:
            outbox.streams -= 1


async def _mingled_to_end(
    request: web.Request,
    response: web.StreamResponse,
    answer: Answer,
    served: Served,
    speed: float,
    shift: float,
) -> bool:
    """Past its own chunks, a stream sends what it is given until its recorded end (or
    break), and on while more may come; held open, until its client leaves. False: the
    client left."""
    assert answer.joined is not None
    end_ns = answer.cut_ns if answer.cut_ns is not None else answer.end_ns
    until = None if answer.hold else due(answer.start, end_ns or 0, speed) + shift
    return await _mingle(request, response, answer.joined, served, until, stay=True)


async def _mingle(
    request: web.Request,
    response: web.StreamResponse,
    joined: Joined,
    served: Served,
    until: float | None,
    stay: bool = False,
) -> bool:
    """Send ``outbox``'s messages as they come due until ``until`` (None: for as long as
    the client stays), and past it while more may come (``stay``). False: the client left."""
    loop = asyncio.get_running_loop()
    outbox = joined.outbox
    while True:
        now = loop.time()
        for message in outbox.take(now):
            served.body.append((0, message.data))  # (its offset counts for nothing: bytes are compared)
            await response.write(message.data)
            message.out.set()
            if message.carried_by != joined.origin:
                served.because(
                    Divergence.REWRITE,
                    f"{message.label}, recorded on {message.carried_by}, sent with its call",
                )
            served.bytes_sent += len(message.data)
            served.late_s.append(now - message.when)
        if until is not None and now >= until and not (stay and joined.staying()):
            return True
        if (transport := request.transport) is None or transport.is_closing():
            return False
        first = outbox.first_due()
        if first is not None and first <= loop.time():
            continue  # put while it wrote
        wake = [t for t in (first, until) if t is not None and t > now]
        await outbox.wait(min([*wake, now + GONE_POLL_S]) - loop.time())


def _event_ends(pieces: Chunks) -> set[int]:
    """Where a message may go in between a stream's own: its start, and each whole event's end."""
    return {0, *(e.end for e in events_in(pieces) if e.complete)}


def _left(app: web.Application, served: Served, sent_all: bool) -> None:
    """The answer ends as its client leaves: finished if every byte had gone out."""
    if sent_all and not app[STOPPING].now:
        served.finished = True
    else:
        cut_short(app, served)


def _size(chunks: Chunks) -> int:
    return sum(len(data) for _, data in chunks)


def _broken_framing(headers: CIMultiDict[str], answer: Answer, edited: Chunks, break_at: int) -> None:
    """The framing of a body a fault breaks off at byte ``break_at``: a length longer than
    what the client gets, a broken transfer (as when a real connection drops), the body's
    without faults or, if longer, the edited one's (no-final;drop-after=4 keeps the length
    with the closing event). Broken off after the last byte of both, a length would make it
    a clean end: it goes out without one (chunked), whose end then never comes."""
    length = max(_size(answer.chunks), _size(edited))
    if break_at < length:
        headers["Content-Length"] = str(length)
    else:
        headers.popall("Content-Length")


def _cut(chunks: Chunks, marks: list[int]) -> Chunks:
    """The chunks, cut at each byte of ``marks`` (a piece then starts at every mark)."""
    out: Chunks = []
    rest, done = chunks, 0
    for mark in marks:
        before, rest = split_at(rest, mark - done)
        out += before
        done = mark
    return out + rest


class _Drip:
    """A byte rate: when the next piece may go."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.size = max(1, int(rate * DRIP_SLICE_S))
        self._free_at: float | None = None

    def slices(self, data: bytes) -> Iterator[bytes]:
        view = memoryview(data)
        for i in range(0, len(data), self.size):
            yield bytes(view[i : i + self.size])

    def next_at(self, now: float) -> float:
        return now if self._free_at is None else self._free_at

    def sent(self, n: int, now: float) -> None:
        self._free_at = max(now, self._free_at or now) + n / self.rate


async def _break(request: web.Request, how: FaultName) -> None:
    """End the connection mid-answer: a close (FIN) without the body's end, or a reset."""
    if how is not FaultName.RESET_AFTER:
        request.protocol.force_close()
        return
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    # A reset throws away what the kernel has not sent yet: let every byte reach the
    # client first, so it gets exactly the events before the reset.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_TIMEOUT_S
    while loop.time() < deadline and (transport.get_write_buffer_size() or _unsent(sock)):
        await asyncio.sleep(0.002)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _unsent(sock: Any) -> int:
    """Bytes the kernel holds that the peer has not acknowledged yet (0 where unknown)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (OSError, AttributeError):
        return 0


async def _until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    delay = when - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def _until_gone(request: web.Request) -> None:
    """Until the client has closed the connection (or the server stops)."""
    while (transport := request.transport) is not None and not transport.is_closing():
        await asyncio.sleep(0.05)
