"""The numbers a replay server is given (its speed, the status of a miss), checked where
they are given, on the command line and in Python alike: a wrong one is a usage error at
start, not a server that misbehaves later."""

from __future__ import annotations

from tasktape.choices import time_scale
from tasktape.errors import UsageError

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
