"""``tasktape`` commands as real processes, for the tests that run them as users do."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class Running:
    proc: asyncio.subprocess.Process
    url: str  # the first URL its first line printed
    printed: list[str] = field(default_factory=list)  # that line; stdout and stderr once stopped


@asynccontextmanager
async def running(*args: str, preexec_fn: Callable[[], None] | None = None) -> AsyncIterator[Running]:
    """``python -m tasktape ARGS``, once it printed where it serves; killed if still running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tasktape",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=preexec_fn,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        found = re.search(r"(http://[^\s/]+:\d+)", line)
        assert found, line + (await proc.stderr.read()).decode()
        yield Running(proc, found.group(1), [line])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stop(run: Running) -> int:
    """SIGTERM, as Ctrl-C would; its exit status (what it printed goes to ``run.printed``)."""
    run.proc.send_signal(signal.SIGTERM)
    out, err = await asyncio.wait_for(run.proc.communicate(), 60)
    run.printed += [out.decode(), err.decode()]
    assert run.proc.returncode is not None
    return run.proc.returncode
