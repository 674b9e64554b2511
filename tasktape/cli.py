"""The ``tasktape`` command line."""

from __future__ import annotations

import click

from eventlog import __version__

from .agent_command import agent
from .cassette_commands import export, import_
from .check_command import check
from .demo import demo
from .inspect_command import inspect
from .mitm_command import mitm
from .record import record
from .replay_command import replay


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tasktape")
def main() -> None:
    """Record, replay and inspect streaming agent traffic (A2A over Server-Sent Events)."""


main.add_command(record)
main.add_command(agent)
main.add_command(demo)
main.add_command(inspect)
main.add_command(replay)
main.add_command(export)
main.add_command(import_)
main.add_command(check)
main.add_command(mitm)
