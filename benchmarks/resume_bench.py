"""How soon ``tasktape record --resume`` answers a client that reconnects with Last-Event-ID,
side by side with how soon the same request, fresh, is answered when ``tasktape record``
forwards it to the agent (and when the agent gets it directly), each in its own process, on
loopback.

The agent (``upstream_main``) streams a burst of 200-byte events, then keeps the stream open:
a held stream that is still live. A client reads the whole burst through the gateway (so it
knows every id) and drops; then, over many rounds, it reconnects with the Last-Event-ID of an
event it had, and times the reconnect from sending its request (on a connection already open)
to the first byte of the first resumed event, then reads the events it is owed, checks them
(their number, the first one's id, and for JSON-RPC the id they answer) and drops again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from .harness import Section
from .proxy_bench import free_port, process

EVENT_SIZE = 200
BACKLOGS = (10, 1_000, 10_000)  # events held by the stream a client reconnects to
ROUNDS, QUICK_ROUNDS = 100, 15
WARM_UP = 2  # rounds, not counted
# How a benchmark process starts: python -c BENCH.format("upstream_main") ARGS...
BENCH = "import sys; from benchmarks.resume_bench import {0}; {0}(*sys.argv[1:])"
AIM_MS = 5.0  # a resume is answered within this (plus the log read, once there is one)
WITHIN = f"within {AIM_MS:g} ms"
RECORD, RESUMING, DIRECT = "tasktape record", "tasktape record --resume", "direct"


# -- the agent -----------------------------------------------------------------------------


def upstream_main(port: int) -> None:
    """An SSE agent. POST /stream?n=N: N events of EVENT_SIZE bytes without ids, as fast as
    they go; POST /jsonrpc?n=N: the same as JSON-RPC responses to the request's id. With
    ``open=1`` the stream then stays open, with nothing more, until the connection closes.
    GET /idle answers once no stream is sending its events."""

    bursts = [0]  # streams still sending their events
    idle = asyncio.Event()
    idle.set()

    def count(change: int) -> None:
        bursts[0] += change
        if bursts[0]:
            idle.clear()
        else:
            idle.set()

    async def stream(request: web.Request) -> web.StreamResponse:
        count(+1)
        try:
            return await send(request)
        finally:
            count(-1)

    async def wait_idle(request: web.Request) -> web.Response:
        await idle.wait()
        return web.Response(text="idle")

    async def send(request: web.Request) -> web.StreamResponse:
        n = int(request.query["n"])
        body = await request.read()
        rpc = request.path == "/jsonrpc"
        rpc_id = json.dumps(json.loads(body)["id"]) if rpc else None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(n):
            if rpc:
                head, tail = f'data: {{"jsonrpc":"2.0","id":{rpc_id},"result":{{"n":{i},"pad":"', '"}}\n\n'
            else:
                head, tail = f'data: {{"n":{i},"pad":"', '"}\n\n'
            await response.write((head + "x" * (EVENT_SIZE - len(head) - len(tail)) + tail).encode())
        if request.query.get("open") == "1":
            count(-1)  # sent: the stream stays open, idle, until its connection closes
            try:
                await asyncio.Event().wait()
            finally:
                count(+1)
        return response

    app = web.Application()
    app.router.add_post("/stream", stream)
    app.router.add_post("/jsonrpc", stream)
    app.router.add_get("/idle", wait_idle)
    web.run_app(
        app,
        host="127.0.0.1",
        port=port,
        print=lambda *_: print("ready", flush=True),
        handler_cancellation=True,
        access_log=None,
    )


# -- the client: plain sockets, so that what it adds to each figure is a recv() ----------------


@dataclass
class Answer:
    status: int
    first_byte: float  # seconds from sending the request to the first byte of the body
    events: list[bytes]  # the events read, whole (each ending in its blank line)


class ProtocolError(RuntimeError):
    pass


def ask(
    port: int, path: str, body: bytes, *, events: int, last_id: str | None = None, to_end: bool = False
) -> Answer:
    """POST ``body`` to ``path`` on a new connection, opened before the clock starts; read
    until ``events`` whole events have come (``to_end``: until the body ends), then drop
    the connection."""
    extra = f"Last-Event-ID: {last_id}\r\n" if last_id is not None else ""
    request = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray()
        start = time.perf_counter()
        sock.sendall(request)
        while (head_end := buf.find(b"\r\n\r\n")) < 0:
            buf += _recv(sock)
        head = bytes(buf[:head_end]).decode("latin-1").lower()
        status = int(head.split(None, 2)[1])
        if status != 200:
            return Answer(status, time.perf_counter() - start, [])
        if "transfer-encoding: chunked" not in head:
            raise ProtocolError(f"expected a chunked body: {head!r}")
        pos = head_end + 4
        # The first byte of the body: past the first chunk's size line, a byte of data.
        while (line_end := buf.find(b"\r\n", pos)) < 0 or len(buf) <= line_end + 2:
            buf += _recv(sock)
        first_byte = time.perf_counter() - start
        if int(buf[pos:line_end], 16) == 0:
            raise ProtocolError("the body ended before any event")
        body_bytes = bytearray()
        while to_end or body_bytes.count(b"\n\n") < events:
            while (line_end := buf.find(b"\r\n", pos)) < 0:
                buf += _recv(sock)
            size = int(buf[pos:line_end], 16)
            if size == 0:
                break
            while len(buf) < line_end + 2 + size + 2:
                buf += _recv(sock)
            body_bytes += buf[line_end + 2 : line_end + 2 + size]
            pos = line_end + 2 + size + 2
        whole = bytes(body_bytes).split(b"\n\n")
        return Answer(status, first_byte, [e + b"\n\n" for e in whole[:-1]])


def _recv(sock: socket.socket) -> bytes:
    data = sock.recv(1 << 20)
    if not data:
        raise ProtocolError("the connection closed mid-answer")
    return data


def event_id(event: bytes) -> str | None:
    for line in event.split(b"\n"):
        if line.startswith(b"id:"):
            return line[3:].strip().decode()
    return None


def event_data(event: bytes) -> dict:
    (line,) = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    return json.loads(line[5:])


# -- the held streams and the cells measured --------------------------------------------------


@dataclass
class Kind:
    reconnect: str  # what its rows call a reconnect
    path: str

    def body(self, rpc_id: object) -> bytes:
        if self.path == "/jsonrpc":
            return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": "SendStreamingMessage"}).encode()
        return b"{}"


REST = Kind("reconnect", "/stream")
JSONRPC = Kind("JSON-RPC reconnect under a new id", "/jsonrpc")
FRESH = "fresh request, the stream's first again"


@dataclass
class Held:
    """A stream the gateway holds: the ids of its events, as its first client got them."""

    kind: Kind
    backlog: int
    ids: list[str]

    @property
    def target(self) -> str:
        return f"{self.kind.path}?n={self.backlog}&open=1"


def open_held(port: int, kind: Kind, backlog: int) -> Held:
    """A client reads a whole burst through the gateway, then drops: the stream stays held."""
    answer = ask(port, f"{kind.path}?n={backlog}&open=1", kind.body(1), events=backlog)
    ids = [event_id(e) for e in answer.events]
    if answer.status != 200 or len(ids) != backlog or None in ids or len(set(ids)) != backlog:
        raise RuntimeError(f"the gateway's stream of {backlog} events came with ids {ids[:3]}...")
    return Held(kind, backlog, ids)  # type: ignore[arg-type]


def resume(port: int, held: Held, missed: int, round_: int) -> float:
    """Reconnect after the event ``missed`` before the newest; check what comes; the
    seconds to its first byte."""
    after = held.backlog - 1 - missed
    rpc_id = f"again-{round_}"  # a JSON-RPC client's reconnect is a request of its own
    answer = ask(port, held.target, held.kind.body(rpc_id), events=missed, last_id=held.ids[after])
    ids = [event_id(e) for e in answer.events]
    if answer.status != 200 or ids != held.ids[after + 1 :]:
        raise RuntimeError(f"a reconnect after {held.ids[after]!r} was answered {answer.status} {ids[:3]}")
    if held.kind is JSONRPC and {event_data(e)["id"] for e in answer.events} != {rpc_id}:
        raise RuntimeError("a JSON-RPC reconnect was answered under another id")
    return answer.first_byte


def fresh(port: int, held: Held) -> float:
    """The same request, without Last-Event-ID: the seconds to its first event's first byte."""
    answer = ask(port, held.target, held.kind.body(1), events=1)
    data = event_data(answer.events[0]) if answer.status == 200 else {}
    if data.get("result", data).get("n") != 0:
        raise RuntimeError(f"a fresh request was answered {answer.status} {answer.events[:1]}")
    return answer.first_byte


