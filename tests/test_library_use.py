"""The Python API used as a library, carelessly: one string where a list of names goes, a
mode given by its name, text no stream sends, a cassette written into no folder, one
source given alone, a path or one exchange given the checker. Each is refused in the error
tree, or does what was meant."""

from __future__ import annotations

import asyncio
import math
import os
import re
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
from conftest import Serve
from loopback import answering_anything

import tasktape
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.models import parse_stream_response
from tasktape.eventlog.producer import NullWriter
from tasktape.proxy import RecordingProxy

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "make",
    [
        lambda: tasktape.Redactor(headers="X-Tenant"),
        lambda: tasktape.Redactor(query="token"),
        lambda: tasktape.Redactor(json_pointers="/apiKey"),
        lambda: tasktape.MatchRules.of(headers="X-Tenant"),
        lambda: tasktape.MatchRules.of(ignore="/metadata"),
        lambda: RecordingProxy("http://127.0.0.1:9", NullWriter(), credential_headers="X-Tenant"),
    ],
    ids=["redacted headers", "redacted query", "json pointers", "matched headers", "ignored", "credentials"],
)
def test_one_string_where_a_list_of_names_goes_is_refused(make: object) -> None:
    """Its letters were taken for the names: the header "X-Tenant" went into the log as it
    was, while headers named "x", "-", "t"... were redacted."""
    with pytest.raises(tasktape.UsageError, match=r"is a list of names, not one string: write \['"):
        make()  # type: ignore[operator]


async def test_a_replay_mode_given_by_its_name_is_that_mode(serve: Serve) -> None:
    """A str mode was never the enum member the server compared by identity: passthrough
    replayed instead, record-missing skipped its checks, replay raised AttributeError."""
    contacted: list[str] = []
    upstream = await serve(answering_anything(contacted))
    server = tasktape.ReplayServer([], mode="passthrough", upstream=upstream)
    assert server.mode is tasktape.ReplayMode.PASSTHROUGH
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session, session.get(f"{url}/anything") as r:
        assert r.status == 200
    assert contacted
    assert tasktape.ReplayServer([], mode="replay").mode is tasktape.ReplayMode.REPLAY
    with pytest.raises(tasktape.UsageError, match="give its writer and path"):
        tasktape.ReplayServer([], mode="record-missing", upstream=upstream)
    with pytest.raises(tasktape.UsageError, match="'replya' is not a replay mode"):
        tasktape.ReplayServer([], mode="replya")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"writer": None}, "writer is a LogWriter or ProcessLogWriter, not NoneType"),
        ({"writer": "log.db"}, "writer is a LogWriter or ProcessLogWriter, not str"),
        ({"public_url": "ftp://proxy"}, "the public URL must be an http:// or https:// URL"),
        ({"hold": float("nan")}, "hold is a number of seconds, at least 0, not nan"),
        ({"hold": float("inf")}, "hold is a number of seconds, at least 0, not inf"),
        ({"rejoin_for": -1}, "rejoin_for is a number of seconds, at least 0, not -1"),
        ({"max_request_body": 1.5}, "max_request_body is a whole number, at least 0, not 1.5"),
        ({"connect_timeout": "10"}, "connect_timeout is a number of seconds, at least 0, not '10'"),
    ],
)
def test_a_recording_proxy_refuses_what_the_command_line_refuses(
    options: dict[str, object], words: str
) -> None:
    """Taken, each failed at the first request (a writer that is none), when the app was
    built (a NaN hold), or never (a public URL no client can use in an agent card)."""
    given: dict[str, object] = {"writer": NullWriter(), **options}
    writer = given.pop("writer")
    with pytest.raises(tasktape.UsageError, match=re.escape(words)):
        RecordingProxy("http://127.0.0.1:9", writer, **given)  # type: ignore[arg-type]


def test_text_no_stream_sends_is_classified_or_refused_as_documented() -> None:
    """classify never raises, even on a lone surrogate (text decoded with surrogateescape);
    parse_stream_response raises FrameError, even on JSON nested past what Python follows."""
    assert tasktape.classify('{"a": "\ud800"}').kind == "other"
    update = '{"statusUpdate": {"taskId": "t\ud800", "status": {"state": "TASK_STATE_WORKING"}}}'
    assert tasktape.classify(update).state == "TASK_STATE_WORKING"
    with pytest.raises(tasktape.FrameError, match="not JSON"):
        parse_stream_response('{"task": ' + "[" * 5000 + "]" * 5000 + "}")


