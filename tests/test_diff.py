"""`tasktape diff` as a user runs it: two recordings of the demo agent at two paces, a
recording against an edited copy of itself, hand-written cassettes (ids made up afresh,
polls, exchanges in one recording alone), MCP sessions of the official SDK and LLM token
streams recorded through the proxy, and arguments it refuses."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from a2a_frames import USAGE, sse, status, streamed, task
from aiohttp import web
from click.testing import CliRunner, Result
from conftest import RecordFactory
from llm_servers import anthropic_app, openai_app
from test_llm_streams import chat, messages
from test_llm_tool_calls import chat_calls, messages_calls
from test_mcp_sdk import generation, recorded_session

from tasktape.agent import create_agent_app
from tasktape.cli import main
from tasktape.demo import scenarios
from tasktape.eventlog import LogWriter
from tasktape.proxy import RecordingProxy
from tasktape.serving import start_site

HEADER = re.compile(
    r"^(GET|POST) /\S* \(a2a( \w+)?\)  \S+ exchange \d+( \(last of \d+ identical requests\))? ~ "
)
# Tolerances for live recordings of a few milliseconds: their content is the subject, and a busy
# machine can move a first event by hundreds of milliseconds.
LOOSE = ("--time-tolerance", "1000%", "--time-tolerance", "30s")
SUMMARY = re.compile(r"^(\d+) pairs, (\d+) differs?, (\d+) only in A, (\d+) only in B$")


def diff(*args: str | Path) -> Result:
    return CliRunner().invoke(main, ["diff", *map(str, args)])


def diff_json(*args: str | Path) -> tuple[int, dict[str, Any]]:
    result = diff(*args, "--json")
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def aspects(doc: dict[str, Any]) -> list[list[str]]:
    """The aspects that differ, pair by pair, of the pairs that differ."""
    return [[d["aspect"] for d in p["differences"]] for p in doc["pairs"] if p["differs"]]


# -- the demo agent, recorded twice ----------------------------------------------------------


async def record_demo(db: Path, pace: float) -> None:
    """The demo's scenarios, driven through the proxy all at once as `tasktape demo` does."""
    writer = LogWriter(db)
    agent_runner, agent_url = await start_site(create_agent_app(pace=pace), "127.0.0.1", 0)
    proxy = RecordingProxy(agent_url, writer)
    proxy_runner, proxy_url = await start_site(proxy.app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            plans = [go for _, go in scenarios(session, proxy_url)]
            await asyncio.gather(*(go() for go in plans))
        await asyncio.wait_for(proxy.wait_idle(), 30)
    finally:
        await proxy_runner.cleanup()
        await agent_runner.cleanup()
        await writer.aclose()


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo agent recorded at one pace, then at a pace twice as slow."""
    folder = tmp_path_factory.mktemp("paced")
    fast, slow = folder / "fast.db", folder / "slow.db"
    asyncio.run(record_demo(fast, 0.1))
    asyncio.run(record_demo(slow, 0.2))
    return fast, slow


def test_an_agent_at_half_the_pace_differs_in_time_alone(paced: tuple[Path, Path]) -> None:
    fast, slow = paced
    result = diff(fast, slow, "--time-tolerance", "10%")
    assert result.exit_code == 1, result.output
    *body, blank, summary = result.output.splitlines()
    pairs, differ, only_a, only_b = map(int, SUMMARY.match(summary).groups())  # type: ignore[union-attr]
    assert blank == "" and differ > 0 and (only_a, only_b) == (0, 0)
    # Every scenario pairs: the dropped stream's GetTask polls are one run, however many there were.
    assert pairs == 16
    for line in body:
        assert HEADER.match(line) or re.fullmatch(
            r"  (first event|duration): \d+\.\d ms -> \d+\.\d ms \([+-]\d+%\)", line
        ), line
    assert any(line.startswith("  duration: ") for line in body)

    code, doc = diff_json(fast, slow, "--time-tolerance", "10%")
    assert code == 1 and doc["summary"] == {"pairs": 16, "differ": differ, "only_in_a": 0, "only_in_b": 0}
    assert doc["time_tolerance"] == {"percent": 10.0, "ms": 10.0}
    assert {a for pair in aspects(doc) for a in pair} <= {"ttfe", "duration"}
    # B thinks and streams its tokens for twice as long: a stream's 150 ms become 300.
    durations = [d for p in doc["pairs"] for d in p["differences"] if d["aspect"] == "duration"]
    assert max(d["b"] - d["a"] for d in durations) > 50
    assert all(d["field"] is None and d["diff"] == [] for d in durations)


def test_a_generous_tolerance_finds_nothing(paced: tuple[Path, Path]) -> None:
    fast, slow = paced
    # Beyond the agent's own pace (its streams' 150 ms become 300): room for a loaded machine,
    # where a poll or a first event can come tens of milliseconds late.
    generous = ("--time-tolerance", "300%", "--time-tolerance", "250ms")
    result = diff(fast, slow, *generous)
    assert (result.exit_code, result.output) == (0, "16 pairs, 0 differ, 0 only in A, 0 only in B\n")
    code, doc = diff_json(fast, slow, *generous)
    assert code == 0 and aspects(doc) == [] and doc["only_in_a"] == doc["only_in_b"] == []
    polls = [p for p in doc["pairs"] if p["a"]["operation"] == "GetTask"]
    assert polls and all(p["a"]["request"].startswith("GET /tasks/task.") for p in polls)


# -- a recording against an edited copy of itself ---------------------------------------------


def export(db: Path, to: Path) -> Path:
    result = CliRunner().invoke(main, ["export", str(db), "-o", str(to)])
    assert result.exit_code == 0, result.output
    return to


def edited(cassette: Path, to: Path, edit: Callable[[dict[str, Any], dict[str, Any]], bool]) -> Path:
    """A copy of ``cassette`` whose chunks ``edit`` (given its exchange's request and the
    chunk) changed in place; it says whether it did."""
    lines, request, changed = [], None, 0
    for line in cassette.read_text().splitlines():
        doc = json.loads(line)
        if "exchange" in doc:
            request = doc["exchange"]["request"]
        elif "chunk" in doc and request is not None and edit(request, doc["chunk"]):
            changed += 1
            lines.append(json.dumps(doc))
            continue
        lines.append(line)
    assert changed
    to.write_text("\n".join(lines) + "\n")
    return to


def first_rest_answer(request: dict[str, Any]) -> bool:
    return request["path"] == "/message:stream" and "J45.909" in request.get("body", "")


def test_a_recording_and_its_cassette_are_the_same(paced: tuple[Path, Path], tmp_path: Path) -> None:
    fast, _ = paced
    cassette = export(fast, tmp_path / "fast.jsonl")
    result = diff(fast, cassette, "--time-tolerance", "0%", "--time-tolerance", "0ms")
    assert (result.exit_code, result.output) == (0, "16 pairs, 0 differ, 0 only in A, 0 only in B\n")


def held_open(release: asyncio.Event) -> web.Application:
    """An agent whose stream sends its task, then waits for ``release`` to end it."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        (submitted,) = sse([task("task.live", "ctx.live", "TASK_STATE_SUBMITTED")], ids="e")
        await response.write(submitted)
        await release.wait()
        (completed,) = sse([status("task.live", "ctx.live", "TASK_STATE_COMPLETED")], ids="e", start=2)
        await response.write(completed)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


async def test_a_log_still_recording_and_its_export_are_the_same(
    record: RecordFactory, tmp_path: Path
) -> None:
    """The stream its recorder was still writing was read from the log with no outcome, and
    from its export as log_closed: "outcome: (none) -> log_closed", exit 1. Both are read
    as check and export read a log, cut short where it stops."""
    release = asyncio.Event()
    rec = await record(held_open(release))
    async with rec.session.post(f"{rec.url}/message:stream", json=message("hi")) as live:
        assert (await live.content.readuntil(b"\n\n")).startswith(b"id: e1\n")
        await rec.writer.aflush()
        cassette = export(rec.db, tmp_path / "live.jsonl")
        result = diff(rec.db, cassette, "--time-tolerance", "0%", "--time-tolerance", "0ms")
        release.set()
        await live.read()
    assert (result.exit_code, result.output) == (0, "1 pair, 0 differ, 0 only in A, 0 only in B\n")


def test_an_edited_token_and_answer_are_all_it_reports(paced: tuple[Path, Path], tmp_path: Path) -> None:
    fast, _ = paced
    cassette = export(fast, tmp_path / "fast.jsonl")

    def gathered(request: dict[str, Any], chunk: dict[str, Any]) -> bool:
        # The delta " assembled", and the lastChunk that consolidates the answer.
        if not first_rest_answer(request) or "assembled" not in chunk["text"]:
            return False
        chunk["text"] = chunk["text"].replace("assembled", "gathered")
        return True

    copy = edited(cassette, tmp_path / "edited.jsonl", gathered)
    result = diff(cassette, copy)
    assert result.exit_code == 1, result.output
    head, *lines, blank, summary = result.output.splitlines()
    assert re.fullmatch(
        r"POST /message:stream \(a2a SendStreamingMessage\)  fast\.jsonl:\d+ ~ edited\.jsonl:\d+", head
    )
    assert (blank, summary) == ("", "16 pairs, 1 differs, 0 only in A, 0 only in B")
    assert lines[:5] == [
        "  answer:",
        "    --- A",
        "    +++ B",
        "    @@ -1,2 +1,2 @@",
        "    -About What does J45.909 mean: the answer is assembled from the sources ",
    ]
    assert "    +About What does J45.909 mean: the answer is gathered from the sources " in lines
    assert (
        "  deltas:" in lines
        and "    -J45.909 mean: the answer is assembled from the sources found and " in lines
    )
    removed = [line for line in lines if line.startswith("    -") and not line.startswith("    ---")]
    assert removed and all("assembled" in line for line in removed)

    code, doc = diff_json(cassette, copy)
    assert code == 1 and aspects(doc) == [["answer", "deltas"]]
    (pair,) = [p for p in doc["pairs"] if p["differs"]]
    answer, deltas = pair["differences"]
    assert answer["a"].replace("assembled", "gathered") == answer["b"] and "gathered" in answer["b"]
    assert deltas["a"].startswith("Looking up What does J45.909 mean") and "assembled" in deltas["a"]
    assert [line[0] for line in answer["diff"][3:]] == ["-", "+", " "]


def test_an_edited_final_state_is_all_it_reports(paced: tuple[Path, Path], tmp_path: Path) -> None:
    fast, _ = paced
    cassette = export(fast, tmp_path / "fast.jsonl")

    def failed(request: dict[str, Any], chunk: dict[str, Any]) -> bool:
        if not first_rest_answer(request) or "TASK_STATE_COMPLETED" not in chunk["text"]:
            return False
        chunk["text"] = chunk["text"].replace("TASK_STATE_COMPLETED", "TASK_STATE_FAILED")
        return True

    copy = edited(cassette, tmp_path / "failed.jsonl", failed)
    result = diff(cassette, copy)
    assert result.exit_code == 1
    assert result.output.splitlines()[1:] == [
        "  finish: TASK_STATE_COMPLETED -> TASK_STATE_FAILED",
        "",
        "16 pairs, 1 differs, 0 only in A, 0 only in B",
    ]


# -- hand-written cassettes: ids made up afresh, polls, exchanges in one alone ---------------


def sse_exchange(
    path: str, body: dict[str, Any], frames: list[dict[str, Any]], ids: str
) -> list[dict[str, Any]]:
    request = {"method": "POST", "path": path, "headers": [["Content-Type", "application/json"]]}
    lines: list[dict[str, Any]] = [
        {
            "exchange": {
                "request": {**request, "body": json.dumps(body)},
                "response": {"status": 200, "headers": [["Content-Type", "text/event-stream"]], "ttfb_ms": 2},
            }
        }
    ]
    for n, event in enumerate(sse(frames, ids=ids), 1):
        lines.append({"chunk": {"offset_ms": 10 * n, "text": event.decode()}})
    lines.append({"end": {"duration_ms": 10 * len(frames) + 5}})
    return lines


def json_exchange(
    method: str, path: str, body: dict[str, Any] | None, answer: dict[str, Any]
) -> list[dict[str, Any]]:
    request: dict[str, Any] = {
        "method": method,
        "path": path,
        "headers": [["Content-Type", "application/json"]],
    }
    if body is not None:
        request["body"] = json.dumps(body)
    head = {"status": 200, "headers": [["Content-Type", "application/json"]], "ttfb_ms": 2}
    return [
        {"exchange": {"request": request, "response": head}},
        {"chunk": {"offset_ms": 3, "text": json.dumps(answer)}},
        {"end": {"duration_ms": 3}},
    ]


def message(text: str, task_id: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}
    return {"message": {**m, "taskId": task_id} if task_id else m}


def polled(task_id: str, ctx: str, state: str) -> dict[str, Any]:
    body = task(task_id, ctx, state)["task"]
    body["status"]["timestamp"] = f"2026-12-01T10:00:{uuid.uuid4().int % 60:02d}Z"  # no two runs agree
    return body


def session(tokens: list[str], polls: list[str], last: str = "TASK_STATE_COMPLETED") -> list[dict[str, Any]]:
    """An agent's session with made-up plain UUIDs (as the a2a-sdk's): an answer in
    ``tokens``, another task's in between, the first task polled (REST) once per state in
    ``polls``, asked for on JSON-RPC, then resumed with a follow-up message."""
    t, c, art, other = (str(uuid.uuid4()) for _ in range(4))
    answer = [
        task(t, c),
        status(t, c, "TASK_STATE_WORKING"),
        *streamed(t, c, art, tokens),
        status(t, c, "TASK_STATE_INPUT_REQUIRED", usage=USAGE),
    ]
    lines = sse_exchange("/message:stream", message("What does J45.909 mean?"), answer, f"{uuid.uuid4()}-")
    for n, state in enumerate(polls):
        lines += json_exchange("GET", f"/tasks/{t}", None, polled(t, c, state))
        if n == 0:
            frames = [task(other, c), status(other, c, "TASK_STATE_REJECTED")]
            lines += sse_exchange("/message:stream", message("Reject this"), frames, f"{uuid.uuid4()}-")
    rpc = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": "GetTask", "params": {"id": t}}
    answered = {"jsonrpc": "2.0", "id": rpc["id"], "result": polled(t, c, last)}
    lines += json_exchange("POST", "/jsonrpc", rpc, answered)
    follow_up = [status(t, c, "TASK_STATE_WORKING"), status(t, c, "TASK_STATE_COMPLETED")]
    lines += sse_exchange("/message:stream", message("Record 42", t), follow_up, f"{uuid.uuid4()}-")
    return lines


def cassette(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(line) for line in [{"tasktape_cassette": 1}, *lines]) + "\n")
    return path


