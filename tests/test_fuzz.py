"""Hostile input: real captures mutated byte by byte, malformed cassettes, and content nothing
expects, through the SSE decoder, the classifiers, the cassette reader, the log writers, the
live recording proxy and the replay server. Nothing raises past tasktape, nothing hangs, and
every byte is kept. ``--stress`` runs many more examples."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner
from conftest import RecordFactory
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_sse_decoder import fields, reference, split

from tasktape.cli import main
from tasktape.errors import CassetteError
from tasktape.eventlog import EventLog, LogProducer, LogWriter, SSEDecoder, SSEEvent, classify
from tasktape.eventlog.cassette import MAX_MS, load_into, read_cassette
from tasktape.eventlog.checker import protocol_names
from tasktape.eventlog.process_writer import ProcessLogWriter
from tasktape.eventlog.protocols import Request, by_name, recognise
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import UNREADABLE, Redactor
from tasktape.eventlog.requests import RequestInfo, classify_request
from tasktape.proxy.headers import HEADER_LIMITS, MAX_HEADERS, MAX_LINE
from tasktape.replay.server import ReplayServer
from tasktape.serving import start_site

CASSETTES = sorted((Path(__file__).resolve().parent.parent / "cassettes").glob("*.jsonl"))
RECORDED = [r for path in CASSETTES for r in read_cassette(path)]
STREAMS = [r.body for r in RECORDED if r.is_sse]
BODIES = [r.request_body for r in RECORDED if r.request_body]
KINDS = {"task", "message", "statusUpdate", "artifactUpdate", "error", "other"}
# Whatever the content, a case finishes well within this (the biggest take a few seconds).
TIMEOUT = 60
SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def examples(stress: bool, default: int) -> int:
    return default * 20 if stress else default


# A mutation: what to do, where (taken modulo the length), and a byte or a length.
mutations = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "delete", "duplicate"]),
        st.integers(min_value=0, max_value=2**32),
        st.integers(min_value=0, max_value=255),
    ),
    max_size=12,
)
cuts = st.lists(st.integers(min_value=0, max_value=2**32), max_size=40)
# Inserted bytes lean towards what SSE, JSON and UTF-8 give meaning to.
SPECIAL = b'\r\n:\x00 {}[]",\\\xef\xbb\xbf\xc3\xe2\xff\x80'


def mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for op, where, n in ops:
        at = where % (len(out) + 1)
        if op == "flip" and out:
            out[min(at, len(out) - 1)] ^= 1 << (n % 8)
        elif op == "insert":
            out[at:at] = bytes([SPECIAL[n % len(SPECIAL)] if n < 128 else n])
        elif op == "delete":
            del out[at : at + n % 64 + 1]
        elif op == "duplicate":
            out[at:at] = out[at : at + n + 1]
    return bytes(out)


def decode(chunks: list[bytes], *, keep_raw: bool = True) -> list[SSEEvent]:
    decoder = SSEDecoder(keep_raw=keep_raw)
    events = [e for chunk in chunks for e in decoder.feed(chunk)]
    return events + decoder.close()


# -- the decoder and the classifiers ----------------------------------------------------------


def test_mutated_captures_decode_as_the_w3c_rules_say_keeping_every_byte(stress: bool) -> None:
    @settings(SLOW, max_examples=examples(stress, 150))
    @given(stream=st.sampled_from(STREAMS), ops=mutations, cut=cuts)
    def check(stream: bytes, ops: list[tuple[str, int, int]], cut: list[int]) -> None:
        data = mutate(stream, ops)
        chunks = split(data, cut)
        events = decode(chunks)
        assert b"".join(e.raw for e in events) == data
        assert [fields(e) for e in events if e.complete] == reference(data)[0]
        assert [fields(e) for e in decode(chunks, keep_raw=False)] == [fields(e) for e in events]
        for event in events:
            assert classify(event.data).kind in KINDS
            assert classify(event.raw, bare_task=True).kind in KINDS

    check()


def test_mutated_requests_are_classified_without_raising(stress: bool) -> None:
    redactor = Redactor(json_pointers=["/message/metadata/*", "/params/message/parts/*/text", "/*"])

    @settings(SLOW, max_examples=examples(stress, 200))
    @given(body=st.sampled_from(BODIES), ops=mutations, path=st.sampled_from([r.path for r in RECORDED]))
    def check(body: bytes, ops: list[tuple[str, int, int]], path: str) -> None:
        data = mutate(body, ops)
        assert isinstance(classify_request("POST", path, data), RequestInfo)
        assert isinstance(
            classify_request("GET", mutate(path.encode(), ops).decode("latin-1"), None), RequestInfo
        )
        assert classify(data, bare_task=True).kind in KINDS
        assert isinstance(redactor.json_bytes(data), bytes)

    check()


# Events of each protocol, as their servers send them (the A2A ones are the cassettes').
PROTOCOL_EVENTS = [
    ('{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":3,"progress":1,'
     '"total":3,"message":"counted 1 of 3"}}', "message"),
    ('{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"counted to 3"}],"isError":false}}',
     "message"),
    ('{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"Unknown tool"}}', "message"),
    ('{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"gpt-4o-mini-2024-07-18","choices":'
     '[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null}],"usage":null}', None),
    ('{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,'
     '"completion_tokens":12,"total_tokens":21}}', None),
    ("[DONE]", None),
    ('{"type":"response.completed","sequence_number":9,"response":{"status":"completed","model":"gpt-4o-mini",'
     '"output":[{"content":[{"type":"output_text","text":"Hi"}]}],"usage":{"input_tokens":1,"output_tokens":2}}}',
     "response.completed"),
    ('{"type":"message_start","message":{"id":"msg_1","model":"claude-sonnet-4-5-20250929","usage":'
     '{"input_tokens":9,"output_tokens":1}}}', "message_start"),
    ('{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}',
     "content_block_delta"),
    ('{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}',
     "message_delta"),
    ('{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}', "error"),
]  # fmt: skip


def test_every_protocol_reads_mutated_events_without_raising(stress: bool) -> None:
    @settings(SLOW, max_examples=examples(stress, 300))
    @given(sample=st.sampled_from(PROTOCOL_EVENTS), ops=mutations, name=st.sampled_from(protocol_names()))
    # An event whose "type" is an object, not a name (Anthropic's reader raised on it).
    @example(sample=('{"type":{"type":"overloaded_error"}}', "error"), ops=[], name="anthropic")
    def check(sample: tuple[str, str | None], ops: list[tuple[str, int, int]], name: str) -> None:
        protocol = by_name(name)
        assert protocol is not None
        raw = mutate(sample[0].encode(), ops)
        data = raw.decode("utf-8", "replace")
        reader = protocol.reader()
        assert reader.event(data, sample[1]).kind in {k.value for k in protocol.kinds}
        body = reader.body(raw)
        assert body is None or body.kind in {k.value for k in protocol.kinds}
        reader.finished()
        protocol.claims_stream(data, sample[1])
        request = Request("POST", "/v1/messages", [("MCP-Protocol-Version", "2025-11-25")], raw)
        found = recognise(request)
        if found is not None:
            found.request_info(request)

    check()


# -- cassettes -------------------------------------------------------------------------------


def line_ops(text: str, ops: list[tuple[str, int, int]]) -> str:
    """The mutations read for whole lines: a line dropped (delete) or repeated (duplicate),
    two swapped (flip), the file cut anywhere (insert)."""
    lines = text.splitlines(keepends=True)
    for op, where, n in ops:
        at = where % len(lines) if lines else 0
        if op == "delete" and lines:
            del lines[at]
        elif op == "duplicate" and lines:
            lines.insert(at, lines[at])
        elif op == "flip" and len(lines) > 1:
            other = n % len(lines)
            lines[at], lines[other] = lines[other], lines[at]
        elif op == "insert":
            text = "".join(lines)
            lines = [text[: where % (len(text) + 1)]]
    return "".join(lines)


def test_mutated_cassettes_load_or_say_which_line_is_wrong(tmp_path: Path, stress: bool) -> None:
    path = tmp_path / "mutated.jsonl"
    pattern = re.compile(rf"^{re.escape(str(path))}(:\d+)?: \S")
    loaded: list[tuple[int, int]] = []
    with LogWriter(tmp_path / "loaded.db") as writer:
        capture = writer.begin_capture(source="fuzz")

        @settings(SLOW, max_examples=examples(stress, 120))
        @given(source=st.sampled_from(CASSETTES), ops=mutations, lines=mutations)
        def check(source: Path, ops: list[tuple[str, int, int]], lines: list[tuple[str, int, int]]) -> None:
            path.write_bytes(mutate(line_ops(source.read_text(), lines).encode(), ops))
            try:
                recorded = read_cassette(path)
            except CassetteError as exc:
                assert pattern.match(str(exc)), exc
                return
            # What loads is written whole.
            for exchange_id, r in zip(load_into(writer, recorded, capture), recorded, strict=True):
                loaded.append((exchange_id, len(r.body)))

        check()
        writer.flush(TIMEOUT)
        assert writer.stats.rows_lost == 0, writer.stats.errors
    with EventLog(tmp_path / "loaded.db") as log:
        for exchange_id, size in loaded:
            assert sum(len(c["data"]) for c in log.chunks(exchange_id)) == size


HEADER = '{"tasktape_cassette": 1}\n'
EXCHANGE = (
    '{"exchange": {"request": {"method": "POST", "path": "/message:stream"}, '
    '"response": {"status": 200, "headers": [["Content-Type", "text/event-stream"]]}}}\n'
)


def chunk_line(offset: str, text: str = "data: {}\\n\\n") -> str:
    return f'{{"chunk": {{"offset_ms": {offset}, "text": "{text}"}}}}\n'


MALFORMED = {
    "truncated line": (HEADER + EXCHANGE + chunk_line("1")[:30], 3, "not JSON: Unterminated string"),
    "a chunk before any exchange": (HEADER + chunk_line("1"), 2, "a chunk line must follow an exchange line"),
    "the status as a list": (
        HEADER + '{"exchange": {"request": {"method": "GET", "path": "/"}, "response": {"status": [200]}}}\n',
        2,
        "exchange: response.status: Input should be a valid integer",
    ),
    "a path that is not one": (  # (an absolute-form target is one: a refused request's)
        HEADER + '{"exchange": {"request": {"method": "GET", "path": "evil.example/x"}}}\n',
        2,
        "exchange: request.path: String should match pattern",
    ),
    "an offset of 1e300 ms": (
        HEADER + EXCHANGE + chunk_line("1e300"),
        3,
        f"chunk: offset_ms: Input should be less than or equal to {MAX_MS:.0f}",
    ),
    "an offset of Infinity": (
        HEADER + EXCHANGE + chunk_line("Infinity"),
        3,
        "chunk: offset_ms: Input should be a finite",
    ),
    "an offset of NaN": (
        HEADER + EXCHANGE + chunk_line("NaN"),
        3,
        "chunk: offset_ms: Input should be a finite",
    ),
    "a negative offset": (
        HEADER + EXCHANGE + chunk_line("-1"),
        3,
        "chunk: offset_ms: Input should be greater",
    ),
    "a duration of Infinity": (
        HEADER + EXCHANGE + '{"end": {"duration_ms": Infinity}}\n',
        3,
        "end: duration_ms: Input should be a finite",
    ),
    "a time to first byte of 1e300": (
        HEADER + '{"exchange": {"request": {"method": "GET", "path": "/"}, "response": {"status": 200, '
        '"ttfb_ms": 1e300}}}\n',
        2,
        "exchange: response.ttfb_ms: Input should be less",
    ),
    "offsets going back in time": (
        HEADER + EXCHANGE + chunk_line("5") + chunk_line("4"),
        4,
        "offset_ms goes back in time",
    ),
    "a request body that is not base64": (
        HEADER + '{"exchange": {"request": {"method": "POST", "path": "/", "body_base64": "abc"}}}\n',
        2,
        "exchange: request body: Incorrect padding",
    ),
    "a request body that is not Unicode": (
        HEADER + '{"exchange": {"request": {"method": "POST", "path": "/", "body": "\\ud800"}}}\n',
        2,
        "exchange: request body: 'utf-8' codec can't encode",
    ),
    "a chunk that is not Unicode": (
        HEADER + EXCHANGE + chunk_line("1", "\\udc00"),
        3,
        "chunk: 'utf-8' codec",
    ),
    "a header that would split the response": (
        HEADER + '{"exchange": {"request": {"method": "GET", "path": "/"}, "response": {"status": 200, '
        '"headers": [["X-A", "a\\r\\nSet-Cookie: s=1"]]}}}\n',
        2,
        "exchange: response.headers: Value error, header 'X-A': a header value holds no CR, LF or NUL",
    ),
    "100,000 nested arrays": (HEADER + "[" * 100_000 + "\n", 2, "not JSON: maximum recursion depth exceeded"),
    "a number of a million digits": (
        HEADER + EXCHANGE + '{"event": {"offset_ms": 1, "data": "x", "retry": 1' + "0" * 10**6 + "}}\n",
        3,
        "not JSON: Exceeds the limit",
    ),
    "a version that is a boolean": (
        '{"tasktape_cassette": true}\n',
        1,
        "'tasktape_cassette' must be a version",
    ),
    "a line of NUL bytes": (HEADER + "\x00" * 100 + "\n", 2, "not JSON: Expecting value"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_cassettes_name_their_file_and_line(tmp_path: Path, name: str) -> None:
    text, line, message = MALFORMED[name]
    path = tmp_path / "broken.jsonl"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(CassetteError, match=rf"^{re.escape(f'{path}:{line}: {message}')}"):
        read_cassette(path)
    # The command line says the same, and nothing else: no traceback, nothing imported or
    # served (both take it for bad input: a usage error).
    db = tmp_path / "imported.db"
    for args in (["import", str(path), "--db", str(db)], ["replay", str(path), "--listen", "0"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert f"{path}:{line}: " in result.output and "Traceback" not in result.output
    assert not db.exists()


def test_binary_garbage_and_empty_files_are_not_cassettes(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(hashlib.sha256(b"seed").digest() * 1000)
    with pytest.raises(CassetteError, match=rf"^{re.escape(str(garbage))}:1: not JSON: 'utf-8'"):
        read_cassette(garbage)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(
        CassetteError, match=rf"^{re.escape(str(empty))}: empty; a cassette starts with its header"
    ):
        read_cassette(empty)


def test_a_50_mb_line_is_read_whole_or_refused_with_its_line(tmp_path: Path) -> None:
    body = b"data: " + b"x" * (50 * 2**20) + b"\n\n"
    path = tmp_path / "big.jsonl"
    path.write_text(HEADER + EXCHANGE + chunk_line("1", body.decode().replace("\n", "\\n")))
    started = time.monotonic()
    (recorded,) = read_cassette(path)
    assert recorded.body == body
    path.write_text(HEADER + EXCHANGE + chunk_line("1", "x" * (50 * 2**20))[:-4])  # cut before its end
    with pytest.raises(CassetteError, match=rf"^{re.escape(str(path))}:3: not JSON: Unterminated string"):
        read_cassette(path)
    assert time.monotonic() - started < TIMEOUT


def test_times_the_log_cannot_hold_are_loaded_not_lost(tmp_path: Path) -> None:
    exchange = '{"exchange": {"request": {"method": "GET", "path": "/"}, "started_at": "%s"}}\n'
    times = ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "2026-11-30T11:30:41Z")
    path = tmp_path / "times.jsonl"
    path.write_text(HEADER + "".join(exchange % t for t in times))
    with LogWriter(tmp_path / "log.db") as w:
        ids = load_into(w, read_cassette(path), w.begin_capture(source="import"))
    assert w.stats.rows_lost == 0
    with EventLog(tmp_path / "log.db") as log:
        started = [log.exchange(i)["started_at"] for i in ids]
    assert started[0] > "2026" and started[1] > "2026" and started[2] == "2026-11-30T11:30:41.000000Z"


# -- the log writers ---------------------------------------------------------------------------

EVENT_20_MB = (
    b'data: {"artifactUpdate": {"taskId": "t", "artifact": {"artifactId": "a", "parts": [{"text": "'
    + b"token " * (20 * 2**20 // 6)
    + b'"}]}}}\n\n'
)
FRAME = (
    b'data: {"statusUpdate": {"taskId": "task.1", "status": {"state": "TASK_STATE_WORKING"}}, "n": 1234}\n\n'
)
TINY = FRAME * (200_000 // len(FRAME))  # 2,000 events of 100 bytes
DEEP_SECRET = b"[" * 900 + b'"sk-1"' + b"]" * 900


def one_byte_chunks(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


# name: (chunks, what the events must say, whether a redacting writer keeps the bytes as they were)
HOSTILE: dict[str, tuple[Callable[[], list[bytes]], Callable[[list[Any]], bool], bool]] = {
    "invalid UTF-8": (
        lambda: [b'data: \xff\xfe\xc3\x28 {"a": "\xed\xa0\x80"}\n\n', b"id: \xc3\n", b"data: \xe2\x82\n\n"],
        lambda events: (
            len(events) == 2 and "\ufffd" in events[0]["data"] and events[1]["event_id"] == "\ufffd"
        ),
        True,
    ),
    "100,000 nested arrays": (
        lambda: [b"data: " + b"[" * 100_000 + b"\n\n"],
        lambda events: events[0]["parse_error"].startswith("not JSON: maximum recursion depth"),
        False,  # unreadable JSON is redacted whole: it could hold a secret
    ),
    "a secret in 900 nested arrays": (
        # Read, but too deep to search for the secret's copies: not kept when redacting.
        lambda: [b'data: {"statusUpdate": {"metadata": {"token": "sk-1"}, "n": ' + DEEP_SECRET + b"}}\n\n"],
        lambda events: events[0]["kind"] == "statusUpdate" and events[0]["parse_error"] is None,
        False,
    ),
    "a number of a million digits": (
        lambda: [b'data: {"statusUpdate": {"taskId": "t", "n": 1' + b"0" * 10**6 + b"}}\n\n"],
        # Valid JSON, though longer than the standard library reads an integer (4,300 digits),
        # in a member the log does not read: skipped, and the frame is read.
        lambda events: events[0]["kind"] == "statusUpdate" and events[0]["parse_error"] is None,
        False,
    ),
    "a fraction of a million digits": (
        lambda: [b'data: {"statusUpdate": {"taskId": "t", "n": 0.' + b"1" * 10**6 + b"}}\n\n"],
        lambda events: events[0]["kind"] == "statusUpdate" and events[0]["task_id"] == "t",
        True,
    ),
    "200,000 one-byte chunks": (
        lambda: one_byte_chunks(TINY),
        lambda events: len(events) == 2000 and {e["task_id"] for e in events} == {"task.1"},
        True,
    ),
    "a 20 MB event": (
        lambda: [EVENT_20_MB[i : i + 2**16] for i in range(0, len(EVENT_20_MB), 2**16)],
        lambda events: len(events) == 1 and events[0]["text"] == "token " * (20 * 2**20 // 6),
        True,
    ),
}


@pytest.fixture(params=[LogWriter, ProcessLogWriter], ids=["thread", "process"])
def writer_class(request: pytest.FixtureRequest) -> type[LogProducer]:
    return request.param


@pytest.mark.parametrize("redact", [False, True], ids=["as-is", "redacting"])
@pytest.mark.parametrize("case", HOSTILE)
def test_the_writer_records_hostile_content_faithfully(
    tmp_path: Path, writer_class: type[LogProducer], case: str, redact: bool
) -> None:
    make, events_ok, kept_when_redacting = HOSTILE[case]
    chunks = make()
    started = time.monotonic()
    redactor = Redactor(json_pointers=["/statusUpdate/metadata/token"]) if redact else None
    errors: list[str] = []
    with writer_class(
        tmp_path / "log.db", redactor=redactor, on_error=lambda e, n: errors.append(str(e))
    ) as w:
        exchange = w.begin_exchange(w.begin_capture(source="fuzz"), method="POST", path="/message:stream")
        w.response_head(
            exchange, status=200, headers={"Content-Type": "text/event-stream"}, is_sse=True, ttfb_ns=1
        )
        for n, chunk in enumerate(chunks):
            w.chunk(exchange, n, chunk)
        summary = w.end_exchange(exchange, duration_ns=len(chunks)).result(timeout=TIMEOUT)
    assert errors == [] and w.stats.rows_lost == 0
    with EventLog(tmp_path / "log.db") as log:
        rows = log.chunks(exchange)
        events = [dict(e) for e in log.events(exchange)]
    stored = b"".join(bytes(c["data"]) for c in rows)
    assert summary.events == len(events) == len(decode(chunks))
    if redact and not kept_when_redacting:
        assert [e["data"] for e in events] == [UNREADABLE] and UNREADABLE.encode() in stored
        assert b"sk-1" not in stored
    else:
        assert stored == b"".join(chunks) and events_ok(events)
        assert len(rows) == len(chunks)  # and with their boundaries
    assert time.monotonic() - started < TIMEOUT


# -- the live proxy ----------------------------------------------------------------------------


# 100,000 one-byte chunks of events with invalid UTF-8 in them, the last one cut off.
TINY_EVENT = b"data: \xff\xfe caf\xc3\n\n"
TINY_CHUNKS = [TINY_EVENT[n % len(TINY_EVENT) :][:1] for n in range(100_000)]


def hostile_upstream(contacted: list[str]) -> web.Application:
    """An agent streaming TINY_CHUNKS, and swallowing uploads."""

    async def tiny(request: web.Request) -> web.StreamResponse:
        contacted.append(request.path)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in TINY_CHUNKS:
            await response.write(chunk)
        return response

    async def upload(request: web.Request) -> web.Response:
        contacted.append(request.path)
        digest = hashlib.sha256()
        async for chunk in request.content.iter_any():
            digest.update(chunk)
        return web.Response(text=digest.hexdigest())

    app = web.Application()
    app.router.add_get("/tiny", tiny)
    app.router.add_post("/upload", upload)
    return app


async def test_100k_tiny_chunks_of_invalid_utf8_reach_the_client_and_the_log(record: RecordFactory) -> None:
    contacted: list[str] = []
    rec = await record(hostile_upstream(contacted))
    async with asyncio.timeout(TIMEOUT), rec.session.get(f"{rec.url}/tiny") as r:
        received = await r.read()
    assert received == b"".join(TINY_CHUNKS)
    with await rec.log() as log:
        (x,) = log.exchanges()
        assert x["outcome"] == "complete"
        assert b"".join(bytes(c["data"]) for c in log.chunks(x["id"])) == received
        assert len(log.events(x["id"])) == len(decode([received]))


def big_headers_agent(seen: list[dict[str, str]]) -> web.Application:
    """An agent that answers with the headers it was sent, plus big ones of its own."""

    async def echo(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        headers = {"Set-Cookie": "s=" + "c" * 40_000, **{f"X-Answer-{n}": str(n) for n in range(500)}}
        return web.Response(text=str(len(request.headers)), headers=headers)

    app = web.Application(handler_args=HEADER_LIMITS)
    app.router.add_get("/echo", echo)
    return app


async def test_big_headers_pass_through_both_ways_and_are_recorded(record: RecordFactory) -> None:
    """What agents and browsers accept (a 40 KB cookie, a 50 KB token, 500 headers)
    passes through unchanged, and the log keeps it."""
    seen: list[dict[str, str]] = []
    rec = await record(big_headers_agent(seen))
    sent = {"X-Token": "t" * 50_000, **{f"X-Hint-{n}": str(n) for n in range(500)}}
    async with (
        aiohttp.ClientSession(**HEADER_LIMITS) as session,
        asyncio.timeout(TIMEOUT),
        session.get(f"{rec.url}/echo", headers=sent) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["Set-Cookie"] == "s=" + "c" * 40_000
        assert r.headers["X-Answer-499"] == "499"
    (got,) = seen
    assert got["X-Token"] == sent["X-Token"] and got["X-Hint-499"] == "499"
    with await rec.log() as log:
        (x,) = log.exchanges()
        request_headers = dict(json.loads(x["request_headers"]))
        assert request_headers["X-Token"] == sent["X-Token"]
        assert len(json.loads(x["response_headers"])) > 500


def unread_line(reason: str) -> str:
    """What a server of tasktape's says on stderr of a request from this machine it could not read."""
    return f"tasktape: refused a request from 127.0.0.1 that could not be read: {reason}"