def test_a_cassette_of_the_longest_name_a_folder_takes_is_written(tmp_path: Path) -> None:
    """A name of 241 to 255 bytes failed "File name too long": the file written first was
    named after it, and longer."""
    recorded = tasktape.read_cassette(ROOT / "cassettes" / "completed.jsonl")
    target = tmp_path / ("c" * 249 + ".jsonl")
    write_cassette(target, recorded)
    assert [r.chunks for r in tasktape.read_cassette(target)] == [r.chunks for r in recorded]
    assert os.listdir(tmp_path) == [target.name]


def test_a_cassette_written_into_no_folder_says_which(tmp_path: Path) -> None:
    """It raised FileNotFoundError naming the file written first (.c.jsonl.NNN.partial)."""
    target = tmp_path / "missing" / "c.jsonl"
    with pytest.raises(tasktape.CassetteError, match=f"cannot write {target}: its folder .* does not exist"):
        write_cassette(target, [])


async def test_a_recording_proxy_mounted_elsewhere_says_it_was_not_started(
    serve: Serve, tmp_path: Path
) -> None:
    """A bare AssertionError became a 500, logged as a client that went away; started
    twice, its first upstream session leaked."""
    with tasktape.LogWriter(tmp_path / "mounted.db") as writer:
        proxy = RecordingProxy("http://127.0.0.1:9", writer)
        app = aiohttp.web.Application()
        errors: list[BaseException] = []

        async def handler(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
            try:
                return await proxy.handle(request)
            except tasktape.UsageError as exc:
                errors.append(exc)
                raise aiohttp.web.HTTPServiceUnavailable() from None

        app.router.add_get("/x", handler)
        url = await serve(app)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/x") as r:
            assert r.status == 503
        assert "not started: await its start()" in str(errors[0])
        await proxy.start()
        with pytest.raises(tasktape.UsageError, match="started already"):
            await proxy.start()
        await proxy.close()
        await proxy.start()  # (served again: its app starts it again)
        await proxy.close()


def test_one_source_given_alone_is_refused_saying_how() -> None:
    """A str's letters were taken for the sources: "c: no such file or folder"."""
    cassette = str(ROOT / "cassettes" / "completed.jsonl")
    with pytest.raises(tasktape.SourceError, match=r"load\(\) takes a list of sources"):
        tasktape.load(cassette)  # type: ignore[arg-type]
    assert tasktape.load([cassette])


def test_the_checker_given_a_path_or_one_exchange_says_what_to_pass(tmp_path: Path) -> None:
    """check_log("captures.db") raised AttributeError ('str' object has no attribute
    'exchanges'), check_recorded(recorded) TypeError ('Recorded' object is not iterable)."""
    db = tmp_path / "captures.db"
    recorded = tasktape.read_cassette(ROOT / "cassettes" / "completed.jsonl")
    with tasktape.LogWriter(db) as writer:
        capture = writer.begin_capture(source="record", upstream="http://127.0.0.1:9")
        exchange = writer.begin_exchange(capture, method="GET", path="/tasks/t1")
        writer.end_exchange(exchange, duration_ns=1)
    said = re.escape(f"the log to check is an EventLog, not a path: write EventLog('{db}')")
    with pytest.raises(tasktape.UsageError, match=said):
        tasktape.check_log(str(db))  # type: ignore[arg-type]
    with tasktape.EventLog(db) as log:
        said = re.escape("exchange_ids is a list of exchange ids, not one: write [1]")
        with pytest.raises(tasktape.UsageError, match=said):
            tasktape.check_log(log, 1)  # type: ignore[arg-type]
        assert tasktape.check_log(log, [1]) == []
    with pytest.raises(tasktape.UsageError, match=re.escape("not one alone: write [recorded]")):
        tasktape.check_recorded(recorded[0])  # type: ignore[arg-type]
    with pytest.raises(tasktape.UsageError, match=r"the exchanges to check are Recorded .*, not str"):
        tasktape.check_recorded("completed.jsonl")  # type: ignore[arg-type]
    assert tasktape.check_recorded(recorded) == []


def twelve_exchanges(db: Path) -> None:
    """A log of twelve exchanges, /p1 to /p12."""
    with tasktape.LogWriter(db) as writer:
        capture = writer.begin_capture(source="record")
        for n in range(1, 13):
            exchange = writer.begin_exchange(capture, method="GET", path=f"/p{n}")
            writer.response_head(exchange, status=200, headers=[], is_sse=False, ttfb_ns=1)
            writer.chunk(exchange, 1, b"x")
            writer.end_exchange(exchange, duration_ns=2)


def test_exchange_ids_given_as_one_id_or_text_are_refused_saying_how(tmp_path: Path) -> None:
    """read_log(db, exchange_ids="12") returned exchanges 1 and 2, select(exchanges="12")
    the strings '1' and '2'; one int alone, or a str among ints, raised TypeError."""
    db = tmp_path / "twelve.db"
    twelve_exchanges(db)
    for given in ("12", b"12", 12):
        with pytest.raises(
            tasktape.UsageError, match=r"^exchange_ids is a list of exchange ids, not one.*: write \[12\]$"
        ):
            tasktape.read_log(db, exchange_ids=given)  # type: ignore[arg-type]
    with pytest.raises(tasktape.UsageError, match="whole numbers such as 12: not True"):
        tasktape.read_log(db, exchange_ids=[True])
    assert [r.path for r in tasktape.read_log(db, exchange_ids=[12])] == ["/p12"]
    with tasktape.EventLog(db) as log:
        with pytest.raises(
            tasktape.UsageError, match=r"^exchanges is a list of exchange ids, not one string: write \[12\]$"
        ):
            log.select(exchanges="12")  # type: ignore[arg-type]
        with pytest.raises(
            tasktape.UsageError,
            match=r"^exchanges is a list of exchange ids, whole numbers such as 12: not '2'$",
        ):
            log.select(exchanges=[1, "2"])  # type: ignore[list-item]
        assert log.select(exchanges=[12], with_cards=False) == [12]
        # (check_log read "12" as the exchanges 1 and 2)
        with pytest.raises(
            tasktape.UsageError, match=r"^exchange_ids is a list .*, not one string: write \[12\]$"
        ):
            tasktape.check_log(log, "12")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            {"chunks": [(0, "text")]},
            "chunks are (offset_ns, bytes) pairs, an int and bytes, not (0, 'text'): for text",
        ),
        ({"chunks": [(0.5, b"x")]}, "chunks are (offset_ns, bytes) pairs, an int and bytes, not (0.5, b'x')"),
        ({"chunks": b"ok"}, "chunks are a list of (offset_ns, bytes) pairs, not bytes"),
        (
            {"response_headers": {"Content-Type": "text/plain"}},
            "response_headers are a list of (name, value) pairs, not dict: pass list(headers.items())",
        ),
        (
            {"request_headers": [("Accept",)]},
            "request_headers are (name, value) pairs of strings, not ('Accept',)",
        ),
        ({"request_body": "hello"}, "request_body is bytes or None, not str: encode it"),
        ({"path": None}, "path is text (str), not NoneType"),
        ({"method": b"GET"}, "method is text (str), not bytes"),
        ({"query": 5}, "query is the URL's query string (str) or None, not int"),
    ],
    ids=[
        "text chunk",
        "float offset",
        "bytes for chunks",
        "dict of headers",
        "header without value",
        "text request body",
        "no path",
        "bytes method",
        "int query",
    ],
)
def test_a_recorded_exchange_made_in_another_shape_says_what_to_pass(
    given: dict[str, object], said: str
) -> None:
    """Made by hand so, it was taken: then its body raised TypeError, serving it ValueError
    (not enough values to unpack), far from where it was made; a request line or body that
    is no text and bytes crashed serving, checking and writing it with TypeError."""
    with pytest.raises(tasktape.UsageError, match=re.escape(f"Recorded's {said}")):
        tasktape.Recorded(**{"method": "GET", "path": "/", "status": 200, **given})  # type: ignore[arg-type]


