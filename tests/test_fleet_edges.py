"""A fleet's edges, with real processes: names NATS refuses, a shipper that dies, sinks that
share a file name, a ClickHouse that is not there."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
from fleet_runs import collect_until, ship_once
from log_rows import MS, SSE, shipped_rows, write_log
from loopback import running, serve, stop, upstream_app
from nats_servers import NATS_SERVER, NatsCluster
from ports import free_port
from processes import stop as stop_process

from tasktape.eventlog import LogWriter
from tasktape.fleet.names import parse_servers
from tasktape.fleet.shipper import Backoff, Shipper, ShipStats
from tasktape.fleet.wire import Table


def _tasktape(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the tests read its status
        [sys.executable, "-m", "tasktape", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def _closed_port() -> int:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shipper_of(recorder: int) -> int:
    """The pid of a recorder's shipper process."""
    for child in Path(f"/proc/{recorder}/task/{recorder}/children").read_text().split():
        if b"ship_process" in Path(f"/proc/{child}/cmdline").read_bytes():
            return int(child)
    raise AssertionError(f"recorder {recorder} has no shipper process")


async def test_a_stream_name_nats_refuses_is_refused_at_start_and_a_shipper_that_dies_is_said(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """The shipper crashed on 'bad.name' (a traceback, then an abort in its shutdown) while
    the recorder recorded on without a word, and exited 0."""
    log = tmp_path / "rec.db"
    refused = _tasktape(
        "record", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--db", str(log),
        "--ship", nats_node.url, "--ship-stream", "bad.name",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "Invalid value for '--ship-stream': 'bad.name' cannot name a JetStream stream" in refused.stderr
    assert "none of them whitespace, '.', '*', '>', '/' or '\\'" in refused.stderr
    assert not log.exists()
    # A shipper that dies anyway (here, killed) is said at once, and again at the end.
    async with serve(upstream_app(events=3)) as agent:
        args = ["--upstream", agent, "--listen", "127.0.0.1:0", "--db", str(log), "--ship", nats_node.url]
        async with running("record", *args) as rec:
            os.kill(_shipper_of(rec.proc.pid), signal.SIGKILL)
            assert rec.proc.stderr is not None
            said = ""
            while "WARNING" not in said:  # (what it said before, if anything, is not the point)
                said = (await asyncio.wait_for(rec.proc.stderr.readline(), 10)).decode()
                assert said, "the recorder ended without a word"
            assert said == (
                "tasktape record: WARNING: shipping stopped: the shipper was killed by signal 9; every row "
                "recorded from now on waits in the log for its next shipping\n"
            )
            async with aiohttp.ClientSession() as session, session.post(f"{rec.url}/message:stream") as r:
                assert len(await r.read()) > 0
            assert await stop(rec, signal.SIGINT) == 0
    waiting = re.search(
        r"WARNING: shipping failed \(the shipper was killed by signal 9\): (\d+) rows wait in the log",
        rec.printed[-1],
    )
    assert waiting and int(waiting.group(1)) > 0, rec.printed


async def test_every_new_sink_gets_the_whole_stream_and_one_collected_before_resumes(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """The default consumer was named after the log's file name alone: a log made again
    under that name, or another folder's, got nothing (the consumer had acknowledged it
    all), and two of them collected side by side split the rows."""
    log = write_log(tmp_path / "a.db", "a")
    await ship_once(log, nats_node.url)

    def collect(into: str, target: str) -> subprocess.Popen[str]:
        args = ["collect", "--from", nats_node.url, into, target, "--until-idle", "1"]
        return subprocess.Popen([sys.executable, "-m", "tasktape", *args], stdout=subprocess.PIPE, text=True)

    def said(proc: subprocess.Popen[str]) -> str:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        return out

    sinks = [tmp_path / "a" / "fleet.db", tmp_path / "b" / "fleet.db"]
    for sink in sinks:
        sink.parent.mkdir()
    for out in map(said, [collect("--db", str(sink)) for sink in sinks]):  # side by side
        assert "stopped: 17 rows from 5 messages, 17 new" in out, out
    for sink in sinks:
        assert shipped_rows(sink) == shipped_rows(log)
    assert "stopped: 0 rows from 0 messages" in said(collect("--db", str(sinks[0])))  # it resumes
    for path in sinks[0].parent.iterdir():  # made again under the same name
        path.unlink()
    assert "stopped: 17 rows from 5 messages, 17 new" in said(collect("--db", str(sinks[0])))
    assert shipped_rows(sinks[0]) == shipped_rows(log)
    # So for ClickHouse: each database its own consumer.
    for store in (tmp_path / "a" / "clickhouse", tmp_path / "b" / "clickhouse"):
        assert "stopped: 17 rows from 5 messages" in said(collect("--clickhouse", f"chdb://{store}"))


def test_a_stream_or_consumer_name_nats_refuses_is_a_usage_error(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """It was a ValueError's traceback from NATS's client, exit 1."""
    for option in ("--stream", "--consumer"):
        for name in ("bad name", "bad.name"):
            ran = _tasktape(
                "collect", "--from", nats_node.url, "--db", str(tmp_path / "c.db"), option, name,
                "--until-idle", "1",
            )  # fmt: skip
            assert ran.returncode == 2, ran.stderr
            assert f"Invalid value for '{option}': '{name}' cannot name a JetStream stream" in ran.stderr
            assert "Traceback" not in ran.stderr
    assert not (tmp_path / "c.db").exists()


def test_a_stream_or_consumer_name_too_long_for_nats_is_a_usage_error(tmp_path: Path) -> None:
    """A stream's name of 300 characters was said as the broker being down, for ever (its
    'stream name is too long' taken for one to try again)."""
    for option in ("--stream", "--consumer"):
        ran = _tasktape(
            "collect", "--from", f"nats://127.0.0.1:{_closed_port()}", "--db", str(tmp_path / "c.db"),
            option, "é" * 128, "--until-idle", "1",
        )  # fmt: skip
        assert ran.returncode == 2, ran.stderr
        assert (
            f"Invalid value for '{option}': '{'é' * 20}'... cannot name a JetStream stream or consumer:"
            " it is 256 bytes long, and NATS takes at most 255"
        ) in ran.stderr, ran.stderr
    assert not (tmp_path / "c.db").exists()


def test_a_clickhouse_not_there_is_one_line_and_a_pull_makes_no_store(
    nats_node: NatsCluster, tmp_path: Path
) -> None:
    """A refused connection was clickhouse-connect's traceback; a pull from a chdb:// path
    that did not exist made a store there, and said nothing in it matched."""
    url = f"http://someone:secret@127.0.0.1:{_closed_port()}"
    line = f"Error: cannot reach ClickHouse at {url.replace('someone:secret@', '')}: Connection refused\n"
    pulled = _tasktape("pull", "--clickhouse", url, "--since", "2026-01-01", "-o", str(tmp_path / "t.db"))
    assert (pulled.returncode, pulled.stderr) == (1, line)
    collected = _tasktape("collect", "--from", nats_node.url, "--clickhouse", url, "--until-idle", "2")
    assert (collected.returncode, collected.stderr) == (1, line)
    assert "secret" not in collected.stdout
    nowhere = _tasktape("pull", "--clickhouse", "chdb://nowhere", "--task", "t", "-o", "t.db", cwd=tmp_path)
    assert nowhere.returncode == 1
    assert (
        nowhere.stderr
        == f"Error: nothing in chdb://nowhere: there is no ClickHouse store at {tmp_path}/nowhere\n"
    )
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "t.db").exists()


def _nats_server(root: Path, port: int, config: str) -> subprocess.Popen[bytes]:
    """A ``nats-server`` with JetStream on loopback at ``port`` (its store in ``root``, kept
    from one start to the next), with ``config`` besides, once it listens."""
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "nats.conf"
    conf.write_text(f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{root}" }}\n{config}\n')
    server = subprocess.Popen(
        [NATS_SERVER, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return server
        if server.poll() is not None or time.monotonic() > deadline:
            stop_process(server)
            raise AssertionError("nats-server did not start")
        time.sleep(0.05)


@contextlib.contextmanager
def _nats_configured(root: Path, config: str) -> Iterator[int]:
    """A ``nats-server`` with JetStream on loopback, with ``config`` besides: its port."""
    port = free_port()
    server = _nats_server(root, port, config)
    try:
        yield port
    finally:
        stop_process(server)


def test_a_wrong_password_is_said_as_such_and_no_password_is_shown(tmp_path: Path) -> None:
    """Passwords were printed in status lines, and a wrong one was 'no connection in 5 s'
    (the client's 'Authorization Violation' kept to itself) while it retried for ever."""
    with _nats_configured(tmp_path / "nats", "authorization { user: fleet, password: s3cr3tpw }") as port:
        wrong = _tasktape(
            "collect", "--from", f"nats://fleet:wrongpw@127.0.0.1:{port}", "--db", str(tmp_path / "c.db"),
            "--until-idle", "1",
        )  # fmt: skip
        assert wrong.returncode == 2, wrong.stderr
        assert (
            f"Invalid value for --from: nats://127.0.0.1:{port} refused the user and password given:"
            " Authorization Violation" in wrong.stderr
        ), wrong.stderr
        right = _tasktape(
            "collect", "--from", f"nats://fleet:s3cr3tpw@127.0.0.1:{port}", "--db", str(tmp_path / "c.db"),
            "--until-idle", "1",
        )  # fmt: skip
        assert right.returncode == 0, right.stderr
        assert f"collecting TASKTAPE from nats://127.0.0.1:{port} into" in right.stdout
    for out in (wrong.stdout, wrong.stderr, right.stdout, right.stderr):  # (s3cr3tpw, wrongpw)
        assert "pw" not in out and "fleet:" not in out


_PASSWORD = "authorization {{ user: fleet, password: {} }}"


async def _said(said: list[str], start: str, timeout: float = 10.0) -> None:
    """Until a line starting with ``start`` was said."""
    deadline = time.monotonic() + timeout
    while not any(line.startswith(start) for line in said):
        assert time.monotonic() < deadline, f"not said in {timeout} s: {start!r}: {said}"
        await asyncio.sleep(0.05)


BACKOFF = Backoff(0.1, 0.2)


class _Refused:
    """A shipper's run against a ``nats-server`` (on one port and store, restarted with
    another password when asked) that refuses or takes the shipper's (s3cr3tpw)."""

    def __init__(self, tmp_path: Path, password: str) -> None:
        self.tmp_path, self.port, self.store = tmp_path, free_port(), tmp_path / "nats"
        self.server = _nats_server(self.store, self.port, _PASSWORD.format(password))
        self.log = write_log(tmp_path / "a.db", "a")
        self.said: list[str] = []
        self.url = f"nats://fleet:s3cr3tpw@127.0.0.1:{self.port}"
        refused = f"nats://127.0.0.1:{self.port} refused the user and password given: Authorization Violation"
        self.paused = (
            f"WARNING: shipping paused: {refused}; rows wait in the log, and go out once the servers take"
            " them (asked again after 0.1 s, then less and less often, every 0.2 s at most)"
        )

    def restart(self, password: str) -> None:
        stop_process(self.server)
        self.server = _nats_server(self.store, self.port, _PASSWORD.format(password))

    @contextlib.asynccontextmanager
    async def shipping(self, shipper: Shipper) -> AsyncIterator[asyncio.Future[ShipStats]]:
        """``shipper`` running until the block ends; the server stopped then too."""
        self._stop = asyncio.Event()
        self._shipping = asyncio.ensure_future(shipper.run(self._stop))
        try:
            yield self._shipping
        finally:
            self._stop.set()
            await asyncio.gather(self._shipping, return_exceptions=True)
            shipper.close()
            stop_process(self.server)

    async def taken(self) -> ShipStats:
        """The server restarted with the shipper's password: it catches up, and stops; what
        a collector then gathers is what the log holds."""
        self.restart("s3cr3tpw")
        await _said(self.said, "shipping: caught up")
        self._stop.set()
        stats = await self._shipping
        sink = self.tmp_path / "fleet.db"
        await collect_until(
            self.url, sink, lambda: sink.exists() and shipped_rows(sink) == shipped_rows(self.log)
        )
        return stats


async def test_a_password_refused_at_start_is_said_once_and_shipping_starts_once_it_is_taken(
    tmp_path: Path,
) -> None:
    """Shipping stopped for good on the servers' first refusal: a password put right on the
    servers afterwards was never taken up, until the log was shipped again by hand."""
    run = _Refused(tmp_path, "otherpw")
    shipper = Shipper(
        run.log, parse_servers(run.url), on_status=run.said.append, refused_backoff=BACKOFF, first_connect=1
    )
    async with run.shipping(shipper):
        await _said(run.said, "WARNING")
        await asyncio.sleep(2.5)  # refused again, twice at least
        stats = await run.taken()
    said, port = run.said, run.port
    assert [line for line in said if line.startswith("WARNING")] == [run.paused], said
    assert f"shipping: nats://127.0.0.1:{port} took the user and password: shipping again" in said
    assert (stats.rows, stats.duplicates, stats.waiting) == (17, 0, 0)
    for line in said:
        assert "pw" not in line and "fleet:" not in line


async def test_a_password_the_servers_refuse_later_is_said_and_shipping_goes_on_once_they_take_it(
    tmp_path: Path,
) -> None:
    """Servers restarted with another password under a running shipper: its rows were said
    to wait for 'no answer in time', and nothing said the servers refused its password."""
    run = _Refused(tmp_path, "s3cr3tpw")
    shipper = Shipper(run.log, parse_servers(run.url), on_status=run.said.append, refused_backoff=BACKOFF)
    async with run.shipping(shipper) as shipping:
        while shipper.cursor.rows < 17:
            assert not shipping.done(), shipping.result()
            await asyncio.sleep(0.05)
        run.restart("otherpw")
        with LogWriter(run.log) as w:  # the recorder records on
            cap = w.begin_capture(source="record")
            ex = w.begin_exchange(cap, method="GET", path="/later", started_ns=time.time_ns())
            w.end_exchange(ex, duration_ns=MS)
            w.end_capture(cap)
        await _said(run.said, "WARNING")
        await asyncio.sleep(1)  # (the client is refused every quarter of a second meanwhile)
        stats = await run.taken()
    said, port = run.said, run.port
    assert [line for line in said if line.startswith("WARNING")] == [run.paused], said
    assert said[-2:] == [
        f"shipping: nats://127.0.0.1:{port} took the user and password: shipping again",
        "shipping: caught up (19 rows shipped in all)",
    ], said
    assert stats.waiting == 0


async def test_each_row_too_big_for_a_server_is_named_as_it_is_left_out(tmp_path: Path) -> None:
    """Rows too big for a server with a small max_payload, in a message halved to fit it,
    were all named by the message's first rowid (rowid 28 for 29, 32 and 35)."""
    log = tmp_path / "big.db"
    with LogWriter(log) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        for seq in range(6):  # the odd ones over 64 KiB
            data = b"x" * (70_000 if seq % 2 else 10)
            w.chunk(ex, (seq + 1) * MS, b'data: "' + data + b'"\n\n')
        w.end_exchange(ex, duration_ns=9 * MS).result()
    (uid,) = sqlite3.connect(log).execute("SELECT uid FROM exchanges").fetchone()
    with _nats_configured(tmp_path / "nats", "max_payload: 65536") as port:
        said: list[str] = []
        stats = await ship_once(log, f"nats://127.0.0.1:{port}", on_status=said.append)
    assert stats.too_large == 3
    named = [re.sub(r", [\d,]+ bytes encoded.*", "", line) for line in said if line.startswith("WARNING")]
    assert named == [f"WARNING: a row of events (exchange_uid {uid}, seq {seq}" for seq in (1, 3, 5)]


async def test_a_part_stored_after_the_rest_of_its_window_makes_no_reconnect(tmp_path: Path) -> None:
    """A window's part published again (it failed) was acknowledged before the window's
    later parts, stored before it: their lower numbers looked like a stream made again, and
    the round was shipped again after a reconnect, for nothing."""
    log = tmp_path / "a.db"
    with LogWriter(log) as w:
        cap = w.begin_capture(source="record")
        ex = w.begin_exchange(cap, method="POST", path="/message:stream", started_ns=time.time_ns())
        w.response_head(ex, status=200, headers=SSE, is_sse=True, ttfb_ns=MS)
        for seq in range(6):  # 120 KB of events, in a message of their own
            w.chunk(ex, (seq + 1) * MS, b'data: "' + b"x" * 20_000 + b'"\n\n')
        w.end_exchange(ex, duration_ns=9 * MS).result()
    with _nats_configured(tmp_path / "nats", "max_payload: 65536") as port:
        shipper = Shipper(log, parse_servers(f"nats://127.0.0.1:{port}"))
        try:
            js = await shipper._connect()
            messages = {m.table: m for m in shipper._read_round().messages}
            # The events first, too big for the server as they are (as for one reconnected to
            # a server that takes less): they fail, and go again in parts after the capture.
            window = [messages[Table.EVENTS], messages[Table.CAPTURES]]
            assert len(window[0].payload) > 65536
            left_out = await shipper._publish_window(js, window)
            gone = shipper._gone
            await shipper._nc.close()
        finally:
            shipper.close()
    assert (left_out, gone, shipper.stats.rows, shipper.stats.duplicates) == (0, False, 7, 0)