async def test_oversized_headers_are_refused_before_the_upstream_and_logged(
    record: RecordFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp answers a request it cannot read before any handler runs; the log still
    gets it, as refused and why, and stderr a line, without the bytes aiohttp quotes."""
    contacted: list[str] = []
    rec = await record(hostile_upstream(contacted))
    too_long = {"Authorization": "Bearer " + "s3cr3t" * MAX_LINE}
    too_many = {f"X-{n}": "b" for n in range(MAX_HEADERS + 1)}
    for headers, said in ((too_long, f"Got more than {MAX_LINE} bytes"), (too_many, "Too many headers")):
        async with rec.session.get(f"{rec.url}/tiny", headers=headers) as r:
            assert r.status == 400 and said in await r.text()
    # A request line too long, a token in its query: aiohttp quotes it as bytearray(b'...').
    async with rec.session.get(f"{rec.url}/tiny?token=s3cr3t&pad={'a' * MAX_LINE}") as r:
        assert r.status == 400
    reader, writer = await asyncio.open_connection(*rec.url.removeprefix("http://").split(":"))
    writer.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 a TLS hello\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.0 400 Bad Request\r\n")
    writer.close()
    assert contacted == []
    with await rec.log() as log:
        refused = [(x["method"], x["path"], x["status"], x["outcome"], x["error"]) for x in log.exchanges()]
    assert [r[:4] for r in refused] == [("UNKNOWN", "", 400, "refused")] * 4
    assert refused[0][4] == f"the request could not be read: Got more than {MAX_LINE} bytes when reading"
    assert refused[1][4] == "the request could not be read: Too many headers received"
    assert refused[2][4] == f"the request could not be read: Got more than {MAX_LINE} bytes when reading"
    assert refused[3][4] == "the request could not be read: Received HTTPS traffic on an HTTP port"
    assert b"s3cr3t" not in b"".join(p.read_bytes() for p in rec.db.parent.glob(rec.db.name + "*"))
    said = [r.getMessage() for r in caplog.records if r.name == "tasktape.http"]
    assert said[0] == unread_line(f"Got more than {MAX_LINE} bytes when reading")
    # aiohttp logs a first request that is not HTTP at all at the debug level only.
    assert len(said) == 3 and "s3cr3t" not in caplog.text


async def test_a_32_mib_upload_streams_through_and_the_log_keeps_its_cap(record: RecordFactory) -> None:
    contacted: list[str] = []
    rec = await record(hostile_upstream(contacted), max_body=2**20)
    blocks = [bytes([0x80 + n]) * 2**20 for n in range(32)]  # not UTF-8: stored as a BLOB

    async def body() -> AsyncIterator[bytes]:
        for block in blocks:
            yield block

    async with asyncio.timeout(TIMEOUT), rec.session.post(f"{rec.url}/upload", data=body()) as r:
        assert await r.text() == hashlib.sha256(b"".join(blocks)).hexdigest()
    with await rec.log() as log:
        (x,) = log.exchanges()
    assert (x["request_body"], x["request_body_truncated"]) == (blocks[0], 1)


# -- the replay server ---------------------------------------------------------------------------


@pytest.fixture
async def replay() -> AsyncIterator[tuple[str, Recorded]]:
    """A replay server of the completed REST stream: its URL, and the recorded stream."""
    recorded = read_cassette(next(p for p in CASSETTES if p.name == "completed.jsonl"))
    # Repeats allowed: a request that matched but was refused (a bad Last-Event-ID) used it up.
    runner, url = await start_site(ReplayServer(recorded, speed=0, allow_repeats=True).app, "127.0.0.1", 0)
    yield url, next(r for r in recorded if r.path == "/message:stream")
    await runner.cleanup()


def hostile_requests(body: bytes) -> Iterator[tuple[str, dict[str, Any], int, str]]:
    """(what, request options, status, what the error says)."""
    miss = "no recorded exchange matches POST /message:stream"
    yield "a body that is not JSON", {"data": b"{not json"}, 404, miss
    yield "a body that is not UTF-8", {"data": b"\xff\xfe{\x80"}, 404, miss
    yield "100,000 nested arrays", {"data": b"[" * 100_000}, 404, miss
    yield "985 nested objects", {"data": b'{"a":' * 985 + b"1" + b"}" * 985}, 404, miss
    yield "a number of a million digits", {"data": b'{"message": 1' + b"0" * 10**6 + b"}"}, 404, miss
    yield "a body of 3 MiB", {"data": b"x" * 3 * 2**20}, 404, miss
    yield "a body of 17 MiB", {"data": b"x" * 17 * 2**20}, 413, "is over 16,777,216 bytes"
    long_id = "x" * 8000
    yield (
        "an 8 KB Last-Event-ID",
        {"data": body, "headers": {"Last-Event-ID": long_id}},
        400,
        f"Last-Event-ID {long_id!r} names no event of the recorded stream",
    )
    yield (
        "a 100 KB Last-Event-ID",
        {"data": body, "headers": {"Last-Event-ID": "x" * 100_000}},
        400,
        f"Got more than {MAX_LINE} bytes",
    )
    for fault in (
        "drop-after=-1",
        "stall=1",
        "stall=1:nan",
        "status=1" + "0" * 5000,
        "status=99",
        "nonsense",
    ):
        yield (
            f"X-Tasktape-Fault {fault[:20]}",
            {"data": body, "headers": {"X-Tasktape-Fault": fault}},
            400,
            "X-Tasktape-Fault: ",
        )


async def test_the_replay_server_answers_hostile_requests_with_clear_errors(
    replay: tuple[str, Recorded], caplog: pytest.LogCaptureFixture
) -> None:
    url, stream = replay
    body = stream.request_body or b""
    async with aiohttp.ClientSession() as session:
        for what, options, status, message in hostile_requests(body):
            async with asyncio.timeout(10), session.post(f"{url}/message:stream", **options) as r:
                text = await r.text()
                assert (r.status, message in text) == (status, True), (what, text[:300])
                if r.content_type == "application/json":
                    assert json.loads(text)["error"]["source"] == "tasktape replay"
        # And it still serves what was recorded, byte for byte.
        async with session.post(f"{url}/message:stream", data=body) as r:
            assert (r.status, await r.read()) == (200, stream.body)
    # What it could not read is one line on stderr, without the bytes it quoted to the client.
    said = [r.getMessage() for r in caplog.records if r.name == "tasktape.http"]
    assert said == [unread_line(f"Got more than {MAX_LINE} bytes when reading")]
    assert "x" * 50 not in caplog.text
