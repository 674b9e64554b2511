"""Capture with mitmproxy: real mitmdump processes running the tasktape addon, in front of
the demo agent and the official a2a-sdk agent, as a reverse proxy and as an explicit HTTP
proxy. What they record matches what ``tasktape record`` records of the same traffic."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner
from conftest import RecordFactory, Recording
from loopback import answering, raw_upstream, serve
from mitmproxy import exceptions, http, optmanager
from mitmproxy.connection import ConnectionState
from mitmproxy.test import taddons, tflow
from ports import free_port
from sdk_agent import SdkAgent, run_sdk_agent
from sdk_client import stream_message

from tasktape.cli import main
from tasktape.eventlog import EventLog
from tasktape.mitm_command import addon_path
from tasktape.proxy.mitm_addon import TasktapeRecorder
from tasktape.proxy.mitm_flows import ending

MITMDUMP = str(Path(sys.executable).with_name("mitmdump"))
SECRET = "sk-mitm-secret-27182818"
EVENT_FIELDS = ("kind", "state", "artifact_type", "append", "last_chunk", "text", "event_type", "complete")
BINDINGS = ["rest", "jsonrpc"]


# -- processes ------------------------------------------------------------------------------


@dataclass
class Proc:
    process: subprocess.Popen[bytes]
    output: Path

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.process.args} did not stop:\n{self.output.read_text()}") from None


def wait_listening(proc: Proc, ports: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    for port in ports:
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.process.poll() is not None or time.monotonic() > deadline:
                proc.stop()
                raise AssertionError(f"{proc.process.args} did not start:\n{proc.output.read_text()}")
            time.sleep(0.05)


@contextlib.contextmanager
def running(args: list[str], ports: list[int], output: Path) -> Iterator[Proc]:
    """A process started, listening on ``ports``, and stopped (SIGINT) on exit."""
    with output.open("wb") as out:
        proc = Proc(
            subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL), output
        )
    try:
        wait_listening(proc, ports)
        yield proc
    finally:
        proc.stop()


def mitmdump_args(confdir: Path, *modes: str) -> list[str]:
    """mitmdump options for a test: its CA in ``confdir``, not ~/.mitmproxy; quiet."""
    args = ["--set", f"confdir={confdir}", "--set", "termlog_verbosity=warn", "--set", "flow_detail=0"]
    for mode in modes:
        args += ["--mode", mode]
    return args


# An addon noting, in the file MARKS, each response head mitmproxy has read and each flow it
# ended with an error ("responseheaders /path", "error /path"): a test waits for one before
# acting on a flow mitmproxy holds (a head it keeps while buffering the body), or on its end.
SEEN = """
class Seen:
    def note(self, hook, flow):
        with open(MARKS, "a") as f:
            f.write(f"{hook} {flow.request.path}\\n")

    def responseheaders(self, flow):
        self.note("responseheaders", flow)

    def error(self, flow):
        self.note("error", flow)