def agent_idle(port: int) -> None:
    """Wait until the agent sends no stream's events (a fresh request's burst, cut short)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /idle HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while sock.recv(4096):
            pass


def ended_exchanges(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT count(*) FROM exchanges WHERE outcome IS NOT NULL").fetchone()[0]


def caught_up(db: Path, expected: int, timeout: float = 60.0) -> None:
    """Wait until the log has ended ``expected`` exchanges (so its writer is idle again)."""
    deadline = time.monotonic() + timeout
    while ended_exchanges(db) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{db}: the log never ended {expected} exchanges")
        time.sleep(0.005)


@contextlib.contextmanager
def recorders(tmp: Path) -> Iterator[dict[str, tuple[int, Path | None]]]:
    """The agent, ``tasktape record`` and ``tasktape record --resume`` in front of it:
    each path's port and log."""
    with contextlib.ExitStack() as stack:
        port = free_port()
        stack.enter_context(
            process([sys.executable, "-c", BENCH.format("upstream_main"), str(port)], "ready")
        )
        upstream = f"http://127.0.0.1:{port}"
        paths: dict[str, tuple[int, Path | None]] = {DIRECT: (port, None)}
        for name, extra in ((RECORD, []), (RESUMING, ["--resume"])):
            port, db = free_port(), tmp / f"{len(paths)}.db"
            args = ["record", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(db)]
            stack.enter_context(
                process([sys.executable, "-m", "tasktape", *args, "--quiet", *extra], "listening on")
            )
            paths[name] = (port, db)
        yield paths


