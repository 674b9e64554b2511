"""How `tasktape diff` pairs two recordings' exchanges: found by the keys of their requests
rather than by comparing every request of one with every request of the other, it pairs
exactly as comparing them one by one does: the same pairs, whatever makes two requests
match (fields the protocol's clients make up, fields at their default, numbers written
two ways, redacted values, ignored pointers, the query's order)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tasktape.eventlog.recorded import Recorded
from tasktape.replay.diff import Tolerance, diff_recordings, read
from tasktape.replay.matching import MatchRules
from tasktape.replay.pairing import Run, pair, runs, same_request

A2A = "/message:stream"
CHAT = "/v1/chat/completions"
MCP = "/mcp"


def a2a(rng: random.Random) -> dict[str, Any]:
    """An A2A SendStreamingMessage: its messageId made up afresh, its configuration sent
    or left out (protobuf JSON: the same), a history length of 0 or none."""
    body: dict[str, Any] = {
        "message": {
            "messageId": f"m-{rng.random()}",
            "role": "ROLE_USER",
            "parts": [{"text": rng.choice(["hi", "hello", "bye"])}],
        }
    }
    body["configuration"] = rng.choice([{}, {"historyLength": 0}, {"historyLength": 2}, None, "absent"])
    if body["configuration"] == "absent":
        del body["configuration"]
    return body


def chat(rng: random.Random) -> dict[str, Any]:
    """An OpenAI chat completion: temperatures written 1 or 1.0, a key redacted or not."""
    body: dict[str, Any] = {
        "model": "gpt-x",
        "stream": True,
        "messages": [{"role": "user", "content": rng.choice(["q1", "q2", "q3"])}],
        "temperature": rng.choice([1, 1.0, 0, 0.5]),
    }
    if rng.random() < 0.2:
        body["user"] = rng.choice(["[REDACTED]", "alice"])
    if rng.random() < 0.3:
        body["metadata"] = rng.choice([{}, {"trace": "x"}])
    return body


def mcp(rng: random.Random) -> dict[str, Any]:
    """An MCP tools/call: its JSON-RPC id and progress token differ from run to run."""
    params: dict[str, Any] = {
        "name": rng.choice(["add", "echo"]),
        "arguments": {"a": rng.choice([1, 2, 2.0])},
    }
    if rng.random() < 0.5:
        params["_meta"] = {"progressToken": rng.randrange(100)}
    return {"jsonrpc": "2.0", "id": rng.randrange(100), "method": "tools/call", "params": params}


SHAPES = {A2A: a2a, CHAT: chat, MCP: mcp}


def recording(rng: random.Random, n: int) -> list[Recorded]:
    out = []
    for _ in range(n):
        path = rng.choice(list(SHAPES))
        query = rng.choice([None, "a=1&b=2", "b=2&a=1", "a=[REDACTED]&b=2", "a=2&a=1"])
        out.append(
            Recorded(
                "POST",
                path,
                query,
                [("Content-Type", "application/json"), ("A2A-Version", "1.0")] if path == A2A else [],
                json.dumps(SHAPES[path](rng)).encode(),
                status=200,
            )
        )
    return out


def one_by_one(a: list[Run], b: list[Run], rules: MatchRules) -> list[tuple[int, int]]:
    """Each run of A with the first unpaired run of B whose request matches: every pair of
    requests compared (ids are not made up here, so none are translated)."""
    free = list(b)
    pairs = []
    for run in a:
        match = next((c for c in free if same_request(run.first.recorded, c.first.recorded, rules)), None)
        if match is not None:
            free.remove(match)
            pairs.append((a.index(run), b.index(match)))
    return pairs


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ignore", [(), ("/messages/0/content",)], ids=["as-recorded", "ignoring"])
def test_pairs_are_those_comparing_every_request_finds(seed: int, ignore: tuple[str, ...]) -> None:
    rng = random.Random(seed)
    rules = MatchRules.of(ignore)
    a = runs([read(r) for r in recording(rng, 60)], rules)
    b = runs([read(r) for r in recording(rng, 60)], rules)
    expected = one_by_one(a, b, rules)
    found = pair(a, b, rules)
    assert [(a.index(x), b.index(y)) for x, y in found.pairs] == expected
    assert len(expected) > 10  # (the recordings share requests enough to tell)
    assert len(found.only_a) == len(a) - len(expected)


def test_requests_alike_only_under_the_other_side_s_protocol_still_pair() -> None:
    """A request no protocol claims (sent without the A2A-Version header) matches a
    recorded A2A request under A2A's rules (its messageId made up afresh), as comparing
    them does, either way round."""
    sent = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    again = {"message": {"messageId": "m-2", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    claimed = Recorded("POST", "/x", None, [("A2A-Version", "1.0")], json.dumps(sent).encode(), status=200)
    unclaimed = Recorded("POST", "/x", None, [], json.dumps(again).encode(), status=200)
    rules = MatchRules()
    a, b = runs([read(unclaimed)], rules), runs([read(claimed)], rules)
    assert (a[0].first.protocol, b[0].first.protocol) == (None, "a2a")
    assert same_request(unclaimed, claimed, rules)
    assert len(pair(a, b, rules).pairs) == len(pair(b, a, rules).pairs) == 1


def mcp_stream(
    method: str,
    messages: list[dict[str, Any]],
    started_at: str,
    *,
    from_id: int = 0,
    last_id: str | None = None,
) -> Recorded:
    """An MCP session's stream, an event every 150 ms from its start: a tool call's POST,
    or (``last_id``) the GET resuming it; event ids as an event store numbers them."""
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "slow_count"}}
    headers = [("Mcp-Session-Id", "s1"), *([("Last-Event-ID", last_id)] if last_id else [])]
    chunks = [
        ((n + 1) * 150_000_000, f"id: ev{from_id + n}\ndata: {json.dumps(m)}\n\n".encode())
        for n, m in enumerate(messages)
    ]
    return Recorded(
        method,
        MCP,
        None,
        headers,
        json.dumps(call).encode() if last_id is None else None,
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=chunks,
        outcome="complete",
        started_at=started_at,
        duration_ns=len(messages) * 150_000_000,
    )


def test_a_stream_answered_on_the_get_that_resumed_it_is_one_answer() -> None:
    """The same tool call recorded whole, and with its stream closed by the server after
    the first progress and resumed with a GET: the same answer, nothing only in one."""
    progress = [
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 7, "progress": n}}
        for n in (1, 2, 3)
    ]
    answer = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "counted to 3"}]}}
    whole = [mcp_stream("POST", [*progress, answer], "2026-01-01T00:00:00Z")]
    resumed = [
        mcp_stream("POST", progress[:1], "2026-01-01T00:00:00Z"),
        mcp_stream("GET", [*progress[1:], answer], "2026-01-01T00:00:00.150Z", from_id=1, last_id="ev0"),
    ]
    report = diff_recordings(whole, resumed, Tolerance(), MatchRules())
    assert (report.only_a, report.only_b) == ([], [])
    (pair,) = report.pairs
    assert (pair.b.last.finish, pair.b.last.answer, pair.differences) == ("result", "counted to 3", [])
