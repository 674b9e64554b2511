"""``tasktape demo``: the main job in one command. The demo agent and the recording proxy
start on free loopback ports; a client drives every scenario through the proxy (streaming
and not, both bindings); then the log is read back and checked against what the client
received, byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import click

from tasktape.errors import LogError, UsageError
from tasktape.eventlog import EventLog, ProcessLogWriter, SSEDecoder
from tasktape.eventlog.a2a_terms import short_state
from tasktape.eventlog.outcomes import Outcome
from tasktape.eventlog.recorded import Recorded, from_log
from tasktape.eventlog.writer_lock import cannot_open
from tasktape.proxy import RecordingProxy
from tasktape.replay import ReplayServer

from .a2a_client import A2AClient, StreamResult
from .agent import create_agent_app
from .agent.tasks import check_pace
from .inspect_command import serve_inspector
from .listen import DEFAULT_INSPECT_PORT, answered_hosts
from .option_checks import bad_input, checked, refused_log
from .serving import start_site

# How long the client waits for one call (a whole stream), and so for the slowest scenario:
# the long token stream, 4.6 s at pace 1. At a pace beyond MAX_PACE it would outlast the
# wait, and every scenario fail after that long.
CALL_TIMEOUT = 300.0
SLOWEST_SCENARIO_S = 6.0
MAX_PACE = CALL_TIMEOUT / SLOWEST_SCENARIO_S
POLL_EVERY = 0.05  # seconds between GetTask polls at pace 1 (or faster)


def check_demo_pace(value: float) -> float:
    """``value`` as the demo's pace: the agent's (0, or a finite number above it), and at
    most ``MAX_PACE``, which the slowest scenario's stream takes ``CALL_TIMEOUT`` at."""
    pace = check_pace(value)
    if pace > MAX_PACE:
        raise UsageError(
            f"the demo's pace is at most {MAX_PACE:g}, not {value!r}: its slowest scenario would take "
            f"longer than the client waits for a call ({CALL_TIMEOUT:g} s)"
        )
    return pace


@dataclass
class Run:
    """One scenario as the client lived it."""

    name: str
    binding: str
    expected: str  # the final state the client must see
    streams: list[StreamResult] = field(default_factory=list)
    task_id: str | None = None
    final_state: str | None = None
    expect_cut: bool = False  # the stream is meant to break off
    streamed: bool = True  # False: answered without a stream, which the log must hold
    problems: list[str] = field(default_factory=list)


async def _stream(client: A2AClient, run: Run, text: str, **kw: Any) -> StreamResult:
    result = await client.stream(text, **kw)
    run.streams.append(result)
    run.task_id = run.task_id or result.task_id
    run.final_state = result.final_state or run.final_state
    return result


