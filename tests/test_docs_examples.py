"""Every example in the docs runs as written (the rules: tests/docs_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_examples import DOCS, ROOT, Page, commands, runnable

PAGES = sorted(p for p in DOCS.rglob("*.md") if runnable(p))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_the_examples_run_as_written(page: Path, tmp_path: Path) -> None:
    assert Page(page, tmp_path).run() > 0


def test_the_pages_with_commands_are_all_found() -> None:
    names = {str(p.relative_to(DOCS)) for p in PAGES}
    assert {"capture.md", "replay.md", "testing.md", "cassettes.md", "inspect.md", "check.md"} <= names


def write_page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_commands_outputs_and_continuations_are_read() -> None:
    parsed = commands("$ echo a \\\n  b\na b\n$ true\n")
    assert [(c.text, c.output) for c in parsed] == [("echo a \\\n  b", ["a b"]), ("true", [])]


def test_output_is_compared_with_ellipses(tmp_path: Path) -> None:
    good = write_page(tmp_path, "```console\n$ printf 'one\\ntwo 42\\nthree\\n'\none\n...\nthree\n```\n")
    assert Page(good, tmp_path).run() == 1
    bad = write_page(tmp_path, "```console\n$ echo one\ntwo\n```\n")
    with pytest.raises(AssertionError, match="but the page shows"):
        Page(bad, tmp_path).run()


def test_a_failing_command_without_output_fails_the_page(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="exited 3"):
        Page(write_page(tmp_path, "```console\n$ exit 3\n```\n"), tmp_path).run()


def test_files_servers_and_mapped_ports(tmp_path: Path) -> None:
    """A titled block is written; a server started with & serves on its mapped default port
    until the page ends; skipped blocks do not run."""
    page = write_page(
        tmp_path,
        '```text title="hello.txt"\nhi\n```\n'
        "```console\n$ cat hello.txt\nhi\n$ tasktape agent &\n"
        "$ curl -s http://127.0.0.1:7473/.well-known/agent-card.json | grep -c 'demo agent'\n1\n```\n"
        "<!-- docs-test: skip (shows a failure) -->\n```console\n$ exit 1\n```\n",
    )
    run = Page(page, tmp_path)
    assert run.ports["7473"] != "7473"
    assert run.run() == 3
    assert all(proc.returncode is not None for _, proc, _ in run.servers)


def test_pip_install_lines_must_name_installed_packages(tmp_path: Path) -> None:
    assert Page(
        write_page(tmp_path, "```console\n$ python -m pip install aiohttp 'tasktape[mitm]'\n```\n"), tmp_path
    ).run()
    with pytest.raises(AssertionError, match="not a package here"):
        Page(write_page(tmp_path, "```console\n$ pip install no-such-package-xyz\n```\n"), tmp_path).run()


def test_the_root_is_this_checkout() -> None:
    assert (ROOT / "pyproject.toml").is_file()
