"""The resume gateway's promise, checked with real peers and real broken connections:
every event the agent produced reaches the client once, in order, with its bytes as the
agent sent them (an ``id:`` line added where it had none; a JSON-RPC answer carrying the
reconnecting request's id), however often and wherever the client's connection and the
agent's connection break; and the agent is asked to start one task, never two.

The peers: the official a2a-sdk agent (no event ids) and ``tasktape agent`` (ids of its
own, Last-Event-ID not read), on both bindings. The client: httpx with httpx-sse, dropping
after a random number of events or of bytes (mid-event too) and coming back with the last
id it saw, by the same request again or by ``tasks/{id}:subscribe``. The agent's connections
go through ``cutter.Cutter``, which cuts them (RST or FIN) after a random number of bytes.

The truth is the log: the agent's stream as the recorder received it (``exchanges`` and
``chunks``), and for ``tasktape agent`` also the agent's own list of the events it emitted.
Each run's seed comes from BASE_SEED and is in every assertion message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from conftest import RecordFactory, Recording, Serve
from cutter import Cut, Cutter, Relayed, cut_streams
from httpx_sse import EventSource
from sdk_agent import SdkAgent, run_sdk_agent

from tasktape.agent import create_agent_app
from tasktape.agent.app import STORE, _for_rest  # the agent's REST rendering of a frame
from tasktape.agent.tasks import TaskRun, TaskStore
from tasktape.proxy.credentials import stream_key

BASE_SEED = 20261201
SEEDS = range(4)  # runs of each random test (seeds from BASE_SEED)
STRESS_RUNS = 25  # seeds per run with --stress
HOLD = 30.0
REJOIN_FOR = 30.0
A2A = {"A2A-Version": "1.0"}
STATES = ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
MAX_LEGS = 40  # connections a client makes before it gives up
STALLED = 6  # connections in a row without a new event, and it gives up


def seed_of(test: int, n: int) -> int:
    return BASE_SEED + 1000 * test + n


# -- SSE, read independently of the recorder's decoder ------------------------------------------------

_LINE_END = re.compile(rb"\r\n|\n|\r")


@dataclass(frozen=True)
class Block:
    """One event's bytes through its blank line, and the fields that matter here."""

    raw: bytes
    id: str | None  # its own id line's value (None: it has none)
    data: str | None  # its data lines joined (None: no data field)

    def frame(self) -> Any:
        return json.loads(self.data or "null")

    def short(self) -> str:
        """The event in a few words: its id, kind, and the state or text it carries."""
        try:
            frame = self.frame()
        except ValueError:
            return f"{self.id}: {(self.data or '')[:60]!r}"
        if isinstance(frame, dict) and "result" in frame:
            frame = frame["result"]
        if not isinstance(frame, dict) or not frame:
            return f"{self.id}: {(self.data or '')[:60]!r}"
        kind, body = next(iter(frame.items()))
        if kind == "artifactUpdate":
            sign = "+" if body.get("append") else "="
            last = " lastChunk" if body.get("lastChunk") else ""
            artifact = body["artifact"]
            return f"{self.id}: artifact {artifact['artifactId'][-6:]} {sign}{text_of(artifact)!r}{last}"
        if kind in ("statusUpdate", "task"):
            return f"{self.id}: {kind} {body['status']['state'].removeprefix('TASK_STATE_')}"
        return f"{self.id}: {kind}"


def split(raw: bytes) -> tuple[list[Block], bytes]:
    """The complete events in ``raw``, and the bytes after the last (an event cut off). A CR
    at the very end may be half a CRLF: its line is not complete yet."""
    blocks: list[Block] = []
    start = line_start = 0
    event_id: str | None = None
    data: list[str] | None = None
    for found in _LINE_END.finditer(raw):
        if found.group() == b"\r" and found.end() == len(raw):
            break
        line = raw[line_start : found.start()]
        line_start = found.end()
        if not line:
            blocks.append(Block(raw[start:line_start], event_id, None if data is None else "\n".join(data)))
            start, event_id, data = line_start, None, None
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        value = value.removeprefix(b" ")
        if name == b"id":
            event_id = value.decode()
        elif name == b"data":
            data = [*(data or []), value.decode()]
    return blocks, raw[start:]


def with_id(raw: bytes, event_id: str) -> bytes:
    """An event's bytes with an id line last in its block, in the blank line's line end."""
    end = b"\r\n" if raw.endswith(b"\r\n") else raw[-1:]
    return raw[: -len(end)] + f"id: {event_id}".encode() + end + end


def without_last_id(raw: bytes) -> bytes | None:
    """The event's bytes without an id line that is last in its block (None: there is none)."""
    found = re.search(rb"(\r\n|\n|\r)id: [^\r\n]*(\r\n|\n|\r)(\r\n|\n|\r)\Z", raw)
    if found is None:
        return None
    return raw[: found.start()] + found.group(1) + found.group(3)


def member_span(text: str, key: str) -> tuple[int, int] | None:
    """Where the value of ``key`` of the JSON object ``text`` is (its top level only)."""
    decoder, space = json.JSONDecoder(), re.compile(r"\s*")
    at = space.match(text, 0).end()  # type: ignore[union-attr]
    if text[at : at + 1] != "{":
        return None
    at += 1
    while True:
        at = space.match(text, at).end()  # type: ignore[union-attr]
        if text[at] == "}":
            return None
        name, at = decoder.raw_decode(text, at)
        at = space.match(text, at).end() + 1  # type: ignore[union-attr]  # past the colon
        at = space.match(text, at).end()  # type: ignore[union-attr]
        _, end = decoder.raw_decode(text, at)
        if name == key:
            return at, end
        at = space.match(text, end).end()  # type: ignore[union-attr]
        if text[at] == ",":
            at += 1


