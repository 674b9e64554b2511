"""``tasktape import`` of mitmproxy flow files: flows saved by a plain ``mitmdump -w`` (which
buffers event streams whole) give the events ``tasktape record`` records of the same
traffic, flagged as having no per-event timing."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from click.testing import CliRunner
from conftest import RecordFactory
from loopback import in_thread, raw_upstream
from mitmproxy import http, io
from mitmproxy.io import tnetstring
from mitmproxy.test import tflow
from ports import free_port
from sdk_agent import run_sdk_agent
from sdk_client import stream_message
from test_mitm import (
    MITMDUMP,
    SECRET,
    digest,
    mitmdump_args,
    recorded_by_tasktape_record,
    running,
    seen_by_mitmproxy,
    wait_for_mark,
)

from tasktape.cli import main
from tasktape.eventlog import EventLog
from tasktape.mitm_command import addon_path
from tasktape.proxy.mitm_flows import NOT_KEPT, REQUEST_CUT, REQUEST_NOT_KEPT, STOPPED, STREAMED, UNTIMED

CASES = [("demo", "rest"), ("sdk", "rest"), ("sdk", "jsonrpc")]  # in the order they are saved


@dataclass
class Saved:
    flows: Path
    agents: dict[str, str]  # name -> the agent's own URL


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saved]:
    """A flow file written by a plain mitmdump (no addon) while the SDK client streamed
    through it: from the demo agent through a reverse proxy, from the SDK agent through an
    explicit HTTP proxy. Named without the .mitm extension."""
    tmp = tmp_path_factory.mktemp("saved")
    flows, demo_port, forward, reverse = tmp / "flows.bin", free_port(), free_port(), free_port()
    agent_args = [sys.executable, "-m", "tasktape", "agent", "--listen", f"127.0.0.1:{demo_port}"]
    with running([*agent_args, "--pace", "0"], [demo_port], tmp / "agent.txt"), run_sdk_agent() as sdk:
        demo = f"http://127.0.0.1:{demo_port}"
        args = [
            *(MITMDUMP, "-w", str(flows)),
            *mitmdump_args(tmp / "conf", f"regular@{forward}", f"reverse:{demo}@{reverse}"),
            *("--set", "keep_host_header=true"),  # the demo agent's card then lists the proxy
        ]
        with running(args, [forward, reverse], tmp / "mitmdump.txt"), pytest.MonkeyPatch.context() as env:
            # A credential the log must not keep (the flow file does).
            card = urllib.request.Request(
                f"http://127.0.0.1:{reverse}/.well-known/agent-card.json",
                headers={"Authorization": f"Bearer {SECRET}"},
            )
            with urllib.request.urlopen(card, timeout=10) as r:
                assert r.status == 200
            env.delenv("NO_PROXY", raising=False)
            env.delenv("no_proxy", raising=False)
            for agent, binding in CASES:
                if agent == "demo":
                    url = f"http://127.0.0.1:{reverse}"
                else:  # the SDK client's httpx uses the proxy the environment names
                    url = sdk.url
                    env.setenv("HTTP_PROXY", f"http://127.0.0.1:{forward}")
                asyncio.run(stream_message(url, "hello there", binding))
        yield Saved(flows, {"sdk": sdk.url, "demo": demo})


@pytest.fixture(scope="module")
def imported(saved: Saved, tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("imported") / "imported.db"
    result = subprocess.run(
        [sys.executable, "-m", "tasktape", "import", str(saved.flows), "--db", str(db)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"7 exchanges from {saved.flows}" in result.stderr
    assert "(3 event streams without per-event timing)" in result.stderr
    return db


@pytest.mark.parametrize(("agent", "binding"), CASES)
async def test_imported_flows_give_the_events_tasktape_record_records(
    saved: Saved, imported: Path, record: RecordFactory, agent: str, binding: str
) -> None:
    rec = await record(saved.agents[agent])
    await stream_message(rec.url, "hello there", binding)
    expected = await recorded_by_tasktape_record(rec)
    with EventLog(imported) as log:
        got = [digest(log, x) for x in log.exchanges()]
    n = 1 + CASES.index((agent, binding)) * 2  # after the first card: each case's card and stream
    assert got[n : n + 2] == expected


def test_a_flow_file_is_imported_once(saved: Saved, imported: Path, tmp_path: Path) -> None:
    """Its capture's uid follows from its bytes, each exchange's from that and its flow's id."""
    copy = tmp_path / "copy.db"
    shutil.copy(imported, copy)
    result = CliRunner().invoke(main, ["import", str(saved.flows), "--db", str(copy)])
    assert result.exit_code == 0 and "already (capture 1): nothing added" in result.output
    with EventLog(copy) as log, EventLog(imported) as first:
        assert len(log.captures()) == 1
        assert [x["uid"] for x in log.exchanges()] == [x["uid"] for x in first.exchanges()]


