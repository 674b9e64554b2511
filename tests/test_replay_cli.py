"""`tasktape replay` as a user runs it: ready line, answers, and the report on exit."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from conftest import RecordFactory
from loopback import finished, running, serve, stop, upstream_app
from ports import free_port
from yarl import URL

from tasktape.eventlog import LogWriter
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.serving import bind


def cassette(path: Path) -> Path:
    answer = Recorded(
        method="POST",
        path="/message:send",
        request_body=b'{"message": {"parts": [{"text": "hi"}]}}',
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(1_000_000, b'{"task": {"id": "t1", "status": {"state": "TASK_STATE_COMPLETED"}}}')],
        duration_ns=2_000_000,
        outcome="complete",
    )
    unused = Recorded(method="GET", path="/tasks/t1", status=200, chunks=[(0, b"{}")], outcome="complete")
    write_cassette(path, [answer, unused])
    return path


async def test_serves_then_reports_on_exit(tmp_path: Path) -> None:
    source = cassette(tmp_path / "session.jsonl")
    args = ("--listen", "127.0.0.1:0", "--speed", "0", "--match-header", "X-Tenant")
    async with running("replay", str(source), *args) as run:
        match = re.search(
            r"2 exchanges from .*session.jsonl on (http://127\.0\.0\.1:\d+) \(speed 0, mode replay\)",
            run.printed[0],
        )
        assert match, run.printed[0]
        url = match.group(1)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/message:send", json={"message": {"parts": [{"text": "hi"}]}}
            ) as r:
                assert (await r.json())["task"]["id"] == "t1"
            async with session.get(f"{url}/tasks/t1", headers={"X-Tasktape-Fault": "status=503"}) as r:
                assert r.status == 503
            async with session.get(f"{url}/tasks/t1", headers={"X-Tasktape-Fault": "explode=1"}) as r:
                assert r.status == 400
            async with session.post(
                f"{url}/message:send",
                json={"message": {"parts": [{"text": "other"}]}},
                headers={"X-Tenant": "south"},
            ) as r:
                (closest, *_) = json.loads(await r.text())["error"]["closest"]
                assert r.status == 404 and 'header x-tenant "south" vs (absent)' in closest["differs"]
        assert await stop(run, signal.SIGINT) == 0
        err = run.printed[-1]
    assert "tasktape replay: 2 served, 1 missed, 1 refused" in err
    assert "  refused GET /tasks/t1 (X-Tasktape-Fault 'explode=1': unknown fault 'explode'; use " in err
    assert (
        "missed POST /message:send" in err
        and 'body differs at /message/parts/0/text ("other" vs "hi")' in err
    )
    assert "recorded exchanges were never used" not in err
    assert re.search(r"fidelity: 1 of 2 answers byte-identical, latest chunk [\d.]+ ms behind schedule", err)
    assert re.search(r"GET /tasks/t1 \(session.jsonl:\d+\): fault: status=503", err)


async def test_the_redaction_options_hide_values_from_what_misses_report(tmp_path: Path) -> None:
    """In replay mode, --redact-query and --redact-json say what a miss's answer and the exit
    summary hide (both end up in logs), though the recordings hold those values as sent."""
    source = cassette(tmp_path / "session.jsonl")
    args = ("--listen", "127.0.0.1:0", "--speed", "0", "--redact-query", "sess", "--redact-json", "/apiKey")
    async with running("replay", str(source), *args) as run:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{run.url}/message:send?sess=sk-live-1", json={"apiKey": "sk-live-2", "message": {}}
            ) as r,
        ):
            answer = await r.text()
        assert await stop(run, signal.SIGINT) == 0
        err = run.printed[-1]
    assert r.status == 404 and "sk-live" not in answer and "sk-live" not in err
    assert "  missed POST /message:send?sess=[REDACTED]" in err
    assert "query sess=[REDACTED] vs (none); body differs at /apiKey ((a value) vs (absent))" in err


async def test_a_stream_cut_by_the_stop_is_said_to_be_stopped_not_left(tmp_path: Path) -> None:
    """Ctrl-C while a stream goes out: the report says the server stopped it (it said the
    client left)."""
    events = [(n * 100_000_000, f"data: {n}\n\n".encode()) for n in range(50)]  # 5 s of them
    stream = Recorded(
        method="GET",
        path="/stream",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=events,
        duration_ns=5_000_000_000,
        outcome="complete",
    )
    write_cassette(tmp_path / "long.jsonl", [stream])
    async with running("replay", str(tmp_path / "long.jsonl"), "--listen", "127.0.0.1:0") as run:
        url = re.search(r"on (http://127\.0\.0\.1:\d+)", run.printed[0]).group(1)  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as session, session.get(f"{url}/stream") as r:
            assert await r.content.readuntil(b"data: 2\n\n")
            assert await stop(run, signal.SIGINT) == 0
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
        err = run.printed[-1]
    assert re.search(r"GET /stream \(long.jsonl:\d+\): stopped: after \d+ bytes", err), err
    assert "client-left" not in err


async def test_the_exit_summary_says_answers_that_differed_alike_once(tmp_path: Path) -> None:
    """An agent card served a thousand times differs a thousand times the same way: the
    exit summary says so in one line, with the count."""
    card = Recorded(
        method="GET",
        path="/.well-known/agent-card.json",
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(0, b'{"name": "agent", "url": "http://agent.example/rpc"}')],
        outcome="complete",
    )
    write_cassette(tmp_path / "card.jsonl", [card])
    args = ("--listen", "127.0.0.1:0", "--speed", "0", "--allow-repeats")
    async with running("replay", str(tmp_path / "card.jsonl"), *args) as run:
        url = re.search(r"on (http://127\.0\.0\.1:\d+)", run.printed[0]).group(1)  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                async with session.get(f"{url}/.well-known/agent-card.json") as r:
                    await r.read()
            async with session.get(f"{url}/_tasktape/report") as r:
                report = await r.json()
        assert await stop(run, signal.SIGINT) == 0
        err = run.printed[-1]
    assert (report["answers"], report["reasons"], len(report["streams"])) == (300, {"rewrite": 300}, 300)
    lines = [line for line in err.splitlines() if "agent-card.json" in line]
    assert len(lines) == 1 and lines[0].endswith(f"rewrite: the agent card points at {url} (x300)"), err
    assert "fidelity: 0 of 300 answers byte-identical" in err


async def test_passthrough_needs_no_source_and_reports_no_unused_ones(tmp_path: Path) -> None:
    async with serve(upstream_app(events=3)) as agent:
        for sources in ((), (str(cassette(tmp_path / "session.jsonl")),)):
            args = ("--mode", "passthrough", "--upstream", agent, "--listen", "127.0.0.1:0")
            async with running("replay", *sources, *args) as run:
                assert f"on {run.url}, everything goes to {agent} (mode passthrough)" in run.printed[0]
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(
                        f"{run.url}/message:stream", json={}, headers={"X-Tasktape-Fault": "drop-after=1"}
                    ) as r,
                ):
                    assert (await r.read()).count(b"data:") == 3  # forwarded live: no fault made
                assert await stop(run, signal.SIGINT) == 0
            assert "0 served, 0 missed, 1 forwarded" in run.printed[-1]
            assert "never used" not in run.printed[-1]
            assert (
                "  X-Tasktape-Fault drop-after=1 of POST /message:stream not applied: the request was "
                "forwarded live to the upstream" in run.printed[-1]
            )
    code, err = await finished("replay", "--listen", "127.0.0.1:0")
    assert code == 2 and "Missing argument 'SOURCE...'" in err


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (
            ["--mode", "record_missing"],
            2,
            "not a replay mode; choose one of replay, record-missing, passthrough",
        ),
        (["--mode", "passthrough"], 2, "mode passthrough needs --upstream"),
        (
            ["--fault", "drop-after=x"],
            2,
            "Invalid value for --fault: cannot read the fault 'drop-after=x': it is drop-after=N, N a whole "
            "number of events, 0 or more",
        ),
        (["--fault", "stall=3"], 2, "it is stall=N:MS, N:MS an event count, a colon and milliseconds"),
        (["--fault", "seed=q"], 2, "it is seed=S, S a whole number"),
        (["--fault", "no-final=2"], 2, "cannot read the fault 'no-final=2': no-final takes no value"),
        (["--fault", "times=1"], 2, "names no fault"),
        (["--mode", "record-missing", "--upstream", "http://127.0.0.1:9"], 2, "record-missing needs --db"),
        (["--ignore", "foo"], 2, "Invalid value for '--ignore': not a JSON pointer (it must start with '/')"),
        *(
            (
                ["--miss-status", status],
                2,
                "a miss is answered with an error status, 400 to 599, not " + status,
            )
            for status in ("100", "101", "204", "304", "200")
        ),
        *(
            (["--speed", speed], 2, "the speed is 0 (as fast as possible) or a finite number above it, not ")
            for speed in ("nan", "inf", "-1")
        ),
        (
            ["--mode", "passthrough", "--upstream", "http://127.0.0.1:9", "--fault", "drop-after=1"],
            2,
            "Invalid value for --fault: mode passthrough replays nothing",
        ),
    ],
)
async def test_bad_arguments_are_explained(
    tmp_path: Path, args: list[str], status: int, message: str
) -> None:
    source = cassette(tmp_path / "session.jsonl")
    code, err = await finished("replay", str(source), *args)
    assert code == status and message in err, err


@pytest.mark.parametrize(
    ("mode", "option"),
    [
        *(
            ("passthrough", option)
            for option in (
                ["--speed", "1"],
                ["--add-ids"],
                ["--ignore", "/metadata"],
                ["--match-header", "X-Tenant"],
                ["--allow-repeats"],
                ["--miss-status", "418"],
            )
        ),
        ("record-missing", ["--miss-status", "418"]),
    ],
)
async def test_an_option_of_matching_or_misses_is_refused_where_nothing_uses_it(
    tmp_path: Path, mode: str, option: list[str]
) -> None:
    """Passthrough matches and replays nothing, record-missing forwards a miss: each was
    taken and ignored, while --redact-header and --fault were refused."""
    args = ["--mode", mode, "--upstream", "http://127.0.0.1:9", "--db", str(tmp_path / "missing.db")]
    args = args[:4] if mode == "passthrough" else args
    code, err = await finished("replay", str(cassette(tmp_path / "c.jsonl")), *args, *option)
    assert code == 2, err
    assert f"{option[0]} is for mode replay" in err and f"mode {mode} has no use for it" in err, err
    assert not (tmp_path / "missing.db").exists()


async def test_the_usage_says_passthrough_needs_no_source() -> None:
    """The usage line said SOURCE... as if always needed, though passthrough starts without."""
    code, err = await finished("replay", "--listen", "127.0.0.1:0")
    assert code == 2 and "Usage: python -m tasktape replay [OPTIONS] [SOURCE]..." in err, err
    assert (
        "Missing argument 'SOURCE...': the logs or cassettes to replay (needed unless --mode passthrough)"
        in err
    )


async def test_a_source_that_cannot_be_read_is_a_usage_error_as_to_check(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    for command in ("replay", "check"):
        code, err = await finished(command, str(notes))
        assert code == 2 and f"Invalid value for SOURCE: {notes}:1: not JSON" in err, (command, err)


async def test_a_bad_upstream_is_explained_with_the_user_s_query_names_redacted(tmp_path: Path) -> None:
    """``--redact-query team`` keeps the value out of what replay prints, the usage error too."""
    upstream = "ftp://agent.example/?team=sk-team-1"
    args = ["--mode", "passthrough", "--redact-query", "team", "--upstream", upstream]
    status, err = await finished("replay", str(cassette(tmp_path / "c.jsonl")), *args)
    assert status == 2 and "sk-team-1" not in err
    assert "ftp://agent.example/?team=[REDACTED]" in err


async def test_a_request_its_recording_already_answered_is_said_so_as_it_comes(tmp_path: Path) -> None:
    """An SDK shows a miss as a bare 404: the console's line is where a user looks, and it
    said "no recording matches" of a request whose recording was used up."""
    source = cassette(tmp_path / "session.jsonl")
    async with running("replay", str(source), "--listen", "127.0.0.1:0", "--speed", "0") as run:
        url = re.search(r"on (http://127\.0\.0\.1:\d+)", run.printed[0]).group(1)  # type: ignore[union-attr]
        async with aiohttp.ClientSession() as session:
            for status in (200, 404):
                body = {"message": {"parts": [{"text": "hi"}]}}
                async with session.post(f"{url}/message:send", json=body) as r:
                    assert r.status == status
        assert await stop(run, signal.SIGINT) == 0
        err = run.printed[-1]
    assert re.search(
        r"POST /message:send matches session\.jsonl:\d+, already served \(answer requests more often", err
    ), err
    assert "no recording matches" not in err


async def test_requests_and_recordings_are_printed_with_their_control_characters_escaped(
    tmp_path: Path,
) -> None:
    """A client's path (percent-encoded, then decoded) and a recorded one: printed raw, in the
    miss's warning and in the summary on exit, an ESC, BEL or NUL would set the terminal's
    title or clear it (a recorded path holds no NUL: it would split the request line)."""
    recorded = "/u\x1b]0;TITLE\x07\x1b[2J"
    unused = Recorded(method="GET", path=recorded, status=200, chunks=[(0, b"{}")], outcome="complete")
    write_cassette(tmp_path / "session.jsonl", [unused])
    sent = "/x%1b%5d0%3bTITLE%07%1b%5b2J%00"
    async with running("replay", str(tmp_path / "session.jsonl"), "--listen", "127.0.0.1:0") as run:
        async with aiohttp.ClientSession() as session, session.get(URL(run.url + sent, encoded=True)) as r:
            assert r.status == 404
        assert await stop(run, signal.SIGINT) == 0
        err = run.printed[-1]
    escaped = "\\x1b]0;TITLE\\x07\\x1b[2J"
    assert f"tasktape replay: no recording matches GET /x{escaped}\\x00\n" in err, err
    assert f"\n  missed GET /x{escaped}\\x00\n" in err, err
    assert re.search(rf"\n    GET /u{re.escape(escaped)} \(session\.jsonl:\d+\)\n", err), err
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", err), err


def held_open(release: asyncio.Event) -> web.Application:
    """An agent whose POST /events stream sends event e1, then waits for ``release`` to end."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"id: e1\ndata: {}\n\n")
        await release.wait()
        await response.write(b"id: e2\ndata: {}\n\n")
        return response

    app = web.Application()
    app.router.add_post("/events", stream)
    return app