def with_rpc_id(block: Block, rpc_id: Any) -> Block:
    """The event with the top-level id of its JSON-RPC frame set to ``rpc_id`` (written as
    compact JSON), every other byte as it was."""
    text = block.raw.decode()
    data_at = re.search(r"(?m)^data: ?", text)
    assert data_at is not None, block.raw
    line_end = re.compile(r"\r\n|\n|\r").search(text, data_at.end())
    assert line_end is not None
    data = text[data_at.end() : line_end.start()]
    span = member_span(data, "id")
    assert span is not None, f"a JSON-RPC event without an id: {block.raw!r}"
    data = data[: span[0]] + json.dumps(rpc_id) + data[span[1] :]
    return Block((text[: data_at.end()] + data + text[line_end.start() :]).encode(), block.id, data)


# -- the peers ----------------------------------------------------------------------------------------


@dataclass
class Peer:
    """An agent behind the gateway, and how to talk to it."""

    kind: str  # "sdk" or "tasktape"
    url: str
    rpc_path: str
    text: str  # the message that starts a task streaming at a useful pace
    store: TaskStore | None = None  # tasktape agent's tasks, in process

    def task(self, task_id: str) -> Any:
        """The agent's task as it is now, asked directly (not through the gateway)."""
        response = httpx.get(f"{self.url}/tasks/{task_id}", headers=A2A, timeout=10)
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def sdk_agent() -> Any:
    with run_sdk_agent() as running:
        yield running


PeerFactory = Callable[[str], Any]


@pytest.fixture
def peer(sdk_agent: SdkAgent, serve: Serve) -> PeerFactory:
    """``await peer("sdk" | "tasktape", pace=...)``: the agent, running."""

    async def start(kind: str, pace: float = 0.2) -> Peer:
        if kind == "sdk":
            return Peer("sdk", sdk_agent.url, "/", "slow hello")
        app = create_agent_app(pace=pace)
        return Peer("tasktape", await serve(app), "/jsonrpc", "What does J45.909 mean?", app[STORE])

    return start


# -- the client ---------------------------------------------------------------------------------------


class ClientDrop(Exception):
    """The client lets go of the connection (after so many bytes)."""


@dataclass
class Tap:
    """What a connection received, and when the client lets go: after ``budget`` bytes
    (counted from the end of the first event, with ``from_first``)."""

    budget: int | None
    from_first: bool = False
    raw: bytearray = field(default_factory=bytearray)
    _cut_at: int | None = None

    def take(self, chunk: bytes) -> tuple[bytes, bool]:
        if self.budget is None:
            self.raw += chunk
            return chunk, False
        if self._cut_at is None:
            if not self.from_first:
                self._cut_at = self.budget
            else:
                blocks, _ = split(bytes(self.raw + chunk))
                if blocks:
                    self._cut_at = len(blocks[0].raw) + self.budget
        if self._cut_at is not None and len(self.raw) + len(chunk) > self._cut_at:
            chunk = chunk[: self._cut_at - len(self.raw)]
            self.raw += chunk
            return chunk, True
        self.raw += chunk
        return chunk, False


class _TappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, tap: Tap) -> None:
        self.inner, self.tap = inner, tap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            part, cut = self.tap.take(chunk)
            if part:
                yield part
            if cut:
                raise ClientDrop(f"the client let go after {len(self.tap.raw)} bytes")

    async def aclose(self) -> None:
        await self.inner.aclose()


