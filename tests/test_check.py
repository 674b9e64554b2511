"""The lifecycle rules, each on a hand-made stream that breaks it and one that keeps it."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from a2a_frames import artifact, completed_run, sse, status, streamed, task
from conftest import RecordFactory
from test_gateway_rejoin import read_all, slow_subscribes
from test_replay import events_of

from tasktape.agent import create_agent_app
from tasktape.errors import UsageError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.checker import Finding, all_rules, check_recorded, explain, report_log, report_recorded
from tasktape.eventlog.recorded import Recorded, read_log
from tasktape.eventlog.resumes import ResumeOutcome
from tasktape.eventlog.rules import RULES

T, C = "task.1", "ctx.1"
Frames = list[dict[str, Any]]


def stream(
    frames: Frames | list[bytes],
    *,
    jsonrpc: int | None = None,
    reply_id: Any = None,
    ids: str | None = "e",
    outcome: str = "complete",
    started_at: str | None = None,
    origin: str = "t.jsonl:2",
) -> Recorded:
    """A recorded SSE exchange of these frames (or these raw SSE events), REST unless
    ``jsonrpc`` gives the request's JSON-RPC id (``reply_id``: the id the frames carry)."""
    message = {"message": {"messageId": "msg.1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    if jsonrpc is None:
        path, body = "/message:stream", message
    else:
        path, body = (
            "/jsonrpc",
            {"jsonrpc": "2.0", "id": jsonrpc, "method": "SendStreamingMessage", "params": message},
        )
    if frames and isinstance(frames[0], bytes):
        events: list[bytes] = frames  # type: ignore[assignment]
    else:
        events = sse(frames, ids=ids, jsonrpc_id=jsonrpc if reply_id is None else reply_id)  # type: ignore[arg-type]
    return Recorded(
        method="POST",
        path=path,
        request_body=json.dumps(body).encode(),
        status=200,
        is_sse=True,
        chunks=[(n * 1_000_000, e) for n, e in enumerate(events)],
        outcome=outcome,
        started_at=started_at,
        origin=origin,
    )


def body(method: str, path: str, reply: dict[str, Any], origin: str = "t.jsonl:9") -> Recorded:
    """A recorded plain (not streamed) A2A response."""
    return Recorded(
        method=method, path=path, status=200, chunks=[(0, json.dumps(reply).encode())], origin=origin
    )


def rules_broken(*recorded: Recorded) -> list[str]:
    return [f.rule for f in check_recorded(recorded)]


def run_ending(state: str, task_id: str = T, **status_extra: Any) -> Frames:
    end = status(task_id, C, state)
    end["statusUpdate"]["status"].update(status_extra)
    return [task(task_id, C, "TASK_STATE_SUBMITTED"), status(task_id, C, "TASK_STATE_WORKING"), end]


# (rule, a stream breaking it, a stream keeping it): each breaks that rule only.
CASES = [
    (
        "transition",
        [task(T, C, "TASK_STATE_SUBMITTED"), status(T, C, "TASK_STATE_COMPLETED")],
        completed_run(),
    ),
    (
        "transition",
        [task(T, C, "TASK_STATE_SUBMITTED"), status(T, C, "TASK_STATE_INPUT_REQUIRED")],
        run_ending("TASK_STATE_INPUT_REQUIRED"),
    ),
    ("after-terminal", [*completed_run(), artifact(T, C, "art.late", "late")], completed_run()),
    ("stream-end", run_ending("TASK_STATE_WORKING")[:2], run_ending("TASK_STATE_AUTH_REQUIRED")),
    (
        "stream-end",
        [*completed_run()[:-1]],
        [{"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": []}}],
    ),
    (
        "artifact-order",
        [task(T, C), artifact(T, C, "art.1", "a", append=True), status(T, C, "TASK_STATE_COMPLETED")],
        [task(T, C), *streamed(T, C, "art.1", ["a", "b"]), status(T, C, "TASK_STATE_COMPLETED")],
    ),
    (
        "artifact-order",
        [
            task(T, C),
            *streamed(T, C, "art.1", ["a"]),
            artifact(T, C, "art.1", "b", append=True),
            status(T, C, "TASK_STATE_COMPLETED"),
        ],
        # the whole artifact at once, and a last piece appended by the lastChunk itself
        [
            task(T, C),
            artifact(T, C, "art.1", "ab", last_chunk=True),
            artifact(T, C, "art.2", "a"),
            artifact(T, C, "art.2", "b", append=True, last_chunk=True),
            status(T, C, "TASK_STATE_COMPLETED"),
        ],
    ),
    (
        "artifact-order",
        [
            task(T, C),
            artifact(T, C, "art.1", "a"),
            artifact(T, C, "art.1", "b"),
            status(T, C, "TASK_STATE_FAILED"),
        ],
        [
            task(T, C),
            artifact(T, C, "art.1", "a"),
            artifact(T, C, "art.2", "b"),
            status(T, C, "TASK_STATE_FAILED"),
        ],
    ),
    (
        "last-chunk-text",
        [
            task(T, C),
            *streamed(T, C, "art.1", ["J45", ".909"])[:2],
            artifact(T, C, "art.1", "J45.90", last_chunk=True),
            status(T, C, "TASK_STATE_COMPLETED"),
        ],
        [task(T, C), *streamed(T, C, "art.1", ["J45", ".909"]), status(T, C, "TASK_STATE_COMPLETED")],
    ),
    (
        "completed-message",
        run_ending("TASK_STATE_COMPLETED", message={"role": "ROLE_AGENT", "parts": [{"text": "the answer"}]}),
        # FAILED explains itself in a message; only COMPLETED must not carry one
        run_ending("TASK_STATE_FAILED", message={"role": "ROLE_AGENT", "parts": [{"text": "why"}]}),
    ),
]


@pytest.mark.parametrize(("rule", "breaks", "keeps"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_on_a_stream_that_breaks_it_and_one_that_keeps_it(
    rule: str, breaks: Frames, keeps: Frames
) -> None:
    assert rules_broken(stream(breaks)) == [rule]
    assert rules_broken(stream(keeps)) == []


def test_a_finding_says_where_and_what() -> None:
    frames = [*completed_run(), artifact(T, C, "art.late", "late")]
    (finding,) = check_recorded([stream(frames, origin="mine.jsonl:3")])
    assert finding == Finding(
        rule="after-terminal",
        task_id=T,
        exchange="mine.jsonl:3",
        exchange_id=None,
        seq=len(frames) - 1,
        message=f"an artifactUpdate after the task ended COMPLETED at event {len(frames) - 2}",
    )


def test_an_exchange_changed_after_it_was_made_is_refused_naming_it() -> None:
    """A text chunk appended, or a header value set to an int, after the Recorded was made:
    checking it said "SSEDecoder.feed takes bytes" (a TypeError for a body not streamed),
    naming no exchange, or took the header, where write_cassette refuses both."""
    texted, numbered = stream(completed_run(T, C)), stream(completed_run(T, C), origin="t.jsonl:7")
    texted.chunks.append((10**9, "data: {}\n\n"))  # type: ignore[arg-type]
    numbered.response_headers.append(("X-Attempt", 5))  # type: ignore[arg-type]
    said = "exchange 1 to check (t.jsonl:2): Recorded's chunks are (offset_ns, bytes) pairs"
    with pytest.raises(UsageError, match=re.escape(said)):
        check_recorded([texted])
    said = "exchange 2 to check (t.jsonl:7): Recorded's response_headers are (name, value) pairs of strings"
    with pytest.raises(UsageError, match=re.escape(f"{said}, not ('X-Attempt', 5)")):
        report_recorded([stream(completed_run(T, C)), numbered])


def test_every_rule_explains_itself_in_one_line() -> None:
    assert set(RULES) == {
        "transition", "after-terminal", "stream-end", "artifact-order", "last-chunk-text",
        "completed-message", "unique-ids", "jsonrpc-id", "frame",
    }  # fmt: skip
    assert set(RULES) <= set(all_rules())
    for name in all_rules():  # every protocol's: the summary prints them as they are
        assert explain(name) and "\n" not in explain(name) and "``" not in explain(name)
        assert len(name) + len(explain(name)) < 120


def test_rest_shows_rejected_as_failed_straight_after_submitted_but_jsonrpc_does_not() -> None:
    rejected = [task(T, C, "TASK_STATE_SUBMITTED"), status(T, C, "TASK_STATE_FAILED")]
    assert rules_broken(stream(rejected)) == []
    (finding,) = check_recorded([stream(rejected, jsonrpc=1)])
    assert finding.rule == "transition" and finding.seq == 1
    assert finding.message.startswith("SUBMITTED -> FAILED is not a legal transition (allowed: ")


def test_a_state_the_lifecycle_does_not_know() -> None:
    assert rules_broken(stream([*run_ending("TASK_STATE_DONE")[:2], status(T, C, "TASK_STATE_DONE")])) == [
        "transition",
        "stream-end",
    ]


def test_a_task_resumed_in_a_new_stream_carries_its_state_over() -> None:
    asked = stream(run_ending("TASK_STATE_INPUT_REQUIRED"), origin="t.jsonl:2")
    resumed = stream(
        [
            task(T, C, "TASK_STATE_INPUT_REQUIRED"),
            status(T, C, "TASK_STATE_WORKING"),
            status(T, C, "TASK_STATE_COMPLETED"),
        ],
        origin="t.jsonl:9",
    )
    assert rules_broken(asked, resumed) == []
    done = stream(run_ending("TASK_STATE_COMPLETED"), origin="t.jsonl:2")
    (finding,) = check_recorded([done, resumed])
    assert (finding.rule, finding.exchange, finding.seq) == ("transition", "t.jsonl:9", 0)
    assert finding.message.startswith("COMPLETED (in t.jsonl:2 event 2) -> INPUT_REQUIRED is not a legal")


def test_a_task_resumed_in_a_new_stream_goes_on_with_the_artifact_it_began() -> None:
    """After INPUT_REQUIRED a new message resumes the task on a new stream, whose first
    artifact events append to the artifact the first stream began: they continue it, and
    its replacing lastChunk holds the text of both streams. An append to an artifact no
    stream of the task began is still one with nothing to append to."""
    began = [task(T, C), artifact(T, C, "a", "Hello "), status(T, C, "TASK_STATE_INPUT_REQUIRED")]
    asked = stream(began, started_at="2026-01-01T00:00:00.000000Z", origin="t.jsonl:2")
    goes_on = [
        task(T, C, "TASK_STATE_INPUT_REQUIRED"),
        status(T, C, "TASK_STATE_WORKING"),
        artifact(T, C, "a", "wor", append=True),
        artifact(T, C, "a", "ld", append=True),
        artifact(T, C, "a", "Hello world", last_chunk=True),
        status(T, C, "TASK_STATE_COMPLETED"),
    ]
    resumed = stream(goes_on, started_at="2026-01-01T00:00:01.000000Z", origin="t.jsonl:9")
    assert rules_broken(asked, resumed) == []
    other = stream(
        [task(T, C), artifact(T, C, "b", "x", append=True), status(T, C, "TASK_STATE_COMPLETED")],
        origin="t.jsonl:20",
    )
    (finding,) = check_recorded([other])
    assert (finding.rule, finding.exchange, finding.seq, finding.message) == (
        "artifact-order",
        "t.jsonl:20",
        1,
        "the first event of artifact b has append true: nothing to append to",
    )


def test_overlapping_exchanges_are_followed_in_arrival_order() -> None:
    # A resubscribe opened while the first stream still ran: its snapshot (WORKING) came
    # before the first stream's COMPLETED, though its exchange comes second.
    first = stream(run_ending("TASK_STATE_COMPLETED"), started_at="2026-01-01T00:00:00.000000Z")
    first.chunks[-1] = (50_000_000, first.chunks[-1][1])
    again = stream(
        [task(T, C, "TASK_STATE_WORKING"), status(T, C, "TASK_STATE_COMPLETED")],
        started_at="2026-01-01T00:00:00.010000Z",
    )
    again.chunks[-1] = (40_000_000, again.chunks[-1][1])
    assert rules_broken(first, again) == []
    # Without times, the order given is all there is.
    first.started_at = again.started_at = None
    assert rules_broken(first, again) == ["transition"]


def test_plain_responses_carry_a_state_too() -> None:
    done = stream(completed_run())
    assert (
        rules_broken(done, body("GET", f"/tasks/{T}", {"id": T, "status": {"state": "TASK_STATE_COMPLETED"}}))
        == []
    )
    canceled = body("POST", f"/tasks/{T}:cancel", {"id": T, "status": {"state": "TASK_STATE_CANCELED"}})
    (finding,) = check_recorded([done, canceled])
    assert (finding.rule, finding.exchange, finding.seq) == ("transition", "t.jsonl:9", None)
    # An agent card is no A2A operation: not checked at all.
    card = body("GET", "/.well-known/agent-card.json", {"name": "agent"})
    assert report_recorded([card]).exchanges == 0


def test_another_tasks_end_in_a_stream_does_not_end_its_own() -> None:
    """A stream whose task stayed WORKING, an event naming another task COMPLETED at its end:
    no finding at all (any task's end counted as the stream's), though the log's views leave
    its task WORKING. The stream's own task (its first event's) decides."""
    frames = [*run_ending("TASK_STATE_WORKING")[:2], status("task.other", C, "TASK_STATE_COMPLETED")]
    (finding,) = check_recorded([stream(frames)])
    assert (finding.rule, finding.seq, finding.task_id) == ("stream-end", 1, T)


def test_a_stream_cut_short_is_noted_not_broken() -> None:
    events = [*sse(run_ending("TASK_STATE_COMPLETED")[:2], ids="e"), b'data: {"artifactUpd']
    report = report_recorded([stream(events, outcome="upstream_disconnected")])
    assert report.findings == []
    (note,) = report.cut_short
    assert (note.rule, note.task_id, note.seq) == ("cut-short", T, 2)
    assert note.message.startswith(
        "broke off after 2 complete events, the task last WORKING (upstream_disconnected)"
    )
    # The same bytes, said to have ended as the agent meant: two broken rules.
    assert rules_broken(stream(events)) == ["stream-end", "frame"]


def llm_event(data: dict[str, Any]) -> bytes:
    """An LLM stream's event: one whose data names a type names it in its event field too,
    as Anthropic's and the Responses API's do."""
    named = f"event: {data['type']}\n" if "type" in data else ""
    return f"{named}data: {json.dumps(data)}\n\n".encode()


def llm_stream(path: str, body: dict[str, Any], events: list[dict[str, Any]]) -> Recorded:
    """An LLM stream the upstream broke off after these events (their data)."""
    chunks = [(n * 1_000_000, llm_event(e)) for n, e in enumerate(events)]
    return Recorded(
        method="POST",
        path=path,
        request_body=json.dumps({**body, "stream": True}).encode(),
        status=200,
        is_sse=True,
        chunks=chunks,
        outcome="upstream_disconnected",
        origin="t.jsonl:2",
    )


def test_a_cut_short_llm_stream_is_noted_in_its_protocols_words() -> None:
    """An LLM stream has no task: the note on one cut short says where it stood as its
    protocol says it (the stop reason, the response's status, choice 0's finish_reason)."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []}
    pending = {"id": "resp_1", "object": "response", "model": "gpt-x", "status": "in_progress"}
    chunk = {"object": "chat.completion.chunk", "model": "gpt-x"}
    cut = [
        llm_stream(
            "/v1/messages",
            {"model": "claude-x", "max_tokens": 9, "messages": []},
            [
                {"type": "message_start", "message": message},
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 3},
                },
            ],
        ),
        llm_stream(
            "/v1/responses",
            {"model": "gpt-x", "input": "Hi"},
            [
                {"type": "response.created", "response": pending},
                {"type": "response.in_progress", "response": pending},
            ],
        ),
        llm_stream(
            "/v1/chat/completions",
            {"model": "gpt-x", "messages": [], "n": 2},
            [
                {**chunk, "choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": "stop"}]},
                {**chunk, "choices": [{"index": 1, "delta": {"content": "B"}, "finish_reason": "length"}]},
            ],
        ),
    ]
    report = report_recorded(cut)
    assert report.findings == []
    assert [n.message for n in report.cut_short] == [
        f"broke off after 2 complete events, {last} (upstream_disconnected); how it ends is unknown"
        for last in ("last stop reason tool_use", "last status in_progress", "last finish reason stop")
    ]


def test_a_stream_left_after_its_closing_event_was_not_cut_short() -> None:
    """A client that leaves once it has the event closing its stream ([DONE], message_stop, a
    response's terminal event, a final state) is owed nothing more: a log recorded before
    the recorder waited for the upstream's end holds it client_disconnected, with no note.
    One left before that event is noted."""
    chunk = {"object": "chat.completion.chunk", "model": "gpt-x"}
    finished = {**chunk, "choices": [{"index": 0, "delta": {"content": "A"}, "finish_reason": "stop"}]}
    chat = llm_stream("/v1/chat/completions", {"model": "gpt-x", "messages": []}, [finished])
    done = (len(chat.chunks) * 1_000_000, b"data: [DONE]\n\n")
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []}
    completed = {"id": "resp_1", "object": "response", "model": "gpt-x", "status": "completed"}
    closed = [
        dataclasses.replace(chat, chunks=[*chat.chunks, done]),
        llm_stream(
            "/v1/messages",
            {"model": "claude-x", "max_tokens": 9, "messages": []},
            [{"type": "message_start", "message": message}, {"type": "message_stop"}],
        ),
        llm_stream(
            "/v1/responses",
            {"model": "gpt-x", "input": "Hi"},
            [{"type": "response.completed", "response": completed}],
        ),
    ]
    left = [dataclasses.replace(r, outcome="client_disconnected") for r in closed]
    left.append(stream(run_ending("TASK_STATE_COMPLETED"), outcome="client_disconnected"))
    assert report_recorded(left).cut_short == []
    (note,) = report_recorded([dataclasses.replace(chat, outcome="client_disconnected")]).cut_short
    assert note.message == (
        "broke off after 1 complete events, last finish reason stop (client_disconnected); "
        "how it ends is unknown"
    )


def mcp_stream(
    method: str, events: list[dict[str, Any]], outcome: str, last_event_id: str | None = None
) -> Recorded:
    """An MCP session's stream (a tool call's POST, or a GET resuming it) of these messages,
    with event ids as an event store gives them."""
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "slow_count"}}
    headers = [("Mcp-Session-Id", "s1"), *([("Last-Event-ID", last_event_id)] if last_event_id else [])]
    chunks = [
        (n * 1_000_000, f"id: {method}{n}\ndata: {json.dumps(e)}\n\n".encode()) for n, e in enumerate(events)
    ]
    return Recorded(
        method=method,
        path="/mcp",
        request_headers=headers,
        request_body=json.dumps(call).encode() if method == "POST" else None,
        status=200,
        is_sse=True,
        chunks=chunks,
        outcome=outcome,
        origin=f"t.jsonl:{method}",
    )


def test_an_mcp_stream_that_carried_its_response_was_not_cut_short() -> None:
    """mcp 1.x closes the GET resuming a tool call's stream once the response came: the
    client left with nothing owed. One that left before it is noted in MCP's words."""

    def progress(n: int) -> dict[str, Any]:
        params = {"progressToken": 2, "progress": float(n), "total": 3.0, "message": f"counted {n} of 3"}
        return {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}

    answer = {"jsonrpc": "2.0", "id": 2, "result": {"content": [{"type": "text", "text": "counted to 3"}]}}
    closed = mcp_stream("POST", [progress(1)], "complete")
    resumed = mcp_stream("GET", [progress(2), progress(3), answer], "client_disconnected", "POST0")
    report = report_recorded([closed, resumed])
    assert (report.findings, report.cut_short) == ([], [])
    left = mcp_stream("GET", [progress(2)], "client_disconnected", "POST0")
    (note,) = report_recorded([closed, left]).cut_short
    assert note.message == (
        "broke off after 1 complete events, last progress 2 of 3 (client_disconnected); "
        "how it ends is unknown"
    )


def test_a_stream_without_events_or_ending_on_an_error() -> None:
    empty = stream([])
    assert [(f.rule, f.message) for f in check_recorded([empty])] == [
        ("stream-end", "the stream ended without a single event")
    ]
    error = b'event: error\ndata: {"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}\n\n'
    (finding,) = check_recorded([stream([*sse(run_ending("x")[:2], jsonrpc_id=1), error], jsonrpc=1)])
    assert (finding.rule, finding.seq, finding.task_id) == ("stream-end", 2, T)
    assert finding.message == (
        "the stream ended on an error frame (-32603: boom), not on a terminal or interrupted state"
    )


@pytest.mark.parametrize(
    ("events", "broken"),
    [
        ([b"id: 1\ndata: {}\n\n"], ["stream-end", "frame"]),
        ([b"id: 1\ndata: {not json\n\n"], ["stream-end", "frame"]),
        (
            [
                *sse(run_ending("TASK_STATE_COMPLETED"), ids="e")[:2],
                b"data: [1]\n\n",
                *sse([status(T, C, "TASK_STATE_COMPLETED")]),
            ],
            ["frame"],
        ),
    ],
)
def test_frames_that_are_not_a2a(events: list[bytes], broken: list[str]) -> None:
    assert rules_broken(stream(events)) == broken


def test_sse_ids_are_unique_within_a_stream() -> None:
    frames = run_ending("TASK_STATE_COMPLETED")
    repeated = sse(frames[:2], ids="e") + sse(frames[2:], ids="e", start=2)
    (finding,) = check_recorded([stream(repeated)])
    assert (finding.rule, finding.seq, finding.message) == (
        "unique-ids",
        2,
        "event id 'e2' repeats that of event 1",
    )
    assert rules_broken(stream(frames, ids="e")) == rules_broken(stream(frames, ids=None)) == []
    # Another stream may use the same ids.
    assert rules_broken(stream(frames), stream(run_ending("TASK_STATE_COMPLETED", "task.2"))) == []
    # An empty id clears the last event id: it names no event, however often it comes.
    empty = [b"id: \n" + event for event in sse(frames, ids=None)]
    assert rules_broken(stream(empty)) == []


@pytest.mark.parametrize(
    "tail",
    [b": bye\n\n", b": ping", b"retry: 1000\n\n", b"id: 9\n\n", b"\n"],
    ids=["comment", "comment-cut", "retry", "id-only", "lf-of-a-split-crlf"],
)
def test_bytes_after_the_last_event_that_dispatch_nothing_are_no_frame(tail: bytes) -> None:
    """sse-starlette (under the a2a-sdk) sends CRLF and `: ping` comments: what follows the
    last event that no client would dispatch breaks no rule."""
    events = sse(run_ending("TASK_STATE_COMPLETED"), ids="e")
    if tail == b"\n":  # CRLF line ends, the blank line's CR in one chunk and its LF in the next
        events = [event.replace(b"\n", b"\r\n") for event in events]
        events[-1], tail = events[-1][:-1], events[-1][-1:]
    assert rules_broken(stream([*events, tail])) == []
    cut = b'data: {"statusUpdate": {"taskId"'  # but an event cut off still is one
    assert "frame" in rules_broken(stream([*events, cut]))


def test_jsonrpc_frames_answer_with_the_request_id() -> None:
    frames = run_ending("TASK_STATE_COMPLETED")
    assert rules_broken(stream(frames, jsonrpc=7)) == []
    findings = check_recorded([stream(frames, jsonrpc=7, reply_id=8)])
    assert [(f.rule, f.seq) for f in findings] == [("jsonrpc-id", 0), ("jsonrpc-id", 1), ("jsonrpc-id", 2)]
    assert findings[0].message == "JSON-RPC id 8 is not the request's 7"
    # "7" is not 7.
    assert rules_broken(stream(frames[:1], jsonrpc=7, reply_id="7")) == ["stream-end", "jsonrpc-id"]


def rpc_answer(method: str, params: dict[str, Any], result: Any) -> Recorded:
    """A plain JSON-RPC exchange as the official SDK's server answers it (its key order)."""
    request = {"method": method, "params": params, "id": "r1", "jsonrpc": "2.0"}
    return Recorded(
        method="POST",
        path="/",
        request_body=json.dumps(request).encode(),
        status=200,
        chunks=[(0, json.dumps({"result": result, "id": "r1", "jsonrpc": "2.0"}).encode())],
        origin="t.jsonl:3",
    )


def test_an_operation_that_returns_nothing_answers_a_null_result() -> None:
    # Deleting a push config returns google.protobuf.Empty: the SDK answers "result": null.
    deleted = rpc_answer("DeleteTaskPushNotificationConfig", {"taskId": T, "id": "cfg1"}, None)
    assert rules_broken(stream(completed_run()), deleted) == []
    # An operation that returns a task does not answer nothing.
    fetched = rpc_answer("GetTask", {"id": T}, None)
    findings = check_recorded([fetched])
    assert [(f.rule, f.message) for f in findings] == [("frame", "JSON-RPC result is not an object")]


def logged(path: Path, *recorded: Recorded) -> Path:
    """These recorded streams written into a log, as the recorder writes them."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="test")
        for r in recorded:
            x = w.begin_exchange(cap, method=r.method, path=r.path, request_body=r.request_body)
            w.response_head(
                x, status=200, headers={"content-type": "text/event-stream"}, is_sse=True, ttfb_ns=0
            )
            for offset, data in r.chunks:
                w.chunk(x, offset, data)
            w.end_exchange(x, duration_ns=r.chunks[-1][0] + 1)
    return path


def test_a_logged_stream_is_checked_from_its_events_not_decoded_again(tmp_path: Path) -> None:
    """The log holds a finished stream's events as its chunks decode to: the check reads
    them there (a stream of 100,000 events takes seconds to decode again), and finds what
    it finds in the chunks. A stream that ends mid-event is read from its chunks."""
    broken = stream([*run_ending("TASK_STATE_COMPLETED"), status(T, C, "TASK_STATE_WORKING")])
    cut = stream([*sse(run_ending("TASK_STATE_COMPLETED", "task.2")[:2], ids="e"), b'data: {"artifactUpd'])
    statements: list[str] = []
    with EventLog(logged(tmp_path / "log.db", broken, cut)) as log:
        log.db.conn.set_trace_callback(statements.append)
        report = report_log(log)
    chunks_read = re.findall(r"FROM chunks WHERE exchange_id = (\d+)", "\n".join(statements))
    assert chunks_read == ["2"]
    found = [(f.rule, f.task_id, f.seq, f.message) for f in report.findings]
    assert found == [(f.rule, f.task_id, f.seq, f.message) for f in check_recorded([broken, cut])]
    assert [rule for rule, *_ in found] == ["transition", "after-terminal", "stream-end", "frame"]


def _rpc_stream(
    method: str, params: dict[str, Any], frames: list[dict[str, Any]], rid: int, second: int, outcome: str
) -> Recorded:
    """A JSON-RPC stream without event ids (as the official SDK's server sends), started
    at ``second`` past the minute, its events a second apart."""
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    return Recorded(
        method="POST",
        path="/",
        request_body=json.dumps(body).encode(),
        request_headers=[("Content-Type", "application/json")],
        status=200,
        is_sse=True,
        response_headers=[("Content-Type", "text/event-stream")],
        chunks=[(n * 1_000_000_000, e) for n, e in enumerate(sse(frames, jsonrpc_id=rid))],
        outcome=outcome,
        started_at=f"2026-01-01T00:00:{second:02d}Z",
        origin=f"run:{rid}",
    )


def test_a_delta_a_subscribe_sends_like_one_sent_before_it_is_a_new_one() -> None:
    """An event without an id a subscribe sends counts as sent again when the stream it
    continues sent one alike while the subscribe ran; one alike sent before the subscribe
    (the model's "ha", then "ha" again) is new, its text the snapshot's to hold."""
    message = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "laugh"}]}}
    first = _rpc_stream(
        "SendStreamingMessage",
        message,
        [task("t", "c"), status("t", "c", "TASK_STATE_WORKING"), artifact("t", "c", "a", "ha"),
         artifact("t", "c", "a", "ha", append=True)],
        1,
        1,
        "upstream_disconnected",
    )  # fmt: skip
    subscribe = _rpc_stream(
        "SubscribeToTask",
        {"id": "t"},
        [task("t", "c", "TASK_STATE_WORKING"), artifact("t", "c", "a", "ha", append=True),
         artifact("t", "c", "a", "hahaha", last_chunk=True), status("t", "c", "TASK_STATE_COMPLETED")],
        2,
        10,
        "complete",
    )  # fmt: skip
    assert check_recorded([first, subscribe]) == []


def test_a_snapshot_does_not_restate_an_artifact_a_stream_that_ran_to_its_end_carries() -> None:
    """A subscribe opened while the task's stream ran: its snapshot may hold deltas that
    stream brings a moment later (arrival order across two connections is not exact), so
    that stream's deltas, all there, make the artifact's text, not the snapshot; and the
    first delta of an artifact the snapshot began is no later delta replacing its text."""
    first = [
        task(T, C),
        artifact(T, C, "a", "a"),
        artifact(T, C, "b", "x"),
        artifact(T, C, "a", "b", append=True),
        artifact(T, C, "b", "y", append=True),
        artifact(T, C, "a", "ab", last_chunk=True),
        artifact(T, C, "b", "xy", last_chunk=True),
        status(T, C, "TASK_STATE_COMPLETED"),
    ]
    running = stream(first, started_at="2026-01-01T00:00:00.000000Z")
    held = [{"artifactId": "a", "parts": [{"text": "ab"}]}, {"artifactId": "b", "parts": [{"text": "x"}]}]
    ahead = {"task": {**task(T, C)["task"], "artifacts": held}}
    # Its snapshot comes after the first stream's "a" and before its "x" and "b", and holds
    # them; then the events the first stream sends after those, under their ids.
    joined = dataclasses.replace(
        stream([*sse([ahead], ids="s"), *sse(first, ids="e")[4:]], started_at="2026-01-01T00:00:00.001500Z"),
        method="GET",
        path=f"/tasks/{T}:subscribe",
        request_body=None,
    )
    assert rules_broken(running, joined) == []


def _with_snapshot(subscribe: Recorded, change: Callable[[dict[str, Any]], None]) -> Recorded:
    """A copy of a recorded subscribe whose first event, its Task snapshot, ``change``
    edits; the events after it as they came."""
    body, passed = b"".join(data for _, data in subscribe.chunks), 0
    end = body.index(b"\n\n") + 2
    fields, data = body[:end].split(b"data: ", 1)
    snapshot = json.loads(data)
    change(snapshot["task"])
    first = fields + b"data: " + json.dumps(snapshot).encode() + b"\n\n"
    for n, (offset, chunk) in enumerate(subscribe.chunks):
        passed += len(chunk)
        if passed >= end:  # the chunk that completed the first event
            chunks = [(offset, first + body[end:passed]), *subscribe.chunks[n + 1 :]]
            return dataclasses.replace(subscribe, chunks=chunks)
    raise AssertionError("the subscribe has no whole first event")


async def test_a_stream_rejoined_mid_artifact_goes_on_from_its_subscribe_s_snapshot(
    record: RecordFactory,
) -> None:
    """The agent's stream drops mid-answer; the resume gateway subscribes to the task again,
    whose first event, a Task, holds the text the agent sent meanwhile, which the log holds
    no event of: the subscribe's deltas append to it, and its lastChunk is that text and
    theirs. An append to an artifact the snapshot leaves out still has nothing to append
    to, and a lastChunk that is not the snapshot's text and the deltas after it is found."""
    agent = create_agent_app(pace=1.0)  # its thinking streams 0.3-0.6 s in, its answer 0.6-1.3 s
    slow_subscribes(agent, 0.35)  # its stream drops in the thinking: the subscribe finds it mid-answer
    rec = await record(agent, hold=30.0)
    ask = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "drop please"}]}}
    await read_all(rec.url, ask)
    with await rec.log() as log:
        ((broken, (outcome, subscribe_id)),) = log.rejoins().items()
        report = report_log(log)
    assert outcome == ResumeOutcome.REJOINED
    assert report.findings == [] and [n.exchange_id for n in report.cut_short] == [broken]
    first, subscribe = read_log(rec.db, [broken, subscribe_id])
    snapshot, *events = [json.loads(e.data) for e in events_of(b"".join(d for _, d in subscribe.chunks))]
    appended = next(e["artifactUpdate"] for e in events if "artifactUpdate" in e)
    open_id = appended["artifact"]["artifactId"]
    held = {a["artifactId"] for a in snapshot["task"]["artifacts"]}
    assert appended.get("append") and open_id in held  # the case: the snapshot began what they append to

    def leave_out(snapshot: dict[str, Any]) -> None:
        snapshot["artifacts"] = [a for a in snapshot["artifacts"] if a["artifactId"] != open_id]

    order, text = check_recorded([first, _with_snapshot(subscribe, leave_out)])
    assert (order.rule, order.seq, order.message) == (
        "artifact-order",
        1,
        f"the first event of artifact {open_id} has append true: nothing to append to",
    )
    assert text.rule == "last-chunk-text"  # (nor is its lastChunk the deltas, without what they follow)

    def misquote(snapshot: dict[str, Any]) -> None:
        (artifact,) = [a for a in snapshot["artifacts"] if a["artifactId"] == open_id]
        artifact["parts"][0]["text"] = "X" + artifact["parts"][0]["text"][1:]

    deltas = sum(bool(u.get("append")) for e in events if (u := e.get("artifactUpdate")))
    (finding,) = check_recorded([first, _with_snapshot(subscribe, misquote)])
    assert finding.rule == "last-chunk-text" and finding.message.startswith(
        f"the lastChunk of artifact {open_id} is not its text in the Task at event 0 and the {deltas} "
        "deltas after it joined: they differ at character 0 ('X"
    )


def test_an_answer_the_log_holds_in_a_coding_it_could_not_decode_is_not_read() -> None:
    """A valid OpenAI answer sent with Content-Encoding: zstd (which the log cannot decode)
    was read as its compressed bytes: an openai-frame finding, exit 1, on a recording the
    client read whole. Such a body is not checked, as one cut at --max-body is not."""
    request = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()

    def answer(*coding: tuple[str, str]) -> Recorded:
        return Recorded(
            method="POST",
            path="/v1/chat/completions",
            request_body=request,
            status=200,
            response_headers=[("Content-Type", "application/json"), *coding],
            chunks=[(1_000_000, b"\x28\xb5\x2f\xfd\x00\x58not json to a reader")],
            outcome="complete",
        )

    assert rules_broken(answer(("Content-Encoding", "zstd"))) == []
    assert rules_broken(answer()) == ["openai-frame"]  # (the same bytes said to be plain: read)