def test_a_recorded_request_changed_to_no_text_is_refused_by_what_takes_it(tmp_path: Path) -> None:
    """A path set to None after it was made: the replay server, check_recorded and
    write_cassette raised TypeError; now each says which exchange, and nothing is written."""
    recorded = tasktape.Recorded(method="GET", path="/health", status=200, chunks=[(0, b"ok")])
    recorded.path = None  # type: ignore[assignment]
    said = re.escape("Recorded's path is text (str), not NoneType")
    with pytest.raises(tasktape.UsageError, match=f"^recording 1 .*: {said}$"):
        tasktape.ReplayServer([recorded])
    with pytest.raises(tasktape.UsageError, match=f"^exchange 1 to check .*: {said}$"):
        tasktape.check_recorded([recorded])
    with pytest.raises(tasktape.CassetteError, match=f"exchange 1: {said}$"):
        tasktape.write_cassette(tmp_path / "c.jsonl", [recorded])
    assert not (tmp_path / "c.jsonl").exists()


def test_write_cassette_given_one_exchange_or_what_json_cannot_hold_says_so(tmp_path: Path) -> None:
    """One Recorded raised TypeError ('Recorded' object is not iterable), a datetime in the
    header TypeError (not JSON serializable), a text chunk added after it was made
    AttributeError; none wrote anything, and none now does. A NaN or infinity in the header
    was written as NaN or Infinity, which no JSON reader takes."""
    target = tmp_path / "c.jsonl"
    answer = tasktape.Recorded(method="GET", path="/health", status=200, chunks=[(0, b"ok")])
    with pytest.raises(tasktape.UsageError, match=re.escape("not one: write [recorded]")):
        tasktape.write_cassette(target, answer)  # type: ignore[arg-type]
    with pytest.raises(tasktape.UsageError, match="takes a list of Recorded exchanges, not str"):
        tasktape.write_cassette(target, "answer.jsonl")  # type: ignore[arg-type]
    with pytest.raises(
        tasktape.CassetteError,
        match=f"cannot write {target}: the header's made is written as JSON, which has no form .*datetime",
    ):
        tasktape.write_cassette(target, [answer], made=datetime.now(UTC))
    for number in (math.nan, math.inf):  # (written as NaN, Infinity: no JSON)
        with pytest.raises(
            tasktape.CassetteError,
            match=f"cannot write {target}: the header's x is written as JSON, which has no form for it",
        ):
            tasktape.write_cassette(target, [answer], x={"n": number})
    added = tasktape.Recorded(method="GET", path="/later", status=200)
    added.chunks.append((0, "text"))  # type: ignore[arg-type]
    with pytest.raises(
        tasktape.CassetteError, match=re.escape(f"cannot write {target}: exchange 2: Recorded's chunks are")
    ):
        tasktape.write_cassette(target, [answer, added])
    assert not target.exists()
    tasktape.write_cassette(target, [answer], made=datetime.now(UTC).isoformat())
    assert tasktape.read_cassette(target)[0].body == b"ok"


