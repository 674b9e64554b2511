"""A TCP relay on loopback that cuts connections: put between two HTTP peers (a recorder and
its agent, a browser and a recorder), it passes bytes both ways and, as its plan says, cuts
a response after some number of its bytes, abruptly (an RST) or with a FIN mid-body.

Each request on a connection (kept-alive connections carry several) is seen by its request
line, and the plan is asked about it once, when its response starts (the request has gone
through by then, body and all): ``plan(request, rng)`` returns a :class:`Cut` or None. The
``rng`` is the cutter's own, seeded: the same requests in the same order get the same cuts.
The response's bytes are counted from its first byte (its status line), or from the end of
the ``nth`` occurrence of ``marker`` in them (the first event's end, say), so that a cut
can be placed after something has surely passed.

    async with Cutter(agent_url, plan=cut_streams(max_cuts=2), seed=7) as cutter:
        ...  # send requests to cutter.url
    cutter.requests  # every request seen, with its cut (if any) and the bytes passed back
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from yarl import URL

KEEP = 64 * 1024  # bytes of each request kept for the test to look at
# A request line, wherever it starts: a request after one whose body has a Content-Length
# follows its last byte directly.
_REQUEST_LINE = re.compile(rb"((?:GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS) /\S* HTTP/1\.[01])\r\n")
_READ = 64 * 1024


@dataclass(frozen=True)
class Cut:
    """Where to cut a response: ``after`` bytes (from its start, or from the end of the
    ``nth`` ``marker`` in it, or of the first ``then`` after that), then ``how``: ``"rst"``
    (SO_LINGER 0: a reset) or ``"close"`` (a FIN, the body unfinished); or ``"pause"``: the
    rest of the response passes ``pause`` seconds later, so that the peer reads what came
    before the point apart from what follows it (a line end split across two reads)."""

    after: int
    how: str = "rst"
    marker: bytes | None = None
    nth: int = 1
    then: bytes | None = None  # and then from the end of this, the first after the marker
    pause: float = 0.0  # how="pause": no cut, the rest passes on this many seconds later


@dataclass
class Relayed:
    """One request that went through, and what came back for it."""

    line: str  # "POST /message:stream HTTP/1.1"
    data: bytearray = field(default_factory=bytearray)  # its bytes (head and body), the first KEEP
    cut: Cut | None = None  # what the plan said
    passed: int = 0  # response bytes passed back
    cut_at: int | None = None  # response bytes passed when it was cut; None: never cut

    @property
    def method(self) -> str:
        return self.line.split(" ", 1)[0]

    @property
    def path(self) -> str:
        return self.line.split(" ")[1]


Plan = Callable[[Relayed, random.Random], Cut | None]


class Cutter:
    """The relay: ``url`` stands for ``target``; ``requests`` lists what went through."""

    def __init__(self, target: str, plan: Plan | None = None, *, seed: int = 0) -> None:
        url = URL(target)
        assert url.host and url.port, target
        self.target = (url.host, url.port)
        self.plan = plan
        self.rng = random.Random(seed)
        self.requests: list[Relayed] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> Cutter:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # each link's reads end, and the link with them
        links = list(self._links)
        if links:
            _, stuck = await asyncio.wait(links, timeout=5)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> Cutter:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def cuts(self) -> list[Relayed]:
        """The requests whose response was cut (paused ones are not)."""
        return [
            r for r in self.requests if r.cut_at is not None and r.cut is not None and r.cut.how != "pause"
        ]

    def count(self, line_start: str, body: bytes | None = None) -> int:
        """How many requests whose line starts with ``line_start`` (and whose bytes hold ``body``)."""
        return sum(
            1 for r in self.requests if r.line.startswith(line_start) and (body is None or body in r.data)
        )

    async def _link(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        self._writers.add(client_writer)
        try:
            try:
                target_reader, target_writer = await asyncio.open_connection(*self.target)
            except OSError:
                client_writer.transport.abort()
                return
            self._writers.add(target_writer)
            link = _Link(self, client_writer, target_writer)
            try:
                await asyncio.gather(
                    link.requests(client_reader), link.responses(target_reader), return_exceptions=True
                )
            finally:
                for writer in (client_writer, target_writer):
                    writer.transport.abort()
                    self._writers.discard(writer)
        finally:
            self._writers.discard(client_writer)
            self._links.discard(task)


class _Link:
    """One connection through the cutter: requests one way, responses the other."""

    def __init__(self, cutter: Cutter, client: asyncio.StreamWriter, target: asyncio.StreamWriter) -> None:
        self.cutter = cutter
        self.client = client
        self.target = target
        self.current: Relayed | None = None
        self.cut_point: int | None = None  # response bytes after which to cut (None: not yet known)
        self.planned = False  # whether the plan was asked about the current request
        self.rest = b""  # bytes held back by a pause
        self.seen = bytearray()  # the current response's bytes so far, while looking for a marker
        # The end of the request bytes so far, where a request line may begin (a CRLF
        # stands before the connection's first request).
        self._pending = b"\r\n"
        self.done = False

    async def requests(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(_READ):
                self._note_request_bytes(data)
                self.target.write(data)
                await self.target.drain()
            if not self.done and self.target.can_write_eof():
                self.target.write_eof()
        except (ConnectionError, OSError):
            self._end()

    async def responses(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(_READ):
                if self.done:
                    return
                data, cut = self._allowed(data)
                if cut is not None and cut.how == "pause":
                    self.client.write(data)
                    await self.client.drain()
                    await asyncio.sleep(cut.pause)
                    data, cut, self.rest = self.rest, None, b""
                if data:
                    self.client.write(data)
                    await self.client.drain()
                if cut is not None:
                    await self._cut(cut)
                    return
            if not self.done:
                self.client.close()
                await self.client.wait_closed()
        except (ConnectionError, OSError):
            self._end()

    def _note_request_bytes(self, data: bytes) -> None:
        before = self._pending
        text = before + data
        at = len(before)  # where this chunk's bytes start in text
        for found in _REQUEST_LINE.finditer(text):
            if found.end() <= len(before):
                continue  # seen with the bytes before
            start = max(found.start(1), len(before))
            self._keep(text[at:start])
            at = start
            relayed = Relayed(found.group(1).decode("latin-1"))
            self.cutter.requests.append(relayed)
            self.current, self.planned, self.cut_point, self.seen = relayed, False, None, bytearray()
            if found.start(1) < len(before):  # its line began in the bytes before
                relayed.data += before[found.start(1) :]
        self._keep(text[at:])
        self._pending = text[-512:]

    def _keep(self, data: bytes) -> None:
        if self.current is not None and data:
            room = KEEP - len(self.current.data)
            self.current.data += data[: max(room, 0)]

    def _allowed(self, data: bytes) -> tuple[bytes, Cut | None]:
        """The part of these response bytes to pass on, and the cut to make after it."""
        relayed = self.current
        if relayed is not None and not self.planned:
            # Asked on the response's first bytes: the request (line, head, body) has gone through.
            self.planned = True
            plan = self.cutter.plan
            relayed.cut = plan(relayed, self.cutter.rng) if plan is not None else None
            if relayed.cut is not None and relayed.cut.marker is None:
                self.cut_point = relayed.cut.after
        if relayed is None or relayed.cut is None or relayed.cut_at is not None:
            if relayed is not None:
                relayed.passed += len(data)
            return data, None
        cut = relayed.cut
        if self.cut_point is None:  # counting from a marker not seen yet
            assert cut.marker is not None
            self.seen += data
            at = -1
            for _ in range(cut.nth):
                at = self.seen.find(cut.marker, at + 1)
                if at < 0:
                    break
            if at >= 0:
                at += len(cut.marker)
                if cut.then is not None:
                    then = self.seen.find(cut.then, at)
                    at = -1 if then < 0 else then + len(cut.then)
            if at >= 0:
                self.cut_point = at + cut.after  # seen holds the response from its start
                self.seen = bytearray()
        if self.cut_point is not None and relayed.passed + len(data) > self.cut_point:
            # Bytes past the cut point came: pass those before it, then cut. (A response that
            # ends at or before the point is never cut: an idle connection is not broken.)
            keep = data[: max(self.cut_point - relayed.passed, 0)]
            relayed.passed += len(keep)
            relayed.cut_at = relayed.passed
            if cut.how == "pause":  # the rest goes on after the pause
                self.rest = data[len(keep) :]
                relayed.passed += len(self.rest)
            return keep, cut
        relayed.passed += len(data)
        return data, None

    async def _cut(self, cut: Cut) -> None:
        self.done = True
        if cut.how == "rst":
            sock = self.client.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.client.transport.abort()
        else:
            self.client.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.client.wait_closed()
        self.target.transport.abort()

    def _end(self) -> None:
        self.done = True
        self.client.transport.abort()
        self.target.transport.abort()


def cut_streams(
    *,
    max_cuts: int,
    paths: tuple[str, ...] = (":stream", ":subscribe", "/jsonrpc"),
    longest: int = 4000,
    first_after_marker: bytes | None = None,
    first_nth: int = 1,
    chance: float = 1.0,
) -> Plan:
    """A plan: cut up to ``max_cuts`` responses to requests whose path ends with one of
    ``paths`` (or, with ``"/"`` among them, is ``/``), each after a random number of bytes up
    to ``longest``, by RST or FIN at random, each with probability ``chance``. The first
    request's cut counts from ``first_after_marker`` (its ``first_nth`` occurrence)."""
    made = 0
    asked = 0

    def plan(request: Relayed, rng: random.Random) -> Cut | None:
        nonlocal made, asked
        if not any(request.path.endswith(p) or (p == "/" and request.path == "/") for p in paths):
            return None
        first = asked == 0
        asked += 1
        if made >= max_cuts or rng.random() >= chance:
            return None
        made += 1
        how = rng.choice(("rst", "close"))
        if first and first_after_marker is not None:
            return Cut(rng.randint(0, longest), how, first_after_marker, first_nth)
        return Cut(rng.randint(0, longest), how)

    return plan