TOKENS = ["J45.909", " is", " mild", " intermittent", " asthma."]


def test_ids_made_up_afresh_pair_by_position_and_polls_as_one_run(tmp_path: Path) -> None:
    """Every id, SSE id and JSON-RPC id differs between the two, B polls once where A
    polled three times, and streams its answer in other pieces: nothing differs."""
    a = cassette(
        tmp_path / "a.jsonl", session(TOKENS, ["TASK_STATE_WORKING"] * 2 + ["TASK_STATE_INPUT_REQUIRED"])
    )
    b = cassette(
        tmp_path / "b.jsonl",
        session(["J45.909 is", " mild intermittent asthma."], ["TASK_STATE_INPUT_REQUIRED"]),
    )
    result = diff(a, b)
    assert (result.exit_code, result.output) == (0, "5 pairs, 0 differ, 0 only in A, 0 only in B\n"), (
        result.output
    )
    _, doc = diff_json(a, b)
    polls = [
        p for p in doc["pairs"] if p["a"]["operation"] == "GetTask" and p["a"]["request"].startswith("GET")
    ]
    (poll,) = polls
    assert [len(poll[side]["exchanges"]) for side in "ab"] == [3, 1]
    # The other task's stream, between the first two, does not break the run.
    assert poll["a"]["exchanges"] == ["a.jsonl:13", "a.jsonl:20", "a.jsonl:23"]


