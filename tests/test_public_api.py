"""The public Python API: what ``tasktape`` exports is what the API page documents, it loads
lazily, and the parts depend on each other one way only."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from package_modules import FOLDERS, ROOT

import tasktape

API_PAGE = ROOT / "docs" / "reference" / "python-api.md"

# What each part may import of tasktape's other parts: dependencies point one way,
# tasktape (the command line) -> {proxy, replay, inspector} -> eventlog.
# The root (every part loads it first), its errors, its lazy loader, its version, and two
# helpers of wording: a choice given as text (choices), a count (counted).
SHARED = {
    "tasktape",
    "tasktape.errors",
    "tasktape.lazy",
    "tasktape.version",
    "tasktape.choices",
    "tasktape.counted",
}
ALLOWED = {
    "tasktape.eventlog": {"tasktape.eventlog"},
    "tasktape.proxy": {"tasktape.eventlog", "tasktape.proxy"},
    "tasktape.replay": {"tasktape.eventlog", "tasktape.proxy", "tasktape.replay"},
    "tasktape.inspector": {"tasktape.eventlog", "tasktape.inspector"},
    "tasktape.fleet": {"tasktape.eventlog", "tasktape.fleet"},
}
# Nothing in eventlog serves HTTP, runs Datasette or parses a command line.
FORBIDDEN = {"tasktape.eventlog": ("aiohttp", "datasette", "click")}


def documented_names() -> set[str]:
    """The names in the first column of the API page's tables."""
    return set(re.findall(r"^\|\s*`([^`]+)`\s*\|", API_PAGE.read_text(), re.M))


def test_all_is_what_the_api_page_documents() -> None:
    assert set(tasktape.__all__) == documented_names()
    assert len(tasktape.__all__) == len(set(tasktape.__all__))


@pytest.mark.parametrize("name", tasktape.__all__)
def test_every_name_resolves(name: str) -> None:
    assert getattr(tasktape, name) is not None
    assert name in dir(tasktape)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        tasktape.Nope  # noqa: B018


def writers_section() -> str:
    return API_PAGE.read_text().split("The writers:", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("writer", ["LogWriter", "ProcessLogWriter"])
def test_every_option_of_the_writers_is_documented(writer: str) -> None:
    """max_batch_seconds went unnamed while the page promised commits within 50 ms (they
    take 0.1 s), and max_backlog was said to be ProcessLogWriter's alone."""
    options = inspect.signature(getattr(tasktape, writer)).parameters.values()
    for option in (o for o in options if o.kind is inspect.Parameter.KEYWORD_ONLY):
        assert f"`{option.name}`" in writers_section(), f"{writer}'s {option.name} is not documented"


@pytest.mark.parametrize("option", ["max_batch_seconds", "busy_timeout"])
def test_the_writers_times_are_documented_as_they_are(option: str) -> None:
    default = inspect.signature(tasktape.LogWriter).parameters[option].default
    assert re.search(rf"`{option}` \([^)]*\b{default:g} s by default", writers_section()), option


def loaded_after(code: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-P", "-c", f"import sys; {code}; print(*sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(result.stdout.split())


def test_import_tasktape_loads_only_its_root_errors_and_loader() -> None:
    ours = {m for m in loaded_after("import tasktape") if m.startswith("tasktape")}
    assert ours == {"tasktape", "tasktape.errors", "tasktape.lazy"}
    assert not loaded_after("import tasktape") & {"aiohttp", "pydantic", "sqlite_utils", "datasette", "click"}


def test_a_name_loads_only_its_own_part() -> None:
    loaded = loaded_after("import tasktape; tasktape.SSEDecoder")
    assert "tasktape.eventlog.sse" in loaded
    assert not loaded & {"tasktape.replay", "tasktape.proxy", "aiohttp", "sqlite_utils", "datasette"}


def test_the_lifecycle_checker_does_not_load_datasette() -> None:
    loaded = loaded_after("import tasktape.eventlog.checker; import tasktape; tasktape.check_log")
    assert "tasktape.eventlog.checker" in loaded
    # (sqlite-utils itself imports click; what tasktape imports is checked below)
    assert not loaded & {"datasette", "tasktape.inspector", "aiohttp"}


def imports_of(path: Path, package: str) -> set[str]:
    """The absolute names a module imports (relative imports resolved against its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            names.add(module)
    return names


@pytest.mark.parametrize("part", sorted(ALLOWED))
def test_dependencies_point_one_way(part: str) -> None:
    for path in FOLDERS[part].glob("*.py"):
        for name in imports_of(path, part):
            if name.startswith("tasktape") and name not in SHARED:
                assert any(name == a or name.startswith(a + ".") for a in ALLOWED[part]), (
                    f"{part}: {path.name} imports {name}"
                )
            for forbidden in FORBIDDEN.get(part, ()):
                assert name != forbidden and not name.startswith(forbidden + "."), (
                    f"{part}: {path.name} imports {name}"
                )


def test_py_typed_ships() -> None:
    assert (Path(tasktape.__file__).parent / "py.typed").is_file()