addons = [Seen()]
"""


def seen_by_mitmproxy(folder: Path) -> tuple[Path, Path]:
    """The SEEN addon written in ``folder``: its script, and the file it notes in."""
    script, marks = folder / "seen.py", folder / "seen.txt"
    script.write_text(f"MARKS = {str(marks)!r}\n{SEEN}")
    return script, marks


def wait_for_mark(marks: Path, mark: str, timeout: float = 10) -> None:
    """Until the SEEN addon has noted ``mark`` ("responseheaders /path")."""
    deadline = time.monotonic() + timeout
    while not (marks.exists() and mark in marks.read_text().splitlines()):
        if time.monotonic() > deadline:
            raise AssertionError(f"mitmproxy did not get to {mark}")
        time.sleep(0.05)


# -- reading the logs -----------------------------------------------------------------------


def digest(log: EventLog, x: dict[str, Any]) -> tuple[Any, ...]:
    """An exchange as both recorders must agree on it: everything but ids, times and bytes
    that differ per run."""
    events = tuple(tuple(e[f] for f in EVENT_FIELDS) for e in log.events(x["id"]))
    return (
        x["method"],
        x["path"],
        x["status"],
        x["is_sse"],
        x["binding"],
        x["rpc_method"],
        x["outcome"],
        events,
    )


def wait_for_exchanges(db: Path, after: int, count: int, timeout: float = 10) -> list[dict[str, Any]]:
    """The first ``count`` exchanges with ids above ``after``, once all of them have ended."""
    deadline = time.monotonic() + timeout
    while True:
        if db.exists():
            with EventLog(db) as log:
                rows = [x for x in log.exchanges() if x["id"] > after][:count]
            if len(rows) == count and all(x["outcome"] for x in rows):
                return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"{db}: expected {count} ended exchanges after #{after}")
        time.sleep(0.05)


def last_id(db: Path) -> int:
    if not db.exists():
        return 0
    with EventLog(db) as log:
        return max((x["id"] for x in log.exchanges()), default=0)


def digests(db: Path, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    with EventLog(db) as log:
        return [digest(log, x) for x in rows]


async def recorded_by_tasktape_record(rec: Recording) -> list[tuple[Any, ...]]:
    with await rec.log() as log:
        return [digest(log, x) for x in log.exchanges()]


# -- the shared processes -------------------------------------------------------------------


@dataclass
class Mitm:
    """One ``tasktape mitm`` process for the module, with four listeners."""

    db: Path
    demo: str  # reverse proxy to the demo agent
    sdk: str  # reverse proxy to the a2a-sdk agent
    forward: str  # an explicit HTTP proxy
    dead: str  # reverse proxy to a port nobody listens on
    demo_agent: str
    sdk_agent: str


@pytest.fixture(scope="module")
def demo_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    args = [sys.executable, "-m", "tasktape", "agent", "--listen", f"127.0.0.1:{port}", "--pace", "0.05"]
    with running(args, [port], tmp_path_factory.mktemp("agent") / "out.txt"):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def mitm(tmp_path_factory: pytest.TempPathFactory, demo_agent: str) -> Iterator[Mitm]:
    tmp = tmp_path_factory.mktemp("mitm")
    demo, sdk, forward, dead = (free_port() for _ in range(4))
    # The SDK client dials the URLs the card lists: this agent lists the reverse proxy.
    with run_sdk_agent(public_url=f"http://127.0.0.1:{sdk}") as sdk_agent:
        args = [
            *(sys.executable, "-m", "tasktape", "mitm", "--db", str(tmp / "mitm.db")),
            *("--redact-header", "X-Tenant-Secret", "--redact-query", "tenant"),
            *(
                "--redact-json",
                "/message/metadata/apiKey",
                "--redact-json",
                "/task/history/*/metadata/apiKey",
            ),
            "--",
            *mitmdump_args(
                tmp / "conf",
                f"reverse:{demo_agent}@{demo}",
                f"reverse:{sdk_agent.url}@{sdk}",
                f"regular@{forward}",
                f"reverse:http://127.0.0.1:{free_port()}@{dead}",
            ),
            # The demo agent's card lists the Host it was asked at: the proxy's.
            *("--set", "keep_host_header=true"),
            # Connect upstream once a request came (by default a reverse proxy connects as the
            # client does, and drops the client, with no request read, if it cannot).
            *("--set", "connection_strategy=lazy"),
        ]
        with running(args, [demo, sdk, forward, dead], tmp / "out.txt"):
            yield Mitm(
                tmp / "mitm.db",
                *(f"http://127.0.0.1:{p}" for p in (demo, sdk, forward, dead)),
                demo_agent,
                sdk_agent.url,
            )


@pytest.fixture(scope="module")
def sdk_agent_alone() -> Iterator[SdkAgent]:
    """An a2a-sdk agent listing its own address, for ``tasktape record`` to rewrite."""
    with run_sdk_agent() as agent:
        yield agent


# -- the same traffic through both recorders ------------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("agent", ["demo", "sdk"])
async def test_reverse_mode_records_what_tasktape_record_does(
    mitm: Mitm, sdk_agent_alone: SdkAgent, record: RecordFactory, agent: str, binding: str
) -> None:
    before = last_id(mitm.db)
    via_mitm = await stream_message(mitm.demo if agent == "demo" else mitm.sdk, "hello there", binding)
    rec = await record(mitm.demo_agent if agent == "demo" else sdk_agent_alone.url)
    via_record = await stream_message(rec.url, "hello there", binding)
    assert len(via_mitm) == len(via_record) > 5
    expected = await recorded_by_tasktape_record(rec)
    assert len(expected) == 2 and expected[0][:2] == ("GET", "/.well-known/agent-card.json")
    got = digests(mitm.db, wait_for_exchanges(mitm.db, before, len(expected)))
    assert got == expected
    stream = got[1]
    assert stream[3:7] == (1, binding, "SendStreamingMessage", "complete")
    assert [e[1] for e in stream[7] if e[1]][-1] == "TASK_STATE_COMPLETED"


async def test_forward_proxy_mode_records_what_tasktape_record_does(
    mitm: Mitm, record: RecordFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = await record(mitm.demo_agent)
    await stream_message(rec.url, "forward me", "rest")
    expected = await recorded_by_tasktape_record(rec)
    before = last_id(mitm.db)
    # The SDK client's httpx uses the proxy the environment names, as most clients do.
    monkeypatch.setenv("HTTP_PROXY", mitm.forward)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    events = await stream_message(mitm.demo_agent, "forward me", "rest")
    assert [next(iter(e)) for e in events][:2] == ["task", "statusUpdate"]
    rows = wait_for_exchanges(mitm.db, before, len(expected))
    assert digests(mitm.db, rows) == expected
    host = dict(json.loads(rows[1]["request_headers"]))["Host"]
    assert f"http://{host}" == mitm.demo_agent  # the agent was asked directly, through the proxy


# -- secrets, disconnects, failures ---------------------------------------------------------


async def test_secrets_appear_nowhere_in_the_log_files(mitm: Mitm) -> None:
    before = last_id(mitm.db)
    headers = {
        "Authorization": f"Bearer {SECRET}",
        "Cookie": f"s={SECRET}",
        "X-Api-Key": SECRET,
        "X-Tenant-Secret": SECRET,
        "A2A-Version": "1.0",
    }
    message = {
        "messageId": "m1",
        "role": "ROLE_USER",
        "parts": [{"text": "hi"}],
        "metadata": {"apiKey": SECRET},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{mitm.demo}/message:stream?key={SECRET}&tenant={SECRET}&lang=en",
            json={"message": message},
            headers=headers,
        ) as r,
    ):
        received = await r.read()
    assert SECRET.encode() in received  # the agent echoes it: the client sees the stream unchanged
    (x,) = wait_for_exchanges(mitm.db, before, 1)
    stored = dict(json.loads(x["request_headers"]))
    assert {stored[h] for h in ("Authorization", "Cookie", "X-Api-Key", "X-Tenant-Secret")} == {"[REDACTED]"}
    assert x["query"] == "key=[REDACTED]&tenant=[REDACTED]&lang=en"
    with EventLog(mitm.db) as log:
        assert log.events(x["id"])[-1]["state"] == "TASK_STATE_COMPLETED"
    files = [p for p in mitm.db.parent.iterdir() if p.name.startswith(mitm.db.name)]
    assert {p.name for p in files} >= {mitm.db.name, f"{mitm.db.name}-wal"}
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path.name


async def read_events_then_leave(url: str, text: str, events: int) -> bytes:
    """Start a stream, read ``events`` events (or what comes before it breaks off), then
    close the connection."""
    body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": text}]}}
    received = b""
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{url}/message:stream", json=body, headers={"A2A-Version": "1.0"})
        with contextlib.suppress(aiohttp.ClientPayloadError):
            async for data in response.content.iter_any():
                received += data
                if received.count(b"\n\n") >= events:
                    break
        response.close()
    return received


async def test_a_client_leaving_mid_stream(mitm: Mitm) -> None:
    before = last_id(mitm.db)
    await read_events_then_leave(mitm.demo, "a long story", 3)
    (x,) = wait_for_exchanges(mitm.db, before, 1)
    assert x["outcome"] == "client_disconnected", x["error"]
    with EventLog(mitm.db) as log:
        assert 3 <= len(log.events(x["id"])) < 100


async def test_an_upstream_dropping_mid_stream(mitm: Mitm, record: RecordFactory) -> None:
    rec = await record(mitm.demo_agent)
    expected_bytes = await read_events_then_leave(rec.url, "please drop", 10_000)
    (expected,) = await recorded_by_tasktape_record(rec)
    before = last_id(mitm.db)
    received = await read_events_then_leave(mitm.demo, "please drop", 10_000)
    assert received.count(b"\n\n") == expected_bytes.count(b"\n\n")
    (x,) = wait_for_exchanges(mitm.db, before, 1)
    assert x["outcome"] == "upstream_disconnected" and "peer closed connection" in x["error"]
    assert digests(mitm.db, [x]) == [expected]


async def test_an_upstream_that_cannot_be_reached(mitm: Mitm) -> None:
    before = last_id(mitm.db)
    async with aiohttp.ClientSession() as session, session.post(f"{mitm.dead}/message:stream", json={}) as r:
        assert r.status == 502  # mitmproxy's own answer
    (x,) = wait_for_exchanges(mitm.db, before, 1)
    assert (x["status"], x["outcome"], x["is_sse"]) == (502, "upstream_error", 0)
    assert "failed before answering" in x["error"]


async def test_an_upstream_breaking_off_a_body_mitmproxy_buffers(mitm: Mitm) -> None:
    """mitmproxy keeps the head of a body it buffers: the client never saw the upstream's
    200, but mitmproxy's 502, which is what the log holds."""

    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a": 1'
        )
        await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(short, "127.0.0.1", 0)
    before = last_id(mitm.db)
    try:
        port = upstream.sockets[0].getsockname()[1]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/short", proxy=mitm.forward) as r,
        ):
            assert r.status == 502  # mitmproxy's own answer
    finally:
        upstream.close()
        await upstream.wait_closed()
    (x,) = wait_for_exchanges(mitm.db, before, 1)
    assert (x["status"], x["outcome"], x["is_sse"]) == (502, "upstream_error", 0)
    assert "broke off mid-response" in x["error"]


