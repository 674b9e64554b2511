"""What hostile traffic and careless use used to get past: secrets in absolute-form targets,
behind a byte order mark or after a ';', refusal reasons cut short, cassette headers that
cannot be sent, and agent data of unexpected shapes on the task page."""

from __future__ import annotations

import asyncio
import gzip
import json
import signal
from pathlib import Path

import aiohttp
import pytest
from a2a_frames import sse, status, task
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import RecordFactory, Serve
from loopback import answering, answering_anything, raw_upstream, running, serve

from tasktape.agent import create_agent_app
from tasktape.errors import CassetteError, UsageError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.recorded import Recorded, from_log
from tasktape.eventlog.redact import Redactor, parse_pointer
from tasktape.inspector.app import create_datasette
from tasktape.proxy import recorder
from tasktape.proxy.unread import reason_for
from tasktape.replay import ReplayServer

SECRET = "sk-live-0123456789"


async def raw_request(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    return answer


async def test_an_absolute_form_target_is_stored_without_its_secrets(record: RecordFactory) -> None:
    """What a client whose HTTP_PROXY points at the recorder sends: refused, and logged with
    the query redacted and no user or password."""
    rec = await record(web.Application())
    target = f"http://user:pw@agent.example/v1/x?api_key={SECRET}&keep=1"
    answer = await raw_request(rec.url, f"GET {target} HTTP/1.1\r\nHost: agent.example\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 400")
    with await rec.log() as log:
        (x,) = log.exchanges()
        rows = str(log.db.execute("SELECT * FROM exchanges").fetchall())
    assert (x["outcome"], x["path"]) == ("refused", "http://agent.example/v1/x")
    assert x["query"] == "api_key=[REDACTED]&keep=1"
    assert SECRET not in rows and "pw@" not in rows
    recorded = from_log(EventLog(rec.db))
    assert SECRET not in json.dumps([r.request_line for r in recorded])


@pytest.mark.parametrize("separator", ["&", ";"])
def test_query_parameters_after_either_separator_are_redacted(separator: str) -> None:
    redactor = Redactor(query=["token"])
    raw = f"a=1{separator}token={SECRET}{separator}api_key={SECRET}"
    assert redactor.query(raw) == f"a=1{separator}token=[REDACTED]{separator}api_key=[REDACTED]"


def test_json_behind_a_byte_order_mark_is_redacted() -> None:
    redactor = Redactor(json_pointers=["/apiKey"])
    text = "\ufeff" + json.dumps({"apiKey": SECRET, "q": 1})
    assert redactor.json_text(text) == '\ufeff{"apiKey": "[REDACTED]", "q": 1}'
    assert SECRET not in redactor.json_bytes(text.encode()).decode()
    plain = "\ufeffnot json"
    assert redactor.json_text(plain) is plain


def test_a_field_can_be_redacted_wherever_it_appears() -> None:
    """Agents echo request fields back (task.history[*].metadata ...): ``/**/name`` finds
    them at any depth."""
    redactor = Redactor(json_pointers=["/**/apiKey"])
    doc = {"apiKey": SECRET, "task": {"history": [{"metadata": {"apiKey": SECRET}}, {"x": [{"apiKey": 7}]}]}}
    out = json.loads(redactor.json_text(json.dumps(doc)))
    assert out == {
        "apiKey": "[REDACTED]",
        "task": {"history": [{"metadata": {"apiKey": "[REDACTED]"}}, {"x": [{"apiKey": "[REDACTED]"}]}]},
    }
    with pytest.raises(UsageError, match="ends with"):
        parse_pointer("/task/**")


async def test_redaction_behind_a_bom_in_a_recorded_stream(record: RecordFactory) -> None:
    event = b"data: \xef\xbb\xbf" + json.dumps({"statusUpdate": {"taskId": "t", "apiKey": SECRET}}).encode()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(event + b"\n\n")
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    rec = await record(app, redactor=Redactor(json_pointers=["/statusUpdate/apiKey"]))
    async with rec.session.post(f"{rec.url}/message:stream", json={}) as r:
        assert await r.read() == event + b"\n\n"  # the client gets it as sent
    with await rec.log() as log:
        stored = b"".join(row[0] for row in log.db.execute("SELECT data FROM chunks"))
        (ev,) = log.events(log.exchanges()[0]["id"])
    assert SECRET.encode() not in stored and SECRET not in ev["data"]


async def test_a_transfer_coding_the_recorder_would_drop_is_refused(record: RecordFactory) -> None:
    """aiohttp takes the chunks off a gzip, chunked body and leaves the gzip on: the agent
    was sent the gzip bytes as a plain body, and the log kept them as one."""
    contacted: list[str] = []
    rec = await record(answering_anything(contacted))
    body = gzip.compress(b'{"a": 1}')
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = b"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: gzip, chunked\r\n"
    head += b"Connection: close\r\n\r\n"
    answer = await raw_request(rec.url, head + chunked)
    assert answer.startswith(b"HTTP/1.1 501 ") and b"send the coding as Content-Encoding" in answer
    assert contacted == []
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert (x["status"], x["outcome"]) == (501, "refused") and "Transfer-Encoding 'gzip, chunked'" in x[
        "error"
    ]


async def test_a_transfer_coding_the_client_would_not_be_told_of_is_a_502(record: RecordFactory) -> None:
    """aiohttp takes the chunks off an answer's gzip, chunked body and leaves the gzip on: the
    client was sent the gzip bytes under chunked alone, nothing saying they were compressed."""
    body = gzip.compress(b'{"a": 1}')
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    async with raw_upstream(answering(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))) as upstream:
        rec = await record(upstream)
        async with rec.session.get(f"{rec.url}/x") as r:
            said = (await r.json())["error"]["message"]
        await rec.proxy.wait_idle()
        with await rec.log() as log:
            (x,) = log.exchanges()
    assert r.status == 502 and "answered with Transfer-Encoding 'gzip, chunked'" in said
    assert (x["status"], x["outcome"], x["error"]) == (502, "upstream_error", said)


