"""`tasktape record` as a user runs it: a real process, signals, exit statuses, and a
SIGKILL that loses nothing forwarded more than 100 ms before it."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from a2a_frames import completed_run, sse
from aiohttp import web
from loopback import Running, finished, running, serve, upstream_app
from ports import free_port

from tasktape.eventlog import EventLog, ExchangeSummary
from tasktape.record import describe_exchange
from tasktape.serving import serve_until_stopped


@asynccontextmanager
async def tasktape_record(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    async with running("record", "--listen", "127.0.0.1:0", *args) as run:
        assert re.match(r"tasktape record: listening on http://127\.0\.0\.1:\d+ -> ", run.printed[0])
        yield run.proc, run.url


def quiet_recorder(
    upstream: str, db: Path, preexec_fn: Callable[[], None]
) -> AbstractAsyncContextManager[Running]:
    """``tasktape record --quiet`` in front of ``upstream``, started by ``preexec_fn``."""
    args = ["--listen", "127.0.0.1:0", "--upstream", upstream, "--db", str(db), "--quiet"]
    return running("record", *args, preexec_fn=preexec_fn)


async def post_stream(url: str) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/message:stream", json={}) as r:
        return await r.read()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_prints_one_line_per_exchange_and_flushes_on_signal(
    tmp_path: Path, sig: signal.Signals
) -> None:
    db = tmp_path / "captures.db"
    async with (
        serve(upstream_app()) as upstream,
        tasktape_record("--upstream", upstream, "--db", str(db)) as (
            proc,
            url,
        ),
    ):
        for _ in range(2):
            assert await post_stream(url) == b"".join(sse(completed_run(), ids="e"))
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 10)).decode() for _ in range(2)]  # type: ignore[union-attr]
        proc.send_signal(sig)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    for line in lines:
        pattern = (
            r"POST /message:stream 200  task task\.1  COMPLETED  10 events, first after [\d.]+ ms  took "
        )
        assert re.match(pattern + r"[\d.]+ ms$", line.strip()), line
    with EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["complete", "complete"]
        (capture,) = log.captures()
        assert capture["source"] == "record" and capture["upstream"] == upstream


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_a_signal_to_the_whole_process_group_loses_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    """timeout(1), systemd and a terminal (Ctrl-C, or closing it) signal the recorder's log
    writer too: it keeps writing until the recorder has stopped, and the log holds every
    exchange."""
    db = tmp_path / "captures.db"
    async with (
        serve(upstream_app(events=2000)) as upstream,
        quiet_recorder(upstream, db, os.setpgrp) as run,
    ):
        bodies = await asyncio.gather(*(post_stream(run.url) for _ in range(5)))
        os.killpg(run.proc.pid, sig)
        status = await asyncio.wait_for(run.proc.wait(), 30)
        err = (await run.proc.stderr.read()).decode()  # type: ignore[union-attr]
    assert status == 0, err
    assert "FAILED" not in err and "could not be written" not in err, err
    with EventLog(db) as log:
        exchanges = log.exchanges()
        assert [x["outcome"] for x in exchanges] == ["complete"] * 5
        events = [len(log.events(x["id"])) for x in exchanges]
        assert events == [2000] * 5 == [b.count(b"\n\n") for b in bodies]


def recorder_process(upstream: str, db: Path, **streams: int) -> subprocess.Popen[bytes]:
    """``tasktape record`` in front of ``upstream``, its standard output a pipe (and
    ``streams``: stderr as Popen takes it)."""
    args = [sys.executable, "-m", "tasktape", "record", "--listen", "127.0.0.1:0", "--upstream", upstream]
    return subprocess.Popen([*args, "--db", str(db)], stdout=subprocess.PIPE, **streams)


@pytest.mark.parametrize("stderr", ["its own", "the same pipe"])
async def test_a_recorder_whose_output_is_closed_goes_on_and_stops_as_ever(
    tmp_path: Path, stderr: str
) -> None:
    """`tasktape record | head -1` (to learn the address) then Ctrl-C: the first exchange
    after head had gone warned that the on_exchange callback raised (BrokenPipeError), and
    the recorder exited 1, though its log was whole. It goes on without printing, says so
    once, and a Ctrl-C stops it with status 0."""
    db = tmp_path / "captures.db"
    streams = {"stderr": subprocess.PIPE if stderr == "its own" else subprocess.STDOUT}
    async with serve(upstream_app(events=20)) as upstream:
        proc = recorder_process(upstream, db, **streams)
        try:
            assert proc.stdout is not None
            first = (await asyncio.to_thread(proc.stdout.readline)).decode()
            url = re.search(r"listening on (http://\S+)", first)
            assert url, first
            proc.stdout.close()  # (as head does, once it has its line)
            bodies = [await post_stream(url[1]) for _ in range(3)]
            proc.send_signal(signal.SIGINT)
            status = await asyncio.to_thread(proc.wait, 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
        err = proc.stderr.read().decode() if proc.stderr else ""
    assert status == 0, err
    assert [b.count(b"\n\n") for b in bodies] == [20] * 3
    if stderr == "its own":  # (the exchanges are said as the log has them: maybe after the stop)
        assert sorted(err.splitlines()) == [
            "tasktape record: standard output cannot be written (it was closed): exchanges are no longer"
            " printed; the recording goes on",
            "tasktape record: stopping; flushing the log",
        ]
    with EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["complete"] * 3


async def test_ctrl_c_before_the_recorder_listens_stops_it_as_after(tmp_path: Path) -> None:
    """Ctrl-C while the recorder started (its log writer starting) ended it with click's
    "Aborted!" and status 1, where its help says a Ctrl-C stops it with 0."""
    db = tmp_path / "captures.db"
    proc = recorder_process("http://127.0.0.1:9", db, stderr=subprocess.PIPE)
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        while proc.poll() is None and not children.read_text().split():  # its log writer starts
            time.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"Aborted" not in err and b"Traceback" not in err, err


# Ctrl-C landing while `tasktape record` loads the recorder (aiohttp), after the command
# line itself loaded.
_INTERRUPTED_AS_RECORD_LOADS = """
import os, signal, sys
class Interrupting:
    def find_spec(self, name, path, target=None):
        if name == "aiohttp":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Interrupting())
