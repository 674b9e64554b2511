"""Record the sample cassettes again, from the built-in demo agent and the official
a2a-sdk echo agent (needs the test extras): ``python cassettes/rerecord.py``."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

from tasktape.a2a_client import A2AClient  # noqa: E402
from tasktape.agent import create_agent_app  # noqa: E402
from tasktape.eventlog import EventLog, LogWriter  # noqa: E402 - after the path is set
from tasktape.eventlog.cassette import write_cassette  # noqa: E402
from tasktape.eventlog.recorded import from_log  # noqa: E402
from tasktape.proxy import RecordingProxy  # noqa: E402
from tasktape.serving import start_site  # noqa: E402

PACE = 0.1  # the demo agent's delays, scaled: realistic shapes, short cassettes

Drive = Callable[[aiohttp.ClientSession, str], Awaitable[str]]


async def stream(session: aiohttp.ClientSession, url: str, binding: str, text: str) -> str:
    client = await A2AClient.connect(session, url, binding)
    return (await client.stream(text)).task_id or ""


async def resumed(session: aiohttp.ClientSession, url: str) -> str:
    client = await A2AClient.connect(session, url, "rest")
    task = (await client.stream("What input do you need?")).task_id
    await client.stream("Record 42", task_id=task)
    return task or ""


async def canceled(session: aiohttp.ClientSession, url: str) -> str:
    client = await A2AClient.connect(session, url, "rest")
    answering: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_event(frame: dict[str, Any]) -> None:
        update = frame.get("artifactUpdate", {})
        if update.get("artifact", {}).get("name") == "answer" and not answering.done():
            answering.set_result(update["taskId"])

    streaming = asyncio.create_task(client.stream("Cancel me halfway", on_event=on_event))
    task = await answering
    await client.cancel(task)
    await streaming
    return task


SAMPLES: dict[str, Drive] = {
    "completed": lambda s, u: stream(s, u, "rest", "What does J45.909 mean?"),
    "completed_jsonrpc": lambda s, u: stream(s, u, "jsonrpc", "What does J45.909 mean?"),
    "input_required": resumed,
    "auth_required": lambda s, u: stream(s, u, "jsonrpc", "Open my records (auth needed)"),
    "failed": lambda s, u: stream(s, u, "rest", "This will fail"),
    "rejected": lambda s, u: stream(s, u, "jsonrpc", "Reject this, please"),
    "canceled": canceled,
    "long_stream": lambda s, u: stream(s, u, "rest", "A long answer, please"),
    "dropped_connection": lambda s, u: stream(s, u, "rest", "Drop the line mid-answer"),
}


async def record(upstream: str, db: Path, drive: Callable[[str], Awaitable[str]]) -> list[str]:
    """Run ``drive`` through a recording proxy; the task ids it reports."""
    with LogWriter(db) as writer:
        proxy = RecordingProxy(upstream, writer)
        runner, url = await start_site(proxy.app, "127.0.0.1", 0)
        try:
            return [await drive(url)]
        finally:
            await runner.cleanup()


def export(db: Path, task: str, name: str) -> None:
    with EventLog(db) as log:
        recorded = from_log(log, log.select(tasks=[task]))
    write_cassette(HERE / f"{name}.jsonl", recorded, source="cassettes/rerecord.py")
    print(f"cassettes/{name}.jsonl: {len(recorded)} exchanges")


async def main() -> None:
    from sdk_agent import run_sdk_agent  # noqa: PLC0415 - the test extras
    from sdk_client import stream_message  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        runner, agent = await start_site(create_agent_app(pace=PACE), "127.0.0.1", 0)
        try:
            for name, drive in SAMPLES.items():
                async with aiohttp.ClientSession() as session:
                    db = Path(tmp) / f"{name}.db"
                    (task,) = await record(agent, db, lambda url, d=drive, s=session: d(s, url))
                export(db, task, name)
        finally:
            await runner.cleanup()
        with run_sdk_agent() as sdk:
            db = Path(tmp) / "sdk.db"

            async def sdk_stream(url: str) -> str:
                events = await stream_message(url, "hello", "rest")
                return events[0]["task"]["id"]

            (task,) = await record(sdk.url, db, sdk_stream)
            export(db, task, "sdk_echo")


if __name__ == "__main__":
    asyncio.run(main())
