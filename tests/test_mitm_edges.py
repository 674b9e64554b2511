"""Capture with mitmproxy at its edges, with real processes: an HTTP/2 client leaving
mid-stream, a port mitmdump cannot listen on, a forward proxy's log of several hosts
exported, and tasktape mitm killed outright."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
from ports import free_port
from test_mitm import last_id, mitmdump_args, running, wait_for_exchanges

from tasktape.eventlog import EventLog

TASKTAPE = [sys.executable, "-m", "tasktape"]
ROOT = Path(__file__).resolve().parent.parent
CARD = "/.well-known/agent-card.json"


def message(text: str) -> bytes:
    return json.dumps(
        {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": text}]}}
    ).encode()


def demo_agent(port: int, pace: str) -> list[str]:
    return [*TASKTAPE, "agent", "--listen", f"127.0.0.1:{port}", "--pace", pace]


# -- an HTTP/2 client leaving mid-stream ------------------------------------------------------


async def h2_stream(port: int, text: str, leave: str, events: int) -> bytes:
    """POST /message:stream over HTTP/2 (TLS, mitmproxy's certificate unchecked), read until
    ``events`` events or the stream's end, then leave: ``reset`` the stream (RST_STREAM
    CANCEL, the connection kept a while), ``goaway`` (GOAWAY, then close) or ``close``
    the connection."""
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    tls.set_alpn_protocols(["h2"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    body = message(text)
    stream = conn.get_next_available_stream_id()
    headers = [(":method", "POST"), (":scheme", "https"), (":authority", f"127.0.0.1:{port}")]
    headers += [(":path", "/message:stream"), ("content-type", "application/json")]
    headers += [("a2a-version", "1.0"), ("content-length", str(len(body)))]
    conn.send_headers(stream, headers)
    conn.send_data(stream, body, end_stream=True)
    writer.write(conn.data_to_send())
    received, ended = b"", False
    while received.count(b"\n\n") < events and not ended:
        data = await asyncio.wait_for(reader.read(65536), 10)
        assert data, "mitmproxy closed the connection"
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                received += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, stream)
            ended = ended or isinstance(event, h2.events.StreamEnded | h2.events.StreamReset)
        writer.write(conn.data_to_send())
    if leave == "reset":
        conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
    elif leave == "goaway":
        conn.close_connection()
    writer.write(conn.data_to_send())
    await writer.drain()
    if leave == "reset":
        await asyncio.sleep(0.5)  # the connection outlives the stream
    writer.close()
    return received


@pytest.fixture(scope="module")
def h2_mitm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """tasktape mitm as a reverse proxy to the demo agent, which HTTP/2 clients reach over
    TLS: its port and log."""
    tmp = tmp_path_factory.mktemp("h2")
    agent, port, db = free_port(), free_port(), tmp / "h2.db"
    with running(demo_agent(agent, "0.05"), [agent], tmp / "agent.txt"):
        args = [*TASKTAPE, "mitm", "--db", str(db), "--"]
        args += mitmdump_args(tmp / "conf", f"reverse:http://127.0.0.1:{agent}@{port}")
        with running(args, [port], tmp / "mitm.txt"):
            yield port, db


@pytest.mark.parametrize(
    ("text", "leave", "events", "outcome"),
    [
        ("a long story", "reset", 3, "client_disconnected"),
        ("a long story", "close", 3, "client_disconnected"),
        ("a long story", "goaway", 3, "client_disconnected"),
        # Read to its end, a stream the agent drops is the upstream's doing still.
        ("please drop", "close", 10_000, "upstream_disconnected"),
    ],
)
async def test_an_http2_client_leaving_mid_stream(
    h2_mitm: tuple[int, Path], text: str, leave: str, events: int, outcome: str
) -> None:
    """An HTTP/2 client's close or GOAWAY reads, in mitmproxy's error, as an upstream's
    close would ("peer closed connection"): it is the client's all the same."""
    port, db = h2_mitm
    before = last_id(db)
    received = await h2_stream(port, text, leave, events)
    assert received.count(b"\n\n") >= 3
    (x,) = wait_for_exchanges(db, before, 1)
    assert (x["path"], x["outcome"]) == ("/message:stream", outcome), x["error"]


# -- a port mitmdump cannot listen on ---------------------------------------------------------