async def test_an_exchange_the_log_holds_no_end_of_breaks_off_where_the_log_stops(
    record: RecordFactory,
) -> None:
    """Replayed from a log its recorder was still writing, a stream under way was sent as a
    whole one and ended cleanly, and the report said it was byte-identical; resumed from its
    last event, it was an empty 200. As export and check take it, it is cut short where the
    log stops: it breaks off there, a resume from its last event is a miss, and both the
    load and the exit summary say so."""
    release = asyncio.Event()
    rec = await record(held_open(release))
    async with rec.session.post(f"{rec.url}/events", json={}) as live:
        assert await live.content.readuntil(b"\n\n") == b"id: e1\ndata: {}\n\n"
        await rec.writer.aflush()
        async with running("replay", str(rec.db), "--listen", "127.0.0.1:0", "--speed", "0") as run:
            received = b""
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{run.url}/events", json={}) as r:
                    with pytest.raises(aiohttp.ClientPayloadError):
                        async for data in r.content.iter_any():
                            received += data
                async with session.post(f"{run.url}/events", json={}, headers={"Last-Event-ID": "e1"}) as r:
                    (closest, *_) = (await r.json())["error"]["closest"]
            assert await stop(run, signal.SIGINT) == 0
            err = run.printed[-1]
        release.set()
        await live.read()
    assert received == b"id: e1\ndata: {}\n\n"
    assert r.status == 404
    assert closest["differs"] == [
        "its recording breaks off after event e1 (log_closed): what came after was not recorded"
    ]
    assert (
        f"tasktape replay: {rec.db.name} exchange 1 (POST /events) has no end in the log yet: replayed as "
        "cut short there (log_closed)"
    ) in err
    assert (
        "  1 recorded exchange the log held no end of when it was read, replayed cut short there "
        f"(log_closed):\n    POST /events ({rec.db.name} exchange 1)"
    ) in err


