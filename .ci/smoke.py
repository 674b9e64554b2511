"""What users install, tried as they use it: the sdist and the wheel built from this tree, the
wheel installed into a fresh virtualenv, and tasktape run from a folder of decoy packages
named like its parts (then again with proxy.py installed beside it, and after removing it).

Run by .ci/run with the Python that builds; it needs only the standard library and the
`build` package. Exits non-zero, saying what failed, on the first thing that does not hold.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECOYS = ("eventlog", "fleet", "inspector", "proxy", "replay")
QUESTION = {
    "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}
}
PROJECT_TEST = """\
import json
import urllib.request
from pathlib import Path

import pytest
import replay  # the project's own package, not tasktape's


@pytest.mark.tasktape("cassettes/answer.jsonl")
def test_the_answer_streams_as_recorded(tasktape):
    assert replay.OWNER == "this project"
    request = urllib.request.Request(
        tasktape.url + "/message:stream",
        data=Path("question.json").read_bytes(),
        headers={"Content-Type": "application/json", "A2A-Version": "1.0"},
    )
    with urllib.request.urlopen(request) as response:
        assert response.read() == Path("answer.sse").read_bytes()
    assert tasktape.missed == []
"""


def step(what: str) -> None:
    print(f"smoke: {what}", flush=True)


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    command = [str(a) for a in args]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"smoke: {' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"smoke: {proc.args} exited with {proc.returncode} before listening")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    sys.exit(f"smoke: nothing listens on {port}")


class Server:
    """A tasktape command serving on a port, stopped with Ctrl-C's SIGINT; it must exit 0."""

    def __init__(self, bin_dir: Path, cwd: Path, *args: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(bin_dir / "tasktape"), *args, "--listen", f"127.0.0.1:{self.port}"],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for_port(self.port, self.proc)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        out, err = self.proc.communicate(timeout=60)
        if self.proc.returncode != 0:
            sys.exit(f"smoke: {self.proc.args} exited {self.proc.returncode}:\n{out.decode()}{err.decode()}")
        return out.decode() + err.decode()


def ask(url: str) -> bytes:
    request = urllib.request.Request(
        f"{url}/message:stream",
        data=json.dumps(QUESTION).encode(),
        headers={"Content-Type": "application/json", "A2A-Version": "1.0"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def build(out: Path) -> Path:
    step("building the sdist, and the wheel from it")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    (wheel,) = out.glob("tasktape-*.whl")
    with zipfile.ZipFile(wheel) as files:
        top = sorted({name.split("/")[0] for name in files.namelist()})
    if len(top) != 2 or top[0] != "tasktape" or not top[1].endswith(".dist-info"):
        sys.exit(f"smoke: the wheel installs more than tasktape: {top}")
    step(f"the wheel's top-level entries: {', '.join(top)}")
    return wheel


def decoy_folder(folder: Path) -> Path:
    for name in DECOYS:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"raise ImportError('the decoy {name} was imported')\n")
    return folder


def record_and_replay(bin_dir: Path, cwd: Path) -> bytes:
    step("tasktape record of the demo agent, then tasktape replay of the log")
    agent = Server(bin_dir, cwd, "agent")
    recorder = Server(bin_dir, cwd, "record", "--upstream", agent.url, "--db", "captures.db")
    direct = ask(recorder.url)
    recorder.stop()
    agent.stop()
    if b"TASK_STATE_COMPLETED" not in direct:
        sys.exit(f"smoke: the recorded stream did not complete:\n{direct.decode()}")
    replayer = Server(bin_dir, cwd, "replay", "captures.db", "--speed", "0")
    replayed = ask(replayer.url)
    summary = replayer.stop()
    if replayed != direct:
        sys.exit("smoke: the replayed stream differs from the recorded one")
    said = summary.strip().splitlines()[-1]
    step(f"replayed {len(replayed)} bytes identical to the recorded ones ({said})")
    return direct


def project_with_its_own_replay(bin_dir: Path, work: Path, answer: bytes, log: Path) -> Path:
    project = work / "project"
    (project / "replay").mkdir(parents=True)
    (project / "replay" / "__init__.py").write_text('OWNER = "this project"\n')
    (project / "cassettes").mkdir()
    run(bin_dir / "tasktape", "export", log, "-o", project / "cassettes" / "answer.jsonl")
    (project / "question.json").write_text(json.dumps(QUESTION))
    (project / "answer.sse").write_bytes(answer)
    (project / "test_answer.py").write_text(PROJECT_TEST)
    return project


def pytest_in(bin_dir: Path, project: Path) -> None:
    out = run(bin_dir / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    if "1 passed" not in out:
        sys.exit(f"smoke: the project's test did not pass:\n{out}")
    step("pytest in a project with its own replay package: 1 passed")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tasktape-smoke-") as tmp:
        work = Path(tmp)
        wheel = build(work / "dist")
        step("installing the wheel into a fresh virtualenv")
        run(sys.executable, "-m", "venv", work / "venv")
        bin_dir = work / "venv" / "bin"
        run(bin_dir / "python", "-m", "pip", "install", "-q", wheel, "pytest")
        cwd = decoy_folder(work / "decoys")
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        run(bin_dir / "tasktape", "--help", cwd=cwd, env=env)
        answer = record_and_replay(bin_dir, cwd)
        project = project_with_its_own_replay(bin_dir, work, answer, cwd / "captures.db")
        pytest_in(bin_dir, project)

        step("again with proxy.py installed beside tasktape")
        run(bin_dir / "python", "-m", "pip", "install", "-q", "proxy.py")
        run(bin_dir / "tasktape", "record", "--help", cwd=cwd)
        pytest_in(bin_dir, project)
        run(bin_dir / "python", "-m", "pip", "uninstall", "-q", "-y", "proxy.py")
        run(bin_dir / "tasktape", "record", "--help", cwd=cwd)
        record_and_replay(bin_dir, decoy_folder(work / "decoys-again"))
        step("all good")


if __name__ == "__main__":
    main()
