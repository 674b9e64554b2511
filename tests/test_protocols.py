"""The protocol registry: strict recognition, each protocol's rules on its own exchanges
(a log mixing all four is clean, a deliberately broken MCP session breaks its rule), and
older logs read again by the protocols when they are upgraded."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from a2a_frames import status, task
from aiohttp import web
from conftest import RecordFactory
from llm_servers import anthropic_app, openai_app
from test_llm_streams import chat, messages, responses
from test_mcp_sdk import generation, recorded_session

from tasktape.errors import UsageError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import load_into, read_cassette, write_cassette
from tasktape.eventlog.checker import check_recorded, report_log
from tasktape.eventlog.classify import classify
from tasktape.eventlog.protocols import ProtocolName, Request, recognise, recognise_exchange, recognise_stream
from tasktape.eventlog.recorded import Recorded, read_log

ROOT = Path(__file__).resolve().parent.parent
MCP_HEADERS = [("MCP-Protocol-Version", "2025-11-25"), ("Mcp-Session-Id", "s1")]


def rpc(method: str, rpc_id: Any = 1, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}).encode()


def named(request: Request) -> str | None:
    protocol = recognise(request)
    return None if protocol is None else protocol.name


@pytest.mark.parametrize(
    ("request_", "protocol"),
    [
        (Request("POST", "/message:stream", [], b"{}"), "a2a"),
        (Request("POST", "/tenant/v1/tasks/t1:cancel"), "a2a"),
        (Request("GET", "/.well-known/agent-card.json"), "a2a"),
        (Request("POST", "/", [], rpc("SendStreamingMessage")), "a2a"),
        (Request("POST", "/", [], rpc("tasks/get", id="t1")), "a2a"),  # A2A 0.3
        (Request("POST", "/anything", [("A2A-Version", "1.0")], b""), "a2a"),
        # MCP has tasks/get too: its client says which protocol it speaks.
        (Request("POST", "/mcp", MCP_HEADERS, rpc("tasks/get", taskId="t1")), "mcp"),
        (Request("POST", "/mcp", [], rpc("initialize")), "mcp"),
        (Request("GET", "/mcp", MCP_HEADERS), "mcp"),
        (Request("DELETE", "/mcp", MCP_HEADERS), "mcp"),
        (Request("POST", "/v1/chat/completions", [], b'{"model": "m", "messages": []}'), "openai"),
        (Request("POST", "/openai/v1/responses", [], b'{"model": "m", "input": "hi"}'), "openai"),
        # A Responses call may name no input: a stored prompt (which may carry the model too),
        # or the response it follows.
        (Request("POST", "/v1/responses", [], b'{"prompt": {"id": "pmpt_1"}, "stream": true}'), "openai"),
        (Request("POST", "/v1/responses", [], b'{"model": "m", "previous_response_id": "resp_1"}'), "openai"),
        (Request("POST", "/v1/responses", [], b'{"stream": true}'), None),
        (
            Request("POST", "/v1/messages", [], b'{"model": "m", "messages": [], "max_tokens": 5}'),
            "anthropic",
        ),
        # Neither a path alone nor a body alone makes a protocol.
        (Request("POST", "/v1/chat/completions", [], b'{"messages": []}'), None),
        (Request("POST", "/v1/messages", [], b"not json"), None),
        (Request("POST", "/", [], rpc("frobnicate")), None),
        (Request("POST", "/", [], b'{"message": {"parts": []}}'), None),
        (Request("GET", "/events"), None),
    ],
)
def test_recognition_is_strict(request_: Request, protocol: str | None) -> None:
    assert named(request_) == protocol


def test_a_stream_is_claimed_by_its_first_event_only_when_it_is_exact() -> None:
    def claimer(data: str, event_type: str | None = None) -> str | None:
        found = recognise_stream(data, event_type)
        return None if found is None else found.name

    assert claimer('{"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_WORKING"}}}') == "a2a"
    assert claimer('{"jsonrpc": "2.0", "id": 1, "result": {"kind": "task", "id": "t"}}') == "a2a"
    # An Anthropic message_start has a "message" key, and is no A2A message: it is Anthropic's.
    start = '{"type": "message_start", "message": {"id": "msg_1", "role": "assistant"}}'
    assert claimer(start, "message_start") == claimer(start) == "anthropic"
    assert claimer('{"type": "message", "role": "assistant", "content": []}') == "anthropic"
    assert claimer('{"message": {"role": "user"}, "extra": 1}') is None
    chunk = '{"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": []}'
    assert claimer(chunk) == claimer(chunk.replace(".chunk", "")) == "openai"
    assert claimer('{"type": "response.created", "response": {}}', "response.created") == "openai"
    assert claimer('{"object": "response", "output": []}') == "openai"
    # Nothing on a guess: the end of a stream, a type that is not the event's, a bare object.
    assert claimer("[DONE]") is None
    assert claimer('{"type": "response.created"}', "response.completed") is None
    assert claimer('{"object": "chat.completion.chunk"}') is None
    assert claimer('{"type": "message_start"}', "message_start") is None
    assert claimer('{"type": "ping"}', "ping") is None


def test_the_built_in_protocols_are_named_by_the_enum() -> None:
    assert [p.value for p in ProtocolName] == ["a2a", "mcp", "openai", "anthropic"]


# -- MCP rules, on hand-made sessions ------------------------------------------------------


def sse(*messages: dict[str, Any] | str) -> list[tuple[int, bytes]]:
    chunks = []
    for n, m in enumerate(messages):
        data = m if isinstance(m, str) else json.dumps(m)
        chunks.append((n * 1000, f"id: e{n}\nevent: message\ndata: {data}\n\n".encode()))
    return chunks


def mcp_call(rpc_id: Any, *answer: dict[str, Any] | str, outcome: str = "complete") -> Recorded:
    return Recorded(
        method="POST",
        path="/mcp",
        request_headers=MCP_HEADERS,
        request_body=rpc("tools/call", rpc_id, name="slow", _meta={"progressToken": rpc_id}),
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=sse(*answer),
        duration_ns=10_000,
        outcome=outcome,
        origin=f"call {rpc_id}",
    )


def progress(token: Any, value: float, total: float | None = None) -> dict[str, Any]:
    params = {"progressToken": token, "progress": value, **({"total": total} if total else {})}
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}


def result(rpc_id: Any, **extra: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": {"content": [{"type": "text", "text": "ok"}]}, **extra}


MCP_BREAKS = {
    "mcp-one-response": [mcp_call(1, result(1), result(1))],
    "mcp-result-xor-error": [mcp_call(1, result(1, error={"code": -1, "message": "x"}))],
    "mcp-progress-rising": [mcp_call(1, progress(1, 2), progress(1, 1), result(1))],
    "mcp-frame": [mcp_call(1, "{not json", result(1))],
}


def rules_broken(recorded: list[Recorded]) -> set[str]:
    return {f.rule for f in check_recorded(recorded)}


@pytest.mark.parametrize("rule", MCP_BREAKS)
def test_each_broken_mcp_session_breaks_its_rule(rule: str) -> None:
    assert rules_broken(MCP_BREAKS[rule]) == {rule}


def test_a_progress_token_used_again_by_a_later_request_counts_afresh() -> None:
    """Tokens are unique among the requests under way only: once a request is answered, a
    later one may carry its token again."""
    first, second = (mcp_call(n, progress("p", 1, 2), progress("p", 2, 2), result(n)) for n in (1, 2))
    for n, call in enumerate((first, second), 1):
        call.request_body = rpc("tools/call", n, name="slow", _meta={"progressToken": "p"})
    # Event ids are unique across a session's streams.
    second.chunks = [(at, chunk.replace(b"id: e", b"id: f")) for at, chunk in second.chunks]
    assert rules_broken([first, second]) == set()
    # Within one request, progress still rises.
    second.chunks = [second.chunks[1], second.chunks[0], second.chunks[2]]
    assert rules_broken([first, second]) == {"mcp-progress-rising"}


@pytest.mark.parametrize("code", ["oops", 1.5, True, None])
def test_an_error_code_that_is_no_integer_breaks_the_rule(code: Any) -> None:
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": code, "message": "x"}}
    assert rules_broken([mcp_call(1, error)]) == {"mcp-result-xor-error"}


def responses_stream(request_body: bytes) -> Recorded:
    """A Responses API stream (its events typed), answering ``request_body``."""
    done = {"id": "resp_1", "object": "response", "status": "completed", "output": []}
    events = [
        ("response.created", {"type": "response.created", "response": {**done, "status": "in_progress"}}),
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hi"}),
        ("response.completed", {"type": "response.completed", "response": done}),
    ]
    chunks = [
        (n * 1000, f"event: {e}\ndata: {json.dumps(d)}\n\n".encode()) for n, (e, d) in enumerate(events)
    ]
    return Recorded(
        method="POST",
        path="/v1/responses",
        request_body=request_body,
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=chunks,
        duration_ns=3_000,
        origin="responses",
    )


@pytest.mark.parametrize(
    "body",
    [b'{"prompt": {"id": "pmpt_1"}, "stream": true}', b'{"model": "gpt-4.1", "input": "cut at --max-b'],
    ids=["stored prompt", "body cut short"],
)
def test_a_responses_stream_is_checked_as_one_however_its_request_reads(body: bytes) -> None:
    """Told by its request when it can be read, else by its events: never as a chat stream
    (whose rules would look for choices and [DONE])."""
    stream = responses_stream(body)
    assert rules_broken([stream]) == set()
    stream.chunks.append((4000, b"data: [DONE]\n\n"))
    assert {f.message for f in check_recorded([stream])} == {
        "a second end marker (a terminal response event)"
    }


def test_progress_past_its_total_and_a_request_never_answered() -> None:
    assert rules_broken([mcp_call(1, progress(1, 3, total=2), result(1))]) == {"mcp-progress-rising"}
    assert rules_broken([mcp_call(1, progress(1, 1))]) == {"mcp-one-response"}
    # Cut short, the answer may simply not have come yet: noted, not broken.
    assert rules_broken([mcp_call(1, progress(1, 1), outcome="upstream_disconnected")]) == set()


def test_a_plain_text_http_error_breaks_no_protocol() -> None:
    """What a server (or a proxy before it) answers a path it does not serve is HTTP's, not
    the protocol's: not JSON, and no frame problem; a body of a 2xx still is."""
    not_found = Recorded(
        method="POST",
        path="/mcp",
        request_headers=MCP_HEADERS,
        request_body=rpc("initialize", 1),
        status=404,
        response_headers=[("Content-Type", "text/plain; charset=utf-8")],
        chunks=[(1000, b"404: Not Found")],
        duration_ns=2000,
        outcome="complete",
    )
    assert rules_broken([not_found]) == set()
    bad_gateway = Recorded(
        **{**not_found.__dict__, "path": "/v1/chat/completions", "request_headers": [], "status": 502}
        | {"request_body": b'{"model":"gpt-4o-mini","messages":[]}', "chunks": [(1000, b"<html>502</html>")]}
    )
    assert rules_broken([bad_gateway]) == set()
    assert rules_broken([Recorded(**{**bad_gateway.__dict__, "status": 200})]) == {"openai-frame"}