from tasktape.cli import run
run()
"""


def test_ctrl_c_while_the_recorder_loads_stops_it_as_after(tmp_path: Path) -> None:
    """Ctrl-C while the recorder loaded ended it with click's "Aborted!" and status 1."""
    db = tmp_path / "captures.db"
    args = ["record", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--db", str(db)]
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AS_RECORD_LOADS, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not db.exists()


async def test_a_recorder_started_under_nohup_keeps_ignoring_sighup(tmp_path: Path) -> None:
    def under_nohup() -> None:
        os.setpgrp()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    db = tmp_path / "captures.db"
    async with (
        serve(upstream_app(events=50)) as upstream,
        quiet_recorder(upstream, db, under_nohup) as run,
    ):
        os.killpg(run.proc.pid, signal.SIGHUP)
        await asyncio.sleep(0.5)  # a recorder stopping would have closed its port by now
        body = await post_stream(run.url)  # still recording
        assert run.proc.returncode is None and body.count(b"\n\n") == 50
        run.proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run.proc.wait(), 30) == 0
    with EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["complete"]


async def test_a_full_log_never_stops_traffic_and_sets_the_exit_status(tmp_path: Path) -> None:
    db = tmp_path / "captures.db"
    async with (
        serve(upstream_app(events=3000)) as upstream,
        tasktape_record("--upstream", upstream, "--db", str(db), "--max-log-size", "600000", "--quiet") as (
            proc,
            url,
        ),
    ):
        received = await post_stream(url)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 3
        err = (await proc.stderr.read()).decode()  # type: ignore[union-attr]
    assert len(received) == len(b"".join(sse((completed_run() * 301)[:3000], ids="e")))
    assert "WRITING THE LOG FAILED" in err and "rows could not be written" in err
    with EventLog(db) as log:  # what was written stays readable
        assert log.exchanges()[0]["method"] == "POST"