class TappingTransport(httpx.AsyncBaseTransport):
    """httpx's own transport; a response whose request names a Tap goes through it."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=None))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        tap = request.extensions.get("tasktape.tap")
        if tap is not None:
            response.stream = _TappedStream(response.stream, tap)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def http_client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=TappingTransport(), timeout=httpx.Timeout(60.0)) as client:
        yield client


@dataclass
class Leg:
    """One connection of a client."""

    request: str  # "POST /message:stream", "GET /tasks/…:subscribe", "POST /jsonrpc SubscribeToTask"
    last_event_id: str | None
    rpc_id: Any  # the JSON-RPC id it asked with (None on REST)
    drop: str  # what the client meant to do: "" (read to the end), "events 3", "bytes 812"
    status: int | None = None
    raw: bytes = b""
    events: list[Block] = field(default_factory=list)  # the events the client took from it
    end: str = ""  # "complete", "dropped: ...", "broken: ..." (the server's side ended it)


@dataclass
class Received:
    """Everything a client got, connection by connection."""

    seed: int
    binding: str
    legs: list[Leg] = field(default_factory=list)
    task_id: str | None = None
    ended: str = ""

    def events(self) -> list[Block]:
        """Every event the client took, across its connections, as the agent's frames say
        it (the first request's JSON-RPC id); each JSON-RPC event checked to carry its own
        request's id first."""
        out = []
        for leg in self.legs:
            for block in leg.events:
                if self.binding == "jsonrpc":
                    got = block.frame().get("id")
                    assert got == leg.rpc_id, (
                        f"seed {self.seed}: an answer to {leg.request} (id {leg.rpc_id!r}) carries id "
                        f"{got!r}: {block.short()}"
                    )
                    block = with_rpc_id(block, 1)  # noqa: PLW2901
                out.append(block)
        return out

    def story(self) -> str:
        lines = []
        for n, leg in enumerate(self.legs):
            lines.append(
                f"  leg {n}: {leg.request} Last-Event-ID={leg.last_event_id} plan=[{leg.drop}] "
                f"status={leg.status} bytes={len(leg.raw)} events={len(leg.events)} -> {leg.end}"
            )
            lines += [f"    {b.short()}" for b in leg.events]
        return "\n".join(lines)


class Client:
    """An httpx-sse client that drops at random and comes back with the last id it saw."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base: str,
        peer: Peer,
        binding: str,
        seed: int,
        *,
        drops: bool = True,
        max_drops: int = 5,
        longest: int = 3000,
        message_id: str = "m1",
    ) -> None:
        self.http, self.base, self.peer, self.binding = http, base, peer, binding
        self.rng = random.Random(seed)
        self.drops, self.max_drops, self.longest = drops, max_drops, longest
        self.message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": peer.text}]}
        self.received = Received(seed, binding)
        self.last_id: str | None = None

    def _plan(self, n: int) -> tuple[str, int | None]:
        dropped = sum(1 for leg in self.received.legs if leg.end.startswith("dropped"))
        if not self.drops or dropped >= self.max_drops or (n > 0 and self.rng.random() < 0.4):
            return "", None
        if self.rng.random() < 0.5:
            return "events", self.rng.randint(1, 6)
        return "bytes", self.rng.randint(0, self.longest)

    def _request(self, n: int) -> tuple[str, str, Any, Leg]:
        """Method, URL, JSON body and the leg's record for connection ``n``."""
        task_id = self.received.task_id
        how = "start" if n == 0 else self.rng.choice(("again", "subscribe"))
        if self.binding == "rest":
            if how == "subscribe":
                path = f"/tasks/{task_id}:subscribe"
                return "GET", self.base + path, None, Leg(f"GET {path}", self.last_id, None, "")
            body = {"message": self.message}
            return (
                "POST",
                self.base + "/message:stream",
                body,
                Leg("POST /message:stream", self.last_id, None, ""),
            )
        path = self.peer.rpc_path
        if how == "subscribe":
            rpc_id: Any = f"s{n}"
            body = {"jsonrpc": "2.0", "id": rpc_id, "method": "SubscribeToTask", "params": {"id": task_id}}
        else:
            rpc_id = 1 if how == "start" or self.rng.random() < 0.5 else f"r{n}"
            body = {
                "jsonrpc": "2.0",
                "id": rpc_id,
                "method": "SendStreamingMessage",
                "params": {"message": self.message},
            }
        return "POST", self.base + path, body, Leg(f"POST {path} {body['method']}", self.last_id, rpc_id, "")

    async def run(self) -> Received:
        received = self.received
        stalled = 0
        while len(received.legs) < MAX_LEGS:
            n = len(received.legs)
            method, url, body, leg = self._request(n)
            kind, amount = self._plan(n)
            leg.drop = f"{kind} {amount}" if kind else ""
            received.legs.append(leg)
            before = self.last_id
            await self._leg(method, url, body, leg, kind, amount, from_first=n == 0)
            if leg.status != 200:
                received.ended = f"status {leg.status}: {leg.raw[:300]!r}"
                return received
            if leg.end == "complete":
                received.ended = "complete"
                return received
            if self.last_id is None:
                received.ended = "no event id to resume from"
                return received
            stalled = stalled + 1 if self.last_id == before else 0
            if stalled >= STALLED:
                received.ended = f"gave up: {stalled} connections in a row brought no new event"
                return received
        received.ended = f"gave up after {MAX_LEGS} connections"
        return received

    async def _leg(
        self, method: str, url: str, body: Any, leg: Leg, kind: str, amount: int | None, *, from_first: bool
    ) -> None:
        tap = Tap(amount if kind == "bytes" else None, from_first=from_first)
        headers = {**A2A, **({"Last-Event-ID": leg.last_event_id} if leg.last_event_id else {})}
        dispatched = []
        try:
            async with self.http.stream(
                method, url, json=body, headers=headers, extensions={"tasktape.tap": tap}
            ) as response:
                leg.status = response.status_code
                if response.status_code != 200:
                    await response.aread()
                    leg.end = "refused"
                    leg.raw = bytes(tap.raw)
                    return
                try:
                    async for sse in EventSource(response).aiter_sse():
                        dispatched.append(sse)
                        if kind == "events" and len(dispatched) >= (amount or 0):
                            leg.end = f"dropped: after {len(dispatched)} events"
                            break
                    else:
                        leg.end = "complete"
                except ClientDrop as exc:
                    leg.end = f"dropped: {exc}"
                except httpx.HTTPError as exc:
                    leg.end = f"broken: {type(exc).__name__}: {exc}"
        except httpx.HTTPError as exc:
            leg.end = f"broken before an answer: {type(exc).__name__}: {exc}"
        leg.raw = bytes(tap.raw)
        blocks, _ = split(leg.raw)
        leg.events = blocks[: len(dispatched)]
        # httpx-sse and this module's reading agree on what the client took (httpx-sse gives
        # an event without an id line the last id before it: check() finds those).
        assert [(b.id or e.id, b.data) for b, e in zip(leg.events, dispatched, strict=True)] == [
            (e.id, e.data) for e in dispatched
        ], f"seed {self.received.seed}: httpx-sse dispatched {dispatched}, the bytes hold {blocks}"
        if dispatched:
            self.last_id = dispatched[-1].id  # what an httpx-sse client comes back with
            if self.received.task_id is None:
                frame = leg.events[0].frame()
                frame = frame.get("result", frame) if self.binding == "jsonrpc" else frame
                self.received.task_id = frame["task"]["id"]


# -- the truth ----------------------------------------------------------------------------------------


@dataclass
class Upstream:
    """One stream the recorder got from the agent, as its log holds it."""

    exchange_id: int
    path: str
    outcome: str
    blocks: list[Block]  # its complete events
    tail: bytes  # an event cut off at its end
    key: str  # in the recorder's ids of its events


@dataclass
class Truth:
    upstream: list[Upstream]  # the task's stream, then the recorder's subscribes to it
    reconnects: list[dict[str, Any]]  # the exchanges that answered a client's Last-Event-ID
    resumes: list[dict[str, Any]]  # the log's resumes rows for the task's streams
    agent_task: Any  # the agent's Task, asked directly
    agent_events: list[Block] | None  # tasktape agent: every event it emitted (first stream's bytes)


def _header(row: dict[str, Any], name: str) -> str | None:
    for key, value in json.loads(row["request_headers"] or "[]"):
        if key.lower() == name.lower():
            return value
    return None


async def truth(rec: Recording, peer: Peer, received: Received) -> Truth:
    """What the log and the agent say of the task a client followed."""
    task_id, binding = received.task_id, received.binding
    assert task_id is not None
    asked_after = {leg.last_event_id for leg in received.legs if leg.last_event_id is not None}
    await asyncio.wait_for(rec.proxy.wait_idle(), 60)
    with await rec.log() as log:
        tasks = {
            r["exchange_id"]
            for r in log.db.query("SELECT DISTINCT exchange_id FROM events WHERE task_id = ?", [task_id])
        }
        upstream, reconnects = [], []
        for x in log.exchanges():
            last_id = _header(x, "Last-Event-ID")
            if last_id is not None:
                if last_id in asked_after:
                    reconnects.append({**x, "body": log.body(x["id"])})
            elif x["is_sse"] and (x["task_id"] == task_id or x["id"] in tasks or task_id in x["path"]):
                blocks, tail = split(log.body(x["id"]))
                (uid,) = log.db.execute("SELECT uid FROM captures WHERE id = ?", [x["capture_id"]]).fetchone()
                key = stream_key(uid, x["id"])
                upstream.append(Upstream(x["id"], x["path"], x["outcome"], blocks, tail, key))
        ids = [u.exchange_id for u in upstream]
        resumes = []
        if "resumes" in log.db.table_names() and ids:
            marks = ",".join("?" * len(ids))
            resumes = list(
                log.db.query(f"SELECT * FROM resumes WHERE exchange_id IN ({marks}) ORDER BY id", ids)
            )
    agent_events = None
    if peer.store is not None:
        run = peer.store.get(task_id)
        assert run is not None
        agent_events = rendered(run, binding)
    return Truth(upstream, reconnects, resumes, await asyncio.to_thread(peer.task, task_id), agent_events)


def rendered(run: TaskRun, binding: str) -> list[Block]:
    """The events tasktape agent emitted for a task, as its first stream wrote them."""
    out = []
    for event_id, frame in run.events:
        shown = _for_rest(frame) if binding == "rest" else {"jsonrpc": "2.0", "id": 1, "result": frame}
        data = json.dumps(shown, separators=(",", ":"), ensure_ascii=False)
        (block,), _ = split(f"id: {event_id}\ndata: {data}\n\n".encode())
        out.append(block)
    return out


# -- the checks ---------------------------------------------------------------------------------------


def frame_of(block: Block, binding: str) -> dict[str, Any]:
    frame = block.frame()
    return frame.get("result", {}) if binding == "jsonrpc" else frame


def text_of(artifact: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in artifact.get("parts", []))


@dataclass
class Folded:
    """A task as a client's events build it."""

    states: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    short: list[str] = field(default_factory=list)  # artifacts whose deltas fell short of their last chunk


def fold(frames: list[dict[str, Any]]) -> Folded:
    task = Folded()
    for frame in frames:
        if "task" in frame:
            task.states.append(frame["task"]["status"]["state"])
            for artifact in frame["task"].get("artifacts", []):
                task.artifacts[artifact["artifactId"]] = text_of(artifact)
        elif "statusUpdate" in frame:
            task.states.append(frame["statusUpdate"]["status"]["state"])
        elif "artifactUpdate" in frame:
            update = frame["artifactUpdate"]
            artifact_id, text = update["artifact"]["artifactId"], text_of(update["artifact"])
            if update.get("append"):
                if artifact_id not in task.artifacts:
                    task.short.append(f"{artifact_id}: an append to an artifact never started")
                task.artifacts[artifact_id] = task.artifacts.get(artifact_id, "") + text
            else:
                so_far = task.artifacts.get(artifact_id)
                if update.get("lastChunk") and so_far is not None and so_far != text:
                    task.short.append(
                        f"{artifact_id}: the deltas made {so_far!r}, the last chunk says {text!r}"
                    )
                task.artifacts[artifact_id] = text
    return task


def check(received: Received, truth: Truth, binding: str, *, rejoins: bool) -> None:
    """Every invariant of one stream; a failure says the seed, what the client got and the truth."""
    seed = received.seed

    def fail(why: str) -> str:
        truth_lines = "\n".join(
            f"  upstream exchange {u.exchange_id} {u.path} ({u.outcome}), {len(u.blocks)} events"
            + (f", cut-off tail {u.tail[:60]!r}" if u.tail else "")
            + "".join(f"\n    {b.short()}" for b in u.blocks)
            for u in truth.upstream
        )
        return (
            f"seed {seed} ({binding}): {why}\nclient ({received.ended}):\n{received.story()}\n"
            f"truth:\n{truth_lines}\nresumes: {truth.resumes}"
        )

    assert received.ended == "complete", fail("the client did not get to the end of the stream")
    assert truth.upstream, fail("no stream of the task from the agent in the log")
    got = received.events()
    ids = [b.id for b in got]
    assert None not in ids, fail(
        f"events without an id reached the client: {[b.raw for b in got if b.id is None]}"
    )
    twice = [i for i, c in Counter(ids).items() if c > 1]
    assert not twice, fail(f"events sent twice: {twice}")

    first, *rejoined = truth.upstream
    if not rejoins:
        assert not rejoined, fail("the agent was asked for the task's stream again")
    # What the client is owed, from the agent's streams: the first one's events, with the
    # gateway's ids where they had none; each rejoin's, after the Task snapshot it opens with.
    owed: list[tuple[Block, str | None]] = []  # (the agent's event, the id it must have, if known)
    boundaries = set()
    n = 0
    for block in first.blocks:
        if block.id is None and block.data:
            n += 1
        owed.append((block, block.id or f"tg{first.exchange_id}-{first.key}.{n}"))
    boundaries.add(len(owed))
    for again in rejoined:
        blocks = again.blocks
        if blocks and "task" in frame_of(blocks[0], binding):
            blocks = blocks[1:]
        for block in blocks:
            owed.append((with_rpc_id(block, 1) if binding == "jsonrpc" else block, block.id))
        boundaries.add(len(owed))

    # An agent that would not be subscribed to (its task had ended) told where the task
    # stands in an answer, not a stream: what the client was owed then is made up too.
    caught_up = any(r["outcome"] == "caught_up" for r in truth.resumes)
    if not rejoined and not caught_up:
        expected = b"".join(with_id(b.raw, i) if b.id is None else b.raw for b, i in owed)  # type: ignore[arg-type]
        if b"".join(b.raw for b in got) != expected:
            pairs = "\n".join(
                f"  {'==' if g == e else '!='} client {g}\n     truth  {e}"
                for g, e in zip(
                    [b.short() for b in got] + ["(nothing)"] * (len(owed) - len(got)),
                    [f"{i}: {(b.data or '')[:90]}" for b, i in owed] + ["(nothing)"] * (len(got) - len(owed)),
                    strict=True,
                )
            )
            raise AssertionError(fail(f"the client's events are not the agent's stream:\n{pairs}"))
    else:
        j = 0
        synthesized = []
        for position, block in enumerate(got):
            if j < len(owed):
                agent, want_id = owed[j]
                if agent.id is not None:
                    same = block.raw == agent.raw
                else:
                    bare = without_last_id(block.raw)
                    same = bare == agent.raw and (
                        want_id is None or block.id == want_id or j >= len(first.blocks)
                    )
                if same:
                    j += 1
                    continue
            frame = frame_of(block, binding)
            kind = next(iter(frame), None)
            assert j in boundaries and kind in ("artifactUpdate", "statusUpdate"), fail(
                f"client event {position} ({block.short()}) is neither the agent's next event "
                f"({owed[j][0].short() if j < len(owed) else 'none left'}) nor one the gateway may make "
                "where the agent's stream broke"
            )
            synthesized.append(block)
        assert j == len(owed), fail(
            f"the agent's events {[b.short() for b, _ in owed[j:]]} reached the gateway, never the client"
        )

    frames = [frame_of(b, binding) for b in got]
    folded = fold(frames)
    agent_state = truth.agent_task["status"]["state"]
    assert folded.states and folded.states[-1] == agent_state, fail(
        f"the client's task ends {folded.states[-1:] or 'stateless'}, the agent's is {agent_state}"
    )
    seen = [s for k, s in enumerate(folded.states) if k == 0 or folded.states[k - 1] != s]
    assert seen == [s for s in STATES if s in seen], fail(f"states out of order: {seen}")
    agent_artifacts = {a["artifactId"]: text_of(a) for a in truth.agent_task.get("artifacts", [])}
    assert folded.artifacts == agent_artifacts, fail(
        f"the client's artifacts {folded.artifacts} are not the agent's {agent_artifacts}"
    )
    gaps = [r for r in truth.resumes if r["outcome"] == "gap"]
    assert not folded.short or gaps, fail(
        f"text the client never got, and no gap in the log's resumes: {folded.short}"
    )

    if truth.agent_events is not None:
        # tasktape agent: each of its events the client got is the one it emitted, in order.
        order = {b.id: k for k, b in enumerate(truth.agent_events)}
        mine = [b for b in got if b.id in order]
        for block in mine:
            assert block.raw == truth.agent_events[order[block.id]].raw, fail(
                f"event {block.id} is not as the agent emitted it: {block.raw!r}"
            )
        places = [order[b.id] for b in mine]
        assert places == sorted(places), fail(f"the agent's events out of order: {places}")
        if not rejoined:
            assert places == list(range(len(truth.agent_events))), fail(
                f"the agent emitted {len(truth.agent_events)} events, the client got {places}"
            )


def check_reconnect_log(received: Received, truth: Truth) -> None:
    """Each reconnect is an exchange of its own in the log, holding what that client was sent:
    what the client read of it is where that exchange starts."""
    answered = [leg for leg in received.legs[1:] if leg.status == 200]
    assert len(truth.reconnects) == len(answered), (
        f"seed {received.seed}: {len(answered)} reconnects answered, {len(truth.reconnects)} in the log"
    )
    for leg, row in zip(answered, truth.reconnects, strict=True):
        assert _header(row, "Last-Event-ID") == leg.last_event_id, f"seed {received.seed}"
        assert row["body"].startswith(leg.raw), (
            f"seed {received.seed}: the client read {leg.raw[:200]!r}..., the log says it was sent "
            f"{row['body'][:200]!r}..."
        )


def stream_requests(cutter: Cutter, peer: Peer, binding: str) -> tuple[int, int]:
    """The requests that reached the agent: task-starting ones, and subscribes."""
    if binding == "rest":
        return cutter.count("POST /message:stream"), cutter.count("GET /tasks/") + cutter.count(
            "POST /tasks/"
        )
    line = f"POST {peer.rpc_path} "
    return cutter.count(line, b"SendStreamingMessage"), cutter.count(line, b"SubscribeToTask")


# -- the tests ----------------------------------------------------------------------------------------

PEERS = ["sdk", "tasktape"]
BINDINGS = ["rest", "jsonrpc"]


async def one_stream(
    record: RecordFactory,
    peer: Peer,
    binding: str,
    seed: int,
    *,
    client_drops: bool,
    upstream_cuts: int,
    rejoins: bool,
) -> tuple[Received, Truth, Cutter]:
    plan = None
    if upstream_cuts:
        # The first stream's cut comes after its first event (before it, there is no task to
        # rejoin and no id to resume from: the client can only start again).
        marker = b"\r\n\r\n" if peer.kind == "sdk" else b"\n\n"
        plan = cut_streams(
            max_cuts=upstream_cuts,
            paths=(":stream", ":subscribe", peer.rpc_path),
            longest=1500 if peer.kind == "sdk" else 10000,  # within the first stream: it is cut
            first_after_marker=marker,
            first_nth=2 if peer.kind == "sdk" else 1,  # the head ends with one too
        )
    options: dict[str, Any] = {"hold": HOLD}
    if rejoins:
        options["rejoin_for"] = REJOIN_FOR
    longest = 1500 if peer.kind == "sdk" else 3000
    async with Cutter(peer.url, plan, seed=seed) as cutter:
        rec = await record(cutter.url, **options)
        async with http_client() as http:
            received = await asyncio.wait_for(
                # Drops within the stream (the a2a-sdk's is 8 events, some 2 KB after its first).
                Client(http, rec.url, peer, binding, seed, drops=client_drops, longest=longest).run(),
                120,
            )
        assert received.task_id, f"seed {seed}: no task started: {received.story()} {received.ended}"
        found = await truth(rec, peer, received)
    return received, found, cutter


def runs(test: int, n: int, stress: bool) -> list[int]:
    """The seeds of run ``n`` of a test: one, or with --stress, STRESS_RUNS."""
    return [seed_of(test, n + len(SEEDS) * k) for k in range(STRESS_RUNS if stress else 1)]


@pytest.mark.parametrize("n", SEEDS)
@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("kind", PEERS)
async def test_client_drops(
    record: RecordFactory, peer: PeerFactory, stress: bool, kind: str, binding: str, n: int
) -> None:
    """Only the client drops: what it gets is the agent's stream, byte for byte."""
    for seed in runs(1, n, stress):
        agent = await peer(kind)
        received, found, cutter = await one_stream(
            record, agent, binding, seed, client_drops=True, upstream_cuts=0, rejoins=False
        )
        assert any(leg.end.startswith("dropped") for leg in received.legs), f"seed {seed}: no drop made"
        check(received, found, binding, rejoins=False)
        check_reconnect_log(received, found)
        started, subscribes = stream_requests(cutter, agent, binding)
        assert (started, subscribes) == (1, 0), (
            f"seed {seed}: the agent was asked to start {started} tasks and got {subscribes} subscribes"
        )
        if agent.store is not None:
            assert len(agent.store.tasks) == 1, f"seed {seed}"


@pytest.mark.parametrize("n", SEEDS)
@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("kind", PEERS)
@pytest.mark.parametrize("client_drops", [False, True], ids=["upstream", "both"])
async def test_upstream_drops(
    record: RecordFactory,
    peer: PeerFactory,
    stress: bool,
    client_drops: bool,
    kind: str,
    binding: str,
    n: int,
) -> None:
    """The agent's connection is cut 1 to 3 times (and the client's too, with "both"): the
    gateway rejoins, the client is caught up, and no task starts twice."""
    for seed in runs(2 if not client_drops else 3, n, stress):
        agent = await peer(kind)
        received, found, cutter = await one_stream(
            record, agent, binding, seed, client_drops=client_drops, upstream_cuts=1 + n % 3, rejoins=True
        )
        assert cutter.cuts(), f"seed {seed}: the agent's stream was never cut"
        check(received, found, binding, rejoins=True)
        started, _ = stream_requests(cutter, agent, binding)
        assert started == 1, f"seed {seed}: the agent was asked to start {started} tasks"
        if agent.store is not None:
            assert len(agent.store.tasks) == 1, f"seed {seed}"


@pytest.mark.parametrize("binding", BINDINGS)
async def test_the_agent_s_own_drop_is_rejoined(record: RecordFactory, serve: Serve, binding: str) -> None:
    """tasktape agent's "drop" scenario cuts its first stream mid-event by itself."""
    seed = seed_of(4, BINDINGS.index(binding))
    app = create_agent_app(pace=0.2)
    agent = Peer("tasktape", await serve(app), "/jsonrpc", "drop the answer", app[STORE])
    async with Cutter(agent.url, seed=seed) as cutter:
        rec = await record(cutter.url, hold=HOLD, rejoin_for=REJOIN_FOR)
        async with http_client() as http:
            received = await asyncio.wait_for(
                Client(http, rec.url, agent, binding, seed, drops=False).run(), 60
            )
        assert received.task_id, f"seed {seed}: {received.story()} {received.ended}"
        found = await truth(rec, agent, received)
    assert found.upstream[0].tail, f"seed {seed}: the agent's stream was not cut mid-event"
    check(received, found, binding, rejoins=True)
    assert stream_requests(cutter, agent, binding)[0] == 1, f"seed {seed}"


async def one_client(
    record: RecordFactory, cutter: Cutter, agent: Peer, binding: str, seed: int
) -> tuple[Recording, Received]:
    """A gateway in front of ``cutter``, and one client that does not drop, run to its end."""
    rec = await record(cutter.url, hold=HOLD, rejoin_for=REJOIN_FOR)
    async with http_client() as http:
        received = await asyncio.wait_for(Client(http, rec.url, agent, binding, seed, drops=False).run(), 60)
    return rec, received


async def one_cut_stream(
    record: RecordFactory,
    agent: Peer,
    plan: Callable[[Relayed, random.Random], Cut | None],
    binding: str,
    seed: int,
) -> tuple[Cutter, Received, Truth]:
    """One client's stream through a gateway whose agent connections ``plan`` cuts: the
    cutter (what it saw), what the client got, and the truth."""
    async with Cutter(agent.url, plan, seed=seed) as cutter:
        rec, received = await one_client(record, cutter, agent, binding, seed)
        assert received.task_id, f"seed {seed}: {received.story()} {received.ended}"
        found = await truth(rec, agent, received)
    return cutter, received, found


@pytest.mark.parametrize("where", ["inside", "after"])
@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("kind", PEERS)
async def test_a_stream_cut_at_its_last_event_still_ends(
    record: RecordFactory, peer: PeerFactory, kind: str, binding: str, where: str
) -> None:
    """The agent's stream breaks inside its last event, or right after it (before the end
    of the body): the task has ended by the time the gateway could ask for it again, and
    the client is still owed its final state, and a clean end."""
    seed = seed_of(6, 4 * PEERS.index(kind) + 2 * BINDINGS.index(binding) + (where == "after"))
    agent = await peer(kind)
    asked = 0
    event_end = b"\r\n\r\n\r\n" if kind == "sdk" else b"\n\n\r\n"  # with the chunk's own end

    def plan(request: Relayed, _rng: random.Random) -> Cut | None:
        nonlocal asked
        asked += 1
        if asked > 1:
            return None
        return Cut(0, "rst", b"TASK_STATE_COMPLETED", then=event_end if where == "after" else None)

    cutter, received, found = await one_cut_stream(record, agent, plan, binding, seed)
    assert [r.line for r in cutter.cuts()] == [cutter.requests[0].line], f"seed {seed}"
    assert bool(found.upstream[0].tail) == (where == "inside"), f"seed {seed}: {found.upstream[0].tail!r}"
    check(received, found, binding, rejoins=True)


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("kind", PEERS)
async def test_a_stream_cut_right_after_its_first_event_is_rejoined(
    record: RecordFactory, peer: PeerFactory, kind: str, binding: str
) -> None:
    """The agent's first event (the Task) arrives, and its connection closes right behind
    it: the gateway has received the task, so it can rejoin it rather than leave a client
    nothing to resume from (and only a second task to start)."""
    seed = seed_of(9, 2 * PEERS.index(kind) + BINDINGS.index(binding))
    agent = await peer(kind)
    asked = 0

    def plan(request: Relayed, _rng: random.Random) -> Cut | None:
        nonlocal asked
        asked += 1
        if asked > 1:
            return None
        return Cut(0, "close", b"\r\n\r\n", 2) if kind == "sdk" else Cut(0, "close", b"\n\n")

    async with Cutter(agent.url, plan, seed=seed) as cutter:
        rec, received = await one_client(record, cutter, agent, binding, seed)
        with await rec.log() as log:
            first = log.exchanges()[0]
            body = log.body(first["id"])
        assert split(body)[0], (
            f"seed {seed}: the agent's first event reached the gateway (the cutter passed "
            f"{cutter.requests[0].cut_at} bytes, then closed), yet the log holds {body!r} of "
            f"{first['path']} ({first['outcome']}), and the client got: {received.story()} ({received.ended})"
        )
        assert received.task_id, f"seed {seed}: {received.story()} {received.ended}"
        found = await truth(rec, agent, received)
    check(received, found, binding, rejoins=True)
    assert stream_requests(cutter, agent, binding)[0] == 1, f"seed {seed}"


@pytest.mark.parametrize("how", ["pause", "close"])
@pytest.mark.parametrize("binding", BINDINGS)
async def test_an_event_whose_crlf_is_split_keeps_its_id(
    record: RecordFactory, peer: PeerFactory, binding: str, how: str
) -> None:
    """The a2a-sdk ends its lines with CRLF; the relay hands the gateway the blank line's
    CR, then its LF in a later read ("pause") or never, the connection closing ("close").
    Every event the client is sent has an id (it could not resume from one without), and
    its bytes are the agent's."""
    seed = seed_of(10, 2 * BINDINGS.index(binding) + (how == "close"))
    agent = await peer("sdk")
    asked = 0

    def plan(request: Relayed, _rng: random.Random) -> Cut | None:
        nonlocal asked
        asked += 1
        # After the CR of the second event's blank line: the head's end is the first match,
        # the first event's end and its chunk's CRLF (\r\n\r\n\r\n) the next two.
        return Cut(0, how, b"\r\n\r", 4, pause=0.05) if asked == 1 else None

    cutter, received, found = await one_cut_stream(record, agent, plan, binding, seed)
    assert cutter.requests[0].cut_at is not None, f"seed {seed}: the relay never {how}d"
    check(received, found, binding, rejoins=how == "close")


LOAD = 200


def load_plan(store: TaskStore, base: int) -> Callable[[Relayed, random.Random], Cut | None]:
    """Cuts for many streams at once, the same for a stream whatever the others do: each
    request's from a generator of its own, seeded by its stream's number (its message id)
    and how many requests of that stream came before."""
    asked: Counter[str] = Counter()

    def plan(request: Relayed, _rng: random.Random) -> Cut | None:
        if request.path.endswith(":stream"):
            found = re.search(rb'"messageId":\s*"(m\d+)"', bytes(request.data))
        elif request.path.endswith(":subscribe"):
            run = store.get(request.path.split("/")[2].removesuffix(":subscribe"))
            found = re.search(r"(m\d+)", run.history[0]["messageId"]) if run and run.history else None
        else:
            return None
        if found is None:
            return None
        stream = found.group(1) if isinstance(found.group(1), str) else found.group(1).decode()
        attempt = asked[stream]
        asked[stream] += 1
        rng = random.Random(f"{base}/{stream}/{attempt}")
        if attempt >= 2 or rng.random() < 0.5:
            return None
        if attempt == 0:  # after the first event: a task to rejoin, an id to resume from
            return Cut(rng.randint(0, 6000), rng.choice(("rst", "close")), b"\n\n")
        return Cut(rng.randint(0, 6000), rng.choice(("rst", "close")))

    return plan


@pytest.mark.parametrize("sides", ["client", "both"])
async def test_200_streams_dropping(record: RecordFactory, serve: Serve, sides: str) -> None:
    base = seed_of(5, ["client", "both"].index(sides))
    app = create_agent_app(pace=0.01)
    store = app[STORE]
    agent = Peer("tasktape", await serve(app), "/jsonrpc", "What does J45.909 mean?", store)
    plan = load_plan(store, base) if sides == "both" else None
    options: dict[str, Any] = {"hold": HOLD}
    if sides == "both":
        options["rejoin_for"] = REJOIN_FOR
    async with Cutter(agent.url, plan, seed=base) as cutter:
        rec = await record(cutter.url, **options)
        async with http_client() as http:
            clients = [
                Client(
                    http,
                    rec.url,
                    agent,
                    BINDINGS[i % 2],
                    base + i,
                    max_drops=3,
                    longest=6000,
                    message_id=f"m{i}",
                )
                for i in range(LOAD)
            ]
            everything = await asyncio.wait_for(asyncio.gather(*(c.run() for c in clients)), 120)
        failures = []
        for received in everything:
            if not received.task_id:
                failures.append(f"seed {received.seed}: no task: {received.ended}\n{received.story()}")
                continue
            found = await truth(rec, agent, received)
            try:
                check(received, found, received.binding, rejoins=sides == "both")
            except AssertionError as exc:
                failures.append(str(exc))
    drops = sum(1 for r in everything for leg in r.legs if leg.end.startswith("dropped"))
    assert drops >= LOAD, f"base seed {base}: only {drops} client drops"
    if sides == "both":
        assert len(cutter.cuts()) >= LOAD // 4, f"base seed {base}: only {len(cutter.cuts())} upstream cuts"
    assert not failures, f"{len(failures)} of {LOAD} streams broke an invariant; the first:\n" + failures[0]
    assert len(store.tasks) == LOAD, f"base seed {base}: the agent started {len(store.tasks)} tasks"
    started = cutter.count("POST /message:stream") + cutter.count("POST /jsonrpc", b"SendStreamingMessage")
    assert started == LOAD, f"base seed {base}: {started} task-starting requests reached the agent"
