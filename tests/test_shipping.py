"""Shipping a recorder's log to NATS JetStream (tasktape record --ship): every committed
row once, through an outbox cursor that survives restarts; rows that change shipped again;
a broker that is away leaves rows waiting in the log, said so, and shipped once it is back."""

from __future__ import annotations

import asyncio
import math
import signal
import sqlite3
import time
from pathlib import Path

import aiohttp
import msgspec
import nats
import nats.errors
import nats.js.errors
import pytest
from a2a_frames import completed_run, sse
from click.testing import CliRunner
from fleet_runs import collect_until, raw_messages, raw_rows, ship_once, stream_messages
from log_rows import MS, SSE, shipped_rows, write_log
from loopback import running, serve, stop, upstream_app
from nats_servers import NatsCluster

from tasktape.cli import main
from tasktape.errors import UsageError
from tasktape.eventlog import LogWriter
from tasktape.fleet.jetstream import failure
from tasktape.fleet.names import parse_servers
from tasktape.fleet.shipper import Shipper
from tasktape.fleet.wire import Rows, Table, decode, encode, encoded, message_id, within


def cursor(log: Path) -> tuple[int, ...]:
    db = sqlite3.connect(log)
    row = db.execute(
        "SELECT captures, exchanges, stored_chunks, events, resumes, rows FROM shipments"
    ).fetchone()
    db.close()
    return tuple(row)


async def test_a_log_ships_whole_and_a_restarted_shipper_sends_nothing_twice(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    log = write_log(tmp_path / "a.db", "a")
    first = await ship_once(log, nats_node.url)
    # 1 capture, 3 exchanges, 1 stored chunk, 11 events, 1 resume.
    assert (first.rows, first.duplicates) == (17, 0)
    assert cursor(log) == (1, 3, 1, 11, 1, 17)
    held = await stream_messages(nats_node.url)
    again = await ship_once(log, nats_node.url)
    # A restart looks at its captures again (one may have ended since): JetStream knows it.
    assert again.rows == again.duplicates == 1 and await stream_messages(nats_node.url) == held
    with LogWriter(log) as w:  # the recorder records on
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="GET", path="/later", started_ns=time.time_ns())
        w.end_exchange(ex, duration_ns=MS)
        w.end_capture(cap)
    later = await ship_once(log, nats_node.url)
    assert later.rows - later.duplicates == 2
    fleet = tmp_path / "fleet.db"
    await collect_until(
        nats_node.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == shipped_rows(log)
    )