def test_a_post_stream_closed_for_resumption_and_answered_on_the_resumed_get_is_clean() -> None:
    closed = mcp_call(7, progress(7, 1))
    resumed = Recorded(
        method="GET",
        path="/mcp",
        request_headers=[*MCP_HEADERS, ("Last-Event-ID", "e0")],
        status=200,
        is_sse=True,
        chunks=sse(progress(7, 2), result(7)),
        outcome="complete",
    )
    assert rules_broken([closed, resumed]) == set()
    # The same answer seen again with its event id (a client that resumed twice) is one answer.
    again = Recorded(**{**resumed.__dict__, "chunks": sse(progress(7, 2), result(7))})
    assert rules_broken([closed, resumed, again]) == set()


def test_checking_one_protocol_only() -> None:
    broken_mcp = MCP_BREAKS["mcp-one-response"]
    a2a = read_cassette(ROOT / "cassettes" / "completed.jsonl")
    assert {f.rule for f in check_recorded([*a2a, *broken_mcp], protocols={"a2a"})} == set()
    assert {f.rule for f in check_recorded([*a2a, *broken_mcp], protocols={"mcp"})} == {"mcp-one-response"}
    with pytest.raises(UsageError, match="unknown protocol grpc"):
        check_recorded(a2a, protocols={"grpc"})