async def read_timed(url: str, arrivals: list[tuple[float, bytes]]) -> None:
    """Read a stream, noting when each piece arrived."""
    async with aiohttp.ClientSession() as s, s.post(f"{url}/message:stream", json={}) as r:
        async for data in r.content.iter_any():
            arrivals.append((time.monotonic(), data))


async def test_sigkill_loses_nothing_forwarded_100ms_before(tmp_path: Path, stress: bool) -> None:
    rng = random.Random(11)
    async with serve(upstream_app(events=400, delay=0.005)) as upstream:
        for run in range(25 if stress else 3):
            db = tmp_path / f"killed{run}.db"
            async with tasktape_record("--upstream", upstream, "--db", str(db), "--quiet") as (proc, url):
                arrivals: list[tuple[float, bytes]] = []
                reader = asyncio.create_task(read_timed(url, arrivals))
                await asyncio.sleep(0.3 + rng.random())
                killed_at = time.monotonic()
                os.kill(proc.pid, signal.SIGKILL)
                await proc.wait()
                with pytest.raises(aiohttp.ClientError):
                    await reader
            durable = b"".join(data for at, data in arrivals if at < killed_at - 0.1)
            assert durable, "nothing was forwarded before the kill"
            with sqlite3.connect(db) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            with EventLog(db) as log:
                (x,) = log.exchanges()
                assert log.body(x["id"]).startswith(durable)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--upstream", "ftp://x"], "http:// or https:// URL"),
        (["--upstream", "http://x", "--listen", "127.0.0.1:99999"], "port from 0 to 65535"),
        # A bare IPv6 address: its last group could be meant as the port, so it is refused.
        (["--upstream", "http://x", "--listen", "::1"], "write an IPv6 address in brackets, then its port"),
        (["--upstream", "http://x", "--listen", "::1:8080"], "as [::1]:PORT"),
        (["--upstream", "http://x", "--redact-json", "no/slash"], "must start with '/'"),
        ([], "Missing option '--upstream'"),
        (["--upstream", "http://x", "--hold", "5"], "--hold acts only with --resume, which is not given"),
        (
            ["--upstream", "http://x", "--resume-unknown", "forward"],
            "--resume-unknown acts only with --resume",
        ),
        (["--upstream", "http://x", "--ship-drain", "1"], "--ship-drain acts only with --ship"),
        (["--upstream", "http://x", "--public-url", "notaurl"], "the public URL must be an http:// or"),
        (["--upstream", "http://x/api?team=1"], "the upstream cannot have a query string or a fragment"),
        (["--upstream", "http://x/api#top"], "the upstream cannot have a query string or a fragment"),
        # A range lets NaN through (it is neither below nor above it): a hold that never ends.
        (["--upstream", "http://x", "--resume", "--hold", "nan"], "'nan' is not a finite number"),
        (["--upstream", "http://x", "--resume", "--rejoin-for", "inf"], "'inf' is not a finite number"),
        # Below what an empty log takes: the log was past it at once, and grew on.
        (["--upstream", "http://x", "--max-log-size", "100000"], "--max-log-size: an empty log takes"),
    ],
)
async def test_bad_arguments_are_explained(tmp_path: Path, args: list[str], message: str) -> None:
    status, err = await finished("record", "--db", str(tmp_path / "x.db"), *args)
    assert status == 2 and message in err and "WARNING" not in err


@pytest.mark.parametrize("upstream", ["http://bob:sk-pass#word@127.0.0.1:1", "ftp://bob:sk-pass?word@x"])
async def test_a_bad_upstream_is_explained_without_its_password(tmp_path: Path, upstream: str) -> None:
    status, err = await finished("record", "--db", str(tmp_path / "x.db"), "--upstream", upstream)
    assert status == 2 and "sk-pass" not in err and "bob" not in err
    assert "@" not in err and upstream.rpartition("@")[2] in err