async def test_an_exchange_under_way_ships_as_far_as_it_got_and_again_once_ended(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    log, fleet = tmp_path / "live.db", tmp_path / "fleet.db"
    chunks = sse(completed_run("task.live", "ctx.live"), ids="e")
    with LogWriter(log) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        for n, data in enumerate(chunks[:4]):
            w.chunk(ex, n * MS, data)
        w.flush()
        await ship_once(log, nats_node.url)  # this shipper stops; the next takes up from its cursor
        await collect_until(nats_node.url, fleet, lambda: fleet.exists() and _events(fleet) == 4)
        assert _outcomes(fleet) == [None]
        for n, data in enumerate(chunks[4:], 4):
            w.chunk(ex, n * MS, data)
        w.end_exchange(ex, duration_ns=20 * MS).result()
        w.end_capture(cap)
    await ship_once(log, nats_node.url)
    await collect_until(nats_node.url, fleet, lambda: shipped_rows(fleet) == shipped_rows(log))
    assert _outcomes(fleet) == ["complete"]


def _events(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def _outcomes(db: Path) -> list[str | None]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT outcome FROM exchanges")]


async def test_rows_wait_while_the_broker_is_away_and_go_out_when_it_is_back(tmp_path: Path) -> None:
    node = NatsCluster(tmp_path / "nats", size=1)  # its port chosen, the server not started
    log = write_log(tmp_path / "a.db", "a")
    said: list[str] = []
    shipper = Shipper(log, parse_servers(node.url), on_status=said.append)
    stopping = asyncio.Event()
    shipping = asyncio.ensure_future(shipper.run(stopping, drain=30))
    try:
        await asyncio.sleep(2.0)
        assert said and all(line.startswith("shipping: 17 rows wait for nats://127.0.0.1:") for line in said)
        assert cursor_or_none(log) is None  # nothing shipped, nothing marked
        node.start()
        deadline = time.monotonic() + 30
        while not any("caught up" in line for line in said):
            assert time.monotonic() < deadline, said
            await asyncio.sleep(0.05)
        assert said[-1] == "shipping: caught up (17 rows shipped in all)"
        assert cursor(log)[-1] == 17
    finally:
        stopping.set()
        await shipping
        shipper.close()
        node.stop()


async def test_messages_a_frozen_broker_never_acknowledged_go_again_and_are_stored_once(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    log = tmp_path / "a.db"
    LogWriter(log).close()  # nothing to ship yet: the shipper connects and waits
    shipper = Shipper(log, parse_servers(nats_node.url), publish_timeout=0.5)
    stopping = asyncio.Event()
    shipping = asyncio.ensure_future(shipper.run(stopping, drain=30))
    broker = nats_node.nodes[0].process
    assert broker is not None
    try:
        await asyncio.sleep(1.0)
        broker.send_signal(signal.SIGSTOP)  # a window goes out, and nothing answers it
        write_log(log, "a")
        await asyncio.sleep(2.0)
        assert shipper.stats.retries >= 1 and shipper.stats.rows == 0
        broker.send_signal(signal.SIGCONT)
        stopping.set()
        stats = await shipping
    finally:
        broker.send_signal(signal.SIGCONT)
        stopping.set()
        await shipping
        shipper.close()
    # Each message went out twice or more (the window, then on its own): stored once.
    assert stats.waiting == 0 and stats.duplicates >= 1 and cursor(log)[-1] == 17
    published = [decode(p) for p in await raw_messages(nats_node.url)]
    assert sum(len(m.rows) for m in published) == 17
    fleet = tmp_path / "fleet.db"
    await collect_until(
        nats_node.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == shipped_rows(log)
    )


def cursor_or_none(log: Path) -> tuple[int, ...] | None:
    db = sqlite3.connect(log)
    row = db.execute("SELECT rows FROM shipments").fetchone()
    db.close()
    return row


async def test_tasktape_record_ships_what_it_records(nats_cluster: NatsCluster, tmp_path: Path) -> None:
    log, fleet = tmp_path / "rec.db", tmp_path / "fleet.db"
    async with (
        serve(upstream_app(events=30, delay=0.01)) as agent,
        running(
            "record",
            "--upstream",
            agent,
            "--listen",
            "127.0.0.1:0",
            "--db",
            str(log),
            "--ship",
            nats_cluster.url,
        ) as rec,
    ):
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(f"{rec.url}/message:stream", json={}) as r:
                    assert len(await r.read()) > 0
        assert await stop(rec, signal.SIGINT) == 0, rec.printed
    assert "rows wait" not in "".join(rec.printed)
    assert cursor(log)[:4] == (1, 3, 0, 90)  # every row, shipped before the recorder exited
    # The events went out as the recorder's log writer encoded them: none was read back.
    events = [m for m in map(raw_rows, await raw_messages(nats_cluster.url)) if m.table is Table.EVENTS]
    assert events and all(m.exchanges for m in events)
    await collect_until(
        nats_cluster.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == shipped_rows(log)
    )


async def test_a_row_bigger_than_the_servers_take_is_left_out_loudly_and_the_rest_ships(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    log, fleet = tmp_path / "big.db", tmp_path / "fleet.db"
    with LogWriter(log) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.chunk(ex, MS, b"data: before\n\n")
        w.chunk(ex, 2 * MS, b'data: "' + b"x" * (1536 * 1024) + b'"\n\n')  # over 1 MiB (max_payload)
        w.chunk(ex, 3 * MS, b"data: after\n\n")
        w.end_exchange(ex, duration_ns=4 * MS).result()
    said: list[str] = []
    stats = await ship_once(log, nats_node.url, on_status=said.append)
    assert stats.too_large == 1 and stats.waiting == 0
    (warning,) = [line for line in said if line.startswith("WARNING")]
    (uid,) = sqlite3.connect(log).execute("SELECT uid FROM exchanges").fetchone()
    assert f"a row of events (exchange_uid {uid}, seq 1," in warning and "max_payload 1,048,576" in warning
    assert cursor(log)[-1] == stats.rows  # what was left out is not counted as shipped
    await collect_until(nats_node.url, fleet, lambda: fleet.exists() and _events(fleet) == 2)
    with sqlite3.connect(fleet) as conn:
        assert conn.execute("SELECT data FROM events ORDER BY seq").fetchall() == [("before",), ("after",)]
        assert _outcomes(fleet) == ["complete"]
    # Shipping goes on past it: the next shipper has nothing left to send.
    assert (await ship_once(log, nats_node.url)).too_large == 0


async def test_an_event_too_big_to_ship_with_its_text_travels_without_it_and_is_collected_with_it(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """An event of 700 KB: its row holds its text twice (data and text), 1.4 MB, over the
    1 MiB the servers take; the collector derives the text from the data again."""
    log, fleet = tmp_path / "big.db", tmp_path / "fleet.db"
    message = {"role": "ROLE_AGENT", "parts": [{"text": "y" * 700_000}]}
    frame = {"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "TASK_STATE_WORKING"}}}
    frame["statusUpdate"]["status"]["message"] = message
    with LogWriter(log) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.chunk(ex, MS, b"data: " + msgspec.json.encode(frame) + b"\n\n")
        w.end_exchange(ex, duration_ns=2 * MS).result()
    said: list[str] = []
    stats = await ship_once(log, nats_node.url, on_status=said.append)
    assert (stats.too_large, stats.trimmed, stats.waiting) == (0, 0, 0) and not said
    await collect_until(nats_node.url, fleet, lambda: fleet.exists() and _events(fleet) == 1)
    query = "SELECT kind, data, text FROM events"
    with sqlite3.connect(log) as conn:
        in_log = conn.execute(query).fetchone()
    with sqlite3.connect(fleet) as conn:
        assert conn.execute(query).fetchone() == in_log and in_log[2] == "y" * 700_000


async def test_an_exchange_too_big_to_ship_travels_without_its_bodies(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """A request body over what the servers take: the exchange's row was left out, and a
    collected log held its chunks under an empty placeholder (no method, status, outcome)."""
    log, fleet = tmp_path / "big.db", tmp_path / "fleet.db"
    with LogWriter(log, max_body=4 * 1024 * 1024) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(
            cap, method="POST", path="/upload", request_body=b"x" * (1536 * 1024), started_ns=time.time_ns()
        )
        w.response_head(ex, status=201, headers=[("Content-Type", "text/plain")], is_sse=False, ttfb_ns=MS)
        w.chunk(ex, MS, b"stored")
        w.end_exchange(ex, duration_ns=2 * MS).result()
    said: list[str] = []
    stats = await ship_once(log, nats_node.url, on_status=said.append)
    assert (stats.too_large, stats.trimmed, stats.waiting) == (0, 1, 0)
    assert any("shipped without its bodies, flagged as cut" in line for line in said), said
    await collect_until(nats_node.url, fleet, lambda: fleet.exists() and _outcomes(fleet) == ["complete"])
    with sqlite3.connect(fleet) as conn:
        row = conn.execute(
            "SELECT method, path, status, request_body, request_body_truncated, response_body FROM exchanges"
        ).fetchone()
    assert row == ("POST", "/upload", 201, None, 1, "stored")  # (the request body was enough)


async def test_a_log_shipped_to_another_stream_ships_whole_to_it(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """The cursor was kept by the stream's name alone: shipped to another broker, or to its
    stream deleted and made again, a log shipped only its rows from then on, and collectors
    lost the rest; and a shipper whose stream was deleted waited for it for ever."""
    log = write_log(tmp_path / "a.db", "a")
    await ship_once(log, nats_node.url)
    said: list[str] = []
    other = NatsCluster(tmp_path / "other", size=1).start()
    try:
        await ship_once(log, other.url, on_status=said.append)
        fleet = tmp_path / "other.db"
        await collect_until(
            other.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == shipped_rows(log)
        )
    finally:
        other.stop()
    assert [line.split(" (made ")[0] for line in said if "is not the one" in line] == [
        f"shipping: the stream TASKTAPE on {other.url} is not the one this log was shipped to"
    ]
    # Deleted under a running shipper, the stream is made again, and the whole log shipped to it.
    shipper = Shipper(log, parse_servers(nats_node.url), on_status=said.append)
    stop = asyncio.Event()
    running_shipper = asyncio.ensure_future(shipper.run(stop))
    try:
        while shipper._nc is None:  # connected
            await asyncio.sleep(0.05)
        nc = await nats.connect(parse_servers(nats_node.url))
        await nc.jetstream().delete_stream("TASKTAPE")
        await nc.close()
        write_log(log, "b")  # more rows, into the same log
        fleet = tmp_path / "again.db"
        await collect_until(
            nats_node.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == shipped_rows(log)
        )
    finally:
        stop.set()
        await running_shipper
        shipper.close()
    # (Back to the first broker, then the stream made again.)
    assert sum("is not the one this log was shipped to" in line for line in said) == 3, said


async def test_a_stream_the_broker_will_not_make_stops_shipping_loudly(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """Another stream holds the subjects (a second --ship-stream on one broker): shipping
    stops at once, saying why, and the recorder records on; the shipper process exits
    cleanly (it aborted in the interpreter's shutdown, after a traceback)."""
    await ship_once(write_log(tmp_path / "a.db", "a"), nats_node.url)  # the stream TASKTAPE is there
    async with serve(upstream_app(events=3)) as agent:
        args = ["--listen", "127.0.0.1:0", "--db", str(tmp_path / "b.db"), "--ship", nats_node.url]
        async with running("record", "--upstream", agent, *args, "--ship-stream", "OTHER") as rec:
            async with aiohttp.ClientSession() as session, session.post(f"{rec.url}/message:stream") as r:
                assert len(await r.read()) > 0
            await asyncio.sleep(1)
            assert await stop(rec, signal.SIGINT) == 0
    said = "".join(rec.printed)
    assert "WARNING: shipping stopped: the stream OTHER cannot be made on the broker" in said
    assert "Traceback" not in said and "Fatal Python error" not in said


def test_a_server_list_names_its_ports() -> None:
    assert parse_servers("nats://user:pw@a:4222,b") == ["nats://user:pw@a:4222", "nats://b"]
    with pytest.raises(UsageError, match="'a:notaport' is not HOST:PORT with a port from 1 to 65535"):
        parse_servers("nats://a:notaport")


def test_a_bad_server_list_is_said_without_its_password(tmp_path: Path) -> None:
    """A usage error of --ship or --from quoted the URL as given, password and all."""
    upstream = ["record", "--upstream", "http://127.0.0.1:9", "--db", str(tmp_path / "r.db"), "--ship"]
    runs = [
        ([*upstream, "nats://alice:pw-n1@127.0.0.1:42x22"], "'nats://127.0.0.1:42x22': '127.0.0.1:42x22' is"),
        ([*upstream, "nat://alice:pw-n2@127.0.0.1:4222"], "'nat://127.0.0.1:4222' is not a NATS URL"),
        ([*upstream, "alice:pw-n3@127.0.0.1:4222"], "'127.0.0.1:4222' is not a NATS URL"),
        (
            ["collect", "--db", str(tmp_path / "c.db"), "--from", "nats://a:4222,alice:pw-n4@127.0.0.1:4x"],
            "'nats://a:4222,nats://127.0.0.1:4x': '127.0.0.1:4x' is not HOST:PORT",
        ),
    ]
    for args, said in runs:
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and said in result.output, result.output
        assert "pw-" not in result.output and "alice" not in result.output


def test_a_message_bigger_than_a_server_takes_goes_in_halves_that_fit() -> None:
    rows = Rows(
        Table.EVENTS, "cap", ("exchange_uid", "seq", "data"), [("x", n, "d" * 300) for n in range(40)]
    )
    (whole,) = encoded(rows, range(1, 41))
    parts = list(within(whole, 4096))
    assert len(parts) > 1 and all(len(p.payload) <= 4096 for p in parts)
    assert [row for p in parts for row in decode(p.payload).rows] == rows.rows
    assert sum(p.rows for p in parts) == 40
    assert len({message_id(p) for p in parts}) == len(parts)  # each its own id
    assert list(within(whole, len(whole.payload))) == [whole]
    (alone,) = encoded(msgspec.structs.replace(rows, rows=rows.rows[:1]), [1])
    assert list(within(alone, 10)) == [alone]  # a row alone too big comes out as it is


def test_nulls_the_log_writer_encoded_as_nan_decode_as_none_or_stay_nan_for_sqlite() -> None:
    nan = float("nan")
    rows = Rows(
        Table.EVENTS, "cap", ("exchange_id", "seq", "event_id"), [(7, 0, nan), (7, 1, "e1")], {7: "x7"}
    )
    assert decode(encode(rows)).rows == [("x7", 0, None), ("x7", 1, "e1")]
    kept = decode(encode(rows), nan_nulls=True)
    assert kept.columns == ("exchange_uid", "seq", "event_id")
    assert [r[:2] for r in kept.rows] == [("x7", 0), ("x7", 1)] and math.isnan(kept.rows[0][2])


def test_a_broker_failure_is_said_in_words() -> None:
    """The NATS client's own messages are often empty, or all None."""
    said = [
        failure(nats.js.errors.ServiceUnavailableError()),
        failure(nats.errors.NoRespondersError()),
        failure(nats.errors.TimeoutError()),
        failure(ConnectionRefusedError(111, "Connect call failed")),
    ]
    assert said[:3] == [said[0], said[0], "no answer in time"] and "down" in said[0]
    assert said[3] == "ConnectionRefusedError: [Errno 111] Connect call failed"
    assert not any("None" in s for s in said)
