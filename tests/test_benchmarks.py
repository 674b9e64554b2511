"""The benchmark runner's own plumbing: pinning processes to CPUs, its command line, its report."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from processes import stop

from benchmarks import chart, scaling
from benchmarks.__main__ import SUITES, main
from benchmarks.fleet_bench import _apart
from benchmarks.harness import Section, pin

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs this process may run on")

# Four threads waiting, then, on a line in, one of them starts a fifth.
THREADED = """
import sys, threading
go, done = threading.Event(), threading.Event()
def worker():
    go.wait()
    threading.Thread(target=done.wait).start()
    print("started", flush=True)
    done.wait()
for _ in range(4):
    threading.Thread(target=worker, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
go.set()
sys.stdin.readline()
done.set()
"""


@pytest.fixture
def threaded() -> Iterator[subprocess.Popen[str]]:
    """A process of five threads, on every CPU this one may use."""
    child = subprocess.Popen(
        [sys.executable, "-c", THREADED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout and child.stdout.readline() == "ready\n"
    yield child
    stop(child)


def affinities(pid: int) -> list[set[int]]:
    """The CPUs each thread of the process may run on."""
    return [os.sched_getaffinity(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()]


@two_cpus
def test_pin_moves_every_thread_and_the_threads_started_after(threaded: subprocess.Popen[str]) -> None:
    """pinned and fleet moved a log writer's or nats-server's first thread alone to its CPU:
    os.sched_setaffinity(pid) moves only the thread whose id is pid."""
    assert threaded.stdin and threaded.stdout
    pin(threaded.pid, {ALLOWED[1]})
    assert affinities(threaded.pid) == [{ALLOWED[1]}] * 5
    threaded.stdin.write("go\n")
    threaded.stdin.flush()
    assert [threaded.stdout.readline() for _ in range(4)] == ["started\n"] * 4
    assert affinities(threaded.pid) == [{ALLOWED[1]}] * 9


@two_cpus
def test_fleet_keeps_a_recorder_apart_in_every_thread(threaded: subprocess.Popen[str]) -> None:
    """fleet's shipping rounds left every thread of a recorder's processes but the first, and of
    the brokers, on both CPUs."""
    with _apart([threaded.pid]) as apart:
        assert apart is not None
        assert affinities(threaded.pid) == [{apart[0]}] * 5
        assert set(map(frozenset, affinities(os.getpid()))) == {frozenset({apart[1]})}
    assert affinities(threaded.pid) == [set(ALLOWED)] * 5
    assert set(map(frozenset, affinities(os.getpid()))) == {frozenset(ALLOWED)}


def test_the_help_lists_the_suites_and_an_unknown_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--help offered a choice of "[]" among the suites."""
    with pytest.raises(SystemExit) as help_exit:
        main(["--help"])
    assert help_exit.value.code == 0
    shown = capsys.readouterr().out
    assert "[]" not in shown
    assert ", ".join(SUITES) in " ".join(shown.split())
    with pytest.raises(SystemExit) as unknown_exit:
        main(["decoder", "nope"])
    assert unknown_exit.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_a_report_with_no_folder_is_refused_before_any_suite_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A report into a missing folder failed with FileNotFoundError once every suite had run."""
    ran: list[bool] = []

    def one(quick: bool) -> list[Section]:
        ran.append(quick)
        return []

    monkeypatch.setitem(SUITES, "one", one)
    with pytest.raises(SystemExit) as refused:
        main(["one", "--report", str(tmp_path / "missing" / "report.md")])
    assert refused.value.code == 2
    assert f"no folder {tmp_path / 'missing'}" in capsys.readouterr().err
    assert ran == []


def test_a_failing_suite_leaves_the_others_results_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suite's exception, or matplotlib missing for the chart, lost every suite's results."""
    section = Section("Measured", ["path", "events/s"])
    section.add("tasktape record", 1000.0)

    def fails(quick: bool) -> list[Section]:
        return [Section("Never", [str(1 / 0)])]

    monkeypatch.setitem(SUITES, "fails", fails)
    monkeypatch.setitem(SUITES, "works", lambda quick: [section])
    # What the scaling suite leaves for the chart.
    monkeypatch.setitem(scaling.SHAPES, "concurrency", [(10, 100), (50, 20)])
    monkeypatch.setitem(scaling.SHAPES, "length", [(10, 100)])
    monkeypatch.setitem(scaling.RESULTS, "tasktape record", {(10, 100): 900.0, (50, 20): 800.0})
    report = tmp_path / "report.md"
    with pytest.raises(SystemExit) as failed:
        main(["fails", "works", "--report", str(report)])
    assert failed.value.code == "failed: fails"
    written = report.read_text()
    assert "### The fails suite failed\n\n`ZeroDivisionError: division by zero`" in written
    assert section.markdown() in written
    if chart.can_draw():
        assert "![Throughput by concurrency and by stream length](report.png)" in written
        assert report.with_suffix(".png").is_file()
    else:
        assert f"*No chart: {chart.MISSING}.*" in written