def batch_call(
    requests: list[dict[str, Any]], events: list[dict[str, Any]] | None, body: Any = None
) -> Recorded:
    """A POST of a JSON-RPC batch (MCP 2025-03-26, stateless: no MCP header) answered by an SSE
    stream of ``events``, or by the JSON ``body``."""
    content_type = "text/event-stream" if events is not None else "application/json"
    return Recorded(
        method="POST",
        path="/mcp",
        request_headers=[("Content-Type", "application/json")],
        request_body=json.dumps(requests).encode(),
        status=200,
        response_headers=[("Content-Type", content_type)],
        is_sse=events is not None,
        chunks=sse(*events) if events is not None else [(1000, json.dumps(body).encode())],
        duration_ns=10_000,
        outcome="complete",
    )


def ask(method: str, rpc_id: Any, **params: Any) -> dict[str, Any]:
    return json.loads(rpc(method, rpc_id, **params))


def test_each_message_of_a_batch_is_checked_as_a_single_one(tmp_path: Path) -> None:
    """A batch's requests each need their response (on its stream, or in its JSON array), and
    each response carries a result or an error; each request's progress rises on its own.
    A batch is no broken frame, and its operation is its messages'."""
    call = ask("tools/call", 5, name="slow", _meta={"progressToken": 5})
    answered = batch_call(
        [call, ask("ping", 6)], [progress(5, 1, 2), result(6), progress(5, 2, 2), result(5)]
    )
    unanswered = batch_call([ask("tools/call", 7, name="add"), ask("ping", 8)], [result(7)])
    notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    both = batch_call(
        [ask("ping", 9), notified, ask("ping", 10)],
        None,
        [result(9), result(10, error={"code": -1, "message": "x"})],
    )
    write_cassette(tmp_path / "batch.jsonl", [answered, unanswered, both])
    with LogWriter(tmp_path / "batch.db") as writer:
        load_into(writer, read_cassette(tmp_path / "batch.jsonl"), writer.begin_capture(source="test"))
    with EventLog(tmp_path / "batch.db") as log:
        found = [(f.exchange, f.rule, f.message) for f in report_log(log).findings]
        operations = [x["rpc_method"] for x in log.exchanges()]
    assert found == [
        ("2", "mcp-one-response", "request 8 (ping) got no response"),
        ("3", "mcp-result-xor-error", "a response with both a result and an error (at /1 of the batch)"),
    ]
    assert operations == ["tools/call, ping", "tools/call, ping", "ping, notifications/initialized, ping"]
    assert [f.message for f in check_recorded(read_cassette(tmp_path / "batch.jsonl"))] == [
        m for *_, m in found
    ]