async def test_recordings_never_used_or_under_way_are_said_without_the_values_misses_hide(
    record: RecordFactory, tmp_path: Path
) -> None:
    """The lines of recordings never used, and of those a log held no end of, printed their
    query as recorded (a cassette written by hand with ?key=..., a value of --redact-query
    mode), though the misses beside them hid those values."""
    by_hand = Recorded(
        method="GET", path="/tasks", query="key=sk-live-4&page=2", status=200, outcome="complete"
    )
    written = tmp_path / "by_hand.jsonl"
    write_cassette(written, [by_hand])
    release = asyncio.Event()
    rec = await record(held_open(release))
    async with rec.session.post(f"{rec.url}/events?mode=sk-live-3", json={}) as live:
        assert await live.content.readuntil(b"\n\n") == b"id: e1\ndata: {}\n\n"
        await rec.writer.aflush()
        args = ("--listen", "127.0.0.1:0", "--redact-query", "mode")
        async with running("replay", str(rec.db), str(written), *args) as run:
            assert await stop(run, signal.SIGINT) == 0
            err = run.printed[-1]
        release.set()
        await live.read()
    assert "sk-live" not in "".join(run.printed)
    events, tasks = "POST /events?mode=[REDACTED]", "GET /tasks?key=[REDACTED]&page=2"
    assert f"{rec.db.name} exchange 1 ({events}) has no end in the log yet" in err
    assert f"were never used:\n    {events} ({rec.db.name} exchange 1)\n    {tasks} (by_hand.jsonl:2)" in err
    assert f"(log_closed):\n    {events} ({rec.db.name} exchange 1)" in err


