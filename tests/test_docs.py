"""The README stays true: CI runs its test command, and every CLI command is
documented there and answers --help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tasktape.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    (command,) = re.findall(r"## Run the tests\n\n```console\n(.+)\n```", README)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci


def test_cli_help_and_version() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--help"]).exit_code == 0
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("tasktape, version ")


@pytest.mark.parametrize("name", sorted(main.commands))
def test_every_command_is_documented(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert f"tasktape {name}" in README
