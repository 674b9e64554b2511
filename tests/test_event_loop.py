"""The event loop `tasktape record` forwards on: uvloop where it is installed, plain asyncio
when asked, and a clear error for a loop it cannot run."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
import click
import pytest
from a2a_frames import completed_run, sse
from click.testing import CliRunner
from loopback import finished, running, serve, stop, upstream_app

from tasktape import event_loop
from tasktape.cli import main
from tasktape.eventlog import EventLog

FRAMES = sse(completed_run(), ids="e")  # what upstream_app() streams


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def run_on(choice: str) -> str:
    with asyncio.Runner(loop_factory=event_loop.loop_factory(choice)) as runner:
        return runner.run(loop_module())


def test_auto_is_uvloop_where_installed_and_asyncio_when_asked() -> None:
    assert run_on("auto") == run_on("uvloop") == "uvloop"
    assert run_on("asyncio").startswith("asyncio")


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an interpreter without it sees
    assert run_on("auto").startswith("asyncio")
    db = tmp_path / "captures.db"
    args = ["record", "--upstream", "http://x", "--db", str(db), "--event-loop", "uvloop"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--event-loop: uvloop is not installed (python -m pip install uvloop)" in result.output
    assert not db.exists()  # refused before the log was opened
    with pytest.raises(click.BadParameter, match="'trio' is not one of auto, uvloop, asyncio"):
        event_loop.loop_factory("trio")


@pytest.mark.parametrize(("how", "uvloop"), [("default", True), ("option", False), ("environment", False)])
async def test_record_forwards_and_records_alike_on_either_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, uvloop: bool
) -> None:
    db = tmp_path / "captures.db"
    args = ["--event-loop", "asyncio"] if how == "option" else []
    if how == "environment":
        monkeypatch.setenv(event_loop.ENVVAR, "asyncio")
    async with (
        serve(upstream_app()) as upstream,
        running(
            "record", "--listen", "127.0.0.1:0", "--upstream", upstream, "--db", str(db), "--quiet", *args
        ) as run,
    ):
        # Which loop the recorder runs on: uvloop's extension is mapped only when it runs it.
        assert ("uvloop" in Path(f"/proc/{run.proc.pid}/maps").read_text()) is uvloop
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{run.url}/message:stream", json={}) as response,
        ):
            assert await response.read() == b"".join(FRAMES)
        assert await stop(run) == 0
    with EventLog(db) as log:
        (exchange,) = log.exchanges()
        assert exchange["outcome"] == "complete"
        assert b"".join(c["data"] for c in log.chunks(exchange["id"])) == b"".join(FRAMES)


async def test_a_mistyped_loop_is_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.ENVVAR, "uvlop")
    status, err = await finished("record", "--upstream", "http://x", "--db", str(tmp_path / "x.db"))
    assert status == 2
    assert "Invalid value for '--event-loop' (env var: 'TASKTAPE_EVENT_LOOP'): 'uvlop' is not one of" in err