def run(quick: bool) -> list[Section]:
    rounds = QUICK_ROUNDS if quick else ROUNDS
    samples: dict[tuple[int, str, str], list[float]] = {}  # (events held, request, path): seconds
    with tempfile.TemporaryDirectory() as folder, recorders(Path(folder)) as paths:
        gateway, gateway_db = paths[RESUMING]
        record, record_db = paths[RECORD]
        direct = paths[DIRECT][0]
        assert gateway_db is not None and record_db is not None
        held = [open_held(gateway, kind, b) for b in BACKLOGS for kind in (REST, JSONRPC)]
        resumes = forwarded = 0
        for round_ in range(-WARM_UP, rounds):
            for h in held:
                for missed in sorted({1, h.backlog - 1}):
                    agent_idle(direct)
                    caught_up(gateway_db, resumes)
                    seconds = resume(gateway, h, missed, round_)
                    resumes += 1
                    what = f"{h.kind.reconnect}, {'1 missed' if missed == 1 else 'all but the first missed'}"
                    if round_ >= 0:
                        samples.setdefault((h.backlog, what, RESUMING), []).append(seconds)
                if h.kind is not REST:
                    continue
                for name, port in ((RECORD, record), (DIRECT, direct)):
                    agent_idle(direct)
                    if name == RECORD:
                        caught_up(record_db, forwarded)
                        ask(record, "/stream?n=1", b"{}", events=1, to_end=True)  # a pooled connection
                        forwarded += 2
                    seconds = fresh(port, h)
                    if round_ >= 0:
                        samples.setdefault((h.backlog, FRESH, name), []).append(seconds)
    section = Section(
        "Resume: from a reconnect's request to the first byte of its first resumed event",
        ["request", "path", "events held", "events sent", "p50 ms", "p95 ms", "max ms", WITHIN],
    )
    p50: dict[tuple[int, str, str], float] = {}
    for (backlog, what, path), values in sorted(samples.items(), key=lambda item: item[0][0]):
        ms = sorted(v * 1000 for v in values)
        p95 = ms[min(len(ms) - 1, int(len(ms) * 0.95))]
        p50[backlog, what, path] = statistics.median(ms)
        sent = "1" if what.endswith("1 missed") else f"{backlog - 1:,}"
        sent = f"first of {backlog:,}" if what == FRESH else sent
        within = f"{sum(v <= AIM_MS for v in ms) / len(ms):.0%}" if path == RESUMING else "-"
        section.add(what, path, backlog, sent, p50[backlog, what, path], p95, ms[-1], within)
    section.notes.append(
        f"{rounds} requests per row, interleaved in rounds (after {WARM_UP} rounds of warm-up). The "
        f"agent streams {EVENT_SIZE}-byte events without ids as fast as they go, then keeps the stream "
        "open: each stream the gateway holds is still live. A client read each stream's events through "
        "the gateway and dropped; each reconnect (the same POST with Last-Event-ID, on a TCP connection "
        "opened before the clock starts) names an event it had, the newest but one (1 missed) or the "
        "first, and is answered from the held stream without reaching the agent. The clock stops at "
        "the first byte of the body, the first resumed event's; the client then reads and checks every "
        "event it is owed (their number, the first one's id, and for JSON-RPC that they answer the "
        "reconnect's own new id, which the gateway writes into each) before it drops. Before each "
        "request, the log writers have caught up with the ones before (the gateway logs a reconnect as "
        "an exchange of its own, what it sent as one chunk) and the agent sends nothing."
    )
    section.notes.append(
        f"{FRESH}: the stream's own first request again, without Last-Event-ID, to {RECORD} (forwarded "
        "to the agent over a pooled connection: a short request through it just before) and to the "
        "agent directly; the clock stops at its first event's first byte. This agent answers at once: "
        "a real agent's first event comes after its own thinking, which is not counted here."
    )
    figures = []
    for backlog in BACKLOGS:
        one = p50[backlog, f"{REST.reconnect}, 1 missed", RESUMING]
        every = p50[backlog, f"{REST.reconnect}, all but the first missed", RESUMING]
        figures.append(
            f"{backlog:,} held: {one:.2f} ms for 1 missed, {every:.2f} ms for {backlog - 1:,}, "
            f"against {p50[backlog, FRESH, RECORD]:.2f} ms for a fresh request through {RECORD}"
        )
    section.notes.append("p50s: " + "; ".join(figures) + ".")
    return [section]


if __name__ == "__main__":
    for section in run("--quick" in sys.argv):
        print(section.markdown())