def test_the_last_answer_of_a_run_is_what_is_compared(tmp_path: Path) -> None:
    a = cassette(tmp_path / "a.jsonl", session(TOKENS, ["TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED"]))
    b = cassette(
        tmp_path / "b.jsonl",
        session(TOKENS, ["TASK_STATE_WORKING", "TASK_STATE_FAILED"], last="TASK_STATE_FAILED"),
    )
    result = diff(a, b)
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert re.fullmatch(
        r"GET /tasks/\S+ \(a2a GetTask\)  a\.jsonl:\d+ \(last of 2 identical requests\)"
        r" ~ b\.jsonl:\d+ \(last of 2 identical requests\)",
        lines[0],
    )
    assert lines[1:] == [
        "  finish: TASK_STATE_INPUT_REQUIRED -> TASK_STATE_FAILED",
        "POST /jsonrpc (a2a GetTask)  a.jsonl:23 ~ b.jsonl:23",
        "  finish: TASK_STATE_COMPLETED -> TASK_STATE_FAILED",
        "",
        "5 pairs, 2 differ, 0 only in A, 0 only in B",
    ]


def test_a_message_sent_twice_is_two_exchanges_each_compared(tmp_path: Path) -> None:
    """Only reads repeat harmlessly: the same question sent twice made two tasks, and the
    first one's changed answer shows, though the second's is the same."""

    def asked_twice(first: str) -> list[dict[str, Any]]:
        lines = []
        for text in (first, "Deleted."):
            t, c, art = (str(uuid.uuid4()) for _ in range(3))
            frames = [task(t, c), *streamed(t, c, art, [text]), status(t, c, "TASK_STATE_COMPLETED")]
            lines += sse_exchange("/message:stream", message("Delete report.txt"), frames, f"{uuid.uuid4()}-")
        return lines

    a = cassette(tmp_path / "a.jsonl", asked_twice("Deleted."))
    b = cassette(tmp_path / "b.jsonl", asked_twice("I refuse to delete files."))
    result = diff(a, b)
    assert result.exit_code == 1
    assert (
        result.output.splitlines()[0]
        == "POST /message:stream (a2a SendStreamingMessage)  a.jsonl:2 ~ b.jsonl:2"
    )
    assert result.output.endswith("2 pairs, 1 differs, 0 only in A, 0 only in B\n")