# -- a log of all four --------------------------------------------------------------------


async def test_a_log_mixing_all_four_protocols(record: RecordFactory, tmp_path: Path) -> None:
    rec = await record(openai_app(delay=0))
    await chat(rec.url)
    await responses(rec.url)
    rec2 = await record(anthropic_app(delay=0))
    await messages(rec2.url)
    await rec.log()
    await rec2.log()
    _, mcp_db = await recorded_session(record, generation("mcp1-resumed"))
    a2a = [
        r
        for name in ("completed.jsonl", "completed_jsonrpc.jsonl")
        for r in read_cassette(ROOT / "cassettes" / name)
    ]
    mixed = tmp_path / "mixed.db"
    with LogWriter(mixed) as writer:
        capture = writer.begin_capture(source="test")
        for recorded in (a2a, read_log(rec.db), read_log(rec2.db), read_log(mcp_db)):
            load_into(writer, recorded, capture)
    with EventLog(mixed) as log:
        report = report_log(log)
        summaries = {r["protocol"]: r["finish"] for r in log.stream_summary() if r["finish"]}
    assert report.findings == []
    assert set(report.by_protocol) == {"a2a", "mcp", "openai", "anthropic"}
    assert summaries == {
        "a2a": "TASK_STATE_COMPLETED",
        "openai": "completed",
        "anthropic": "end_turn",
        "mcp": "result",
    }
    # and with one broken exchange of each non-A2A protocol, exactly those rules
    broken = tmp_path / "broken.db"
    with LogWriter(broken) as writer:
        capture = writer.begin_capture(source="test")
        load_into(writer, read_log(mixed), capture)
        load_into(writer, MCP_BREAKS["mcp-progress-rising"], capture)
        broken_anthropic = await record(anthropic_app(delay=0, broken="stop_not_last"))
        await messages(broken_anthropic.url)
        await broken_anthropic.log()
        load_into(writer, read_log(broken_anthropic.db), capture)
    with EventLog(broken) as log:
        assert {f.rule for f in report_log(log).findings} == {"mcp-progress-rising", "anthropic-stop-last"}


