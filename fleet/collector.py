"""Collecting a fleet's rows from NATS JetStream into a sink, through a durable consumer.

A collector acknowledges a message only once its sink has committed it. One killed
mid-batch leaves its messages unacknowledged: JetStream delivers them again (``ack_wait``
after they were handed out), to it after a restart or to another collector of the same
consumer, and the sink, whose writes are keyed by what names each row, holds them once.
Collectors with the same consumer name share its messages; each sink has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.js.api import ConsumerConfig

from .jetstream import FIRST_CONNECT, RETRY, ensure_stream, failure, stream_ready
from .names import FETCH, STREAM, SUBJECTS, shown
from .sqlite_sink import Applied
from .wire import Rows, decode

FETCH_WAIT = 0.5  # seconds a fetch waits for its first message
REPORT_EVERY = 5.0  # seconds between the lines saying what was collected
BUSY_WAIT = 1.0  # seconds between tries of a sink another process holds (besides its own wait)


class Sink(Protocol):
    gather: float  # seconds of messages the sink takes in one write (0: one fetch's)
    nan_nulls: bool  # it takes NULLs as NaN, as a log writer encodes them (wire.decode)
    # Errors of a message the sink cannot store (its values, not the sink): it is dropped.
    refuses: tuple[type[Exception], ...]
    # Errors of a sink busy for now (another process holds it): waited out, then tried again.
    waits: tuple[type[Exception], ...]

    def apply(self, messages: Sequence[Rows]) -> Applied: ...

    def consumer(self) -> str: ...  # the durable consumer the sink is collected through, unless told


@dataclass
class CollectStats:
    messages: int = 0
    rows: int = 0
    written: int = 0  # rows the sink did not hold yet
    refused: int = 0  # messages that were not tasktape's rows: terminated, never redelivered
    lag: float = 0.0  # seconds between the last message's arrival in the stream and its commit
    unreached: str | None = None  # why until_idle gave up on a broker it never reached, or lost


class Collector:
    """Collects the JetStream ``stream`` on ``servers`` into ``sink`` as the durable
    consumer ``consumer``; the sink's ``gather`` seconds of messages (fetched ``batch`` at a
    time) go into each of its transactions (0: what one fetch brings). With ``until_idle``,
    it stops by itself once nothing has come for that many seconds and the consumer has
    nothing left to hand out (a batch job's: collect what is there, then exit)."""

    def __init__(
        self,
        servers: list[str],
        sink: Sink,
        *,
        consumer: str,
        stream: str = STREAM,
        subjects: str = SUBJECTS,
        batch: int = FETCH,
        ack_wait: float = 30.0,
        until_idle: float | None = None,
        on_status: Callable[[str], None] | None = None,
    ) -> None:
        self.servers = servers
        self.sink = sink
        self.consumer = consumer
        self.stream = stream
        self.subjects = subjects
        self.stats = CollectStats()
        self._batch = batch
        self._ack_wait = ack_wait
        self._until_idle = until_idle
        self._on_status = on_status or (lambda line: None)
        self._reported = (0.0, 0)
        self._lost: BaseException | None = None  # why the last fetch failed, while they fail
        self._failing = False  # whether the last fetch failed (rather than brought nothing)

    async def run(self, stop: asyncio.Event) -> CollectStats:
        """Collect until ``stop`` is set (what was fetched by then is committed first), or
        (``until_idle``) until nothing more comes."""
        collecting = asyncio.ensure_future(self._collect(stop))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([collecting, stopped], return_when=asyncio.FIRST_COMPLETED)
            if collecting.done():
                collecting.result()
        finally:
            for task in (collecting, stopped):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return self.stats

    async def _collect(self, stop: asyncio.Event) -> None:
        subscribed = await self._subscribe()
        if subscribed is None:
            return
        nc, sub = subscribed
        idle = self._until_idle
        quiet_since = heard = said = time.monotonic()  # said: when the broker's absence was said
        try:
            while not stop.is_set():
                msgs = await self._fetch(sub)
                if msgs:
                    await self._commit(msgs)
                    quiet_since = time.monotonic()
                elif self._failing and nc.is_connected and await _gone(sub):
                    sub = await self._made_again(nc, sub)
                    continue
                elif not nc.is_connected:  # (a fetch then just times out, as when nothing came)
                    away = time.monotonic() - heard
                    why = self._why(self._lost or ConnectionError("the connection is down"))
                    if idle is not None and away >= idle:  # it went away, and has not come back
                        self.stats.unreached = f"lost {why}"
                        return
                    if away >= REPORT_EVERY and time.monotonic() - said >= REPORT_EVERY:
                        said = time.monotonic()
                        self._on_status(f"waiting for {why}")
                    continue
                elif idle is not None and time.monotonic() - quiet_since >= idle and await _drained(sub):
                    self._on_status(f"nothing new for {idle:g} s: stopping")
                    return
                heard = time.monotonic()
                self._report()
        finally:
            with contextlib.suppress(*RETRY):
                await nc.close()

    async def _subscribe(self) -> tuple[Any, Any] | None:
        """The connection and the durable consumer: tried again until they are there, or
        (until_idle) None once that long has gone by without them."""
        started = time.monotonic()
        waited = started - REPORT_EVERY  # the first failure is said at once
        # With until_idle, a first connection is not tried for longer than that.
        within = FIRST_CONNECT if self._until_idle is None else max(min(FIRST_CONNECT, self._until_idle), 0.5)
        while True:
            try:
                return await stream_ready(
                    self.servers, self.stream, self.subjects, 5, then=self._pull, within=within
                )
            except RETRY as exc:
                why = self._why(exc)
                if self._until_idle is not None and time.monotonic() - started >= self._until_idle:
                    self.stats.unreached = f"never reached {why}"
                    return None
                if time.monotonic() - waited > REPORT_EVERY:
                    waited = time.monotonic()
                    self._on_status(f"waiting for {why}")
                await asyncio.sleep(0.25)

    def _why(self, exc: BaseException) -> str:
        return f"{shown(self.servers)} ({failure(exc)})"

    async def _pull(self, js: Any) -> Any:
        """The durable consumer (made if missing) collected through."""
        config = ConsumerConfig(ack_wait=self._ack_wait, max_ack_pending=50_000)
        sub = await js.pull_subscribe(
            f"{self.subjects}.>", durable=self.consumer, stream=self.stream, config=config
        )
        await self._keep_ack_wait(js, sub)
        return sub

    async def _made_again(self, nc: Any, gone: Any) -> Any:
        """The consumer (and its stream) made again once deleted on the broker (``nats
        consumer rm``; the stream deleted, and made again by a shipper): fetching from it
        would bring nothing, for ever."""
        js = nc.jetstream(timeout=5)
        try:
            await ensure_stream(js, self.stream, self.subjects, len(self.servers))
            sub = await self._pull(js)
        except RETRY:
            return gone  # (the next fetch fails again, and this is tried again)
        with contextlib.suppress(*RETRY):
            await gone.unsubscribe()
        self._lost = None
        self._on_status(
            f"the consumer {self.consumer} of {self.stream} was gone from the broker: made again,"
            " it hands out the stream from its first message"
        )
        return sub

    async def _keep_ack_wait(self, js: Any, sub: Any) -> None:
        """The consumer's ack_wait made this collector's: one there already keeps its own
        (pull_subscribe only looks it up)."""
        info = await sub.consumer_info()
        had = info.config.ack_wait or 0.0
        if math.isclose(had, self._ack_wait):
            return
        await js.add_consumer(self.stream, dataclasses.replace(info.config, ack_wait=self._ack_wait))
        self._on_status(
            f"the consumer {self.consumer} now hands out unacknowledged rows again after"
            f" {self._ack_wait:g} s (it was {had:g} s)"
        )

    async def _fetch(self, sub: Any) -> list[Any]:
        """A fetch's messages, then more for up to ``gather`` seconds."""
        msgs: list[Any] = []
        until = time.monotonic() + self.sink.gather
        while True:
            self._failing = False
            try:
                msgs += await sub.fetch(self._batch, timeout=FETCH_WAIT)
                self._lost = None
            except nats.errors.TimeoutError:
                pass
            except RETRY as exc:
                self._lost = exc
                self._failing = True
                await asyncio.sleep(0.25)
            if not msgs or time.monotonic() >= until:
                return msgs

    async def _commit(self, msgs: list[Any]) -> None:
        decoded: list[tuple[Any, Rows]] = []
        for msg in msgs:
            try:
                decoded.append((msg, decode(msg.data, nan_nulls=self.sink.nan_nulls)))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await self._drop(msg, f"holds no tasktape rows ({exc})")
        try:
            applied = await self._apply([rows for _, rows in decoded])  # committed: only now acknowledged
        except self.sink.refuses:
            # One message the sink cannot store must not hold back (nor, being handed out
            # again, stop for good) every collector of the stream: each goes alone.
            applied, decoded = await self._commit_alone(decoded)
        for msg, _ in decoded:
            with contextlib.suppress(*RETRY):  # unacknowledged, it comes again; the sink holds it once
                await msg.ack()
        s = self.stats
        s.messages += applied.messages
        s.rows += applied.rows
        s.written += applied.written
        if decoded:
            s.lag = max(time.time() - decoded[-1][0].metadata.timestamp.timestamp(), 0.0)

    async def _apply(self, messages: list[Rows]) -> Applied:
        """The messages applied to the sink, once it is free: while another process holds
        it, said once and waited for (its messages stay unacknowledged meanwhile)."""
        said = False
        while True:
            try:
                return self.sink.apply(messages)
            except self.sink.waits as exc:
                if not said:
                    said = True
                    self._on_status(f"waiting for {exc}")
                await asyncio.sleep(BUSY_WAIT)

    async def _commit_alone(self, decoded: list[tuple[Any, Rows]]) -> tuple[Applied, list[tuple[Any, Rows]]]:
        """Each message in a transaction of its own; those the sink refuses, dropped. What
        was committed, and the messages it holds."""
        applied, kept = Applied(), []
        for msg, rows in decoded:
            try:
                one = await self._apply([rows])
            except self.sink.refuses as exc:
                await self._drop(msg, f"holds rows the sink cannot store ({type(exc).__name__}: {exc})")
                continue
            kept.append((msg, rows))
            applied.messages += one.messages
            applied.rows += one.rows
            applied.written += one.written
        return applied, kept

    async def _drop(self, msg: Any, why: str) -> None:
        """A message no sink can take, said and terminated: never handed out again."""
        self.stats.refused += 1
        self._on_status(f"WARNING: {msg.subject} {why}; dropped")
        with contextlib.suppress(*RETRY):
            await msg.term()

    def _report(self) -> None:
        at, rows = self._reported
        now = time.monotonic()
        if self.stats.rows != rows and now - at >= REPORT_EVERY:
            self._reported = (now, self.stats.rows)
            s = self.stats
            self._on_status(
                f"{s.rows:,} rows from {s.messages:,} messages ({s.rows - s.written:,} held already)"
            )


async def _drained(sub: Any) -> bool:
    """Whether the consumer has no message left to hand out: none pending, and none handed
    out unacknowledged (those of a collector that died come again after ``ack_wait``). A
    consumer gone is not: the next fetch finds it gone, and it is made again."""
    try:
        info = await sub.consumer_info()
    except (*RETRY, nats.js.errors.NotFoundError):
        return False
    return not info.num_pending and not info.num_ack_pending


async def _gone(sub: Any) -> bool:
    """Whether the consumer (or its stream) is no longer on the broker: a fetch from it
    fails as from a broker that does not answer, the consumer's info says which."""
    try:
        await sub.consumer_info()
    except nats.js.errors.NotFoundError:
        return True
    except RETRY:
        pass
    return False
