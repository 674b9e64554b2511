"""What ``import tasktape`` costs, and what each kind of user pays on top: a fresh
interpreter per sample, timed from start to exit, side by side with an interpreter that
imports nothing."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from .harness import Section

ROUNDS = 15
CASES = {
    "python (imports nothing)": "pass",
    "import tasktape": "import tasktape",
    "tasktape.SSEDecoder (decoder)": "import tasktape; tasktape.SSEDecoder",
    "tasktape.EventLog (log reader)": "import tasktape; tasktape.EventLog",
    "tasktape.ReplayServer (replay)": "import tasktape; tasktape.ReplayServer",
    "tasktape.RecordingProxy (proxy)": "import tasktape; tasktape.RecordingProxy",
}


def _sample(code: str) -> tuple[float, int]:
    """Seconds a fresh ``python -P -c CODE`` takes, and how many modules it ended with."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-P", "-c", f"{code}; import sys; print(len(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return time.perf_counter() - start, int(out)


def run(quick: bool) -> list[Section]:
    rounds = 3 if quick else ROUNDS
    taken: dict[str, list[float]] = {name: [] for name in CASES}
    modules: dict[str, int] = {}
    for _ in range(rounds):  # interleaved, so drift in the machine's speed hits every case alike
        for name, code in CASES.items():
            seconds, modules[name] = _sample(code)
            taken[name].append(seconds)
    base = statistics.median(taken["python (imports nothing)"])
    section = Section("Import cost", ["what", "start to exit, ms", "over bare python, ms", "modules loaded"])
    for name in CASES:
        median = statistics.median(taken[name])
        section.add(name, median * 1000, (median - base) * 1000, modules[name])
    section.notes.append(
        f"The median of {rounds} fresh interpreters each, run in turn. Names load on first use: "
        "`import tasktape` loads only the package root, its errors and its lazy loader; the log's "
        "reader and SSE decoder load no pydantic (the A2A model loads with the A2A protocol, which "
        "classifies what the writer writes)."
    )
    return [section]