def mcp_get_stream(messages: list[dict[str, Any]], last_event_id: str | None) -> list[dict[str, Any]]:
    """An MCP GET stream of the session, taken up after ``last_event_id`` when given."""
    headers = [
        ["Accept", "text/event-stream"],
        ["Mcp-Session-Id", "s-1"],
        ["MCP-Protocol-Version", "2025-11-25"],
    ]
    request = {
        "method": "GET",
        "path": "/mcp",
        "headers": headers + ([["Last-Event-ID", last_event_id]] if last_event_id else []),
    }
    head = {"status": 200, "headers": [["Content-Type", "text/event-stream"]], "ttfb_ms": 2}
    lines: list[dict[str, Any]] = [{"exchange": {"request": request, "response": head}}]
    for n, m in enumerate(messages, 1):
        lines.append({"chunk": {"offset_ms": 10 * n, "text": f"id: e{n}\ndata: {json.dumps(m)}\n\n"}})
    return [*lines, {"end": {"duration_ms": 10 * len(messages) + 5}}]


def test_an_mcp_get_stream_and_its_resumption_are_compared_apart(tmp_path: Path) -> None:
    """The session's GET stream and the GET that takes a stream up again after an event
    were one run of "identical" reads, the last alone compared: a change on the first
    went unreported."""

    def log(level: str, text: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": level, "data": text}}

    def recording(path: Path, first: str) -> Path:
        lines = mcp_get_stream([log("info", first)], None)
        lines += mcp_get_stream([log("info", "counted 2 of 3")], "e1")
        return cassette(path, lines)

    a = recording(tmp_path / "a.jsonl", "counted 1 of 3")
    b = recording(tmp_path / "b.jsonl", "server is on fire")
    status, doc = diff_json(a, b)
    assert status == 1 and [p["a"]["exchanges"] for p in doc["pairs"]] == [["a.jsonl:2"], ["a.jsonl:5"]], doc
    assert [p["differs"] for p in doc["pairs"]] == [True, False], doc


def test_what_an_mcp_server_asks_is_compared_message_by_message(tmp_path: Path) -> None:
    """An elicitation's message changed ("Favourite colour?" to "Your bank password?"): a
    server's requests had no text, so diff saw nothing; MCP's deltas are messages, one a line."""

    def recording(path: Path, asked: str) -> Path:
        progress = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": 1, "progress": 1, "message": "counted 1 of 3"},
        }
        elicit = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "elicitation/create",
            "params": {"message": asked, "requestedSchema": {}},
        }
        return cassette(path, mcp_get_stream([progress, elicit], None))

    a = recording(tmp_path / "a.jsonl", "Favourite colour?")
    b = recording(tmp_path / "b.jsonl", "Your bank password?")
    status, doc = diff_json(a, b)
    assert status == 1 and aspects(doc) == [["deltas"]], doc
    (difference,) = doc["pairs"][0]["differences"]
    assert difference["a"] == "counted 1 of 3\nelicitation/create: Favourite colour?"
    assert "+elicitation/create: Your bank password?" in difference["diff"]


