"""What each process spends per forwarded event, in instructions counted by valgrind's
callgrind: unlike time on a shared machine, a count does not drift with the machine's
speed, so it says exactly what recording adds to forwarding and what the log writer costs;
nor does it count what other processes on the machine cost it (the brokers a shipping
recorder sends to, here on the same CPUs, take none of its count).

Each path runs under callgrind twice, once with only a warm-up and once with the paced
streams too; the difference, divided by the events, is the cost of one event. The agent
paces its events so that they reach the proxy one by one, as they do at full speed (a
proxy slowed down by valgrind would otherwise read them coalesced, and look cheaper).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .fleet_bench import NATS_SERVER, SHIPPER, NatsCluster, wait_shipped
from .harness import Section
from .proxy_bench import (
    BARE,
    BENCH,
    RECORD,
    RESUMING,
    UNRECORDED,
    free_port,
    listening,
    logged_events,
    start_upstream,
    throughput_run,
)

STREAMS, EVENTS, DELAY = 5, 500, 0.02  # 5 streams of 500 events 20 ms apart
QUICK = (4, 100)
AGENT_IDS = ", the agent's ids"
SHIPPING = "tasktape record --ship"
WARM_UP = (2, 10)
_STARTUP = 300.0  # seconds: Python importing aiohttp and sqlite-utils under valgrind


def run(quick: bool) -> list[Section]:
    streams, events = QUICK if quick else (STREAMS, EVENTS)
    section = Section(
        f"Instructions per event: {streams} streams of {events} events {DELAY * 1000:.0f} ms apart",
        [
            "path",
            "proxy process",
            "vs bare pass-through",
            "log writer process",
            "shipper process",
            "all, vs bare",
        ],
    )
    if shutil.which("valgrind") is None:
        section.notes.append("valgrind is not installed, so nothing was counted (apt-get install valgrind).")
        return [section]
    python = sys.executable
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        upstream = start_upstream(stack)
        paths = {
            BARE: lambda p, _db: [python, "-c", BENCH.format("passthrough_main"), str(p), upstream],
            UNRECORDED: lambda p, _db: [python, "-c", BENCH.format("unrecorded_main"), str(p), upstream],
            RECORD: lambda p, db: [
                python, "-m", "tasktape", "record", "--upstream", upstream,
                "--listen", f"127.0.0.1:{p}", "--db", str(db), "--quiet",
            ],
        }  # fmt: skip
        paths[RESUMING] = lambda p, db: [*paths[RECORD](p, db), "--resume"]
        # The same two, the agent giving every event an id of its own (as tasktape agent does).
        paths[RECORD + AGENT_IDS] = paths[RECORD]
        paths[RESUMING + AGENT_IDS] = paths[RESUMING]
        if shutil.which(NATS_SERVER):  # shipping every row to a three-node JetStream cluster
            cluster = NatsCluster(tmp / "nats").start()
            stack.callback(cluster.stop)
            paths[SHIPPING] = lambda p, db: [*paths[RECORD](p, db), "--ship", cluster.url]
        # One path at a time, its two runs side by side (the warm-up-only one mostly idles):
        # a process starved of CPU would read events coalesced, and count fewer per event.
        counts = {}
        with ThreadPoolExecutor(2) as pool:
            for name, command in paths.items():
                logged, ids, shipped = name.startswith(RECORD), name.endswith(AGENT_IDS), name == SHIPPING
                idle = pool.submit(_count, tmp, command, logged, 0, 0, ids, shipped)
                counts[name, (streams, events)] = _count(tmp, command, logged, streams, events, ids, shipped)
                counts[name, (0, 0)] = idle.result()
    total = streams * events
    per_event = {
        name: [
            (b - a) / total
            for a, b in zip(counts[name, (0, 0)], counts[name, (streams, events)], strict=True)
        ]
        for name in paths
    }
    bare = per_event[BARE][0]
    for name, (proxy, writer, shipper) in per_event.items():
        section.add(
            name,
            f"{proxy:,.0f}",
            f"{proxy / bare:.2f}x",
            f"{writer:,.0f}" if writer else "-",
            f"{shipper:,.0f}" if shipper else "-",
            f"{(proxy + writer + shipper) / bare:.2f}x",
        )
    section.notes.append(
        "Instructions per event in each process (callgrind: user space only, so the kernel's "
        "socket work is not counted), the difference between a run with the streams and one "
        "with only a warm-up. tasktape record's proxy process is what forwards; its log writer "
        "is the child process that decodes, classifies and commits. With --resume, it gives events "
        "without ids ids of its own and holds each stream for clients that reconnect (the "
        "streams here never drop); with the agent's ids, every event comes with an id and "
        "goes out as it came. The shipper is the child process that sends committed rows to "
        "JetStream (--ship)."
    )
    if SHIPPING in per_event:
        on, off = sum(per_event[SHIPPING]), sum(per_event[RECORD])
        section.notes.append(
            f"Shipping costs {on / off:.2f}x tasktape record's instructions per event across its "
            f"process tree: the shipper process {per_event[SHIPPING][2]:,.0f}, reading each committed "
            "row's hints and publishing it to a three-node JetStream cluster on this machine (until "
            "every row is acknowledged); the brokers' own work is not the recorder's, and not counted."
        )
    return [section]


def _count(
    tmp: Path,
    args: Callable[[int, Path], list[str]],
    recording: bool,
    streams: int,
    events: int,
    ids: bool,
    shipped: bool,
) -> tuple[float, float, float]:
    """Instructions of the proxy process, of its log writer and of its shipper (0 when
    none) over a run that forwards ``streams`` paced streams of ``events`` events after the
    warm-up (each with an id of the agent's, with ``ids``); with ``shipped``, until every
    row is acknowledged by JetStream."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    port, db = free_port(), out / "log.db"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p", "--trace-children=yes"]
    # A fixed hash seed: the same dict layouts, so the two runs start up alike to the instruction.
    proc = subprocess.Popen(
        [*valgrind, *args(port, db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    try:
        if not listening(port, proc, timeout=_STARTUP):
            raise RuntimeError(f"{args(port, db)} did not start under valgrind")
        url = f"http://127.0.0.1:{port}"
        asyncio.run(throughput_run(url, *WARM_UP, ids=ids))
        if streams:
            asyncio.run(throughput_run(url, streams, events, delay=DELAY, ids=ids))
        if recording:  # the writer's whole share: every event committed
            logged_events(db, WARM_UP[0] * WARM_UP[1] + streams * events, timeout=_STARTUP)
        if shipped:
            wait_shipped(db, timeout=_STARTUP)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(_STARTUP)
    proxy = writer = shipper = 0.0
    for f in out.glob("cg.*"):
        total, command = _total(f)
        if int(f.name.split(".")[1]) == proc.pid:
            proxy = total
        elif SHIPPER in command:
            shipper += total
        else:
            writer += total
    return proxy, writer, shipper


def _total(path: Path) -> tuple[float, bytes]:
    """The instruction total callgrind wrote at the end of its output file, and the
    command it counted."""
    text = path.read_bytes()
    match = re.search(rb"^(?:totals|summary): (\d+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{path}: no instruction total")
    command = re.search(rb"^cmd: (.*)$", text, re.MULTILINE)
    return float(match.group(1)), command.group(1) if command else b""
