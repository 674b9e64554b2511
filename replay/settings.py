"""What a replay server is given (its recordings, its speed, the status of a miss, its
faults), checked where it is given, on the command line and in Python alike: a wrong one
is a usage error at start, not a server that misbehaves later."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tasktape.choices import time_scale
from tasktape.errors import UsageError
from tasktape.eventlog.recorded import Recorded

from .faults import Faults

# A miss is an error: a 1xx leaves the client waiting for the final answer, and a 2xx, 3xx
# (204 and 304 carry no body at all) would pass for the agent's answer, or lose the JSON
# error that names the closest recordings.
MISS_STATUSES = range(400, 600)


def speed(value: float) -> float:
    """``value`` as a replay speed: 0 (as fast as possible) or a finite number above it."""
    return time_scale(value, "speed")


def miss_status(value: int) -> int:
    """``value`` as the status of the answer to a miss: an error status, 400 to 599."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in MISS_STATUSES:
        raise UsageError(
            f"a miss is answered with an error status, {MISS_STATUSES.start} to {MISS_STATUSES.stop - 1}, "
            f"not {value!r}: a 1xx leaves the client waiting, and a 204 or 304 carries no body for the "
            "error naming the closest recordings"
        )
    return value


def recordings(value: Any) -> list[Recorded]:
    """``value`` as the recordings a server answers with: a list of ``Recorded``. Paths
    are loaded first (``load``), one alone goes in a list: said so."""
    if isinstance(value, Recorded):
        raise UsageError("the recordings are a list of Recorded, not one alone: write [recorded]")
    if isinstance(value, str | bytes | Path) or not isinstance(value, Iterable):
        raise UsageError(
            f"the recordings are a list of Recorded, not {value!r}: load them first, load([path])"
        )
    given = list(value)
    other = next((r for r in given if not isinstance(r, Recorded)), None)
    if isinstance(other, str | Path):
        raise UsageError(
            f"the recordings are Recorded, not paths such as {other!r}: load them first, load(paths)"
        )
    if other is not None:
        raise UsageError(
            f"the recordings are Recorded (load, read_log, read_cassette), not {type(other).__name__}"
        )
    _check_shapes(given)
    return given


def _check_shapes(given: list[Recorded]) -> None:
    """Refuse a ``Recorded`` changed since it was made (a chunk of text appended, a header
    value an int): served, it would fail mid-answer with a 500 rather than here."""
    for n, r in enumerate(given, 1):
        problem = r.misshapen()
        if problem is not None:
            raise UsageError(f"recording {n} ({r.origin or r.request_line}): {problem}")


def fault_specs(value: Any) -> list[Faults | str]:
    """``value`` as the faults armed at start: one ``Faults`` or spec, or a list of them."""
    if value is None:
        return []
    if isinstance(value, Faults | str):
        return [value]
    if not isinstance(value, Iterable):
        raise UsageError(
            f"faults are a Faults, a spec such as 'drop-after=3', or a list of them, not {value!r}"
        )
    return list(value)