def test_kinds_artifacts_and_usage_show_what_changed(tmp_path: Path) -> None:
    """B skips the WORKING status, names its artifact otherwise and costs more credits."""

    def answer(name: str, credits: float, working: bool) -> list[dict[str, Any]]:
        t, c = str(uuid.uuid4()), str(uuid.uuid4())
        deltas = streamed(t, c, str(uuid.uuid4()), TOKENS)
        for frame in deltas:
            frame["artifactUpdate"]["artifact"]["name"] = name
        frames = [task(t, c), *([status(t, c, "TASK_STATE_WORKING")] if working else []), *deltas]
        frames.append(status(t, c, "TASK_STATE_COMPLETED", usage={**USAGE, "credits": credits}))
        return sse_exchange("/message:stream", message("What does J45.909 mean?"), frames, f"{uuid.uuid4()}-")

    a = cassette(tmp_path / "a.jsonl", answer("answer", 1.2, working=True))
    b = cassette(tmp_path / "b.jsonl", answer("reply", 1.5, working=False))
    result = diff(a, b, "--time-tolerance", "20ms")  # one event fewer: 10 ms sooner done
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "POST /message:stream (a2a SendStreamingMessage)  a.jsonl:2 ~ b.jsonl:2",
        "  kinds:",
        "    A: task statusUpdate artifactUpdate*6 statusUpdate",
        "    B: task artifactUpdate*6 statusUpdate",
        "  artifacts: answer -> reply",
        "  usage.credits: 1.2 -> 1.5",
        "",
        "1 pair, 1 differs, 0 only in A, 0 only in B",
    ]
    _, doc = diff_json(a, b, "--time-tolerance", "20ms")
    kinds, artifacts, credits = doc["pairs"][0]["differences"]
    assert kinds["a"] == [["task", 1], ["statusUpdate", 1], ["artifactUpdate", 6], ["statusUpdate", 1]]
    assert (artifacts["a"], artifacts["b"]) == (["answer"], ["reply"])
    assert (credits["field"], credits["a"], credits["b"]) == ("credits", 1.2, 1.5)


def test_a_number_past_a_floats_range_is_valid_json(tmp_path: Path) -> None:
    """Credits of 1e999 and -1e999 in B (read as infinities) were printed bare, as Infinity
    and -Infinity, which no JSON parser takes: they are strings now."""

    def answer(credits: str, spent: str) -> list[dict[str, Any]]:
        t, c = str(uuid.uuid4()), str(uuid.uuid4())
        usage = {**USAGE, "credits": 1.5, "spent": [0.5]}
        frames = [task(t, c), status(t, c, "TASK_STATE_COMPLETED", usage=usage)]
        lines = sse_exchange("/message:stream", message("What does J45.909 mean?"), frames, f"{t}-")
        for line in lines:  # (written as a recording holds them, not as Python writes infinity)
            if "chunk" in line:
                text = line["chunk"]["text"].replace('"credits":1.5', f'"credits":{credits}')
                line["chunk"]["text"] = text.replace('"spent":[0.5]', f'"spent":[{spent}]')
        return lines

    a = cassette(tmp_path / "a.jsonl", answer("1.5", "0.5"))
    b = cassette(tmp_path / "b.jsonl", answer("1e999", "-1e999"))
    result = diff(a, b, "--json")
    assert result.exit_code == 1, result.output
    strict = json.loads(result.stdout, parse_constant=lambda word: pytest.fail(f"{word} is no JSON"))
    (pair,) = strict["pairs"]
    usage = {d["field"]: (d["a"], d["b"]) for d in pair["differences"] if d["aspect"] == "usage"}
    assert usage == {"credits": (1.5, "Infinity"), "spent": ([0.5], ["-Infinity"])}


def polled_path(lines: list[dict[str, Any]]) -> str:
    return next(
        line["exchange"]["request"]["path"]
        for line in lines
        if "exchange" in line and line["exchange"]["request"]["method"] == "GET"
    )


def test_exchanges_in_one_recording_alone_are_listed(tmp_path: Path) -> None:
    a_lines = session(TOKENS, ["TASK_STATE_INPUT_REQUIRED"])
    a = cassette(tmp_path / "a.jsonl", a_lines)
    # B answers another question (so its task's ids are never learned), and never asks on JSON-RPC.
    b_lines = session(TOKENS, ["TASK_STATE_INPUT_REQUIRED"])
    b_lines[0]["exchange"]["request"]["body"] = json.dumps(message("What does J45.901 mean?"))
    rpc = next(i for i, line in enumerate(b_lines) if "jsonrpc" in json.dumps(line))
    del b_lines[rpc : rpc + 3]  # its exchange, its one chunk, its end
    b = cassette(tmp_path / "b.jsonl", b_lines)
    result = diff(a, b)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "only in A: POST /message:stream (a2a SendStreamingMessage)  a.jsonl:2",
        f"only in A: GET {polled_path(a_lines)} (a2a GetTask)  a.jsonl:13",
        "only in A: POST /jsonrpc (a2a GetTask)  a.jsonl:20",
        "only in A: POST /message:stream (a2a SendStreamingMessage)  a.jsonl:23",
        "only in B: POST /message:stream (a2a SendStreamingMessage)  b.jsonl:2",
        f"only in B: GET {polled_path(b_lines)} (a2a GetTask)  b.jsonl:13",
        "only in B: POST /message:stream (a2a SendStreamingMessage)  b.jsonl:20",
        "",
        "1 pair, 0 differ, 4 only in A, 3 only in B",
    ]
    _, doc = diff_json(a, b)
    assert doc["summary"] == {"pairs": 1, "differ": 0, "only_in_a": 4, "only_in_b": 3}
    assert doc["only_in_b"][0] == {
        "request": "POST /message:stream",
        "protocol": "a2a",
        "operation": "SendStreamingMessage",
        "exchanges": ["b.jsonl:2"],
    }


