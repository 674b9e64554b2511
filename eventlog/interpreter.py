"""How tasktape starts a Python child process (the log writer, mitmdump with the addon)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The folder that holds the tasktape package this process runs: the child imports the same
# one, wherever it was started from.
_HOME = str(Path(__file__).resolve().parents[2])


def child_python() -> tuple[list[str], dict[str, str]]:
    """The command line that starts this Python, and the environment to start it in.

    ``-P`` keeps the working directory off the child's import path, so a folder named
    ``tasktape`` (or anything tasktape imports) there cannot shadow the real one.
    """
    path = os.pathsep.join(filter(None, [_HOME, os.environ.get("PYTHONPATH")]))
    return [sys.executable, "-P"], {**os.environ, "PYTHONPATH": path}