async def answer_to(url: str, request: bytes) -> bytes:
    """All a raw ``request`` (one closing its connection) is answered through ``url``."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


@pytest.mark.parametrize(
    ("reason", "content_type", "body", "hold"),
    [
        (b"O\x01K", b"application/json", b"{}", None),
        (b"O\x7fK", b"application/json", b"{}", None),
        (b"O\x1bK", b"text/event-stream", b"data: a\n\n", None),
        (b"O\x1bK", b"text/event-stream", b"data: a\n\n", 30.0),  # a stream held: relayed apart
    ],
)
async def test_a_reason_phrase_that_cannot_be_sent_is_replaced_by_the_statuss_own(
    record: RecordFactory, reason: bytes, content_type: bytes, body: bytes, hold: float | None
) -> None:
    """aiohttp refuses a control character in a status line it sends: the client got its
    500 (an event stream, nothing of it), and the log said the client went away."""
    sent = b"HTTP/1.1 200 %s\r\nContent-Type: %s\r\n\r\n%s" % (reason, content_type, body)
    async with raw_upstream(answering(sent)) as upstream:
        rec = await record(upstream, hold=hold)
        answer = await answer_to(rec.url, b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        await rec.proxy.wait_idle()
        with await rec.log() as log:
            (x,) = log.exchanges()
            kept = log.body(x["id"])
    head, _, chunked = answer.partition(b"\r\n\r\n")
    said = body.strip()  # (a stream held is given ids)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and said in chunked and chunked.endswith(b"\r\n0\r\n\r\n")
    assert (x["status"], x["outcome"]) == (200, "complete") and said in kept
    assert "the reason phrase was sent as 'OK': the upstream's holds a control character" in x["error"]


@pytest.mark.parametrize("framing", [b"Content-Length: 2\r\n\r\n{}", b"\r\n{}"])
async def test_a_head_aiohttp_will_not_send_is_a_502(
    record: RecordFactory, monkeypatch: pytest.MonkeyPatch, framing: bytes
) -> None:
    """A head aiohttp refuses to send (here a reason phrase the recorder is made to pass on
    as it came) was a traceback, aiohttp's 500, and an exchange logged as left by its client.
    The 502 is framed as the refused head set the connection (chunked, with no length)."""
    monkeypatch.setattr(recorder, "unsendable", lambda value: False)
    async with raw_upstream(
        answering(b"HTTP/1.1 200 O\x01K\r\nContent-Type: text/plain\r\n" + framing)
    ) as up:
        rec = await record(up)
        async with rec.session.get(f"{rec.url}/x") as r:
            said = (await r.json())["error"]["message"]
        await rec.proxy.wait_idle()
        with await rec.log() as log:
            (x,) = log.exchanges()
    assert r.status == 502 and "answered with a head that cannot be passed on: ValueError: " in said
    assert (x["status"], x["outcome"], x["error"]) == (502, "upstream_error", said)


async def test_an_answer_the_recorder_cannot_read_is_said_to_be_one(record: RecordFactory) -> None:
    """A 204 with a body after it: a 502, whose reason no longer says the upstream never
    answered, but that it sent bytes past the end of a response."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello")
        await writer.drain()
        writer.close()

    async with raw_upstream(answer) as upstream:
        rec = await record(upstream)
        async with rec.session.get(f"{rec.url}/x") as r:
            said = await r.text()
    assert r.status == 502 and "sent bytes where no HTTP response starts: past the end of a response" in said
    assert "a body where none goes: to a HEAD, a 204 or a 304" in said


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        (
            "Transfer-Encoding can't be present with Content-Length",
            "Transfer-Encoding can't be present with Content-Length",
        ),
        ("Invalid method encountered:\n\n  b'GE\\x00T'", "Invalid method encountered"),
        ('Bad status line "token=abc"', "Bad status line"),
        (
            "Got more than 65536 bytes when reading: bytearray(b'/x?token=abc&pad=aaa')",
            "Got more than 65536 bytes when reading",
        ),
        ("Duplicate 'Host' header found.", "Duplicate 'Host' header found"),  # names a header: kept
    ],
)
def test_refusal_reasons_are_cut_where_the_request_is_quoted_only(said: str, kept: str) -> None:
    assert reason_for(said, "fallback") == kept