def test_requests_are_listed_without_a_credential_s_query_value(tmp_path: Path) -> None:
    """The requests of the pairs and of exchanges in one recording alone were printed with
    their query as recorded (a cassette written by hand with ?key=...), in text and JSON; a
    replay's miss hides those values, and the names either recording holds redacted."""

    def asked(path: str, query: str, status: int) -> list[dict[str, Any]]:
        lines = json_exchange("GET", path, None, {"ok": True})
        lines[0]["exchange"]["request"]["query"] = query
        lines[0]["exchange"]["response"]["status"] = status
        return lines

    a = cassette(
        tmp_path / "a.jsonl",
        [*asked("/items", "key=sk-live-8&page=1", 200), *asked("/poll", "sess=sk-live-9", 200)],
    )
    b = cassette(
        tmp_path / "b.jsonl",
        [*asked("/other", "token=sk-live-10", 200), *asked("/poll", "sess=[REDACTED]", 503)],
    )
    result = diff(a, b)
    assert result.exit_code == 1 and "sk-live" not in result.output
    lines = result.output.splitlines()
    assert lines[0] == "GET /poll?sess=[REDACTED]  a.jsonl:5 ~ b.jsonl:5"
    assert lines[-4:-2] == [
        "only in A: GET /items?key=[REDACTED]&page=1  a.jsonl:2",
        "only in B: GET /other?token=[REDACTED]  b.jsonl:2",
    ]
    _, doc = diff_json(a, b)
    assert "sk-live" not in json.dumps(doc)
    assert [side["request"] for side in (doc["pairs"][0]["a"], doc["only_in_a"][0], doc["only_in_b"][0])] == [
        "GET /poll?sess=[REDACTED]",
        "GET /items?key=[REDACTED]&page=1",
        "GET /other?token=[REDACTED]",
    ]


def test_recorded_text_is_printed_with_its_control_characters_escaped(tmp_path: Path) -> None:
    """An answer is the agent's text: in a diff line, its ESC, BEL or NUL would set the
    terminal's title or clear it (color=True: printed as to a terminal)."""
    a = cassette(tmp_path / "a.jsonl", session(TOKENS, ["TASK_STATE_INPUT_REQUIRED"]))
    b = cassette(tmp_path / "b.jsonl", session([*TOKENS, "PWN"], ["TASK_STATE_INPUT_REQUIRED"]))
    # (as JSON escapes in the stream's frames: raw, they would be no JSON)
    b.write_text(b.read_text().replace("PWN", r"\\u001b]0;TITLE\\u0007\\u001b[2J\\u0000"))
    result = CliRunner().invoke(main, ["diff", str(a), str(b)], color=True)
    assert result.exit_code == 1, result.output
    assert "    +J45.909 is mild intermittent asthma.\\x1b]0;TITLE\\x07\\x1b[2J\\x00" in result.output
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", result.output), result.output
    # A tab only moves along its line, and indents code (a Makefile's): shown as it is.
    b.write_text(b.read_text().replace(r"\\u001b]0;TITLE\\u0007\\u001b[2J\\u0000", r"\\tgo vet"))
    result = CliRunner().invoke(main, ["diff", str(a), str(b)], color=True)
    assert "    +J45.909 is mild intermittent asthma.\tgo vet" in result.output, result.output


def test_ignore_leaves_a_field_out_of_pairing(tmp_path: Path) -> None:
    a = cassette(tmp_path / "a.jsonl", session(TOKENS, ["TASK_STATE_INPUT_REQUIRED"]))
    b_lines = session(TOKENS, ["TASK_STATE_INPUT_REQUIRED"])
    asked = message("What does J45.909 mean?")
    asked["message"]["metadata"] = {"traceId": str(uuid.uuid4())}  # a client of B's traces its calls
    b_lines[0]["exchange"]["request"]["body"] = json.dumps(asked)
    b = cassette(tmp_path / "b.jsonl", b_lines)
    assert diff(a, b).exit_code == 1
    result = diff(a, b, "--ignore", "/message/metadata/traceId")
    assert (result.exit_code, result.output) == (0, "5 pairs, 0 differ, 0 only in A, 0 only in B\n")


# -- other protocols ------------------------------------------------------------------------


