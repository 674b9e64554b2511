"""The ``tasktape`` command line.

Each command's module is imported when the command runs (or help lists it), so that
``tasktape record`` loads what recording needs, not the log reader, Datasette or the demo.
"""

# ruff: noqa: E402 - the imports come after the hook that keeps a Ctrl-C among them quiet

from __future__ import annotations

import sys
from types import TracebackType


def _quiet_interrupt(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """Ctrl-C while this module loads (a tenth of a second, more on a busy machine), before
    any command could stop on it: no traceback. Python still ends the process by SIGINT,
    which a shell counts as status 130, as it does any program stopped by Ctrl-C."""
    if not issubclass(kind, KeyboardInterrupt):
        _hook_before(kind, value, tb)


_hook_before, sys.excepthook = sys.excepthook, _quiet_interrupt

import importlib
import importlib.abc
import importlib.util
import io
import os
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

import click

from tasktape.version import __version__

# name: (module, attribute), in the order help lists them.
COMMANDS = {
    "agent": (".agent_command", "agent"),
    "check": (".check_command", "check"),
    "collect": (".collect_command", "collect"),
    "demo": (".demo", "demo"),
    "diff": (".diff_command", "diff"),
    "export": (".cassette_commands", "export"),
    "import": (".cassette_commands", "import_"),
    "inspect": (".inspect_command", "inspect"),
    "merge": (".merge_command", "merge"),
    "mitm": (".mitm_command", "mitm"),
    "pull": (".pull_command", "pull"),
    "record": (".record", "record"),
    "replay": (".replay_command", "replay"),
    "upgrade": (".upgrade_command", "upgrade"),
}


# The commands a Ctrl-C stops as their help says it does, with status 0, even while they
# load (until they listen; then they stop on it themselves): servers, stopped no other way.
STOPPED_BY_CTRL_C = frozenset({"record"})


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute = COMMANDS[cmd_name]
        try:
            loaded = importlib.import_module(module, __package__)
        except KeyboardInterrupt:
            if cmd_name in STOPPED_BY_CTRL_C:
                ctx.exit(0)
            raise
        return getattr(loaded, attribute)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tasktape")
def main() -> None:
    """Record, replay and inspect streaming agent traffic over Server-Sent Events (A2A, MCP,
    OpenAI and Anthropic)."""


def run() -> None:
    """The ``tasktape`` command: ``main`` in a process of its own (``main`` called in
    another program's process leaves how that process loads its modules alone)."""
    sys.meta_path.insert(0, _SqliteUtilsAlone())
    _watch_stdout()
    _watch_stderr()
    try:
        try:
            main()
        finally:
            if sys.stdout is not None:  # (None: started with its standard output closed)
                sys.stdout.flush()  # here: at exit, its failure would be a traceback
    except OSError as exc:
        if not _Stdout.failed:  # (another file's error: not one said here)
            raise
        let_stdout_go()
        if not isinstance(exc, BrokenPipeError):  # (a reader that stopped reading: silent, as click has it)
            click.echo(f"Error: cannot write standard output: {exc.strerror or exc}", err=True)
        sys.exit(1)


class _Stdout(io.FileIO):
    """Standard output's file, which notes that writing it failed (a full disk, /dev/full,
    a closed pipe): an error any command meets writing it is then said as one line."""

    failed = False

    def write(self, data: Any) -> int | None:
        try:
            return super().write(data)
        except OSError:
            _Stdout.failed = True
            raise


class _Stderr(io.FileIO):
    """Standard error's file, which goes onto the null device once writing it failed (its
    reader stopped reading: `2>&1 | head -1`): there is nowhere left to say anything, and
    the command's exit status, not a traceback, says how it ended."""

    def write(self, data: Any) -> int | None:
        try:
            return super().write(data)
        except OSError:
            _onto_null_device(self.fileno())
            return len(data)


def _watch_stdout() -> None:
    """Standard output as it was (its encoding, errors and buffering), written through ``_Stdout``."""
    sys.stdout = _watched(sys.stdout, _Stdout)


def _watch_stderr() -> None:
    """Standard error as it was, written through ``_Stderr``."""
    sys.stderr = _watched(sys.stderr, _Stderr)


def _watched(out: Any, file: type[io.FileIO]) -> Any:
    """``out``, a standard stream, as it was (its encoding, errors and buffering), written
    through ``file`` (left as it is when it is none, or no file)."""
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):
        return out
    return io.TextIOWrapper(
        io.BufferedWriter(file(fd, "w", closefd=False)),
        encoding=out.encoding,
        errors=out.errors,
        line_buffering=out.line_buffering,
        write_through=out.write_through,
    )


def let_stdout_go() -> None:
    """Standard output onto the null device: what it still holds, flushed again at exit,
    goes nowhere instead of ending in a traceback."""
    _onto_null_device(sys.stdout.fileno())


def _onto_null_device(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


class _SqliteUtilsAlone(importlib.abc.MetaPathFinder):
    """Hides numpy and pandas from sqlite-utils while it loads: it imports both when they
    are installed, only to convert their values on insert, which tasktape never passes (a
    third of a second). Whatever imports them later (Datasette, a protocol plug-in) still
    can; a command that never opens a log never loads sqlite-utils at all."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if name != "sqlite_utils":
            return None
        sys.meta_path.remove(self)  # once: this import goes on without it
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module = _hiding(spec.loader.exec_module)  # type: ignore[method-assign]
        return spec


def _hiding(exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def exec_hidden(module: ModuleType) -> None:
        hidden = [name for name in ("numpy", "pandas") if name not in sys.modules]
        sys.modules.update(dict.fromkeys(hidden))  # None: "not installed", while it loads
        try:
            exec_module(module)
        finally:
            for name in hidden:
                if sys.modules.get(name, ...) is None:
                    del sys.modules[name]

    return exec_hidden


if sys.excepthook is _quiet_interrupt:  # loaded: from here on, commands stop on Ctrl-C themselves
    sys.excepthook = _hook_before