def scenarios(
    session: aiohttp.ClientSession, url: str, pace: float = 1.0
) -> list[tuple[Run, Callable[[], Awaitable[None]]]]:
    """The scenarios, each with the coroutine that drives it through the proxy at ``url``,
    to an agent at ``pace`` (a slower one is polled less often)."""
    plans: list[tuple[Run, Callable[[], Awaitable[None]]]] = []

    def plan(  # noqa: ANN202
        name: str, binding: str, expected: str, *, cut: bool = False, streamed: bool = True
    ):
        def add(drive: Callable[[A2AClient, Run], Awaitable[None]]) -> None:
            run = Run(name, binding, expected, expect_cut=cut, streamed=streamed)

            async def go() -> None:
                await drive(await A2AClient.connect(session, url, binding), run)

            plans.append((run, go))

        return add

    for name, binding, expected, text in [
        ("completed", "rest", "COMPLETED", "What does J45.909 mean?"),
        ("completed", "jsonrpc", "COMPLETED", "What does J45.909 mean?"),
        ("auth required", "jsonrpc", "AUTH_REQUIRED", "Open my records (auth needed)"),
        ("auth required (REST: FAILED)", "rest", "FAILED", "Open my records (auth needed)"),
        ("failed", "rest", "FAILED", "This will fail"),
        ("rejected", "jsonrpc", "REJECTED", "Reject this, please"),
        ("rejected (REST: FAILED)", "rest", "FAILED", "Reject this, please"),
        ("long token stream", "jsonrpc", "COMPLETED", "A long answer, please"),
    ]:

        @plan(name, binding, expected)
        async def _(client: A2AClient, run: Run, text: str = text) -> None:
            await _stream(client, run, text)

    @plan("completed, not streamed", "rest", "COMPLETED", streamed=False)
    async def _(client: A2AClient, run: Run) -> None:
        task = (await client.send("Summarise the last visit"))["task"]
        run.task_id, run.final_state = task["id"], task["status"]["state"]

    @plan("input required, then resumed", "rest", "COMPLETED")
    async def _(client: A2AClient, run: Run) -> None:
        first = await _stream(client, run, "What input do you need?")
        if first.final_state != "TASK_STATE_INPUT_REQUIRED":
            run.problems.append(f"the first stream ended {first.final_state}, not INPUT_REQUIRED")
        await _stream(client, run, "Record 42", task_id=run.task_id)

    @plan("canceled mid-stream", "rest", "CANCELED")
    async def _(client: A2AClient, run: Run) -> None:
        answering = asyncio.get_running_loop().create_future()

        def on_event(frame: dict[str, Any]) -> None:
            artifact = frame.get("artifactUpdate", {}).get("artifact", {})
            if artifact.get("name") == "answer" and not answering.done():
                answering.set_result(frame["artifactUpdate"]["taskId"])

        streaming = asyncio.create_task(_stream(client, run, "Cancel me halfway", on_event=on_event))
        try:
            # The stream may end (or fail) before the answer begins: then there is nothing to cancel.
            await asyncio.wait({answering, streaming}, return_when=asyncio.FIRST_COMPLETED)
            if not answering.done():
                await streaming  # (its failure, if it failed, is the client's)
                run.problems.append("the stream ended before the answer began")
                return
            await client.cancel(answering.result())
            await streaming
        finally:
            # However this ends, the stream's task is not left behind, its failure unread.
            streaming.cancel()
            await asyncio.gather(streaming, return_exceptions=True)

    @plan("dropped connection", "rest", "COMPLETED", cut=True)
    async def _(client: A2AClient, run: Run) -> None:
        await _stream(client, run, "Drop the line mid-answer")
        # The agent finishes the task anyway: ask for it once it is done, asking less often
        # as the agent is slower, for as long as a call may take.
        every = POLL_EVERY * max(pace, 1.0)
        for _ in range(int(CALL_TIMEOUT / every)):
            task = await client.get_task(run.task_id or "")
            if task["status"]["state"] != "TASK_STATE_WORKING":
                break
            await asyncio.sleep(every)
        run.final_state = task["status"]["state"]

    return plans