@pytest.mark.parametrize(
    "upstream", ["http://agent.example/api?team=sk-team-1&v=1", "ftp://agent.example/?team=sk-team-1&v=1"]
)
async def test_a_bad_upstream_is_explained_with_the_user_s_query_names_redacted(
    tmp_path: Path, upstream: str
) -> None:
    """``--redact-query team`` keeps ``team`` out of the log: the error about the URL
    showed it all the same, only the default names redacted."""
    args = ["--db", str(tmp_path / "x.db"), "--redact-query", "team", "--upstream", upstream]
    status, err = await finished("record", *args)
    assert status == 2 and "sk-team-1" not in err
    assert upstream.replace("sk-team-1", "[REDACTED]") in err


async def test_an_upstream_at_the_recorder_s_own_address_is_explained_without_its_password(
    tmp_path: Path,
) -> None:
    """The refusal to forward to itself printed the upstream as given, password and all."""
    port = free_port()  # to listen on, and to name as the upstream
    upstream = f"http://bob:sk-pass@127.0.0.1:{port}"
    args = ["--db", str(tmp_path / "x.db"), "--listen", f"127.0.0.1:{port}", "--upstream", upstream]
    status, err = await finished("record", *args)
    assert status == 2 and "sk-pass" not in err and "bob" not in err
    assert f"http://127.0.0.1:{port} is this recorder's own address" in err


