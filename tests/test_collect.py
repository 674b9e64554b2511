"""Collecting a fleet into one SQLite log (tasktape collect): every shipped row once,
whatever the order, the redeliveries, the collectors sharing the work or killed mid-batch."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from fleet_runs import collect_until, raw_messages, ship_once
from log_rows import MS, SSE, shipped_rows, union, write_log
from nats_servers import NatsCluster
from processes import stop

from tasktape.errors import LogBusy
from tasktape.eventlog import SCHEMA_VERSION, EventLog, LogWriter
from tasktape.eventlog.schema import schema_version
from tasktape.fleet.collector import Collector
from tasktape.fleet.jetstream import ensure_stream
from tasktape.fleet.names import STREAM, SUBJECTS, parse_servers
from tasktape.fleet.sqlite_sink import SqliteSink
from tasktape.fleet.wire import Rows, Table, decode, encode, subject


async def test_two_recorders_collect_into_one_log_that_equals_their_union(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    logs = [write_log(tmp_path / f"{name}.db", name) for name in ("a", "b")]
    for log in logs:
        await ship_once(log, nats_cluster.url)
    fleet = tmp_path / "fleet.db"
    expected = union(*map(shipped_rows, logs))
    stats = await collect_until(
        nats_cluster.url, fleet, lambda: fleet.exists() and shipped_rows(fleet) == expected
    )
    assert stats.refused == 0
    with EventLog(fleet) as log:
        assert {r["task_id"] for r in log.db.query("SELECT task_id FROM task_summary")} == {
            "task.a",
            "task.b",
        }
        hits = log.db.execute("SELECT count(*) FROM events_fts WHERE events_fts MATCH 'intermittent'")
        assert hits.fetchone()[0] == 4  # the full-text index holds the collected events


async def test_messages_in_any_order_and_twice_make_the_same_rows(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    live = tmp_path / "live.db"
    # A log whose exchange was shipped under way, then again once it ended.
    with LogWriter(live) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        w.chunk(ex, MS, b"data: {}\n\n")
        w.flush()
        await ship_once(live, nats_node.url)
        w.chunk(ex, 2 * MS, b"data: {}\n\n")
        w.end_exchange(ex, duration_ns=3 * MS).result()
        w.end_capture(cap)
    await ship_once(live, nats_node.url)
    logs = [live, write_log(tmp_path / "a.db", "a")]
    for log in logs[1:]:
        await ship_once(log, nats_node.url)
    messages = [decode(data) for data in await raw_messages(nats_node.url)]
    expected = union(*map(shipped_rows, logs))
    for seed in range(5):
        order = messages * 2
        random.Random(seed).shuffle(order)
        db = tmp_path / f"sink{seed}.db"
        with SqliteSink(db) as sink:
            for at in range(0, len(order), 3):
                sink.apply(order[at : at + 3])
        assert shipped_rows(db) == expected, seed


async def test_collectors_of_one_consumer_share_its_rows(nats_node: NatsCluster, tmp_path: Path) -> None:
    logs = [write_log(tmp_path / f"{n}.db", n) for n in "abcdef"]
    for log in logs:
        await ship_once(log, nats_node.url)
    fleet = tmp_path / "fleet.db"
    expected = union(*map(shipped_rows, logs))
    stopping = asyncio.Event()
    sinks = [SqliteSink(fleet), SqliteSink(fleet)]  # two collectors on one machine, one log
    collectors = [Collector(parse_servers(nats_node.url), s, consumer="shared", batch=2) for s in sinks]
    tasks = [asyncio.ensure_future(c.run(stopping)) for c in collectors]
    try:
        deadline = time.monotonic() + 30
        while shipped_rows(fleet) != expected:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    finally:
        stopping.set()
        stats = await asyncio.gather(*tasks)
        for sink in sinks:
            sink.close()
    assert all(s.messages > 0 for s in stats) and sum(s.messages for s in stats) == 30


def test_a_sink_is_not_shared_with_a_recorder(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.db"
    with LogWriter(fleet), pytest.raises(LogBusy):
        SqliteSink(fleet)
    with SqliteSink(fleet), pytest.raises(LogBusy):
        LogWriter(fleet)


def with_clickhouse(tmp_path: Path, command: str, url: str) -> subprocess.CompletedProcess[str]:
    """``tasktape collect`` or ``pull`` run with ``--clickhouse url`` (and no reachable broker
    or store: what it says of the URL comes first)."""
    args = {
        "collect": ["--from", "nats://127.0.0.1:9", "--clickhouse", url],
        "pull": ["--clickhouse", url, "--task", "t1", "--output", str(tmp_path / "p.db")],
    }[command]
    return subprocess.run(
        [sys.executable, "-m", "tasktape", command, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["collect", "pull"])
@pytest.mark.parametrize(
    ("query", "status", "said"),
    [
        (
            "password=sk-live-1",
            2,
            "http://127.0.0.1:9/?password=[REDACTED]: a ClickHouse URL gives password in",
        ),
        (
            "bogus=1&token=sk-live-1",
            1,
            "http://127.0.0.1:9/?bogus=1&token=[REDACTED]: the ClickHouse client takes no such URL: ",
        ),
    ],
)
def test_a_clickhouse_url_the_client_cannot_take_is_a_usage_error(
    tmp_path: Path, command: str, query: str, status: int, said: str
) -> None:
    """A password in the URL's query (it goes before the host), or an option the client does
    not know: refused in one line, the URL shown without its credentials, before anything
    is reached (no traceback). The first is told from the URL alone, bad input (exit 2);
    the second by the client, which is an extra's."""
    done = with_clickhouse(tmp_path, command, f"http://127.0.0.1:9/?{query}")
    assert done.returncode == status and said in done.stderr, done.stderr
    assert "sk-live" not in done.stderr + done.stdout and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["collect", "pull"])
