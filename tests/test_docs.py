"""The README and the docs stay true: CI runs the README's test command, the README stays
short and links only to pages that exist, and every CLI command is documented and
answers --help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from tasktape.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
CLI_PAGE = DOCS / "reference" / "cli.md"
README_MAX_LINES = 200


def test_the_quick_start_is_two_commands_and_ci_runs_the_second() -> None:
    (block,) = re.findall(r"## Quick start\n\n.*?\n\n```console\n(.+?)\n```", README, re.S)
    demo, tests = block.split("\n")
    assert demo == "python -m pip install . && tasktape demo"
    install, mcp2, run = tests.split(" && ")
    assert (install, run) == ('python -m pip install -e ".[test]"', "python -m pytest -n auto")
    assert mcp2.startswith("python -m pip install --target .test-deps/mcp2 mcp==2.")
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) <= README_MAX_LINES


def test_the_readme_links_only_to_what_exists() -> None:
    """Relative links (they work on GitHub) lead to files of the repository; the docs pages
    it links to are in the site's nav."""
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link.split("#", 1)[0] for link in links if not re.match(r"[a-z]+://", link)]
    assert any(link.startswith("docs/") for link in local)
    for link in local:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
    nav = (ROOT / "mkdocs.yml").read_text()
    for link in local:
        if link.startswith("docs/") and link.endswith(".md"):
            assert link.removeprefix("docs/") in nav, f"{link} is not in mkdocs.yml's nav"


def test_cli_help_and_version() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0 and all(f"  {name} " in result.output for name in COMMANDS)
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("tasktape, version ")


def test_the_cli_reference_is_generated_from_every_command() -> None:
    page = CLI_PAGE.read_text()
    assert "::: mkdocs-click" in page
    assert re.search(r"^\s+:module: tasktape\.cli$", page, re.M)
    assert re.search(r"^\s+:command: main$", page, re.M)
    assert re.search(r"^\s+:prog_name: tasktape$", page, re.M)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_documented(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    pages = [p for p in DOCS.rglob("*.md") if p != CLI_PAGE and f"tasktape {name}" in p.read_text()]
    assert pages, f"no page of docs/ shows `tasktape {name}`"


def test_the_check_page_lists_every_rule_of_every_protocol_as_it_explains_itself() -> None:
    from tasktape.eventlog.checker import all_rules, explain  # noqa: PLC0415
    from tasktape.eventlog.protocols import protocols  # noqa: PLC0415

    page = (DOCS / "check.md").read_text()
    rows = re.findall(r"^\| `([\w-]+)` \| `([\w-]+)` \| (.+) \|$", page, re.M)
    owner = {name: p.name for p in protocols() for name in p.rules}
    assert [(p, rule, text) for p, rule, text in rows] == [(owner[n], n, explain(n)) for n in all_rules()]


def test_the_protocols_page_explains_every_kind_of_every_protocol() -> None:
    """A kind the classifier stores but the page leaves out is one a reader filtering
    `events.kind` never learns of (thinking, a second choice's chunks)."""
    from tasktape.eventlog.protocols import protocols  # noqa: PLC0415

    page = (DOCS / "protocols.md").read_text()
    for protocol in protocols():
        table = page.split(f"**`{protocol.name}`**\n", 1)[1].strip().split("\n\n", 1)[0]
        listed = re.findall(r"^\| `([\w/]+)` \|", table, re.M)
        assert sorted(listed) == sorted(k.value for k in protocol.kinds), protocol.name