async def test_a_log_in_a_folder_that_is_not_there_is_explained(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "x.db"
    status, err = await finished("record", "--upstream", "http://127.0.0.1:9", "--db", str(missing))
    assert status == 2 and "Traceback" not in err  # (bad input, as every command says it)
    assert f"cannot open {missing} as an event log" in err and f"its folder {missing.parent} does not" in err


async def test_a_busy_port_is_explained(tmp_path: Path) -> None:
    async with serve(upstream_app()) as upstream:
        port = upstream.rsplit(":", 1)[1]
        args = ["--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "x.db")]
        status, err = await finished("record", *args)
    assert status == 1 and f"cannot listen on 127.0.0.1:{port}" in err


def test_lines_for_other_exchanges() -> None:
    rpc = ExchangeSummary(
        7,
        is_sse=True,
        method="POST",
        path="/",
        status=200,
        events=3,
        task_id="t1",
        protocol="a2a",
        binding="jsonrpc",
        rpc_method="SubscribeToTask",
        final_state="TASK_STATE_CANCELED",
        first_event_ns=2_500_000,
        duration_ns=9_000_000,
        outcome="client_disconnected",
    )
    assert describe_exchange(rpc) == (
        "POST / (SubscribeToTask) 200  task t1  CANCELED  3 events, first after 2.5 ms  took 9.0 ms  "
        "[client_disconnected]"
    )
    plain = ExchangeSummary(
        8,
        method="GET",
        path="/.well-known/agent-card.json",
        status=200,
        duration_ns=1_200_000,
        outcome="complete",
    )
    assert describe_exchange(plain) == "GET /.well-known/agent-card.json 200  took 1.2 ms"
    mcp = ExchangeSummary(
        9,
        is_sse=True,
        method="POST",
        path="/mcp",
        status=200,
        events=4,
        protocol="mcp",
        rpc_method="tools/call",
        final_state="result",
        first_event_ns=1_000_000,
        duration_ns=3_000_000,
        outcome="complete",
    )
    assert (
        describe_exchange(mcp)
        == "POST /mcp (tools/call) 200  result  4 events, first after 1.0 ms  took 3.0 ms"
    )


async def test_stopping_with_a_stream_open_is_quick_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "captures.db"
    async with (
        serve(upstream_app(events=1000, delay=0.05)) as upstream,
        tasktape_record("--upstream", upstream, "--db", str(db), "--quiet") as (proc, url),
    ):
        reader = asyncio.create_task(read_timed(url, []))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert time.monotonic() - started < 10
        with pytest.raises(aiohttp.ClientError):
            await reader
    with EventLog(db) as log:
        (x,) = log.exchanges()
        assert (x["outcome"], x["error"]) == ("proxy_stopped", "tasktape record stopped during the exchange")
        assert log.captures()[0]["ended_at"]


async def test_stopping_while_a_reconnected_client_follows_says_the_recorder_stopped(tmp_path: Path) -> None:
    db = tmp_path / "captures.db"
    async with (
        serve(upstream_app(events=1000, delay=0.05)) as upstream,
        tasktape_record("--upstream", upstream, "--db", str(db), "--quiet", "--resume") as (proc, url),
    ):
        async with aiohttp.ClientSession() as s, s.post(f"{url}/message:stream", json={}) as r:
            first = await r.content.readuntil(b"\n\n")
        last_id = re.search(rb"^id: (.*)$", first, re.M).group(1).decode()  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as s:
            headers = {"Last-Event-ID": last_id}
            async with s.post(f"{url}/message:stream", json={}, headers=headers) as r:
                await r.content.readuntil(b"\n\n")
                proc.send_signal(signal.SIGINT)
                assert await asyncio.wait_for(proc.wait(), 20) == 0
    with EventLog(db) as log:
        held, follower = log.exchanges()
    assert held["outcome"] == follower["outcome"] == "proxy_stopped"
    assert follower["error"] == "tasktape record stopped while this client followed the stream"


def test_the_recorder_loads_only_what_recording_needs() -> None:
    """Not the log reader, sqlite-utils (nor the numpy it imports when installed), Datasette
    or the demo: the recording process starts sooner and stays smaller. Its log writer
    process loads sqlite-utils (without numpy: see test_log_writer)."""
    code = "import sys; from tasktape.cli import main; main.get_command(None, 'record'); print(*sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(result.stdout.split())
    assert {"tasktape.proxy.recorder", "tasktape.eventlog.process_writer", "tasktape.record"} <= loaded
    unwanted = {"sqlite_utils", "numpy", "pandas", "datasette", "tasktape.eventlog.reader", "tasktape.demo"}
    assert not loaded & unwanted


def test_serving_keeps_the_start_up_heap_out_of_collections() -> None:
    """Every long-running command (record, replay, agent) freezes what start-up allocated
    once it listens, so that full collections traverse only what serving allocates."""
    frozen = []

    def ready(url: str) -> str:
        frozen.append(gc.get_freeze_count())
        os.kill(os.getpid(), signal.SIGINT)  # the server's own handler stops it
        return f"listening on {url}"

    gc.unfreeze()
    try:
        asyncio.run(serve_until_stopped(web.Application(), "127.0.0.1", 0, ready, stopping="stopping"))
    finally:
        gc.unfreeze()
    assert frozen[0] > 10_000  # the interpreter's and aiohttp's objects, at the least


@pytest.mark.parametrize(
    ("stdout", "said"),
    [
        ("closed", "standard output cannot be written (it was closed): nothing more is printed on it"),
        ("none", "there is no standard output: nothing is printed on it"),
    ],
)
async def test_a_recorder_whose_output_is_gone_before_it_listens_says_where_and_goes_on(
    tmp_path: Path, stdout: str, said: str
) -> None:
    """`tasktape record ... | true`: standard output closed before the listening line, which
    failed (BrokenPipeError), and the recorder exited 1 having recorded nothing; with none at
    all (`>&-`), the line went nowhere, unsaid. It goes to standard error, saying why, and the
    recorder records as ever."""
    db = tmp_path / "captures.db"
    args = ["-m", "tasktape", "record", "--listen", "127.0.0.1:0", "--upstream"]
    async with serve(upstream_app(events=5)) as upstream:
        command = [sys.executable, *args, upstream, "--db", str(db)]
        if stdout == "none":
            command = ["bash", "-c", 'exec "$@" >&-', "bash", *command]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()  # (as `| true` does, before the recorder says anything)
            # (a recorder that says nothing would keep a bare read waiting: the kill ends it)
            first = (await asyncio.wait_for(asyncio.to_thread(proc.stderr.readline), 60)).decode()
            url = re.search(r"^tasktape record: listening on (http://\S+)", first)
            assert url, first
            second = (await asyncio.to_thread(proc.stderr.readline)).decode()
            body = await post_stream(url[1])
            proc.send_signal(signal.SIGINT)
            status = await asyncio.to_thread(proc.wait, 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    assert second == f"tasktape record: {said}\n"
    assert status == 0 and body.count(b"\n\n") == 5
    with EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["complete"]