async def run_demo(db: Path, pace: float) -> tuple[list[Run], str, str]:
    """Start the agent and the recorder, drive every scenario, stop; return the runs and
    the two URLs."""
    # Each stopped, the last started first, however far it got (Ctrl-C may come at any await).
    async with contextlib.AsyncExitStack() as started:
        writer = ProcessLogWriter(db)
        started.push_async_callback(writer.aclose)
        # Both on loopback, answering loopback names only (as `tasktape agent` and `record` do).
        loopback = answered_hosts("127.0.0.1", ())
        agent = create_agent_app(pace=pace, allowed_hosts=loopback)
        agent_runner, agent_url = await start_site(agent, "127.0.0.1", 0)
        started.push_async_callback(agent_runner.cleanup)
        proxy = RecordingProxy(agent_url, writer, allowed_hosts=loopback)
        proxy_runner, proxy_url = await start_site(proxy.app, "127.0.0.1", 0)
        started.push_async_callback(proxy_runner.cleanup)
        timeout = aiohttp.ClientTimeout(total=CALL_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            plans = scenarios(session, proxy_url, pace)
            outcomes = await asyncio.gather(*(go() for _, go in plans), return_exceptions=True)
        runs = [run for run, _ in plans]
        for run, outcome in zip(runs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                said = f": {outcome}" if str(outcome) else ""
                run.problems.append(f"the client failed: {type(outcome).__name__}{said}")
        await asyncio.wait_for(proxy.wait_idle(), 30)
    return runs, agent_url, proxy_url


def check(runs: list[Run], log: EventLog) -> None:
    """Hold each run against the log: final states, byte-exact streams, outcomes."""
    exchanges = log.exchanges()
    for run in runs:
        if run.final_state != f"TASK_STATE_{run.expected}":
            run.problems.append(f"the client saw {run.final_state}, expected {run.expected}")
        mine = [x for x in exchanges if x["task_id"] == run.task_id and x["rpc_method"] != "GetTask"]
        streamed = [x for x in mine if x["is_sse"]]
        if len(streamed) != len(run.streams):
            run.problems.append(f"{len(run.streams)} streams sent, {len(streamed)} recorded")
        for result, x in zip(run.streams, streamed, strict=False):
            if log.body(x["id"]) != result.raw:
                run.problems.append(f"exchange {x['id']}: the log's bytes differ from what the client got")
            events = log.events(x["id"])
            complete = [e for e in events if e["complete"]]
            if len(complete) != len(result.events):
                run.problems.append(f"exchange {x['id']}: {len(complete)} events in the log")
            if run.expect_cut and len(events) != len(complete) + 1:
                run.problems.append(f"exchange {x['id']}: the cut-off last event is missing")
            expected = Outcome.UPSTREAM_DISCONNECTED if run.expect_cut else Outcome.COMPLETE
            if x["outcome"] != expected:
                run.problems.append(f"exchange {x['id']}: outcome {x['outcome']}, expected {expected}")
        if not run.streamed and not list(
            log.db.query("SELECT 1 FROM task_answers WHERE task_id = ?", [run.task_id])
        ):
            run.problems.append("the non-streamed answer is not in the log")


def report(runs: list[Run], log: EventLog) -> list[str]:
    summary = {r["task_id"]: r for r in log.db.query("SELECT * FROM task_summary")}
    rows = [
        ("scenario", "binding", "final state", "events", "first event", "duration", "credits", "recorded")
    ]
    for run in runs:
        s = summary.get(run.task_id or "", {})
        rows.append(
            (
                run.name,
                run.binding,
                short_state(run.final_state) or "-",
                str(s.get("events", "-")),
                f"{s['ttfe_ms']:.0f} ms" if s.get("ttfe_ms") is not None else "-",
                f"{s['duration_ms']:.0f} ms" if s.get("duration_ms") is not None else "-",
                f"{s['credits']:.2f}" if s.get("credits") is not None else "-",
                "ok" if not run.problems else "NO: " + "; ".join(run.problems),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]


@click.command()
@click.option(
    "--db",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to keep the log (default: a new tasktape-demo-<time>.db here).",
)
@click.option(
    "--pace",
    type=float,
    callback=checked(check_demo_pace),
    default=1.0,
    show_default=True,
    help=f"Scale the agent's think time and time per token (0: as fast as possible; at most {MAX_PACE:g}).",
)
@click.option(
    "--inspect",
    is_flag=True,
    help=f"Then browse the log with tasktape inspect (on port {DEFAULT_INSPECT_PORT}, or a free one "
    "if it is taken) until Ctrl-C.",
)
def demo(db: Path | None, pace: float, inspect: bool) -> None:
    """Record a realistic A2A session end to end, on loopback, check it, and replay it.

    Starts the built-in demo agent and the recording proxy, drives every scenario through
    the proxy as a client would (streaming and not, REST and JSON-RPC), then reads the
    log back: each stream must be in it byte for byte, with the events and final state
    the client saw. Then it replays one recorded stream at its recorded pace and reports
    its pacing error and byte equality. Exits 0 only if every scenario was recorded
    completely and the replay was byte-identical; 2 on bad input (--db a file that exists:
    the demo starts a new log; or in a folder that does not exist). With --inspect, it then
    serves the log in the inspector until Ctrl-C.
    """
    db = new_log(db)
    click.echo(f"tasktape demo: starting the demo agent and the recorder; the log goes to {db}")
    started = time.perf_counter()
    try:
        runs, agent_url, proxy_url = asyncio.run(run_demo(db, pace))
    except LogError as exc:
        raise refused_log(exc) from None
    # Read-write, so that closing it folds the WAL back into the file and tidies up.
    with EventLog(db, readonly=False) as log:
        check(runs, log)
        lines = report(runs, log)
        counts = {
            t: log.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("exchanges", "events")
        }
        recorded = from_log(log)
    click.echo(f"agent {agent_url}, recorder {proxy_url}, {time.perf_counter() - started:.1f} s\n")
    for line in lines:
        click.echo(line)
    failed = [run for run in runs if run.problems]
    click.echo("")
    if failed:
        click.secho(
            f"{len(failed)} of {len(runs)} scenarios were NOT recorded completely.", fg="red", err=True
        )
    else:
        click.echo(
            f"All {len(runs)} scenarios recorded completely: {counts['exchanges']} exchanges, "
            f"{counts['events']} events."
        )
    replayed = next((run for run in runs if run.name == "completed" and run.binding == "rest"), None)
    if replayed is not None and replayed.task_id and not replayed.problems:
        check_line, same = asyncio.run(replay_check(recorded, replayed.task_id))
        click.echo(check_line)
        if not same:
            failed.append(replayed)
    click.echo(f"\nThe log: {db.resolve()}\n\nNext:")
    for line in next_steps(db):
        click.echo(f"  {line}")
    if inspect:
        click.echo("")
        serve_inspector(db, "127.0.0.1", DEFAULT_INSPECT_PORT, or_any_port=True)
    if failed:
        raise SystemExit(1)


def new_log(db: Path | None) -> Path:
    """The log to start: ``db``, which must not exist, or a new tasktape-demo-<time>.db in the
    working directory, with -2, -3... added if a demo started in the same second took it."""
    if db is not None:
        if not _create(db):
            raise bad_input(f"{db} exists already: choose another --db (the demo starts a new log)")
        return db
    stem = f"tasktape-demo-{time.strftime('%Y%m%d-%H%M%S')}"
    names = itertools.chain([f"{stem}.db"], (f"{stem}-{n}.db" for n in itertools.count(2)))
    return next(Path(name) for name in names if _create(Path(name)))


def _create(db: Path) -> bool:
    """Create ``db`` empty, exclusively, so that no other run takes it for its log too;
    False if it exists."""
    try:
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileExistsError:
        return False
    except OSError as exc:  # (in the words record's --db has)
        raise bad_input(str(cannot_open(db, exc))) from None
    return True


async def replay_check(recorded: list[Recorded], task_id: str) -> tuple[str, bool]:
    """Replay the task's recorded stream at its recorded pace, as a client: are the bytes
    the same, and how far from its recorded moment did each event arrive?"""
    (stream,) = [r for r in recorded if r.is_sse and r.task_id == task_id]
    runner, url = await start_site(ReplayServer(recorded, speed=1.0).app, "127.0.0.1", 0)
    received, arrivals = b"", []
    try:
        async with aiohttp.ClientSession() as session:
            start = time.perf_counter()
            async with session.post(
                f"{url}{stream.path}", data=stream.request_body, headers={"Content-Type": "application/json"}
            ) as response:
                async for data in response.content.iter_any():
                    arrivals.append((time.perf_counter() - start, data))
                    received += data
    finally:
        await runner.cleanup()
    same = received == stream.body
    errors = pacing_errors(stream.chunks, arrivals)
    line = (
        f"Replayed the completed REST stream from the log ({len(stream.chunks)} chunks): "
        f"{'byte-identical' if same else 'BYTES DIFFER'}; each event within "
        f"{statistics.median(errors):.2f} ms (median), {max(errors):.2f} ms (max) of its recorded moment, "
        "counted from the request."
    )
    return line, same


def pacing_errors(recorded: list[tuple[int, bytes]], arrivals: list[tuple[float, bytes]]) -> list[float]:
    """For each recorded event, how far (ms) its arrival was from its recorded offset, both
    counted from the request. (Counted from the first event, the time the first answer
    takes would count against every later event, which the replay paces from the request.)"""

    def event_times(pieces: list[tuple[float, bytes]]) -> list[float]:
        decoder, times = SSEDecoder(keep_raw=False), []
        for moment, data in pieces:
            times += [moment] * len(decoder.feed(data))
        return times

    wanted = event_times([(offset / 1e9, data) for offset, data in recorded])
    got = event_times(arrivals)
    return [abs(g - w) * 1000 for g, w in zip(got, wanted, strict=False)] or [0.0]


def next_steps(db: Path) -> list[str]:
    """What to try next with the log the demo wrote."""
    summary = "SELECT task_id, final_state, events, ttfe_ms, credits FROM task_summary"
    return [
        f"tasktape inspect {db}     # browse it: each task's run on a time axis, charts, search",
        f"tasktape replay {db}     # serve these recordings again, at their pace",
        f"tasktape export {db} -o session.jsonl     # as a cassette, for your tests",
        f'sqlite-utils query {db} "{summary}" -t',
        f'sqlite-utils query {db} "SELECT seq, gap_ms, kind, state, text FROM task_timeline LIMIT 20" -t',
        "tasktape agent     # the demo agent on http://127.0.0.1:7473, for your own client",
        "tasktape record --upstream http://127.0.0.1:7473 --db mine.db     # then point the client at :7470",
    ]