async def test_a_client_leaving_a_body_read_to_the_close_is_one_exchange(mitm: Mitm) -> None:
    """An event stream with no Content-Length, not chunked (it ends as the upstream closes):
    its client leaving, mitmproxy calls the error hook, then the response hook with the
    flow no longer live. It was recorded a second time, as if read from a flow file."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"GET /after "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                for n in range(200):  # (until mitmproxy, its client gone, closes the connection)
                    writer.write(f"data: {n}\n\n".encode())
                    await writer.drain()
                    await asyncio.sleep(0.05)
        writer.close()

    before = last_id(mitm.db)
    async with raw_upstream(answer) as url, aiohttp.ClientSession() as session:
        response = await session.get(f"{url}/events", proxy=mitm.forward)
        await response.content.readuntil(b"\n\n")
        response.close()  # (and its connection)
        async with session.get(f"{url}/after", proxy=mitm.forward) as after:
            assert await after.read() == b"ok"
    rows = wait_for_exchanges(mitm.db, before, 2)
    assert [(x["path"], x["outcome"]) for x in rows] == [
        ("/events", "client_disconnected"),
        ("/after", "complete"),
    ]
    assert rows[0]["error"] == "the client went away mid-exchange: Client disconnected."


async def test_a_head_mitmproxy_kept_from_a_client_that_left_is_not_kept(tmp_path: Path) -> None:
    """mitmproxy keeps the head of a body it buffers until the body is whole: a client that
    leaves before then never gets it. The log kept it (status 200) where the import of a flow
    file of the same traffic kept none; neither does now. A streamed body's head, which the
    client got, is kept by both."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        kind = b"text/event-stream" if head.startswith(b"GET /streamed ") else b"application/json"
        # Read until the upstream closes: no Content-Length, not chunked.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nConnection: close\r\n\r\n")
        writer.write(b"data: 1\n\n")
        await writer.drain()
        await reader.read()  # (until mitmproxy closes the connection)
        writer.close()

    port, db, flows = free_port(), tmp_path / "live.db", tmp_path / "flows.mitm"
    probe, marks = seen_by_mitmproxy(tmp_path)
    args = [MITMDUMP, "-s", str(addon_path()), "-s", str(probe), "--set", f"tasktape_db={db}"]
    async with raw_upstream(answer) as url:
        args += ["-w", str(flows), *mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")]
        args += ["--set", "connection_strategy=lazy"]  # (no upstream connection without a request)
        with running(args, [port], tmp_path / "out.txt"):
            for path in ("/buffered", "/streamed"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                await writer.drain()
                if path == "/streamed":
                    await reader.readuntil(b"data: 1\n\n")
                await asyncio.to_thread(wait_for_mark, marks, f"responseheaders {path}")
                writer.close()
                await writer.wait_closed()
            live = await asyncio.to_thread(wait_for_exchanges, db, 0, 2)
    imported = tmp_path / "imported.db"
    result = CliRunner().invoke(main, ["import", str(flows), "--db", str(imported)])
    assert result.exit_code == 0, result.output
    with EventLog(imported) as log:
        rows = {"live": live, "imported": log.exchanges()}
    for how, got in rows.items():
        assert [(x["path"], x["status"], x["outcome"]) for x in got] == [
            ("/buffered", None, "client_disconnected"),
            ("/streamed", 200, "client_disconnected"),
        ], how


# An addon loaded after tasktape's: its response hook, once it has let the event loop run,
# kills /kill* flows, and holds /left until the client has gone (noting "response /left").
LATER = """
import asyncio
from mitmproxy.connection import ConnectionState

class Later:
    async def response(self, flow):
        await asyncio.sleep(0)
        if flow.request.path.startswith("/kill"):
            flow.kill()
        elif flow.request.path == "/left":
            with open(MARKS, "a") as f:
                f.write("response /left\\n")
            for _ in range(1000):  # (at most 10 s)
                if not flow.client_conn.state & ConnectionState.CAN_READ:
                    break
                await asyncio.sleep(0.01)

addons = [Later()]
"""


async def _answer_by_path(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    if head.startswith(b"GET /kill-streamed "):  # chunked: its end is sent after the response hook
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n")
        writer.write(b"\r\n9\r\ndata: 1\n\n\r\n0\r\n\r\n")
    else:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    await writer.drain()
    writer.close()


async def _got(port: int, path: str) -> bytes:
    """What a client asking ``path`` (on a connection of its own) got, until the connection closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    got = await reader.read()
    writer.close()
    await writer.wait_closed()
    return got


async def test_a_response_a_later_addon_kills_or_its_client_leaves_is_not_recorded_sent(
    tmp_path: Path,
) -> None:
    """mitmproxy sends a buffered body's response only after every addon's response hook,
    and nothing (with no error hook) if one killed the flow or the client left meanwhile:
    such exchanges were recorded complete, status 200, body kept. A streamed body's client
    had the head and chunks, not the end."""
    port, db = free_port(), tmp_path / "later.db"
    later, marks = tmp_path / "later.py", tmp_path / "marks.txt"
    later.write_text(f"MARKS = {str(marks)!r}\n{LATER}")
    args = [MITMDUMP, "-s", str(addon_path()), "-s", str(later), "--set", f"tasktape_db={db}"]
    async with raw_upstream(_answer_by_path) as url:
        args += mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")
        args += ["--set", "connection_strategy=lazy"]  # (no upstream connection without a request)
        with running(args, [port], tmp_path / "out.txt"):
            assert (await _got(port, "/kept")).endswith(b"\r\n\r\n{}")
            assert await _got(port, "/kill") == b""
            streamed = await _got(port, "/kill-streamed")  # (its last chunk, the empty one, missing)
            assert streamed.startswith(b"HTTP/1.1 200 OK\r\n")
            assert streamed.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /left HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await asyncio.to_thread(wait_for_mark, marks, "response /left")
            writer.close()
            await writer.wait_closed()
            rows = await asyncio.to_thread(wait_for_exchanges, db, 0, 4)
    with EventLog(db) as log:
        got = [(x["path"], x["status"], x["outcome"], log.body(x["id"])) for x in rows]
    assert got == [
        ("/kept", 200, "complete", b"{}"),
        ("/kill", None, "killed", b""),
        ("/kill-streamed", 200, "killed", b"data: 1\n\n"),
        ("/left", None, "client_disconnected", b""),
    ]
    assert rows[3]["error"] == "the client went away mid-exchange: Client disconnected."


async def test_a_body_the_log_cannot_decode_is_said_in_mitmproxys_log(tmp_path: Path) -> None:
    """As tasktape record says it on stderr: the log keeps such a body as it came, which
    search and replay matching cannot read. It was only in the exchange's error."""
    port, db = free_port(), tmp_path / "undecoded.db"
    packed = b"HTTP/1.1 200 OK\r\nContent-Encoding: zstd\r\nContent-Length: 4\r\n\r\n\x28\xb5\x2f\xfd"
    args = [MITMDUMP, "-s", str(addon_path()), "--set", f"tasktape_db={db}"]
    args += mitmdump_args(tmp_path / "conf", f"regular@{port}")
    async with raw_upstream(answering(packed)) as url:
        with running(args, [port], tmp_path / "out.txt") as proc:
            async with (
                aiohttp.ClientSession(auto_decompress=False) as session,
                session.get(f"{url}/packed", proxy=f"http://127.0.0.1:{port}") as r,
            ):
                assert await r.read() == b"\x28\xb5\x2f\xfd"
            (x,) = wait_for_exchanges(db, 0, 1)
            assert await asyncio.to_thread(proc.stop) == 0
    assert x["error"] == "cannot decode Content-Encoding zstd: the body is stored as received"
    why = "cannot decode Content-Encoding zstd; see exchanges.error"
    said = f"tasktape: exchange {x['id']} (GET /packed): {why}"
    assert said in (tmp_path / "out.txt").read_text()


# -- the command, and the plain mitmdump -s form ----------------------------------------------


@pytest.mark.parametrize(
    ("form", "sig"),
    [
        ("mitmdump -s", signal.SIGTERM),
        ("mitmdump -s own script", signal.SIGTERM),
        ("tasktape mitm", signal.SIGTERM),
        ("tasktape mitm", signal.SIGHUP),
    ],
)
async def test_stopped_mid_stream_the_log_is_complete(
    demo_agent: str, tmp_path: Path, form: str, sig: signal.Signals
) -> None:
    """Every form (the addon by path, by module from a script of one's own, and tasktape
    mitm), options by --set (only /message:* recorded): SIGTERM mid-stream (passed on by
    tasktape mitm, which passes a SIGHUP on as one) ends the exchange ``proxy_stopped``;
    the exit status is 0."""
    port, db = free_port(), tmp_path / "stopped.db"
    own = tmp_path / "own_addons.py"
    own.write_text(
        "from tasktape.proxy.mitm_addon import TasktapeRecorder\n\naddons = [TasktapeRecorder()]\n"
    )
    if form == "mitmdump -s":
        args = [MITMDUMP, "-s", str(addon_path()), "--set", f"tasktape_db={db}"]
    elif form == "mitmdump -s own script":
        args = [MITMDUMP, "-s", str(own), "--set", f"tasktape_db={db}"]
    else:
        args = [sys.executable, "-m", "tasktape", "mitm", "--db", str(db), "--"]
    args += [
        "--set",
        "tasktape_paths=/message:*",
        *mitmdump_args(tmp_path / "conf", f"reverse:{demo_agent}@{port}"),
    ]
    with running(args, [port], tmp_path / "out.txt") as proc:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/.well-known/agent-card.json") as r:
                assert r.status == 200
            response = await session.post(
                f"{url}/message:stream",
                json={"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "long"}]}},
            )
            await response.content.readuntil(b"\n\n")
            assert await asyncio.to_thread(proc.stop, sig) == 0
            response.close()
    with EventLog(db) as log:
        (x,) = log.exchanges()
        (capture,) = log.captures()
        assert (x["path"], x["outcome"]) == ("/message:stream", "proxy_stopped")
        assert log.events(x["id"])
    assert (capture["source"], capture["upstream"], capture["ended_at"] is not None) == (
        "mitm",
        demo_agent,
        True,
    )


@pytest.mark.parametrize("form", ["mitmdump -s", "tasktape mitm"])
def test_only_tasktape_mitm_freezes_the_start_up_heap(demo_agent: str, tmp_path: Path, form: str) -> None:
    """tasktape mitm runs the process, so it moves the start-up heap out of the collector's
    sight; the addon loaded into someone's mitmdump leaves the host's heap alone. A second
    addon, loaded after tasktape's, reports what it finds once mitmproxy runs."""
    port, db, seen = free_port(), tmp_path / "heap.db", tmp_path / "freeze_count"
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import gc, pathlib\n"
        "class Probe:\n"
        "    def running(self):\n"
        f"        pathlib.Path({str(seen)!r}).write_text(str(gc.get_freeze_count()))\n"
        "addons = [Probe()]\n"
    )
    if form == "mitmdump -s":
        args = [MITMDUMP, "-s", str(addon_path()), "--set", f"tasktape_db={db}"]
    else:
        args = [sys.executable, "-m", "tasktape", "mitm", "--db", str(db), "--"]
    args += ["-s", str(probe), *mitmdump_args(tmp_path / "conf", f"reverse:{demo_agent}@{port}")]
    with running(args, [port], tmp_path / "out.txt"):
        deadline = time.monotonic() + 30
        while not (seen.exists() and seen.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        frozen = int(seen.read_text())
    if form == "tasktape mitm":
        assert frozen > 10_000  # the interpreter's, mitmproxy's and the addons' objects
    else:
        assert frozen == 0


async def test_rows_the_log_could_not_take_set_the_exit_status(tmp_path: Path) -> None:
    """As with tasktape record: a full log never stops traffic, is reported, and makes
    tasktape mitm exit 3."""
    event = b"data: " + b"x" * 192 + b"\n\n"

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(3000):
            await response.write(event)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    port, db = free_port(), tmp_path / "full.db"
    async with serve(app) as upstream:
        args = [sys.executable, "-m", "tasktape", "mitm", "--db", str(db), "--"]
        args += ["--set", "tasktape_max_log_size=1000000"]
        with running(
            [*args, *mitmdump_args(tmp_path / "conf", f"reverse:{upstream}@{port}")],
            [port],
            tmp_path / "out.txt",
        ) as proc:
            url = f"http://127.0.0.1:{port}/message:stream"
            async with aiohttp.ClientSession() as session, session.post(url, json={}) as r:
                assert await r.read() == event * 3000
            assert await asyncio.to_thread(proc.stop, signal.SIGTERM) == 3
    assert "rows could not be written" in (tmp_path / "out.txt").read_text()
    with EventLog(db) as log:  # what was written stays readable
        assert [c["source"] for c in log.captures()] == ["mitm"]


@pytest.mark.parametrize("command", ["mitm", "import"])
def test_without_mitmproxy_the_commands_say_how_to_install_it(tmp_path: Path, command: str) -> None:
    flows = tmp_path / "flows.bin"
    flows.write_bytes(b"123:{")  # what a flow file starts with
    args = {"mitm": ["mitm"], "import": ["import", str(flows), "--db", str(tmp_path / "x.db")]}[command]
    # mitmproxy hidden from this interpreter, as where the extra is not installed.
    code = "import sys; sys.modules['mitmproxy'] = None; from tasktape.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, timeout=30
    )
    assert result.returncode == 1
    assert "pip install 'tasktape[mitm]'" in result.stderr


def test_tasktape_mitm_refuses_a_bad_pointer_before_starting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tasktape", "mitm", "--redact-json", "apiKey"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert result.returncode == 2 and "--redact-json" in result.stderr


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("tasktape_db=other.db", "Received multiple values for tasktape_db"),
        ("tasktape_freeze_heap=false", "Received multiple values for tasktape_freeze_heap"),
        ("tasktape_max_body=abc", "Not an integer: abc"),
        ("tasktape_hostz=api.example", "Unknown option(s): tasktape_hostz"),
        # Values the options' types let through, which stopped mitmdump with a traceback.
        ("tasktape_max_log_size=0", "tasktape_max_log_size: must be 1 or more, not 0"),
        # Below what an empty log takes: the log was past it at once, and grew on.
        ("tasktape_max_log_size=100000", "tasktape_max_log_size: an empty log takes"),
        ("tasktape_max_body=-1", "tasktape_max_body: must be 0 or more, not -1"),
    ],
)
def test_an_addon_option_mitmproxy_would_refuse_is_refused_before_it_starts(
    tmp_path: Path, setting: str, said: str
) -> None:
    """mitmproxy checks the addon's options once the addon has loaded, and on an error
    leaves it out, saying nothing: traffic flowed, exit 0, and nothing was recorded. (The
    addon's own checks of their values stopped it with a traceback.)"""
    db = tmp_path / "m.db"
    for given in (["--set", setting], [f"--set={setting}"]):
        result = subprocess.run(
            [sys.executable, "-m", "tasktape", "mitm", "--db", str(db), "--", "-p", "0", *given],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert result.returncode == 2 and said in result.stderr, result.stderr
        assert "mitmproxy would leave the addon out, or stop, and record nothing" in result.stderr
    assert not db.exists()


# -- the addon in mitmproxy's test harness --------------------------------------------------


@pytest.fixture
def addon(tmp_path: Path) -> Iterator[tuple[TasktapeRecorder, taddons.context]]:
    recorder = TasktapeRecorder()
    with taddons.context(recorder) as tctx:
        tctx.configure(recorder, tasktape_db=str(tmp_path / "unit.db"))
        yield recorder, tctx
        recorder.done()


def sse_flow() -> Any:
    flow = tflow.tflow(resp=True)
    flow.response.headers["Content-Type"] = "text/event-stream; charset=utf-8"
    flow.response.content = None
    return flow


def test_mitmproxy_credentials_stay_out_of_the_captures_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = [
        *(
            "mitmdump",
            "-s",
            "addon.py",
            "--set",
            f"upstream_auth=bob:{SECRET}",
            f"--set=proxyauth=alice:{SECRET}",
        ),
        *("--proxyauth", f"carol:{SECRET}", f"--upstream-auth=dave:{SECRET}", "--set", "tasktape_db=x.db"),
        *("--set", f"web_password={SECRET}"),
    ]
    monkeypatch.setattr(sys, "argv", given)
    recorder = TasktapeRecorder()
    with taddons.context(recorder) as tctx:
        tctx.configure(recorder, tasktape_db=str(tmp_path / "unit.db"))
        recorder.running()  # the capture begins once mitmproxy runs
        recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        (capture,) = log.captures()
    assert json.loads(capture["argv"]) == [
        *("mitmdump", "-s", "addon.py", "--set", "upstream_auth=[REDACTED]", "--set=proxyauth=[REDACTED]"),
        *("--proxyauth", "[REDACTED]", "--upstream-auth=[REDACTED]", "--set", "tasktape_db=x.db"),
        *("--set", "web_password=[REDACTED]"),
    ]


def test_a_credential_header_mitmproxy_is_told_to_set_stays_out_of_the_captures_argv(
    demo_agent: str, tmp_path: Path
) -> None:
    """``-H``/``--modify-headers`` (``[/filter]/name/value``) is how an agent's key is added
    on the way: its value is kept out when the header is redacted, whatever form the option
    takes; other headers' specs are kept as given."""
    port, db = free_port(), tmp_path / "headers.db"
    given = [
        *("--modify-headers", f"/~q/Authorization/Bearer {SECRET}", "-H", f"|~q|X-Tenant-Secret|{SECRET}"),
        *(f"-H/~q/X-Api-Key/{SECRET}", f"--modify-headers=/X-Goog-Api-Key/{SECRET}"),
        *("--set", f"modify_headers=/~q/Private-Token/{SECRET}", "-H", "/~q/A2A-Version/1.0"),
    ]
    args = [sys.executable, "-m", "tasktape", "mitm", "--db", str(db), "--redact-header", "X-Tenant-Secret"]
    args += ["--", *given, *mitmdump_args(tmp_path / "conf", f"reverse:{demo_agent}@{port}")]
    with running(args, [port], tmp_path / "out.txt"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/.well-known/agent-card.json") as r:
            assert r.status == 200
        (x,) = wait_for_exchanges(db, 0, 1)
    sent = dict(json.loads(x["request_headers"]))  # what mitmproxy sent the agent, redacted
    assert [sent[h] for h in ("Authorization", "X-Tenant-Secret", "X-Api-Key", "A2A-Version")] == [
        *("[REDACTED]",) * 3,
        "1.0",
    ]
    with EventLog(db) as log:
        (capture,) = log.captures()
    argv = json.loads(capture["argv"])
    assert argv[argv.index("--modify-headers") :][: len(given)] == [
        *("--modify-headers", "/~q/Authorization/[REDACTED]", "-H", "|~q|X-Tenant-Secret|[REDACTED]"),
        *("-H/~q/X-Api-Key/[REDACTED]", "--modify-headers=/X-Goog-Api-Key/[REDACTED]"),
        *("--set", "modify_headers=/~q/Private-Token/[REDACTED]", "-H", "/~q/A2A-Version/1.0"),
    ]
    for path in tmp_path.iterdir():
        if path.name.startswith(db.name):
            assert SECRET.encode() not in path.read_bytes(), path.name


def test_options_are_declared_with_types_and_defaults(
    addon: tuple[TasktapeRecorder, taddons.context],
) -> None:
    recorder, tctx = addon
    names = [k for k, _ in tctx.options.items() if k.startswith("tasktape_")]
    declared = optmanager.dump_dicts(tctx.options, names)  # what `mitmdump --options` shows
    assert {k: (v["type"], v["default"]) for k, v in declared.items()} == {
        "tasktape_db": ("optional str", None),
        "tasktape_freeze_heap": ("bool", False),
        "tasktape_hosts": ("sequence of str", []),
        "tasktape_max_body": ("int", 16 * 1024 * 1024),
        "tasktape_max_decoded": ("int", 64 * 1024 * 1024),
        "tasktape_max_log_size": ("optional int", None),
        "tasktape_paths": ("sequence of str", []),
        "tasktape_redact_headers": ("sequence of str", []),
        "tasktape_redact_json": ("sequence of str", []),
        "tasktape_redact_query": ("sequence of str", []),
        "tasktape_stream_events": ("bool", True),
    }
    assert all(v["help"] for v in declared.values())
    with pytest.raises(exceptions.OptionsError, match="JSON pointer"):
        tctx.configure(recorder, tasktape_redact_json=["apiKey"])
    # mitmproxy reports an OptionsError as the option's; anything else as the addon's crash.
    with pytest.raises(exceptions.OptionsError, match="tasktape_max_log_size: must be 1 or more"):
        tctx.configure(recorder, tasktape_max_log_size=0)


def test_an_empty_tasktape_db_records_nothing_rather_than_failing(
    addon: tuple[TasktapeRecorder, taddons.context], caplog: pytest.LogCaptureFixture
) -> None:
    """`--set tasktape_db=` (an empty value, as an unset shell variable gives) is no log, as
    unset is: the log in use is closed and nothing is recorded, said as a warning, where it
    was refused as the current folder, which is no event log."""
    recorder, tctx = addon
    tctx.configure(recorder, tasktape_db="")
    assert recorder.writer is None
    assert "tasktape_db is not set, so nothing is recorded" in caplog.text


def test_event_streams_are_switched_to_streaming_and_teed(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    recorder, _ = addon
    plain, stream = tflow.tflow(resp=True), sse_flow()
    for flow in (plain, stream):
        recorder.requestheaders(flow)
        recorder.request(flow)
        recorder.responseheaders(flow)
    assert not plain.response.stream  # recorded whole, in the response hook
    assert callable(stream.response.stream)
    assert stream.response.stream(b"data: {}\n\n") == b"data: {}\n\n"  # passed on unchanged
    time.sleep(0.002)
    stream.response.stream(b"data: [1]\n\n")
    assert stream.response.stream(b"") == b""
    for flow in (plain, stream):
        recorder.response(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        first, second = log.exchanges()
        assert (first["is_sse"], log.body(first["id"])) == (0, b"message")
        chunks = log.chunks(second["id"])
        assert [c["data"] for c in chunks] == [b"data: {}\n\n", b"data: [1]\n\n"]
        assert 0 < chunks[0]["offset_ns"] < chunks[1]["offset_ns"] - 2_000_000
        assert [e["data"] for e in log.events(second["id"])] == ["{}", "[1]"]


def test_a_status_no_http_status_is_passes_and_is_said_not_kept(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    """mitmproxy passes on any number as a status (``HTTP/1.1 42 X``): the writer refused it
    inside the hook, leaving the exchange open; it is said instead, the answer not kept."""
    recorder, _ = addon
    flow = tflow.tflow(resp=True)
    flow.response.status_code = 42
    for hook in (recorder.requestheaders, recorder.request, recorder.responseheaders, recorder.response):
        hook(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        (x,) = log.exchanges()
        assert (x["status"], x["outcome"], log.chunks(x["id"])) == (None, "complete", [])
    assert x["error"] == (
        "the upstream answered with status 42, outside HTTP's 100 to 999: the client was sent it, the log "
        "keeps none of the answer"
    )


def test_a_streamed_request_body_is_kept_as_it_passes(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    recorder, tctx = addon
    tctx.configure(recorder, tasktape_max_body=10)
    flow = tflow.tflow(resp=True)
    flow.request.method, flow.request.path = "POST", "/upload"
    flow.request.content, flow.request.stream = None, True  # as stream_large_bodies leaves it
    recorder.requestheaders(flow)
    assert flow.request.stream(b"0123456") == b"0123456"
    assert flow.request.stream(b"789abc") == b"789abc"
    for hook in (recorder.request, recorder.responseheaders, recorder.response):
        hook(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        (x,) = log.exchanges()
        assert (x["request_body"], x["request_body_truncated"], x["outcome"]) == ("0123456789", 1, "complete")


def test_a_streamed_prompt_read_whole_is_logged_before_its_answer(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    """An OpenAI request streamed through (stream_large_bodies) is claimed by its body: the
    log has it before the answer's events, so each event is read as OpenAI's."""
    recorder, _ = addon
    flow = tflow.tflow(resp=True)
    flow.request.method, flow.request.path = "POST", "/v1/chat/completions"
    flow.request.content, flow.request.stream = None, True
    recorder.requestheaders(flow)
    asked = [{"role": "user", "content": "x" * 70_000}]
    prompt = json.dumps({"model": "m", "messages": asked, "stream": True})
    for piece in (prompt[:40_000].encode(), prompt[40_000:].encode(), b""):
        flow.request.stream(piece)
    recorder.request(flow)
    flow.response.headers["Content-Type"] = "text/event-stream"
    flow.response.content = None  # its body not read yet, as the response headers arrive
    recorder.responseheaders(flow)
    choices = [{"index": 0, "delta": {"content": "Hi"}}]
    chunk = {"object": "chat.completion.chunk", "model": "m", "choices": choices}
    flow.response.stream(f"data: {json.dumps(chunk)}\n\n".encode())
    flow.response.stream(b"data: [DONE]\n\n")
    flow.response.stream(b"")
    recorder.response(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        (x,) = log.exchanges()
        assert (x["protocol"], x["rpc_method"]) == ("openai", "chat.completions")
        assert len(x["request_body"]) == len(prompt)
        assert [e["kind"] for e in log.events(x["id"])] == ["delta", "done"]


def test_compressed_request_bodies_are_decoded_up_to_the_bound(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    """mitmproxy forwards a flow's bytes as they came; the log keeps a compressed request
    body decoded, and what decodes past tasktape_max_decoded as it came."""
    recorder, tctx = addon
    tctx.configure(recorder, tasktape_max_decoded=1000)
    for plain in (b'{"small": true}', b" " * 5000):
        flow = tflow.tflow(resp=True)
        flow.request.method, flow.request.path = "POST", "/message:send"
        flow.request.headers["Content-Encoding"] = "gzip"
        flow.request.raw_content = gzip.compress(plain)
        for hook in (recorder.requestheaders, recorder.request, recorder.responseheaders, recorder.response):
            hook(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        small, big = log.exchanges()
    assert (small["request_body"], small["request_body_encoding"]) == ('{"small": true}', "gzip")
    assert big["request_body_encoding"] is None and "decodes to more than 1,000 bytes" in big["error"]


def test_hosts_and_paths_choose_what_is_recorded(addon: tuple[TasktapeRecorder, taddons.context]) -> None:
    recorder, tctx = addon
    tctx.configure(recorder, tasktape_hosts=["*.EXAMPLE.com"], tasktape_paths=["/message:*"])
    wanted = {
        ("api.example.com", "/message:stream?x=1"): True,
        ("api.example.com", "/tasks/1"): False,
        ("example.org", "/message:stream"): False,
    }
    for (host, path), expected in wanted.items():
        flow = tflow.tflow()
        flow.request.host, flow.request.path = host, path
        flow.request.headers["Host"] = host
        recorder.requestheaders(flow)
        assert (flow.id in recorder.flows) is expected, (host, path)


STREAMED, BUFFERED = "streamed", "buffered"  # a response's body, as mitmproxy passed it on
OPEN, CLOSED = ConnectionState.OPEN, ConnectionState.CLOSED
LIVE, SAVED = True, False


@pytest.mark.parametrize(
    ("message", "client", "server", "response", "live", "outcome"),
    [
        ("Client disconnected.", CLOSED, OPEN, STREAMED, LIVE, "client_disconnected"),
        ("stream reset by client (CANCEL)", OPEN, OPEN, STREAMED, LIVE, "client_disconnected"),
        # HTTP/3's: a saved flow keeps only its message.
        (
            "stream closed by client (H3_REQUEST_CANCELLED)",
            CLOSED,
            CLOSED,
            STREAMED,
            SAVED,
            "client_disconnected",
        ),
        # An HTTP/2 client's close: mitmproxy closed an HTTP/1 upstream's on passing it on.
        ("peer closed connection", CLOSED, CLOSED, STREAMED, LIVE, "client_disconnected"),
        # The same message, of an HTTP/2 upstream's close.
        ("peer closed connection", OPEN, CLOSED, STREAMED, LIVE, "upstream_disconnected"),
        ("HTTP/1 protocol error: peer closed", OPEN, CLOSED, STREAMED, LIVE, "upstream_disconnected"),
        # A body mitmproxy buffered: the client got its 502, never the upstream's head.
        ("HTTP/1 protocol error: peer closed", OPEN, CLOSED, BUFFERED, LIVE, "upstream_error"),
        ("Connection refused", OPEN, CLOSED, None, LIVE, "upstream_error"),
        ("Connection killed.", OPEN, OPEN, STREAMED, LIVE, "killed"),
        # A saved flow's connections are closed: its message alone decides (and its body:
        # one streamed was not kept).
        ("HTTP/1 protocol error: peer closed", CLOSED, CLOSED, STREAMED, SAVED, "upstream_disconnected"),
        ("HTTP/1 protocol error: peer closed", CLOSED, CLOSED, BUFFERED, SAVED, "upstream_error"),
    ],
)
def test_how_a_failed_flow_ended(
    message: str,
    client: ConnectionState,
    server: ConnectionState,
    response: str | None,
    live: bool,
    outcome: str,
) -> None:
    flow = tflow.tflow(resp=response is not None, err=tflow.terr(message), live=live)
    flow.client_conn.state, flow.server_conn.state = client, server
    if response == STREAMED:  # a live flow says so; a saved one has no body kept
        flow.response.stream, flow.response.raw_content = True, None
    assert ending(flow)[0] == outcome


def test_the_error_hook_records_the_outcome(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    recorder, _ = addon
    flow = sse_flow()
    recorder.requestheaders(flow)
    recorder.request(flow)
    recorder.responseheaders(flow)
    flow.response.stream(b"data: 1\n\n")
    flow.error = tflow.terr("HTTP/1 protocol error: peer closed connection")
    flow.server_conn.state = ConnectionState.CLOSED
    recorder.error(flow)
    assert flow.response.stream(b"data: 2\n\n") == b"data: 2\n\n"  # passed on, no longer recorded
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "upstream_disconnected"
        assert [c["data"] for c in log.chunks(x["id"])] == [b"data: 1\n\n"]


def test_flows_read_from_a_file_are_recorded_as_saved(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    """`mitmdump -r`: mitmproxy calls a loaded flow's response hook before its error's, and
    a failed flow was recorded complete, timed by the clock of the reading; it is recorded
    once, as `tasktape import` records it: the error it was saved with, its own times."""
    recorder, _ = addon
    broken = tflow.tflow(resp=True, err=tflow.terr("HTTP/1 protocol error: peer closed connection"))
    broken.error.timestamp = 1_000.15
    whole = tflow.tflow(resp=True)
    for flow in (broken, whole):
        flow.live = False
        flow.request.timestamp_start = 1_000.0
        flow.response.timestamp_start, flow.response.timestamp_end = 1_000.05, 1_000.25
        hooks = [recorder.requestheaders, recorder.request, recorder.responseheaders, recorder.response]
        for hook in [*hooks, *([recorder.error] if flow.error else [])]:
            hook(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        rows = [(x["status"], x["outcome"], x["duration_ns"]) for x in log.exchanges()]
    assert rows[0] == (502, "upstream_error", 150_000_000)  # mitmproxy's 502: it had buffered the body
    assert rows[1] == (200, "complete", 250_000_000)  # its own times, not the reading's


def test_a_flow_recorded_live_is_not_recorded_again_as_read_from_a_file(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path
) -> None:
    """mitmproxy may call a hook of a flow the addon ended (its client gone) with the flow
    no longer live, as of one read from a file: it was recorded again, as such. Saved
    (mitmdump -w), the flow is still recorded by another mitmdump reading the file."""
    recorder, _ = addon
    flow = sse_flow()
    for hook in (recorder.requestheaders, recorder.request, recorder.responseheaders):
        hook(flow)
    flow.response.stream(b"data: 1\n\n")
    flow.error = tflow.terr("Client disconnected.")
    recorder.error(flow)
    flow.live = False
    recorder.response(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        assert [x["outcome"] for x in log.exchanges()] == ["client_disconnected"]
    reader = TasktapeRecorder()
    with taddons.context(reader) as tctx:
        tctx.configure(reader, tasktape_db=str(tmp_path / "read.db"))
        reader.response(http.HTTPFlow.from_state(flow.get_state()))
        reader.done()
    with EventLog(tmp_path / "read.db") as log:
        assert [x["outcome"] for x in log.exchanges()] == ["client_disconnected"]


def test_a_flow_read_twice_is_recorded_once_and_one_the_log_cannot_hold_is_said(
    addon: tuple[TasktapeRecorder, taddons.context], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """mitmdump -w saves a flow whose client left mid-body twice, one copy after the other:
    read back, it is recorded once. A flow with a time the log cannot hold is left out,
    and said, where the hook failed with a traceback."""
    recorder, _ = addon
    saved = tflow.tflow(resp=True, err=tflow.terr("Client disconnected."))
    far = tflow.tflow(resp=True)
    far.request.timestamp_start = 1e300
    for flow in (saved, http.HTTPFlow.from_state(saved.get_state()), far):
        flow.live = False
        recorder.response(flow)
        if flow.error is not None:
            recorder.error(flow)
    recorder.done()
    with EventLog(tmp_path / "unit.db") as log:
        assert [x["outcome"] for x in log.exchanges()] == ["client_disconnected"]
    said = f"tasktape: flow {far.id} read from a file is not recorded: its request timestamp_start 1e+300"
    assert said in caplog.text


def test_a_long_read_of_flow_files_is_not_held_in_memory(
    addon: tuple[TasktapeRecorder, taddons.context],
) -> None:
    """The addon remembers the flows read from a file it recorded (to record each once):
    only the last ones, not every id of a long mitmdump -r."""
    recorder, _ = addon
    for _ in range(1100):
        flow = tflow.tflow(resp=True)
        flow.live = False
        recorder.response(flow)
    assert len(recorder._read) == 1024


def test_a_body_past_the_decoding_bound_is_said_naming_the_option(
    addon: tuple[TasktapeRecorder, taddons.context], caplog: pytest.LogCaptureFixture
) -> None:
    """Of a flow followed live and of one read from a file alike."""
    recorder, tctx = addon
    tctx.configure(recorder, tasktape_max_decoded=1000)
    live, saved = tflow.tflow(resp=True), tflow.tflow(resp=True)
    for flow in (live, saved):
        flow.response.headers["Content-Encoding"] = "gzip"
        flow.response.raw_content = gzip.compress(b" " * 5000)
    for hook in (recorder.requestheaders, recorder.request, recorder.responseheaders, recorder.response):
        hook(live)
    saved.live = False
    recorder.response(saved)
    recorder.done()
    said = [r.getMessage() for r in caplog.records if r.name == "tasktape" and "exchange" in r.getMessage()]
    why = "Content-Encoding gzip: the body decodes to more than 1,000 bytes (tasktape_max_decoded)"
    assert said == [f"tasktape: exchange {n} (GET /path): {why}; see exchanges.error" for n in (1, 2)]
