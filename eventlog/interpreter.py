"""How tasktape starts a Python child process (the log writer, mitmdump with the addon)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import tasktape

# The folder that holds the tasktape package this process runs (site-packages, or the
# checkout of an editable install): the child imports the same one, wherever it starts.
_HOME = str(Path(tasktape.__file__).resolve().parents[1])


def child_python() -> tuple[list[str], dict[str, str]]:
    """The command line that starts this Python, and the environment to start it in.

    ``-P`` keeps the working directory off the child's import path, so a folder named
    ``tasktape`` (or anything tasktape imports) there cannot shadow the real one.
    """
    path = os.pathsep.join(filter(None, [_HOME, os.environ.get("PYTHONPATH")]))
    return [sys.executable, "-P"], {**os.environ, "PYTHONPATH": path}