@pytest.mark.parametrize("command", ["replay", "record", "inspect", "agent"])
async def test_a_port_another_command_bound_at_the_same_moment_is_said_to_be_in_use(
    tmp_path: Path, command: str
) -> None:
    """Two servers started at once both bound the port (a port is taken again at once, as a
    last run may leave it), and the one that listened second failed with a traceback: a
    port bound is listened on, and the other is told, in a line."""
    port = free_port()
    log = tmp_path / "log.db"
    LogWriter(log).close()
    args = {
        "replay": ("replay", str(cassette(tmp_path / "c.jsonl")), "--listen", f"127.0.0.1:{port}"),
        "record": (
            "record",
            "--upstream",
            "http://127.0.0.1:9",
            "--db",
            str(tmp_path / "new.db"),
            "--listen",
            f"127.0.0.1:{port}",
        ),
        "inspect": ("inspect", str(log), "--port", str(port)),
        "agent": ("agent", "--listen", f"127.0.0.1:{port}"),
    }[command]
    held = bind("127.0.0.1", port)  # as the other command, started at the same moment, does
    try:
        code, err = await finished(*args)
    finally:
        held.close()
    assert (code, err.strip()) == (1, f"Error: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert not (tmp_path / "new.db").exists()


@pytest.mark.parametrize("spec", [";", " ; "])
async def test_a_fault_spec_naming_no_fault_is_refused(tmp_path: Path, spec: str) -> None:
    """``--fault "$A;$B"`` with both unset started a server with nothing armed, unsaid, though
    the control API refused the same spec: it is refused as a spec naming no fault."""
    source = cassette(tmp_path / "session.jsonl")
    code, err = await finished("replay", str(source), "--listen", "127.0.0.1:0", "--fault", spec)
    assert code == 2 and f"Invalid value for --fault: {spec!r} names no fault" in err, err


async def test_answers_still_going_out_at_a_stop_get_one_second(tmp_path: Path) -> None:
    """On Ctrl-C, a stream going out was cut two seconds later, not after the second the docs
    give it: aiohttp waits its shutdown timeout for it to end, asks it to, which an answer
    being written never hears, and waits as long again. It goes on for its second, then is cut."""
    stream = Recorded(
        method="GET",
        path="/stream",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(n * 50_000_000, f"data: {n}\n\n".encode()) for n in range(600)],  # 30 s of them
        duration_ns=30_000_000_000,
        outcome="complete",
    )
    write_cassette(tmp_path / "long.jsonl", [stream])
    loop = asyncio.get_running_loop()
    async with running("replay", str(tmp_path / "long.jsonl"), "--listen", "127.0.0.1:0") as run:
        where = URL(run.url)
        reader, writer = await asyncio.open_connection(where.host, where.port)
        writer.write(f"GET /stream HTTP/1.1\r\nHost: {where.host}:{where.port}\r\n\r\n".encode())
        await reader.readuntil(b"data: 2\n\n")
        run.proc.send_signal(signal.SIGINT)
        signalled, after = loop.time(), b""
        while data := await asyncio.wait_for(reader.read(65536), 30):
            after += data
        cut = loop.time() - signalled
        writer.close()
        await asyncio.wait_for(run.proc.communicate(), 60)
    assert run.proc.returncode == 0
    assert b"data: " in after  # it went on after the signal
    # Loose, for a loaded machine: the old double wait could not end before two seconds.
    assert cut < 1.9, cut