async def test_an_upstream_answer_that_cannot_be_read_is_logged_without_its_bytes(
    record: RecordFactory,
) -> None:
    """A Set-Cookie past aiohttp's 64 KiB limit: the client's 502 and the log say why, but
    not the cookie aiohttp quotes (Set-Cookie is redacted from every log)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        cookie = b"session=" + SECRET.encode() + b"a" * 70_000
        writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: " + cookie + b"\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async with raw_upstream(answer) as upstream:
        rec = await record(upstream)
        async with rec.session.get(f"{rec.url}/cookie") as r:
            body = await r.text()
        await rec.proxy.wait_idle()
        with await rec.log() as log:
            (error,) = [x["error"] for x in log.exchanges()]
    assert r.status == 502 and "Got more than 65536 bytes" in body and "Got more than 65536 bytes" in error
    assert SECRET not in body and SECRET not in error


def odd_header_cassette(tmp_path: Path, value: str) -> Path:
    """A cassette of one exchange whose response has the header ``X-Odd: value``."""
    line = {
        "exchange": {
            "request": {"method": "GET", "path": "/"},
            "response": {"status": 200, "headers": [["X-Odd", value]]},
        }
    }
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"tasktape_cassette": 1}) + "\n" + json.dumps(line) + "\n")
    return path


@pytest.mark.parametrize("value", ["a\x7fb", "a\x0bb", "a\x0cb", "a\x01b"])
def test_a_cassette_header_a_log_can_hold_is_read_as_it_came(tmp_path: Path, value: str) -> None:
    """An HTTP parser reads a value holding DEL, VT, FF or another control character, so a
    log can hold one: its cassette reads it back as it came (replay leaves it out)."""
    assert read_cassette(odd_header_cassette(tmp_path, value))[0].response_headers == [("X-Odd", value)]


@pytest.mark.parametrize("value", ["a\rb", "a\nb", "a\x00b"])
def test_a_cassette_header_no_parser_reads_is_refused_with_its_line(tmp_path: Path, value: str) -> None:
    with pytest.raises(CassetteError, match=r"odd\.jsonl:2.*holds no CR, LF or NUL"):
        read_cassette(odd_header_cassette(tmp_path, value))


async def test_replay_leaves_out_a_recorded_header_it_cannot_send(tmp_path: Path) -> None:
    recorded = Recorded(
        method="GET",
        path="/",
        status=200,
        outcome="complete",
        response_headers=[("X-Odd", "a\x7fb"), ("X-Fine", "yes")],
        chunks=[(0, b"ok")],
    )
    server = TestServer(ReplayServer([recorded], speed=0).app, host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as r:
            assert (r.status, await r.read(), r.headers.get("X-Fine"), "X-Odd" in r.headers) == (
                200,
                b"ok",
                "yes",
                False,
            )
    finally:
        await server.close()


@pytest.mark.parametrize(
    "citation",
    [
        {"offset": 2, "data_part_id": ["a", "b"]},
        {"offset": "two", "data_part_id": {"x": 1}, "locator": ["l"]},
        {"offset": 1, "data_part_id": 7},
    ],
)
async def test_the_task_page_renders_whatever_shape_the_agent_sent(tmp_path: Path, citation: dict) -> None:
    closing = {
        "artifactUpdate": {
            "taskId": "t1",
            "contextId": "c1",
            "lastChunk": True,
            "artifact": {
                "artifactId": "a1",
                "parts": [
                    {"text": "Asthma [1].", "metadata": {"citations": [citation, "junk", 3]}},
                    {"data": {"code": "J45"}, "metadata": {"dataPartId": ["not", "a", "key"]}},
                    {"text": "x", "metadata": {"citations": {"not": "a list"}}},
                ],
            },
        }
    }
    frames = [task("t1", "c1"), closing, status("t1", "c1", "TASK_STATE_COMPLETED")]
    db = tmp_path / "odd.db"
    with LogWriter(db) as writer:
        capture = writer.begin_capture(source="test")
        x = writer.begin_exchange(capture, method="POST", path="/message:stream")
        writer.response_head(
            x, status=200, headers=[("Content-Type", "text/event-stream")], is_sse=True, ttfb_ns=1
        )
        for i, frame in enumerate(sse(frames)):
            writer.chunk(x, i + 1, frame)
        writer.end_exchange(x, duration_ns=10, outcome="complete")
    response = await create_datasette(db).client.get("/odd/-/task/t1")
    assert response.status_code == 200, response.text[:2000]
    assert "Asthma" in response.text


@pytest.mark.parametrize("command", ["record", "replay", "agent"])
async def test_loopback_servers_answer_only_loopback_host_names(tmp_path: Path, command: str) -> None:
    """A DNS-rebinding page reaches 127.0.0.1 under a name of its own: refused with a 421
    that says why, unless the name is allowed; loopback names with any port are served."""
    db = tmp_path / "captures.db"
    cassette = str(Path(__file__).resolve().parent.parent / "cassettes" / "completed.jsonl")
    async with serve(create_agent_app(pace=0)) as agent:
        args = {
            "record": ("record", "--upstream", agent, "--db", str(db)),
            "replay": ("replay", cassette, "--allow-repeats"),
            "agent": ("agent",),
        }[command]
        for extra, evil_status in (((), 421), (("--allow-host", "rebound.example"), 200)):
            async with running(*args, "--listen", "127.0.0.1:0", *extra) as run:
                port = run.url.rsplit(":", 1)[1]
                async with aiohttp.ClientSession() as session:
                    for host, status in (
                        (f"localhost:{port}", 200),
                        (f"127.0.0.1:{port}", 200),
                        (f"[::1]:{port}", 200),
                        (f"rebound.example:{port}", evil_status),
                    ):
                        card = f"{run.url}/.well-known/agent-card.json"
                        async with session.get(card, headers={"Host": host}) as r:
                            assert r.status == status, (host, await r.text())
                            if status == 421:
                                message = (await r.json())["error"]["message"]
                                assert "--allow-host rebound.example" in message
                # An HTTP/1.0 client may send no Host (no browser, which a rebinding page drives, does).
                reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
                writer.write(b"GET /.well-known/agent-card.json HTTP/1.0\r\n\r\n")
                assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.0 200 ")
                writer.close()
                run.proc.send_signal(signal.SIGINT)
                await asyncio.wait_for(run.proc.communicate(), 30)
    if command == "record":
        with EventLog(db) as log:
            refused = [x for x in log.exchanges() if x["outcome"] == "refused"]
        assert len(refused) == 1 and "is not a name tasktape record answers" in refused[0]["error"]


@pytest.mark.parametrize("server", ["record", "replay"])
async def test_a_request_head_that_trickles_in_is_cut_off(
    record: RecordFactory, serve: Serve, server: str
) -> None:
    """A slowloris client (a byte of head every 100 ms, never the end) is disconnected
    once the head timeout (here 0.5 s; 60 s by default) runs out."""
    if server == "record":
        url = (await record(web.Application(), header_timeout=0.5)).url
    else:
        url = await serve(ReplayServer([], header_timeout=0.5).app)
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    loop = asyncio.get_running_loop()
    started = loop.time()
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")

    async def trickle() -> None:
        while True:
            await asyncio.sleep(0.1)
            writer.write(b"X")

    trickling = asyncio.create_task(trickle())
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, with no answer
    finally:
        trickling.cancel()
        writer.close()
    assert 0.4 < loop.time() - started < 2.5


def llm_sse(events: list[tuple[str | None, str]]) -> bytes:
    return b"".join((f"event: {t}\n" if t else "").encode() + f"data: {d}\n\n".encode() for t, d in events)


# A stream of each LLM protocol with a list where an index goes, and how it finishes.
HOSTILE_STREAMS = {
    "openai-responses": (
        "/v1/responses",
        {"model": "gpt-x", "input": "hi", "stream": True},
        [
            ("response.created", '{"type":"response.created","response":{"id":"r1","status":"in_progress"}}'),
            (
                "response.function_call_arguments.delta",
                '{"type":"response.function_call_arguments.delta","output_index":[1],"delta":"x"}',
            ),
            (
                "response.completed",
                '{"type":"response.completed","response":{"id":"r1","status":"completed"}}',
            ),
        ],
        "completed",
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "claude-x", "max_tokens": 9, "messages": [], "stream": True},
        [
            ("message_start", '{"type":"message_start","message":{"id":"m1","model":"claude-x"}}'),
            (
                "content_block_start",
                '{"type":"content_block_start","index":[0],"content_block":{"type":"tool_use"}}',
            ),
            ("content_block_stop", '{"type":"content_block_stop","index":[0]}'),
            ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"}}'),
            ("message_stop", '{"type":"message_stop"}'),
        ],
        "end_turn",
    ),
    "openai-chat": (
        "/v1/chat/completions",
        {"model": "gpt-x", "messages": [], "stream": True},
        [
            (
                None,
                '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":[0],"function":{"arguments":"x"}}]}}]}',
            ),
            (None, '{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'),
            (None, "[DONE]"),
        ],
        "stop",
    ),
}


@pytest.mark.parametrize("name", HOSTILE_STREAMS)
async def test_a_stream_with_json_of_unexpected_types_is_forwarded_and_logged(
    record: RecordFactory, name: str
) -> None:
    """An event whose protocol's reader met a list where an index goes raised in the log
    writer: the chunk holding it, and the events after it there, were lost ("WRITING THE
    LOG FAILED"). Now the client gets the stream as sent, and the log has every event."""
    path, request, events, finish = HOSTILE_STREAMS[name]
    sent = llm_sse(events)

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sent)
        return response

    app = web.Application()
    app.router.add_post(path, stream)
    rec = await record(app)
    async with rec.session.post(f"{rec.url}{path}", json=request) as r:
        assert await r.read() == sent
    with await rec.log() as log:
        (x,) = log.exchanges()
        logged = [(e["event_type"], e["data"]) for e in log.events(x["id"])]
        (summary,) = log.stream_summary(x["id"])
        assert log.body(x["id"]) == sent
    assert rec.writer.stats.rows_lost == 0, rec.writer.stats.errors
    assert logged == events
    assert (x["outcome"], summary["finish"]) == ("complete", finish)
