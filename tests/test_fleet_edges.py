"""A fleet's edges, with real processes: names NATS refuses, a shipper that dies, sinks that
share a file name, a ClickHouse that is not there."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
from fleet_runs import ship_once
from log_rows import shipped_rows, write_log
from loopback import running, serve, stop, upstream_app
from nats_servers import NatsCluster


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