async def test_two_mcp_sessions_of_the_sdk_agree(record: RecordFactory, tmp_path: Path) -> None:
    _, first = await recorded_session(record, generation("mcp1"))
    _, second = await recorded_session(record, generation("mcp1"))
    result = diff(first, second, *LOOSE)
    assert result.exit_code == 0, result.output
    _, doc = diff_json(first, second, *LOOSE)
    assert doc["only_in_a"] == doc["only_in_b"] == [] and aspects(doc) == []
    assert {p["a"]["protocol"] for p in doc["pairs"]} == {"mcp"}
    assert "tools/call" in {p["a"]["operation"] for p in doc["pairs"]}

    def other_sum(request: dict[str, Any], chunk: dict[str, Any]) -> bool:
        # The add tool's answer to 2 + 3, as a client reads it.
        if '"add"' not in request.get("body", "") or '"text":"5"' not in chunk["text"]:
            return False
        chunk["text"] = chunk["text"].replace('"text":"5"', '"text":"6"')
        return True

    cassette_ = export(second, tmp_path / "second.jsonl")
    copy = edited(cassette_, tmp_path / "edited.jsonl", other_sum)
    result = diff(cassette_, copy)
    assert result.exit_code == 1
    head, *lines = result.output.splitlines()
    assert re.fullmatch(r"POST /mcp \(mcp tools/call\)  second\.jsonl:\d+ ~ edited\.jsonl:\d+", head)
    assert lines[-1].endswith(" pairs, 1 differs, 0 only in A, 0 only in B")
    assert lines[:-2] == ["  answer:", "    --- A", "    +++ B", "    @@ -1 +1 @@", "    -5", "    +6"]


async def test_llm_streams_differ_in_their_answer_not_in_how_many_deltas(record: RecordFactory) -> None:
    text = ("The ", "tape ", "keeps ", "every ", "token.")
    recorded = []
    for pieces in (text, ("The tape keeps ", "every token."), (*text[:-1], "byte.")):
        rec = await record(openai_app(pieces, delay=0.005))
        await chat(rec.url)
        rec_anthropic = await record(anthropic_app(pieces, delay=0.005))
        await messages(rec_anthropic.url)
        for r in (rec, rec_anthropic):
            (await r.log()).close()
        recorded.append((rec.db, rec_anthropic.db))
    (chat_a, messages_a), (chat_b, messages_b), (chat_c, messages_c) = recorded

    # Fewer deltas of the same text: the token counts say so, the answer does not differ.
    for a, b in ((chat_a, chat_b), (messages_a, messages_b)):
        code, doc = diff_json(a, b, *LOOSE)
        (pair,) = doc["pairs"]
        assert code == 1 and [d["aspect"] for d in pair["differences"]] == ["usage"] * len(
            pair["differences"]
        )
        assert {d["field"] for d in pair["differences"]} <= {"output_tokens", "total_tokens"}

    result = diff(chat_a, chat_c, *LOOSE)
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "POST /v1/chat/completions (openai chat.completions)  log0.db exchange 1 ~ log4.db exchange 1",
        "  answer:",
        "    --- A",
        "    +++ B",
        "    @@ -1 +1 @@",
        "    -The tape keeps every token.",
        "    +The tape keeps every byte.",
        "",
        "1 pair, 1 differs, 0 only in A, 0 only in B",
    ]
    code, doc = diff_json(messages_a, messages_c, *LOOSE)
    assert aspects(doc) == [["answer"]] and doc["pairs"][0]["a"]["protocol"] == "anthropic"


def thinking_chat(answer: str, rest: str) -> list[dict[str, Any]]:
    """A chat stream as vLLM's reasoning parsers send it: the thinking, then a delta that
    ends it and starts the answer, then the rest of the answer."""

    def chunk(delta: dict[str, str], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return json.dumps({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]})

    events = [
        chunk({"reasoning_content": "Let me think"}),
        chunk({"reasoning_content": " hard.", "content": answer}),
        chunk({"content": rest}, "stop"),
        "[DONE]",
    ]
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "2+2?"}]}
    request = {"method": "POST", "path": "/v1/chat/completions", "body": json.dumps(body)}
    request["headers"] = [["Content-Type", "application/json"]]
    head = {"status": 200, "headers": [["Content-Type", "text/event-stream"]], "ttfb_ms": 2}
    lines: list[dict[str, Any]] = [{"exchange": {"request": request, "response": head}}]
    for n, data in enumerate(events, 1):
        lines.append({"chunk": {"offset_ms": 10 * n, "text": f"data: {data}\n\n"}})
    return [*lines, {"end": {"duration_ms": 10 * len(events) + 5}}]


def test_llm_streams_whose_thinking_meets_the_answer_differ_in_their_answer_alone(tmp_path: Path) -> None:
    """A delta that carries the end of the thinking and the start of the answer adds only
    its answer to the deltas: they join into the answer on both sides, so only it differs."""
    a = cassette(tmp_path / "a.jsonl", thinking_chat("The answer", " is 4."))
    b = cassette(tmp_path / "b.jsonl", thinking_chat("The answer", " is 5."))
    code, doc = diff_json(a, b)
    assert code == 1 and aspects(doc) == [["answer"]], doc
    (difference,) = doc["pairs"][0]["differences"]
    assert (difference["a"], difference["b"]) == ("The answer is 4.", "The answer is 5.")


