"""The ``tasktape`` command line.

Each command's module is imported when the command runs (or help lists it), so that
``tasktape record`` loads what recording needs, not the log reader, Datasette or the demo.
"""

from __future__ import annotations

import importlib
import sys

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
}

# Commands that always open a log, through sqlite-utils, which imports numpy and pandas
# when they are installed only to convert their values on insert (tasktape never has any):
# a third of a second. They load sqlite-utils first with both hidden from it, and only
# from it: whatever imports them later (a protocol plug-in) still can.
_SQLITE_UTILS_FIRST = frozenset({"check", "export", "import", "merge"})


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute = COMMANDS[cmd_name]
        return getattr(importlib.import_module(module, __package__), attribute)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tasktape")
def main() -> None:
    """Record, replay and inspect streaming agent traffic (A2A over Server-Sent Events)."""


def run() -> None:
    """The ``tasktape`` command: ``main`` in a process of its own (``main`` called in
    another program's process leaves how that process loads its modules alone)."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command in _SQLITE_UTILS_FIRST:
        _load_sqlite_utils_without_numpy()
    main()


def _load_sqlite_utils_without_numpy() -> None:
    hidden = [name for name in ("numpy", "pandas") if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))  # None: "not installed", while sqlite-utils loads
    try:
        import sqlite_utils  # noqa: F401, PLC0415
    finally:
        for name in hidden:
            del sys.modules[name]
