"""Careless use that used to lose data or confuse: a start that fails writes nothing, a
recorder pointed at itself (at start, or round a loop) is refused, and Ctrl-C or a bad
URL on tasktape replay ends cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import aiohttp
from aiohttp.test_utils import TestServer
from conftest import RecordFactory
from loopback import finished, running, serve
from ports import free_port

from tasktape.agent import create_agent_app
from tasktape.eventlog import EventLog, LogWriter
from tasktape.proxy import RecordingProxy

ROOT = Path(__file__).resolve().parent.parent
CASSETTE = str(ROOT / "cassettes" / "completed.jsonl")
QUESTION = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "a new question"}]}}


async def test_a_bad_upstream_url_writes_no_log(tmp_path: Path) -> None:
    db = tmp_path / "captures.db"
    for bad in ("ftp://agent", "agent:7473", "http://"):
        code, err = await finished("record", "--upstream", bad, "--db", str(db), "--listen", "0")
        assert code == 2 and "must be an http:// or https:// URL" in err, err
        assert not db.exists()


async def test_a_port_in_use_adds_nothing_to_the_log(tmp_path: Path) -> None:
    db = tmp_path / "captures.db"
    LogWriter(db).close()
    before = db.read_bytes()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = await finished(
            "record", "--upstream", "http://127.0.0.1:9", "--db", str(db), "--listen", f"127.0.0.1:{port}"
        )
        assert code == 1 and f"cannot listen on 127.0.0.1:{port}" in err, err
        missing = tmp_path / "never.db"
        code, _ = await finished(
            "record",
            "--upstream",
            "http://127.0.0.1:9",
            "--db",
            str(missing),
            "--listen",
            f"127.0.0.1:{port}",
        )
        assert code == 1 and not missing.exists()
    assert db.read_bytes() == before
    with EventLog(db) as log:
        assert log.captures() == []


async def test_a_recorder_pointed_at_itself_is_refused_at_start(tmp_path: Path) -> None:
    db = tmp_path / "captures.db"
    port = free_port()
    for upstream in (f"http://127.0.0.1:{port}", f"http://localhost:{port}/agent"):
        code, err = await finished(
            "record", "--upstream", upstream, "--db", str(db), "--listen", f"127.0.0.1:{port}"
        )
        assert code == 2 and "this recorder's own address" in err, err
    assert not db.exists()


async def test_a_loop_through_another_proxy_is_answered_508(record: RecordFactory, tmp_path: Path) -> None:
    """A -> B -> A: the request comes back to A carrying A's Via, and is refused there
    instead of going round for ever."""
    port_b = free_port()
    a = await record(f"http://127.0.0.1:{port_b}")
    with LogWriter(tmp_path / "b.db") as writer_b:
        proxy_b = RecordingProxy(a.url, writer_b)
        server_b = TestServer(proxy_b.app, host="127.0.0.1", port=port_b)
        await server_b.start_server()
        try:
            async with a.session.get(f"{a.url}/.well-known/agent-card.json") as r:
                assert r.status == 508
                assert "came back to this recorder" in (await r.json())["error"]["message"]
        finally:
            await server_b.close()
    with await a.log() as log:
        outcomes = sorted(x["outcome"] for x in log.exchanges())
    assert outcomes == ["complete", "refused"]  # the first pass, and the one that came back


async def test_ctrl_c_right_after_a_request_in_record_missing_ends_cleanly(tmp_path: Path) -> None:
    async with serve(create_agent_app(pace=0)) as agent:
        for attempt in range(3):
            db = tmp_path / f"grows{attempt}.db"
            args = ("replay", CASSETTE, "--mode", "record-missing", "--upstream", agent, "--db", str(db))
            async with running(*args, "--listen", "127.0.0.1:0", "--speed", "0") as run:
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(f"{run.url}/message:stream", json=QUESTION) as r,
                ):
                    await r.read()
                run.proc.send_signal(signal.SIGINT)
                _, err = await asyncio.wait_for(run.proc.communicate(), 30)
                assert run.proc.returncode == 0, err.decode()
                assert b"Traceback" not in err and b"Error" not in err, err.decode()
            with EventLog(db) as log:
                assert [x["outcome"] for x in log.exchanges()] == ["complete"]


async def test_a_bad_upstream_url_on_replay_is_explained(tmp_path: Path) -> None:
    for mode in ("passthrough", "record-missing"):
        db = tmp_path / f"{mode}.db"
        code, err = await finished(
            "replay", CASSETTE, "--mode", mode, "--upstream", "not a url", "--db", str(db)
        )
        assert code == 2 and "must be an http:// or https:// URL" in err and "Traceback" not in err, err
        assert not db.exists()


async def test_a_log_record_cannot_write_is_bad_input_said_as_everywhere(tmp_path: Path) -> None:
    """A --db in a folder that does not exist, no event log, or no file (a pipe, a device:
    SQLite wrote /dev/null-journal beside it): status 2, as the other commands that take
    one say, in record's words, and nothing made beside it."""
    notes = tmp_path / "notes.txt"
    notes.write_text("some notes\n")
    fifo = tmp_path / "fifo.db"
    os.mkfifo(fifo)
    refused = {
        tmp_path / "nodir" / "r.db": "(No such file or directory): its folder",
        notes: "file is not a database",
        fifo: "it is a device or a pipe, not a file",
    }
    for db, said in refused.items():
        code, err = await finished(
            "record", "--upstream", "http://127.0.0.1:9", "--db", str(db), "--listen", "0"
        )
        assert code == 2 and f"Error: cannot open {db} as an event log" in err and said in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo.db", "notes.txt"]


async def test_demo_and_collect_say_a_missing_folder_as_record_does(tmp_path: Path) -> None:
    """demo said "cannot create the log", collect "unable to open database file"; both
    exited 1 where record, bad input, exits 2."""
    for command, db in (("demo", "demo.db"), ("collect", "c.db")):
        db_path = tmp_path / "nodir" / db
        more = ("--from", f"nats://127.0.0.1:{free_port()}") if command == "collect" else ()
        code, err = await finished(command, "--db", str(db_path), *more)
        assert code == 2, err
        said = f"Error: cannot open {db_path} as an event log (No such file or directory): its folder "
        assert f"{said}{db_path.parent} does not exist\n" in err, err