# -- upgrading an older log ---------------------------------------------------------------


def downgrade_to_schema_6(path: Path) -> None:
    """Make a log what the release before protocols wrote: no protocol columns, and every
    event classified the A2A way (an Anthropic message_start as an A2A message)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP VIEW stream_summary")
    for index in ("exchanges_protocol", "exchanges_session"):
        conn.execute(f"DROP INDEX {index}")
    for column in ("protocol", "session_id", "model", "answer", "input_tokens", "output_tokens", "finish"):
        conn.execute(f"ALTER TABLE exchanges DROP COLUMN {column}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0007_protocols'")
    rows = conn.execute("SELECT exchange_id, seq, data FROM events").fetchall()
    for exchange_id, seq, data in rows:
        c = classify(data)
        conn.execute(
            "UPDATE events SET kind = ?, text = ?, usage = NULL WHERE exchange_id = ? AND seq = ?",
            (c.kind, c.text, exchange_id, seq),
        )
    conn.execute("UPDATE exchanges SET binding = 'rest'")  # as message_start made it
    conn.execute("INSERT INTO events_fts (events_fts) VALUES ('rebuild')")
    conn.close()


async def test_an_older_log_is_read_again_by_the_protocols(record: RecordFactory, tmp_path: Path) -> None:
    rec = await record(anthropic_app(delay=0))
    expected = await messages(rec.url)
    await rec.log()
    old = tmp_path / "old.db"
    with sqlite3.connect(rec.db) as source, sqlite3.connect(old) as copy:
        source.backup(copy)
    downgrade_to_schema_6(old)
    with sqlite3.connect(old) as conn:
        assert ("message",) in conn.execute("SELECT kind FROM events").fetchall()  # misread, as it was
        assert conn.execute("SELECT count(*) FROM events_fts WHERE events_fts MATCH 'help'").fetchone() == (
            0,
        )
    with LogWriter(old):  # opened with write access: upgraded
        pass
    with EventLog(old) as log:
        (x,) = log.exchanges()
        (summary,) = log.stream_summary()
        kinds = [e["kind"] for e in log.events(x["id"])]
    assert (x["protocol"], x["binding"], kinds[0], kinds[-1]) == (
        "anthropic",
        None,
        "message_start",
        "message_stop",
    )
    assert (summary["answer"], summary["model"], summary["finish"]) == (
        expected.answer,
        expected.model,
        "end_turn",
    )
    # and full-text search finds the answer's words, which it did not before
    with sqlite3.connect(old) as conn:
        hits = conn.execute("SELECT rowid FROM events_fts WHERE events_fts MATCH 'help'").fetchall()
    assert len(hits) == 1


def test_a_get_stream_the_client_ended_hides_no_unanswered_request() -> None:
    standing = Recorded(
        method="GET",
        path="/mcp",
        request_headers=MCP_HEADERS,
        status=200,
        is_sse=True,
        outcome="client_disconnected",
    )
    assert rules_broken([standing, mcp_call(1, progress(1, 1))]) == {"mcp-one-response"}
    # A GET that resumed the call, from one of its events, and broke off: the answer may be yet to come.
    resuming = Recorded(**{**standing.__dict__, "request_headers": [*MCP_HEADERS, ("Last-Event-ID", "e0")]})
    assert rules_broken([mcp_call(1, progress(1, 1)), resuming]) == set()


def test_initialize_belongs_to_the_session_its_response_opens() -> None:
    initialize = Recorded(
        method="POST",
        path="/mcp",
        request_body=rpc("initialize", 0),
        status=200,
        response_headers=[("Content-Type", "text/event-stream"), ("mcp-session-id", "s1")],
        is_sse=True,
        chunks=sse(result(0)),
        outcome="complete",
    )
    # The session's GET stream answers request 0 once more: a second response in session s1.
    standing = Recorded(
        method="GET",
        path="/mcp",
        request_headers=MCP_HEADERS,
        status=200,
        is_sse=True,
        chunks=[(0, b'id: g1\ndata: {"jsonrpc": "2.0", "id": 0, "result": {}}\n\n')],
        outcome="complete",
    )
    (finding,) = check_recorded([initialize, standing])
    assert (finding.rule, finding.message.startswith("a second response to request 0")) == (
        "mcp-one-response",
        True,
    )


def test_a2a_usage_reaches_stream_summary(tmp_path: Path) -> None:
    usage = {"model": "m-1", "inputTokens": 12, "outputTokens": 34}
    frames = [
        {"task": {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_WORKING"}}},
        {
            "statusUpdate": {
                "taskId": "t1",
                "status": {"state": "TASK_STATE_COMPLETED"},
                "metadata": {"$usage": usage},
            }
        },
    ]
    body = "".join(f"data: {json.dumps(f)}\n\n" for f in frames).encode()
    recorded = Recorded(
        method="POST", path="/message:stream", request_body=b"{}", status=200, is_sse=True,
        chunks=[(1000, body)], duration_ns=2000, outcome="complete",
    )  # fmt: skip
    with LogWriter(tmp_path / "a2a.db") as writer:
        load_into(writer, [recorded], writer.begin_capture(source="test"))
    with EventLog(tmp_path / "a2a.db") as log:
        (row,) = log.stream_summary()
    assert (row["model"], row["input_tokens"], row["output_tokens"], row["finish"]) == (
        "m-1",
        12,
        34,
        "TASK_STATE_COMPLETED",
    )


def a2a_answering(usage: dict[str, Any]) -> web.Application:
    """An A2A agent whose stream ends with a statusUpdate carrying ``usage`` as its $usage."""
    frames = [task("t1", "c1"), status("t1", "c1", "TASK_STATE_COMPLETED", usage)]

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n, frame in enumerate(frames):
            await response.write(f"id: {n}\ndata: {json.dumps(frame)}\n\n".encode())
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


@pytest.mark.parametrize(
    ("tokens", "kept"),
    [
        ((10**30, 3), (None, 3)),  # past SQLite's INTEGER: once, the whole exchange was lost
        ((2**63 - 1, -(2**63)), (2**63 - 1, -(2**63))),  # its bounds, kept
        ((2**63, -(2**63) - 1), (None, None)),
        ((True, False), (None, None)),  # JSON's true is no count
    ],
    ids=["10**30", "int64 bounds", "past them", "booleans"],
)
async def test_an_a2a_token_count_the_log_cannot_hold_is_none(
    record: RecordFactory, tokens: tuple[Any, Any], kept: tuple[int | None, int | None]
) -> None:
    usage = {"model": "m-1", "inputTokens": tokens[0], "outputTokens": tokens[1], "credits": 1.5}
    rec = await record(a2a_answering(usage))
    async with rec.session.post(f"{rec.url}/message:stream", json={"message": {}}) as response:
        assert response.status == 200 and b"TASK_STATE_COMPLETED" in await response.read()
    with await rec.log() as log:
        (x,) = log.exchanges()
        (row,) = log.stream_summary(x["id"])
        (usage_event,) = [e for e in log.events(x["id"]) if e["usage"]]
    assert rec.writer.stats.rows_lost == 0
    assert (x["outcome"], row["finish"], row["model"]) == ("complete", "TASK_STATE_COMPLETED", "m-1")
    assert (row["input_tokens"], row["output_tokens"]) == kept
    assert json.loads(usage_event["usage"]) == usage  # the event keeps $usage as it came


def test_a_requests_header_is_its_first_value_whatever_the_names_case() -> None:
    request = Request("POST", "/", [("Mcp-Session-Id", "a"), ("X-Other", "b"), ("mcp-session-id", "c")])
    assert request.header("MCP-SESSION-ID") == request.header("mcp-session-id") == "a"
    assert (request.header("x-other"), request.header("Missing")) == ("b", None)
    assert Request("GET", "/").header("A2A-Version") is None


@pytest.mark.parametrize("when", ["before the answer", "at the end"])
def test_a_body_that_comes_late_tells_what_the_request_is(tmp_path: Path, when: str) -> None:
    """A body streamed through reaches the log after the request's head: it still tells the
    operation of a request its headers claimed (A2A-Version), and claims one nothing
    else did (an OpenAI call), whether it comes before the answer's events or after them."""
    a2a = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": {"message": {}}}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    cases = [
        ("/", [("A2A-Version", "1.0")], a2a, b'data: {"task":{"id":"t1","status":{}}}\n\n'),
        ("/v1/chat/completions", [], chat, CHAT_ANSWER),
    ]
    with LogWriter(tmp_path / "late.db") as w:
        capture = w.begin_capture(source="test")
        for path, headers, body, answer in cases:
            x = w.begin_exchange(capture, method="POST", path=path, request_headers=headers)
            if when == "before the answer":
                w.late_request_body(x, json.dumps(body).encode())
            w.response_head(x, status=200, headers=None, is_sse=True, ttfb_ns=1)
            w.chunk(x, 2, answer)
            if when == "at the end":
                w.late_request_body(x, json.dumps(body).encode())
            w.end_exchange(x, duration_ns=3)
    with EventLog(tmp_path / "late.db") as log:
        a2a_x, chat_x = log.exchanges()
        assert (a2a_x["protocol"], a2a_x["rpc_method"]) == ("a2a", "SendStreamingMessage")
        assert a2a_x["task_id"] == "t1"
        assert (chat_x["protocol"], chat_x["rpc_method"]) == ("openai", "chat.completions")
        kinds = [e["kind"] for e in log.events(chat_x["id"])]
    assert kinds == ["delta", "done"]  # at the end, since its first event is OpenAI's too


CHAT_ANSWER = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
    b'[{"index":0,"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n'
)


@pytest.mark.parametrize("hostile", ["{}", "[1]", '{"a": 1}'])
def test_an_object_where_a_name_goes_is_no_claim(hostile: str) -> None:
    """A JSON-RPC method, an A2A 0.3 kind, an OpenAI object given as an object or a list:
    the protocols' claims raised on them (a set cannot look one up), and the log writer
    with them."""
    body = f'{{"jsonrpc": "2.0", "id": 1, "method": {hostile}, "kind": {hostile}, "object": {hostile}}}'
    assert recognise_exchange(Request("POST", "/", [], body.encode()), (body, None)) is None