@pytest.mark.parametrize("given", [None, "", 0, []], ids=repr)
def test_a_decoder_fed_no_bytes_at_its_start_says_what_to_feed(given: object) -> None:
    """Falsy, they were read as a chunk of no bytes and gave no events, without a word."""
    decoder = tasktape.SSEDecoder()
    said = f"^SSEDecoder.feed takes bytes, as received, not {type(given).__name__}"
    with pytest.raises(tasktape.UsageError, match=said):
        decoder.feed(given)  # type: ignore[arg-type]
    assert [e.data for e in decoder.feed(b"data: x\n\n")] == ["x"]


def test_a_replay_server_given_paths_or_values_of_another_kind_says_what_to_pass() -> None:
    """ReplayServer("answer.jsonl") was an AttributeError far inside it, faults=3 a
    TypeError, redactor=["X"] an AttributeError; header_timeout="5" was taken, and every
    connection then failed in aiohttp."""
    recorded = tasktape.read_cassette(ROOT / "cassettes" / "completed.jsonl")
    for given, said in (
        ("answer.jsonl", "not 'answer.jsonl': load them first, load([path])"),
        (["answer.jsonl"], "not paths such as 'answer.jsonl': load them first, load(paths)"),
        (recorded[0], "not one alone: write [recorded]"),
        ([1], "not int"),
    ):
        with pytest.raises(tasktape.UsageError, match=re.escape(said)):
            tasktape.ReplayServer(given)  # type: ignore[arg-type]
    for options, said in (
        ({"faults": 3}, "faults are a Faults, a spec such as 'drop-after=3', or a list of them, not 3"),
        ({"redactor": ["X"]}, "redactor must be a tasktape Redactor"),
        ({"header_timeout": "5"}, "header_timeout"),
    ):
        with pytest.raises(tasktape.UsageError, match=re.escape(said)):
            tasktape.ReplayServer(recorded, **options)  # type: ignore[arg-type]
    assert tasktape.ReplayServer(tuple(recorded), faults="drop-after=3").armed