def test_what_is_no_clickhouse_url_is_bad_input(tmp_path: Path, command: str) -> None:
    """`--clickhouse ftp://x` was exit 1 where every other malformed URL option is 2 (bad
    input); the URL is said without its password."""
    done = with_clickhouse(tmp_path, command, "ftp://user:sk-live-1@x")
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--clickhouse': 'ftp://x' is not a ClickHouse URL" in done.stderr
    assert "sk-live" not in done.stderr and not (tmp_path / "p.db").exists()


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999"])
def test_a_clickhouse_url_that_does_not_parse_is_bad_input(tmp_path: Path, url: str) -> None:
    """A broken IPv6 address was a traceback, a port out of range a failure (exit 1) once
    the client was made: both are bad input, said before anything is reached."""
    done = with_clickhouse(tmp_path, "pull", url)
    assert done.returncode == 2 and "the ClickHouse URL does not parse" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "p.db").exists()


def test_pull_into_a_file_that_is_no_event_log_is_bad_input_before_clickhouse_is_reached(
    tmp_path: Path,
) -> None:
    """`pull -o` a cassette tried ClickHouse first, and ended "cannot reach ClickHouse" (exit
    1) where its help says a file that is no event log is bad input (exit 2)."""
    cassette = tmp_path / "session.jsonl"
    cassette.write_text('{"tasktape_cassette": 1}\n')
    args = ["pull", "--clickhouse", "http://127.0.0.1:9", "--task", "t1", "-o", str(cassette)]
    done = subprocess.run(
        [sys.executable, "-m", "tasktape", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (
        2,
        f"Error: {cassette} is a cassette: pull writes an event log, not over it\n",
    )
    assert cassette.read_text() == '{"tasktape_cassette": 1}\n'


def test_a_broker_never_reached_is_said_and_until_idle_gives_up_on_it(tmp_path: Path) -> None:
    """The first connection is tried for a few seconds (no longer than --until-idle), then
    said (the NATS client alone would try for ever, silently); with --until-idle, the
    collector gives up on it, and exits 1."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    args = ["--from", f"nats://127.0.0.1:{port}", "--db", str(tmp_path / "c.db"), "--until-idle", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "tasktape", "collect", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert f"never reached nats://127.0.0.1:{port} (no connection in 1 s)" in done.stderr


def test_a_broker_lost_for_until_idle_is_given_up_on(nats_node: NatsCluster, tmp_path: Path) -> None:
    """Gone after the collector subscribed, the broker left it fetching nothing for ever
    (a fetch then times out, as when nothing comes): with --until-idle it gives up, exit 1."""
    args = ["--from", nats_node.url, "--db", str(tmp_path / "c.db"), "--until-idle", "6"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasktape", "collect", *args], stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(3)  # subscribed by then
        nats_node.kill(0)
        _, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 1 and f"lost {nats_node.url}" in err, err


async def test_a_message_that_is_not_rows_is_dropped_loudly(nats_node: NatsCluster, tmp_path: Path) -> None:
    log = write_log(tmp_path / "a.db", "a")
    await ship_once(log, nats_node.url)
    nc = await nats.connect(parse_servers(nats_node.url))
    await nc.jetstream().publish("tasktape.someone.else", b"not rows at all")
    # Rows, but not rows any sink can write: a row narrower than its columns, rows unnamed.
    narrow = Rows(Table.EVENTS, "c", ("exchange_uid", "seq", "data"), [("x", 1)])
    await nc.jetstream().publish("tasktape.c.events", encode(narrow))
    unnamed = Rows(Table.CAPTURES, "c", ("source",), [("x",)])
    await nc.jetstream().publish("tasktape.c.captures", encode(unnamed))
    await nc.close()
    await ship_once(log, nats_node.url)
    fleet = tmp_path / "fleet.db"
    said: list[str] = []
    with SqliteSink(fleet) as sink:
        collector = Collector(parse_servers(nats_node.url), sink, consumer="c", on_status=said.append)
        stopping = asyncio.Event()
        task = asyncio.ensure_future(collector.run(stopping))
        deadline = time.monotonic() + 20
        while shipped_rows(fleet) != shipped_rows(log) or collector.stats.refused < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        stopping.set()
        stats = await task
    assert stats.refused == 3
    assert [line for line in said if "WARNING" in line] == [
        "WARNING: tasktape.someone.else holds no tasktape rows (Expected `array`, got `int`); dropped",
        "WARNING: tasktape.c.events holds no tasktape rows (a events row of 2 values for 3 columns); dropped",
        "WARNING: tasktape.c.captures holds no tasktape rows (captures rows without uid); dropped",
    ]


async def test_a_message_a_sink_cannot_store_is_dropped_and_the_rest_of_its_batch_kept(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """A map as an event's data crashed every collector of the stream, for good (never
    acknowledged, it came back), rolling back the valid rows of its batch; exchanges with
    no uid were written as rows with none, once more at each redelivery."""
    log = write_log(tmp_path / "a.db", "a")
    x = "01a24f99-0000-7000-8000-0000000000bb"
    bad = [
        Rows(Table.EVENTS, "c", ("exchange_uid", "seq", "data"), [(x, 0, {"a": 1})]),
        Rows(Table.EXCHANGES, "c", ("capture_uid", "uid", "method"), [("c", None, "GET")]),
        Rows(Table.EVENTS, "c", ("exchange_uid", "seq", "data"), [(x, 2**64 - 1, "too big for SQLite")]),
    ]
    nc = await nats.connect(parse_servers(nats_node.url))
    await ensure_stream(nc.jetstream(), STREAM, SUBJECTS, 1)
    for rows in bad:
        await nc.jetstream().publish(subject(SUBJECTS, rows.table, "c"), encode(rows))
    await nc.close()
    await ship_once(log, nats_node.url)  # the same batch as the bad ones
    args = ["collect", "--from", nats_node.url, "--db", str(tmp_path / "fleet.db"), "--until-idle", "1"]
    runs = [
        subprocess.run(
            [sys.executable, "-m", "tasktape", *args], check=False, capture_output=True, text=True, timeout=60
        )
        for _ in range(2)  # the second finds nothing: the bad ones do not come again
    ]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert shipped_rows(tmp_path / "fleet.db") == shipped_rows(log)
    assert runs[0].stderr.splitlines() == [
        "tasktape collect: WARNING: tasktape.c.events holds no tasktape rows"
        " (a events row holds a dict, which no sink stores); dropped",
        "tasktape collect: WARNING: tasktape.c.exchanges holds no tasktape rows"
        " (a exchanges row without a value for capture_uid, uid); dropped",
        "tasktape collect: WARNING: tasktape.c.events holds rows the sink cannot store"
        " (OverflowError: Python int too large to convert to SQLite INTEGER); dropped",
    ]
    assert "stopped: 0 rows from 0 messages" in runs[1].stdout, runs[1].stdout
    assert runs[1].stderr == ""


async def test_a_consumer_or_stream_deleted_under_a_collector_is_made_again_and_collected_on(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """Fetching from a consumer gone (``nats consumer rm``, or its stream deleted and made
    again by a shipper) brought nothing, unsaid, for ever; with --until-idle the collector
    crashed on 'stream not found'."""
    logs = [write_log(tmp_path / f"{name}.db", name) for name in "abc"]
    fleet = tmp_path / "fleet.db"
    said: list[str] = []
    await ship_once(logs[0], nats_node.url)
    nc = await nats.connect(parse_servers(nats_node.url))
    with SqliteSink(fleet) as sink:
        collector = Collector(
            parse_servers(nats_node.url), sink, consumer="c", until_idle=8, on_status=said.append
        )
        task = asyncio.ensure_future(collector.run(asyncio.Event()))

        async def collected(*shipped: Path) -> None:
            expected = union(*map(shipped_rows, shipped))
            deadline = time.monotonic() + 20
            while shipped_rows(fleet) != expected:
                assert not task.done(), task.result()
                assert time.monotonic() < deadline, said
                await asyncio.sleep(0.1)

        try:
            await collected(logs[0])
            await nc.jetstream().delete_stream(STREAM)
            await ship_once(logs[1], nats_node.url)  # (made again by the shipper, or the collector)
            await collected(*logs[:2])
            await nc.jetstream().delete_consumer(STREAM, "c")
            await ship_once(logs[2], nats_node.url)
            await collected(*logs)
        finally:
            await nc.close()
            stats = await asyncio.wait_for(task, 60)
    assert stats.unreached is None
    made_again = (
        "the consumer c of TASKTAPE was gone from the broker: made again,"
        " it hands out the stream from its first message"
    )
    assert said.count(made_again) == 2, said
    assert said[-1] == "nothing new for 8 s: stopping"


async def test_a_collector_started_again_with_another_ack_wait_changes_its_consumers(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """--ack-wait was ignored once the durable consumer existed: it kept the first one's."""
    said: list[str] = []

    async def collect_with(ack_wait: float) -> float:
        with SqliteSink(tmp_path / "fleet.db") as sink:
            collector = Collector(
                parse_servers(nats_node.url), sink, consumer="c", ack_wait=ack_wait, until_idle=0.5,
                on_status=said.append,
            )  # fmt: skip
            await collector.run(asyncio.Event())
        nc = await nats.connect(parse_servers(nats_node.url))
        try:
            return float((await nc.jetstream().consumer_info(STREAM, "c")).config.ack_wait)
        finally:
            await nc.close()

    assert await collect_with(30) == 30
    assert await collect_with(2) == 2
    assert "the consumer c now hands out unacknowledged rows again after 2 s (it was 30 s)" in said, said
    assert await collect_with(2) == 2
    assert sum("now hands out" in line for line in said) == 1  # said only when it changes


@pytest.mark.parametrize("into", ["--db", "--clickhouse"])
async def test_rows_of_a_newer_schema_wait_for_a_collector_that_knows_them(
    nats_node: NatsCluster, tmp_path: Path, into: str
) -> None:
    rows = Rows(Table.CAPTURES, "cap-new", ("uid", "source", "column_of_tomorrow"), [("cap-new", "x", 1)])
    nc = await nats.connect(parse_servers(nats_node.url))
    await ensure_stream(nc.jetstream(), STREAM, SUBJECTS, 1)
    await nc.jetstream().publish(subject(SUBJECTS, Table.CAPTURES, "cap-new"), encode(rows))
    await nc.close()
    target = str(tmp_path / "fleet.db") if into == "--db" else f"chdb://{tmp_path / 'clickhouse'}"
    args = [
        sys.executable,
        "-m",
        "tasktape",
        "collect",
        "--from",
        nats_node.url,
        into,
        target,
        "--consumer",
        "c",
    ]
    ran = subprocess.run(
        [*args, "--until-idle", "0.5"], check=False, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 1
    assert "carry columns this tasktape does not know (column_of_tomorrow)" in ran.stderr, ran.stderr
    assert "upgrade the collector's tasktape" in ran.stderr
    nc = await nats.connect(parse_servers(nats_node.url))
    try:
        info = await nc.jetstream().consumer_info(STREAM, "c")
        assert info.num_pending + info.num_ack_pending == 1  # not acknowledged: it waits
    finally:
        await nc.close()


async def test_a_collector_killed_mid_batch_loses_and_duplicates_nothing(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    log, fleet = tmp_path / "big.db", tmp_path / "fleet.db"
    with LogWriter(log) as w:
        cap = w.begin_capture(source="record")
        for _ in range(40):
            ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
            w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
            for n in range(500):
                w.chunk(ex, n * MS, f'data: {{"n": {n}, "pad": "{"x" * 200}"}}\n\n'.encode())
            w.end_exchange(ex, duration_ns=MS)
        w.end_capture(cap)
    await ship_once(log, nats_node.url)
    args = [sys.executable, "-m", "tasktape", "collect", "--from", nats_node.url, "--db", str(fleet)]
    first = subprocess.Popen(
        [*args, "--ack-wait", "1", "--batch", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while _events(fleet) < 2000:  # some committed, most not yet
            assert time.monotonic() < deadline and first.poll() is None
            await asyncio.sleep(0.01)
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        stop(first)
    assert _events(fleet) < 20_000
    # The next collector stops by itself once it has everything: the messages the first
    # was handed and never acknowledged come to it once their ack wait is over.
    second = subprocess.run(
        [*args, "--ack-wait", "1", "--until-idle", "0.5"],
        check=False,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert second.returncode == 0, second.stderr
    assert shipped_rows(fleet) == shipped_rows(log)
    said = second.stdout.splitlines()
    assert said[0].startswith("tasktape collect: collecting TASKTAPE from"), said
    assert said[-2:-1] == ["tasktape collect: nothing new for 0.5 s: stopping"], said


async def test_a_log_locked_past_sqlites_wait_is_waited_for_and_nothing_is_lost(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """The log write-locked by another process for longer than SQLite waits (a long
    tasktape check saving findings, a sqlite-utils write) crashed the collector with
    'database is locked'."""
    log, fleet = write_log(tmp_path / "a.db", "a"), tmp_path / "fleet.db"
    await ship_once(log, nats_node.url)
    said: list[str] = []
    with SqliteSink(fleet, busy_timeout=0.5) as sink:  # (30 s by default)
        holder = subprocess.Popen(
            [sys.executable, "-c", "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]);"
             " c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(4)", str(fleet)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            collector = Collector(parse_servers(nats_node.url), sink, consumer="c", on_status=said.append)
            task = asyncio.ensure_future(collector.run(asyncio.Event()))
            deadline = time.monotonic() + 60
            while shipped_rows(fleet) != shipped_rows(log):
                assert not task.done(), task.result()
                assert time.monotonic() < deadline, said
                await asyncio.sleep(0.5)
        finally:
            stop(holder)
        assert not task.done()
        task.cancel()
    assert said.count(f"waiting for the log's lock: another process writes {fleet}") == 1, said


def _events(db: Path) -> int:
    """Events the sink holds (0 while the collector has yet to make it)."""
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


def test_collectors_started_together_on_a_new_log_all_collect_into_it(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """Collectors started at once on a log not made yet: one makes it, the others wait for
    it and find it made (none says it is another program's database, or locked)."""
    for trial in range(4):
        fleet = tmp_path / f"fleet{trial}.db"
        args = ["collect", "--from", nats_node.url, "--db", str(fleet), "--until-idle", "0.5"]
        collectors = [
            subprocess.Popen(
                [sys.executable, "-m", "tasktape", *args, "--consumer", f"c{trial}-{n}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(3)
        ]
        try:
            said = [c.communicate(timeout=60)[1] for c in collectors]
        finally:
            for c in collectors:
                stop(c)
        assert [c.returncode for c in collectors] == [0, 0, 0], (trial, said)
        assert schema_version(fleet) == SCHEMA_VERSION and "Error" not in "".join(said)