def test_a_port_in_use_leaves_no_capture_unended(tmp_path: Path) -> None:
    """mitmdump exits without its done hook when it cannot listen: no capture was begun
    then, or it would never end. tasktape mitm exits non-zero, the port named."""
    db = tmp_path / "busy.db"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = [*TASKTAPE, "mitm", "--db", str(db), "--", "--listen-host", "127.0.0.1", "-p", str(port)]
        result = subprocess.run(
            [*args, *mitmdump_args(tmp_path / "conf")],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    said = result.stdout + result.stderr
    assert result.returncode != 0, said
    assert any(f"127.0.0.1:{port}" in line and "address already in use" in line for line in said.splitlines())
    with EventLog(db) as log:
        assert [c["ended_at"] for c in log.captures() if c["ended_at"] is None] == []


@pytest.mark.parametrize("log", ["nodir/r.db", "c1.jsonl"])
def test_a_log_mitm_cannot_open_is_refused_before_mitmdump_starts(tmp_path: Path, log: str) -> None:
    """A --db in a folder that does not exist, or a cassette, was refused by the addon once
    mitmdump listened (on every interface, with -p alone), as mitmproxy's traceback."""
    (tmp_path / "c1.jsonl").write_bytes((ROOT / "cassettes" / "completed.jsonl").read_bytes())
    result = subprocess.run(
        [*TASKTAPE, "mitm", "--db", log, "--", "-p", "0", *mitmdump_args(tmp_path / "conf")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=tmp_path,
    )
    said = {
        "nodir/r.db": "Error: cannot open nodir/r.db as an event log (No such file or directory): its folder "
        "nodir does not exist\n",
        "c1.jsonl": "Error: c1.jsonl is a cassette, not an event log: tasktape import c1.jsonl --db LOG "
        "reads it into one\n",
    }
    assert (result.returncode, result.stdout, result.stderr) == (2, "", said[log])


# -- tasktape mitm killed outright ----------------------------------------------------------


def child_of(pid: int) -> int:
    (child,) = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(child)


def gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's")
def test_mitmdump_stops_when_tasktape_mitm_is_killed(tmp_path: Path) -> None:
    """SIGKILLed, tasktape mitm cannot pass anything on: its mitmdump is sent SIGTERM by the
    system, and stops as it does for Ctrl-C (the port freed, the capture ended), rather than
    going on alone, listening, with the log held."""
    port, db = free_port(), tmp_path / "killed.db"
    args = [*TASKTAPE, "mitm", "--db", str(db), "--", *mitmdump_args(tmp_path / "conf", f"regular@{port}")]
    with running(args, [port], tmp_path / "mitm.txt") as proc:
        mitmdump = child_of(proc.process.pid)
        proc.process.kill()
        proc.process.wait()
        try:
            assert gone(mitmdump, 15), "mitmdump kept running"
        finally:
            if not gone(mitmdump, 0):
                os.kill(mitmdump, signal.SIGKILL)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    with EventLog(db) as log:
        (capture,) = log.captures()
    assert capture["ended_at"] is not None


# -- a forward proxy's log of two agents, exported --------------------------------------------


async def test_export_takes_the_card_of_the_exchanges_host(tmp_path: Path) -> None:
    """Through an explicit proxy, card A then card B are read, then a stream on A: the
    stream's cassette comes with A's card, not with B's, read last."""
    a, b, proxy, db = free_port(), free_port(), free_port(), tmp_path / "forward.db"
    mitm = [*TASKTAPE, "mitm", "--db", str(db), "--", *mitmdump_args(tmp_path / "conf", f"regular@{proxy}")]
    with (
        running(demo_agent(a, "0"), [a], tmp_path / "a.txt"),
        running(demo_agent(b, "0"), [b], tmp_path / "b.txt"),
        running(mitm, [proxy], tmp_path / "mitm.txt"),
    ):
        via = f"http://127.0.0.1:{proxy}"
        async with aiohttp.ClientSession() as session:
            for agent in (a, b):
                async with session.get(f"http://127.0.0.1:{agent}{CARD}", proxy=via) as r:
                    assert r.status == 200
            url = f"http://127.0.0.1:{a}/message:stream"
            async with session.post(
                url, data=message("hello"), proxy=via, headers={"A2A-Version": "1.0"}
            ) as r:
                await r.read()
        *_, stream = wait_for_exchanges(db, 0, 3)
    cassette = tmp_path / "stream.jsonl"
    args = [*TASKTAPE, "export", str(db), "-o", str(cassette), "--exchange", str(stream["id"])]
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    lines = [json.loads(line) for line in cassette.read_text().splitlines()]
    requests = [line["exchange"]["request"] for line in lines if "exchange" in line]
    asked = [(r["path"], dict(r["headers"])["Host"]) for r in requests]
    assert asked == [(CARD, f"127.0.0.1:{a}"), ("/message:stream", f"127.0.0.1:{a}")]
