"""The README stays true: CI runs its test command, and every CLI command is
documented there and answers --help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tasktape.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    (block,) = re.findall(r"## Quick start\n\n.*?\n\n```console\n(.+?)\n```", README, re.S)
    demo, tests = block.split("\n")
    assert demo == "python -m pip install . && tasktape demo"
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_cli_help_and_version() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0 and all(f"  {name} " in result.output for name in COMMANDS)
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("tasktape, version ")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_documented(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert f"tasktape {name}" in README
