"""Processes the tests start, stopped the same way everywhere."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def stop(process: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()
