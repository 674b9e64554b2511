"""Every sample cassette replays, and shows what cassettes/README.md says it shows."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from sdk_client import stream_message

from tasktape.a2a_client import A2AClient
from tasktape.eventlog import classify
from tasktape.eventlog.cassette import read_cassette
from tasktape.replay import ReplayServer, load

CASSETTES = Path(__file__).resolve().parent.parent / "cassettes"
Replay = Callable[[str], Awaitable[str]]


@pytest.fixture
async def replay() -> AsyncIterator[Replay]:
    servers: list[TestServer] = []

    async def start(name: str) -> str:
        server = TestServer(ReplayServer(load([CASSETTES / name]), speed=0).app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in servers:
        await server.close()


def states(events: list[dict[str, Any]]) -> list[str]:
    return [s for e in events if (s := next(iter(e.values())).get("status", {}).get("state"))]


def test_every_cassette_is_described_and_tested() -> None:
    readme = (CASSETTES / "README.md").read_text()
    names = sorted(p.name for p in CASSETTES.glob("*.jsonl"))
    assert len(names) == 10 and all(f"`{name}`" in readme for name in names)
    source = Path(__file__).read_text()
    assert all(f'"{name}"' in source for name in names)


@pytest.mark.parametrize(
    ("name", "binding", "text", "ending"),
    [
        ("completed.jsonl", "rest", "What does J45.909 mean?", "TASK_STATE_COMPLETED"),
        ("completed_jsonrpc.jsonl", "jsonrpc", "What does J45.909 mean?", "TASK_STATE_COMPLETED"),
        ("auth_required.jsonl", "jsonrpc", "Open my records (auth needed)", "TASK_STATE_AUTH_REQUIRED"),
        ("failed.jsonl", "rest", "This will fail", "TASK_STATE_FAILED"),
        ("rejected.jsonl", "jsonrpc", "Reject this, please", "TASK_STATE_REJECTED"),
        ("long_stream.jsonl", "rest", "A long answer, please", "TASK_STATE_COMPLETED"),
    ],
)
async def test_streams_replay_to_their_end(
    replay: Replay, name: str, binding: str, text: str, ending: str
) -> None:
    url = await replay(name)
    # The official SDK client, as a user's code would run it.
    events = await stream_message(url, text, binding)
    assert states(events)[-1] == ending
    if name == "long_stream.jsonl":
        assert sum("artifactUpdate" in e for e in events) > 400
    if name.startswith("completed"):
        closing = [e["artifactUpdate"] for e in events if e.get("artifactUpdate", {}).get("lastChunk")]
        assert [c["artifact"].get("metadata", {}).get("type") for c in closing] == [
            "intermediate-thinking",
            None,
        ]
        assert "citations" in closing[-1]["artifact"]["parts"][0]["metadata"]
        assert "$usage" in events[-1]["statusUpdate"]["metadata"]


async def test_input_required_then_resumed(replay: Replay) -> None:
    url = await replay("input_required.jsonl")
    first = await stream_message(url, "What input do you need?", "rest")
    assert states(first)[-1] == "TASK_STATE_INPUT_REQUIRED"
    second = await stream_message(url, "Record 42", "rest", task_id=first[0]["task"]["id"])
    assert states(second)[-1] == "TASK_STATE_COMPLETED"


async def test_canceled(replay: Replay) -> None:
    import aiohttp  # noqa: PLC0415

    url = await replay("canceled.jsonl")
    async with aiohttp.ClientSession() as session:
        client = await A2AClient.connect(session, url, "rest")
        result = await client.stream("Cancel me halfway")
        assert result.final_state == "TASK_STATE_CANCELED"
        assert (await client.cancel(result.task_id or ""))["status"]["state"] == "TASK_STATE_CANCELED"


async def test_dropped_connection(replay: Replay) -> None:
    import aiohttp  # noqa: PLC0415

    url = await replay("dropped_connection.jsonl")
    async with aiohttp.ClientSession() as session:
        result = await (await A2AClient.connect(session, url, "rest")).stream("Drop the line mid-answer")
    assert (
        result.error and "ClientPayloadError" in result.error and result.final_state == "TASK_STATE_WORKING"
    )
    (_, stream) = read_cassette(CASSETTES / "dropped_connection.jsonl")
    assert stream.outcome == "upstream_disconnected" and result.raw == stream.body


async def test_the_official_sdk_server(replay: Replay) -> None:
    (_, stream) = read_cassette(CASSETTES / "sdk_echo.jsonl")
    assert b"\r\n\r\n" in stream.body and b"id:" not in stream.body
    url = await replay("sdk_echo.jsonl")
    events = await stream_message(url, "hello", "rest")
    deltas = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    assert deltas[-1]["artifact"]["parts"][0]["text"] == "Echo: hello -- done."
    assert classify(stream.body.split(b"\r\n\r\n")[0].decode().removeprefix("data: ")).kind == "task"