async def test_apps_served_again_tell_a_client_leaving_from_a_stop(tmp_path: Path) -> None:
    """Served, stopped and served again, a replay server and a recording proxy took every
    client that left afterwards for their stop ("stopped", proxy_stopped)."""
    events = [b'id: %d\ndata: {"statusUpdate": {"taskId": "t1"}}\n\n' % i for i in range(10)]
    recorded = tasktape.Recorded(
        method="POST",
        path="/message:stream",
        request_body=b"{}",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(i * 200_000_000, event) for i, event in enumerate(events)],
    )
    agent = tasktape.ReplayServer([recorded], allow_repeats=True, every_answer=True)
    replay = tasktape.ReplayServer([recorded], allow_repeats=True, every_answer=True)
    agent_runner = aiohttp.web.AppRunner(agent.app, handler_cancellation=True)
    await agent_runner.setup()
    await aiohttp.web.TCPSite(agent_runner, "127.0.0.1", 0).start()
    agent_url = f"http://127.0.0.1:{agent_runner.addresses[0][1]}"
    db = tmp_path / "again.db"
    with tasktape.LogWriter(db) as writer:
        proxy = RecordingProxy(agent_url, writer)
        for n, (app, answers) in enumerate(((replay.app, replay), (proxy.app, agent)) * 2):
            runner = aiohttp.web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{url}/message:stream", data=b"{}") as r,
            ):
                await r.content.readuntil(b"\n\n")  # one event, then the client leaves
            for _ in range(200):  # until the answer has seen it go (the n // 2 + 1th of its server)
                if sum(bool(served.reasons) for served in answers.served) > n // 2:
                    break
                await asyncio.sleep(0.02)
            await runner.cleanup()
    await agent_runner.cleanup()
    assert [[r.partition(":")[0] for r in served.reasons] for served in replay.served] == [
        ["client-left"]
    ] * 2
    with tasktape.EventLog(db) as log:
        assert [x["outcome"] for x in log.exchanges()] == ["client_disconnected"] * 2


def test_a_recorded_exchange_changed_after_it_was_made_is_refused_by_the_replay_server() -> None:
    """A text chunk appended, or a header value set to an int, after it was made: the
    server raised TypeError, or took the header and answered 500 when it was asked for,
    where write_cassette refused both naming the exchange."""
    recorded = tasktape.read_cassette(ROOT / "cassettes" / "completed.jsonl")
    recorded[1].response_headers.append(("X-Attempt", 5))  # type: ignore[arg-type]
    said = f"recording 2 ({recorded[1].origin}): Recorded's response_headers are (name, value) pairs of"
    with pytest.raises(tasktape.UsageError, match=re.escape(said)):
        tasktape.ReplayServer(recorded)
    added = tasktape.Recorded(method="GET", path="/health", status=200, chunks=[(0, b"ok")])
    added.chunks.append((1, "text"))  # type: ignore[arg-type]
    said = "recording 1 (GET /health): Recorded's chunks are (offset_ns, bytes) pairs, an int and bytes"
    with pytest.raises(tasktape.UsageError, match=re.escape(said)):
        tasktape.ReplayServer([added])


@pytest.mark.parametrize("given", [3, b"drop-after=3", None], ids=["int", "bytes", "None"])
def test_a_fault_spec_that_is_no_text_is_a_fault_error(given: object) -> None:
    """Faults.parse(3) raised AttributeError, Faults.parse(b"drop-after=3") TypeError, and
    Faults.parse(None) gave no faults, unsaid."""
    said = f"a fault spec is text such as 'drop-after=3', not {type(given).__name__}"
    with pytest.raises(tasktape.FaultError, match=f"^{re.escape(said)}$"):
        tasktape.Faults.parse(given)  # type: ignore[arg-type]


def test_a_writer_left_open_in_this_process_is_named_when_another_is_refused(tmp_path: Path) -> None:
    """A LogWriter never closed holds the log for as long as the process lives: the next
    was told of "another tasktape writer (by this name or another)", as if another
    program were writing the log."""
    db = tmp_path / "left.db"
    first = tasktape.LogWriter(db)
    try:
        said = rf"^{re.escape(str(db))} is being written by another tasktape writer in this process"
        with pytest.raises(tasktape.LogBusy, match=said + r" \(pid \d+\): close\(\) the first$"):
            tasktape.LogWriter(db)
    finally:
        first.close()
    tasktape.LogWriter(db).close()


def test_rows_of_an_exchange_the_log_has_not_are_an_error(tmp_path: Path) -> None:
    """exchange(99) raised UnknownExchange, body(99), chunks(99) and events(99) gave an
    empty body, as if the exchange had sent none."""
    db = tmp_path / "one.db"
    with tasktape.LogWriter(db) as writer:
        exchange = writer.begin_exchange(writer.begin_capture(source="test"), method="GET", path="/")
        writer.end_exchange(exchange, duration_ns=1)
    with tasktape.EventLog(db) as log:
        assert (log.body(exchange), log.chunks(exchange), log.events(exchange)) == (b"", [], [])
        for read in (log.exchange, log.body, log.chunks, log.events):
            with pytest.raises(tasktape.UnknownExchange, match=f"no exchange 99 in {db}"):
                read(99)