async def test_record_missing_whose_log_lost_a_forwarded_exchange_exits_3(tmp_path: Path) -> None:
    """record-missing exited 0 after its log could not keep a forwarded miss, with a warning
    of an UnknownExchange from its on_exchange callback: the exit summary says which exchange
    was not recorded, and the exit status is 3, as tasktape record's is."""
    db = tmp_path / "missing.db"
    with LogWriter(db):
        pass
    log = sqlite3.connect(db)  # a log that refuses new exchanges: its writer cannot write them
    log.execute("CREATE TRIGGER refuse BEFORE INSERT ON exchanges BEGIN SELECT RAISE(ABORT, 'refused'); END")
    log.close()
    source = cassette(tmp_path / "session.jsonl")
    async with serve(upstream_app(events=3)) as agent:
        args = ("--mode", "record-missing", "--upstream", agent, "--db", str(db), "--listen", "127.0.0.1:0")
        async with running("replay", str(source), *args) as run:
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{run.url}/message:stream", json={}) as r,
            ):
                assert (await r.read()).count(b"data:") == 3  # answered live all the same
            code = await stop(run, signal.SIGINT)
    err = run.printed[-1]
    assert code == 3, err
    assert "WRITING THE LOG FAILED (IntegrityError: refused)" in err
    assert "UnknownExchange" not in err and "callback raised" not in err, err
    assert re.search(
        r"\n  1 forwarded exchange was not recorded whole, \d+ rows could not be written to "
        rf"{re.escape(str(db))} \([^\n]+\):\n    POST /message:stream: not recorded\n$",
        err,
    ), err