def test_an_imported_stream_says_its_timing_is_unknown(imported: Path) -> None:
    with EventLog(imported) as log:
        (capture,) = log.captures()
        assert capture["source"] == "mitm-import"
        streams = [x for x in log.exchanges() if x["is_sse"]]
        assert len(streams) == 3
        for x in streams:
            assert (x["outcome"], x["error"]) == ("complete", UNTIMED)
            (chunk,) = log.chunks(x["id"])
            assert 0 < x["ttfb_ns"] <= chunk["offset_ns"] <= x["duration_ns"]
            assert {e["offset_ns"] for e in log.events(x["id"])} == {chunk["offset_ns"]}
        cards = [x for x in log.exchanges() if not x["is_sse"]]
        assert len(cards) == 4
        assert all(x["error"] is None and log.body(x["id"]).startswith(b"{") for x in cards)


def test_credentials_in_the_flow_file_stay_out_of_the_log(saved: Saved, imported: Path) -> None:
    assert SECRET.encode() in saved.flows.read_bytes()
    with EventLog(imported) as log:
        first = log.exchanges()[0]
    assert dict(json.loads(first["request_headers"]))["Authorization"] == "[REDACTED]"
    for path in imported.parent.iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name


def write_flows(path: Path, flows: list) -> None:
    with path.open("wb") as f:
        writer = io.FlowWriter(f)
        for flow in flows:
            writer.add(flow)


