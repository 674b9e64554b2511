"""The documentation site builds cleanly (``mkdocs build --strict``), and its command line
reference, generated from the click commands, shows every command with its options."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import click
import pytest

from tasktape.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent


class _Sections(HTMLParser):
    """The text of a page, cut at each heading that has an id: {id: text after it}."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, list[str]] = {}
        self._current: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        ids = [value for name, value in attrs if name == "id" and value]
        if re.fullmatch(r"h[1-6]", tag) and ids:
            self._current = self.sections.setdefault(ids[0], [])

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self._current.append(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("site")
    # Material prints a notice about MkDocs 2.0 on every build unless told not to.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return folder, output


def test_the_site_builds_without_warnings(site: tuple[Path, str]) -> None:
    folder, output = site
    warnings = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert not warnings, "\n".join(warnings)
    assert (folder / "index.html").is_file()
    assert (folder / "reference" / "cli" / "index.html").is_file()


def _options(command: click.Command) -> list[str]:
    """The long (else short) spelling of each option the command's --help lists."""
    found = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names = [*param.opts, *param.secondary_opts]
            found.append(next((n for n in names if n.startswith("--")), names[0]))
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_cli_reference_lists_every_command_with_its_options(site: tuple[Path, str], name: str) -> None:
    folder, _ = site
    parser = _Sections()
    parser.feed((folder / "reference" / "cli" / "index.html").read_text())
    section = f"tasktape-{name}"
    assert section in parser.sections, f"no section {section} in the CLI reference"
    text = html.unescape("".join(parser.sections[section]))
    assert f"tasktape {name}" in text
    command = main.get_command(click.Context(main), name)
    assert command is not None
    options = _options(command)
    assert options, f"tasktape {name} has no options?"
    missing = [option for option in options if option not in text]
    assert not missing, f"the CLI reference's tasktape {name} lacks {missing}"


def test_the_record_reference_shows_its_upstream(site: tuple[Path, str]) -> None:
    folder, _ = site
    parser = _Sections()
    parser.feed((folder / "reference" / "cli" / "index.html").read_text())
    assert "--upstream" in "".join(parser.sections["tasktape-record"])


def test_the_cli_reference_shows_what_help_shows(site: tuple[Path, str]) -> None:
    """Defaults, required options and environment variables read as `--help` prints them:
    no placeholder of click's for an option without a default."""
    folder, _ = site
    text = (folder / "reference" / "cli" / "index.html").read_text()
    assert "Sentinel" not in text and "UNSET" not in text
    assert "[required]" in text and "TASKTAPE_EVENT_LOOP" in text
