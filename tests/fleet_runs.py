"""Running shippers and collectors in the test's own event loop, against real NATS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.js.errors

from tasktape.fleet.collector import Collector, CollectStats
from tasktape.fleet.names import STREAM, parse_servers
from tasktape.fleet.shipper import Shipper, ShipStats
from tasktape.fleet.sqlite_sink import SqliteSink
from tasktape.fleet.wire import Rows


async def ship_once(log: Path, url: str, **options: Any) -> ShipStats:
    """Ship what the log holds now, then stop."""
    shipper = Shipper(log, parse_servers(url), **options)
    stop = asyncio.Event()
    stop.set()
    try:
        return await shipper.run(stop, drain=30)
    finally:
        shipper.close()


async def collect_until(
    url: str, db: Path, done: Callable[[], bool], *, consumer: str = "test", timeout: float = 30.0
) -> CollectStats:
    """Collect into ``db`` until ``done()`` (asked between batches), or fail after ``timeout``."""
    stop = asyncio.Event()
    with SqliteSink(db) as sink:
        collector = Collector(parse_servers(url), sink, consumer=consumer, ack_wait=2.0)
        task = asyncio.ensure_future(collector.run(stop))
        deadline = time.monotonic() + timeout
        try:
            while not done():
                assert not task.done(), task.result()
                assert time.monotonic() < deadline, f"not collected in {timeout} s: {collector.stats}"
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            stats = await task
    return stats


async def stream_messages(url: str, stream: str = STREAM) -> int:
    """How many messages the stream holds."""
    nc = await nats.connect(parse_servers(url))
    try:
        info = await nc.jetstream().stream_info(stream)
        return int(info.state.messages)
    finally:
        await nc.close()


async def raw_messages(url: str, consumer: str = "raw") -> list[bytes]:
    """Every message the stream holds, as published (a consumer of its own reads them)."""
    nc = await nats.connect(parse_servers(url))
    try:
        sub = await nc.jetstream().pull_subscribe("tasktape.>", durable=consumer, stream=STREAM)
        found: list[bytes] = []
        unavailable = 0
        while True:
            try:
                found += [m.data for m in await sub.fetch(1000, timeout=2)]
            except TimeoutError:  # nats.errors.TimeoutError too: no more messages
                return found
            except nats.js.errors.ServiceUnavailableError:
                # A new consumer of a clustered stream answers 503 until its leader is chosen.
                unavailable += 1
                if unavailable > 50:
                    raise
                await asyncio.sleep(0.1)
    finally:
        await nc.close()


def raw_rows(payload: bytes) -> Rows:
    """A message as published (``decode`` gives every message its exchanges' uids)."""
    return msgspec.msgpack.decode(payload, type=Rows)