async def test_tool_calls_differ_in_name_and_arguments_not_in_their_ids(record: RecordFactory) -> None:
    """The calls' ids are made up on every run; what the model called, with what, is compared."""
    logs = []
    for arguments in ({"city": "Zürich"}, {"city": "Zürich"}, {"city": "Paris"}):
        for app, ask in ((openai_app, chat_calls), (anthropic_app, messages_calls)):
            rec = await record(app(delay=0, arguments=arguments))
            await ask(rec.url, True)
            (await rec.log()).close()
            logs.append(rec.db)
    chat_a, messages_a, chat_b, messages_b, chat_c, messages_c = logs
    for a, b in ((chat_a, chat_b), (messages_a, messages_b)):
        assert diff(a, b, *LOOSE).exit_code == 0
    result = diff(chat_a, chat_c, *LOOSE)
    assert result.exit_code == 1
    assert result.output.splitlines()[1:3] == [
        '  tool_calls: get_weather({"city":"Zürich"}), get_time({"city":"Zürich"})'
        ' -> get_weather({"city":"Paris"}), get_time({"city":"Paris"})',
        "",
    ]
    code, doc = diff_json(messages_a, messages_c, *LOOSE)
    assert code == 1 and aspects(doc) == [["tool_calls"]]
    assert doc["pairs"][0]["differences"][0]["b"] == [
        'get_weather({"city":"Paris"})',
        'get_time({"city":"Paris"})',
    ]
    # Integers past 64 bits compared, and shown, as they were sent.
    big = []
    for account in (123456789012345678901234567890, 123456789012345678901234567899):
        rec = await record(openai_app(delay=0, arguments={"account": account}))
        await chat_calls(rec.url, True)
        (await rec.log()).close()
        big.append(rec.db)
    code, doc = diff_json(*big, *LOOSE)
    assert code == 1 and doc["pairs"][0]["differences"][0]["b"][0] == (
        'get_weather({"account":123456789012345678901234567899})'
    )


# -- what it refuses ------------------------------------------------------------------------


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    good = cassette(tmp_path / "good.jsonl", session(TOKENS, ["TASK_STATE_INPUT_REQUIRED"]))
    (tmp_path / "junk.jsonl").write_text("not a cassette\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.db").write_bytes(b"SQLite format 3\x00" + b"\x01" * 200)
    cases = {
        (
            str(tmp_path / "missing.db"),
            str(good),
        ): r"Invalid value for 'A': Path '.*missing\.db' does not exist\.",
        (str(good), str(tmp_path / "junk.jsonl")): r"Invalid value for B: .*junk\.jsonl:1: not JSON: .*",
        (
            str(good),
            str(tmp_path / "empty"),
        ): r"Invalid value for B: .*empty: a folder without cassettes \(\*\.jsonl, in it or its subfolders\)",
        (str(good), str(good), "--time-tolerance", "fast"): (
            r"Invalid value for --time-tolerance: 'fast' is neither a percentage \(20%\)"
            r" nor a duration \(50ms, 0\.5s\)"
        ),
        (
            str(good),
            str(good),
            "--time-tolerance",
            "20",
        ): r"Invalid value for --time-tolerance: '20' is neither .*",
        (str(good), str(good), "--ignore", "message"): r"Invalid value for '--ignore': not a JSON pointer .*",
        (str(tmp_path / "broken.db"), str(good)): (
            r"Invalid value for A: cannot open .*broken\.db as an event log: file is not a database"
            r" \(the log is damaged\)"
        ),
        (str(good),): r"Missing argument 'B'\.",
    }
    for args, error in cases.items():
        result = diff(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        assert re.fullmatch(rf"Error: {error}", result.stderr.splitlines()[-1]), result.stderr


def test_tolerances_are_read_as_given() -> None:
    from tasktape.replay.diff import Tolerance  # noqa: PLC0415

    assert Tolerance.parse([]) == Tolerance(50.0, 10.0)
    assert Tolerance.parse(["20%"]) == Tolerance(20.0, 10.0)
    assert Tolerance.parse(["0.5s", "5%", "25ms"]) == Tolerance(5.0, 25.0)
    tolerance = Tolerance(20.0, 10.0)
    ms = 1_000_000
    assert tolerance.within(100 * ms, 119 * ms) and not tolerance.within(100 * ms, 121 * ms)
    assert tolerance.within(1 * ms, 9 * ms)  # within 10 ms: noise on a loaded machine
    assert not tolerance.within(None, 5 * ms) and tolerance.within(None, None)


def test_the_protocols_say_what_an_event_adds_and_names() -> None:
    from tasktape.eventlog.classify import Classification, classify  # noqa: PLC0415
    from tasktape.eventlog.protocols import by_name  # noqa: PLC0415
    from tasktape.eventlog.protocols.base import Protocol  # noqa: PLC0415
    from tasktape.eventlog.protocols.guard import Guarded  # noqa: PLC0415

    a2a = by_name("a2a")
    assert a2a is not None
    named = {
        "taskId": "t",
        "contextId": "c",
        "artifact": {"artifactId": "x", "name": "answer", "parts": [{"text": "Hi"}]},
    }
    for data in (
        json.dumps({"artifactUpdate": named}),
        json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"artifactUpdate": named}}),
        json.dumps({"jsonrpc": "2.0", "id": 1, "result": {**named, "kind": "artifact-update"}}),  # A2A 0.3
    ):
        c = classify(data)
        assert (list(a2a.artifact_names(data, c)), a2a.delta(c)) == (["answer"], "Hi"), data
    consolidated = json.dumps({"artifactUpdate": {**named, "lastChunk": True}})
    assert a2a.delta(classify(consolidated)) is None  # it restates the deltas
    polled = json.dumps(
        {"id": "t", "status": {"state": "TASK_STATE_COMPLETED"}, "artifacts": [named["artifact"]]}
    )
    assert list(a2a.artifact_names(polled, classify(polled, bare_task=True))) == ["answer"]

    class Broken(Protocol):
        name = "broken"
        kinds = type(a2a).kinds

        def artifact_names(self, data: str, c: Classification) -> list[str]:
            raise RuntimeError("boom")

    guarded = Guarded(Broken())
    c = Classification("other", text="said")
    assert (guarded.artifact_names("{}", c), guarded.delta(c), guarded.server_ids) == (
        (),
        "said",
        frozenset(),
    )