def test_streamed_failed_and_non_http_flows(tmp_path: Path) -> None:
    streamed = tflow.tflow(resp=True)
    streamed.response.headers["Content-Type"] = "text/event-stream"
    streamed.response.content = None  # mitmproxy keeps no body it streamed
    peer_closed = tflow.terr("HTTP/1 protocol error: peer closed connection")
    dropped = tflow.tflow(resp=True, err=peer_closed)
    dropped.response.content = None  # streamed by tasktape's addon (saved with -w): the client had the head
    dropped.metadata[STREAMED] = True
    buffered = tflow.tflow(resp=True, err=peer_closed)  # the client got mitmproxy's 502 instead
    buffered_unkept = tflow.tflow(resp=True, err=peer_closed)  # the same, as mitmdump -w saves it
    buffered_unkept.response.content = None
    refused = tflow.tflow(err=tflow.terr("Connection refused"))
    flows = tmp_path / "flows.mitm"
    write_flows(flows, [streamed, dropped, buffered, refused, buffered_unkept, tflow.ttcpflow()])
    db = tmp_path / "log.db"
    result = CliRunner().invoke(main, ["import", str(flows), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "5 exchanges" in result.output and "1 non-HTTP flows skipped" in result.output
    with EventLog(db) as log:
        got = [(x["status"], x["outcome"], x["error"]) for x in log.exchanges()]
        assert not log.chunks(log.exchanges()[2]["id"])  # nothing of a body the client never saw
    assert got[0] == (200, "complete", NOT_KEPT)
    # The failure, and the body's absence from the file.
    assert got[1][:2] == (200, "upstream_disconnected") and got[1][2].endswith(f"; {NOT_KEPT}")
    assert got[2][:2] == (502, "upstream_error") and "broke off mid-response" in got[2][2]
    assert got[3][:2] == (502, "upstream_error")
    assert got[4][:2] == (502, "upstream_error")  # (it was a 200, its upstream said to have dropped)


def test_a_flow_whose_status_no_http_status_is_is_recorded_without_its_answer(tmp_path: Path) -> None:
    """mitmproxy passes any number on as a status (``HTTP/1.1 42 X``), which the log keeps
    none of: the import ended in a traceback, the log holding a flow cut short."""
    flows = []
    for status in (200, 42, 1000):
        flow = tflow.tflow(resp=True)
        flow.response.status_code = status
        flows.append(flow)
    path, db = tmp_path / "odd.mitm", tmp_path / "log.db"
    write_flows(path, flows)
    result = CliRunner().invoke(main, ["import", str(path), "--db", str(db)])
    assert result.exit_code == 0, result.output
    with EventLog(db) as log:
        got = [(x["status"], x["outcome"], x["error"]) for x in log.exchanges()]
        assert [len(log.chunks(x["id"])) for x in log.exchanges()] == [1, 0, 0]
        # (timed by the response, as the others: it came, only the log keeps none of it)
        assert len({x["duration_ns"] for x in log.exchanges()}) == 1
    assert got[0] == (200, "complete", None)
    for (status, outcome, error), sent in zip(got[1:], (42, 1000), strict=True):
        assert (status, outcome) == (None, "complete")
        assert error == (
            f"the upstream answered with status {sent}, outside HTTP's 100 to 999: the client was sent "
            "it, the log keeps none of the answer"
        )


def test_a_broken_flow_file_writes_nothing(tmp_path: Path) -> None:
    good, broken = tmp_path / "good.mitm", tmp_path / "broken.mitm"
    write_flows(good, [tflow.tflow(resp=True)])
    broken.write_bytes(good.read_bytes()[:-20])
    db = tmp_path / "log.db"
    result = CliRunner().invoke(main, ["import", str(good), str(broken), "--db", str(db)])
    assert result.exit_code == 2
    assert f"{broken}: not a readable mitmproxy flow file" in result.output
    assert not db.exists()


# Flow files whose flow mitmproxy's reader cannot make (from a flow's state, as it saves it).


def without_request(state: dict[str, Any]) -> bytes:
    return tnetstring.dumps({"type": "http", "version": state["version"]})


def tcp_without_messages(state: dict[str, Any]) -> bytes:
    return tnetstring.dumps({**state, "type": "tcp"})


def with_unknown_part(state: dict[str, Any]) -> bytes:
    return tnetstring.dumps({**state, "unknown": 1})


def not_a_flow(state: dict[str, Any]) -> bytes:
    return tnetstring.dumps([state["version"]])


def too_large_a_number(state: dict[str, Any]) -> bytes:
    return tnetstring.dumps({**state, "client_conn": {**state["client_conn"], "timestamp_start": 10**400}})


def nested_too_deep(state: dict[str, Any]) -> bytes:
    nested = b"0:]"  # (by hand: tnetstring.dumps recurses as deep)
    for _ in range(5000):
        nested = b"%d:%s]" % (len(nested), nested)
    return nested


@pytest.mark.parametrize(
    "malformed",
    [
        without_request,
        tcp_without_messages,
        with_unknown_part,
        not_a_flow,
        too_large_a_number,
        nested_too_deep,
    ],
)
def test_a_flow_mitmproxy_cannot_read_is_refused_writing_nothing(tmp_path: Path, malformed: Any) -> None:
    """mitmproxy's reader fails on a flow whose parts are missing or of the wrong kind with
    other errors than its own: the import ended in a traceback."""
    good, bad = tmp_path / "good.mitm", tmp_path / "bad.mitm"
    write_flows(good, [tflow.tflow(resp=True)])
    bad.write_bytes(malformed(tflow.tflow(resp=True).get_state()))
    db = tmp_path / "log.db"
    result = CliRunner().invoke(main, ["import", str(good), str(bad), "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {bad}: not a readable mitmproxy flow file (Invalid data format.)\n"
    assert not db.exists()


# Flows with a time the log cannot hold: each sets it, and says which.


def far_request(flow: Any) -> tuple[str, float]:
    flow.request.timestamp_start = 1e300
    return "request timestamp_start", 1e300


def unknown_request_end(flow: Any) -> tuple[str, float]:
    flow.request.timestamp_end = math.nan
    return "request timestamp_end", math.nan


def response_before_1970(flow: Any) -> tuple[str, float]:
    flow.response.timestamp_end = -1e12
    return "response timestamp_end", -1e12


def response_after_2262(flow: Any) -> tuple[str, float]:
    flow.response.timestamp_start = 2**70
    return "response timestamp_start", 2**70


def endless_error(flow: Any) -> tuple[str, float]:
    flow.error = tflow.terr("Client disconnected.")
    flow.error.timestamp = math.inf
    return "error timestamp", math.inf


@pytest.mark.parametrize(
    "timed", [far_request, unknown_request_end, response_before_1970, response_after_2262, endless_error]
)
def test_a_flow_with_a_time_the_log_cannot_hold_is_refused_writing_nothing(
    tmp_path: Path, timed: Any
) -> None:
    """Checked as the file is read: the import failed part-way with a traceback, leaving the
    files before it imported and this one's capture empty, never ended."""
    good, bad = tmp_path / "good.mitm", tmp_path / "bad.mitm"
    write_flows(good, [tflow.tflow(resp=True)])
    flow = tflow.tflow(resp=True)
    name, moment = timed(flow)
    write_flows(bad, [tflow.tflow(resp=True), flow])
    db = tmp_path / "log.db"
    result = CliRunner().invoke(main, ["import", str(good), str(bad), "--db", str(db)])
    assert result.exit_code == 2, result.output
    why = f"its {name} {moment!r} is no time the log can hold, 1970 to 2262"
    assert result.output == f"Error: {bad}: flow 2 cannot be imported ({why}): nothing imported\n"
    assert not db.exists()


def test_a_flow_saved_twice_is_imported_once(tmp_path: Path) -> None:
    """mitmdump -w saves a flow whose client left mid-body twice (at its error hook, then
    at the response hook mitmproxy calls after it): both had the same uid, and the import
    failed with rows not written."""
    left = tflow.tflow(resp=True, err=tflow.terr("Client disconnected."))
    again = http.HTTPFlow.from_state(left.get_state())
    flows, db = tmp_path / "flows.mitm", tmp_path / "log.db"
    write_flows(flows, [left, tflow.tflow(resp=True), again])
    result = CliRunner().invoke(main, ["import", str(flows), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert f"2 exchanges from {flows}" in result.output
    with EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["client_disconnected", "complete"]


def test_a_flow_file_cut_short_is_refused_naming_its_intact_flows(tmp_path: Path) -> None:
    """A flow file cut short (mitmdump killed as it wrote, or still writing) is refused, as
    its whole would be another file: the message says how many flows are intact, and how to
    keep them in a file of their own, which imports."""
    whole, cut = tmp_path / "whole.mitm", tmp_path / "cut.mitm"
    write_flows(whole, [tflow.tflow(resp=True) for _ in range(3)])
    cut.write_bytes(whole.read_bytes()[:-20])
    db = tmp_path / "log.db"
    result = CliRunner().invoke(main, ["import", str(cut), "--db", str(db)])
    assert result.exit_code == 2 and not db.exists()
    assert f"{cut}: damaged after 2 flows (Invalid data format.), the rest cannot be read" in result.output
    intact = tmp_path / "INTACT.mitm"
    said = f"`mitmdump -nr {cut} -w INTACT.mitm` writes the 2 intact flows to a file of their own"
    assert said in result.output.replace("\n", " ")
    rewrite = [MITMDUMP, "-nr", str(cut), "-w", str(intact), "--set", f"confdir={tmp_path / 'conf'}"]
    subprocess.run(rewrite, capture_output=True, check=False, timeout=60)  # (exits 1: the file is damaged)
    result = CliRunner().invoke(main, ["import", str(intact), "--db", str(db)])
    assert result.exit_code == 0 and f"2 exchanges from {intact}" in result.output


def posting() -> web.Application:
    """An upstream answering POST /upload with the length of the body it read."""

    async def upload(request: web.Request) -> web.Response:
        return web.json_response({"read": len(await request.read())})

    app = web.Application()
    app.router.add_post("/upload", upload)
    return app


def test_a_request_body_not_in_the_flow_file_is_said_cut(tmp_path: Path) -> None:
    """mitmproxy keeps no body it streams (stream_large_bodies), nor one whose client left
    before sending it all: such a request was imported as one with no body at all
    (request_body NULL, not truncated, not a word); it is cut, and said."""
    port, flows, db = free_port(), tmp_path / "flows.mitm", tmp_path / "log.db"
    probe, marks = seen_by_mitmproxy(tmp_path)
    with in_thread(posting()) as url:
        args = [MITMDUMP, "-w", str(flows), "-s", str(probe), "--set", "stream_large_bodies=10k"]
        args += mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")
        with running(args, [port], tmp_path / "mitmdump.txt"):
            with httpx.Client() as client:
                for size in (100, 50_000):
                    posted = client.post(f"http://127.0.0.1:{port}/upload", content=b"x" * size)
                    assert posted.json() == {"read": size}
            with socket.create_connection(("127.0.0.1", port)) as sock:  # leaving 10 bytes in
                sock.sendall(b"POST /left HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            wait_for_mark(marks, "error /left")
    result = CliRunner().invoke(main, ["import", str(flows), "--db", str(db)])
    assert result.exit_code == 0, result.output
    with EventLog(db) as log:
        got = [(x["request_body"], x["request_body_truncated"], x["error"]) for x in log.exchanges()]
    assert got[:2] == [("x" * 100, 0, None), (None, 1, REQUEST_NOT_KEPT)]
    assert got[2][:2] == (None, 1) and got[2][2].endswith(f"; {REQUEST_CUT}")


async def test_flows_saved_in_flight_never_finished(tmp_path: Path) -> None:
    """A plain mitmdump -w stopped (Ctrl-C) saves the flows in flight, with no error: an
    event stream whose head mitmproxy kept while buffering the body, a request not yet
    answered. They were imported complete, the stream said to have been streamed through;
    they end proxy_stopped, without the head the client never got, as the addon records
    them when mitmproxy stops under it. So does mitmdump -r with the addon loaded, which
    left the unanswered one out."""
    asked = {"/held": asyncio.Event(), "/unanswered": asyncio.Event()}

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        path = (await reader.readuntil(b"\r\n\r\n")).split(b" ")[1].decode()
        if path == "/plain":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        elif path == "/held":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n")
        await writer.drain()
        if path in asked:
            asked[path].set()
            await reader.read()  # (until mitmdump, stopping, closes the connection)
        writer.close()

    port, flows = free_port(), tmp_path / "flows.mitm"
    probe, marks = seen_by_mitmproxy(tmp_path)
    async with raw_upstream(answer) as url, aiohttp.ClientSession() as session:
        args = [MITMDUMP, "-w", str(flows), "-s", str(probe), "--set", "connection_strategy=lazy"]
        args += mitmdump_args(tmp_path / "conf", f"reverse:{url}@{port}")
        with running(args, [port], tmp_path / "mitmdump.txt") as proc:
            proxy = f"http://127.0.0.1:{port}"
            async with session.get(f"{proxy}/plain") as r:
                assert await r.read() == b"ok"
            pending = [asyncio.ensure_future(session.get(f"{proxy}{path}")) for path in asked]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in asked.values())), 10)
            await asyncio.to_thread(wait_for_mark, marks, "responseheaders /held")
            assert await asyncio.to_thread(proc.stop) == 0
        for left in await asyncio.gather(*pending, return_exceptions=True):
            assert isinstance(left, aiohttp.ClientError)  # (nothing came: mitmproxy had it all)
    imported, read = tmp_path / "imported.db", tmp_path / "read.db"
    result = CliRunner().invoke(main, ["import", str(flows), "--db", str(imported)])
    assert result.exit_code == 0, result.output
    reading = [MITMDUMP, "-nr", str(flows), "-s", str(addon_path()), "--set", f"tasktape_db={read}"]
    subprocess.run([*reading, *mitmdump_args(tmp_path / "conf")], check=True, capture_output=True, timeout=60)
    for db in (imported, read):
        with EventLog(db) as log:
            got = {x["path"]: (x["status"], x["outcome"], x["error"]) for x in log.exchanges()}
            assert [[c["data"] for c in log.chunks(x["id"])] for x in log.exchanges()] == [[b"ok"], [], []]
        assert got == {
            "/plain": (200, "complete", None),
            "/held": (None, "proxy_stopped", STOPPED),
            "/unanswered": (None, "proxy_stopped", STOPPED),
        }, db.name
