"""Reads the examples out of a docs page and runs them as a reader would.

The rules the pages are written to (docs/layout.md says them for contributors):
- ```console blocks: lines starting with ``$ `` are commands (a line ending in `` \\``
  continues), run by bash in order, in one fresh folder per page. A command ending in
  `` &`` starts a tasktape server in the background; it counts as started once its port
  accepts connections, and every server is stopped (SIGINT) when the page ends. Other
  lines are the command's output, compared doctest-style (``...`` matches anything); a
  command shown without output must exit 0.
- A block with ``title="PATH"`` is a file, written before the commands after it run.
- ```python blocks without a title run as scripts; ```pycon blocks run as doctests.
- The ports 7470-7473 (tasktape's defaults) and 4222 (NATS's) become free ports, the same
  ones throughout a page; a server started without ``--listen`` is given its mapped default.
- ``<!-- docs-test: skip (why) -->`` on the line before a block leaves it out.
- A page starting with ``<!-- docs-test: fresh-venv -->`` runs in a new virtualenv in
  which its pip install lines run for real, with ``tasktape`` meaning this checkout.
  Elsewhere a pip install line only has to name packages installed here.
"""

from __future__ import annotations

import doctest
import importlib.metadata
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DEFAULT_PORTS = {"record": 7470, "replay": 7471, "inspect": 7472, "agent": 7473}
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b")
FRESH_VENV = "<!-- docs-test: fresh-venv -->"
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)(?P<attrs>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)
_PORT = re.compile(r"\b(?:747[0-3]|4222)\b")
_CHECKER = doctest.OutputChecker()


@dataclass
class Block:
    lang: str
    title: str | None
    body: str
    line: int  # where it starts in the page, for messages
    skipped: bool


@dataclass
class Command:
    text: str
    output: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return self.text.endswith(" &")


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        title = re.search(r'title="([^"]+)"', match.group("attrs"))
        # The body's lines carry the fence's indent already (a block nested in a list).
        body = textwrap.dedent(match.group("body"))
        found.append(
            Block(
                match.group("lang"),
                title.group(1) if title else None,
                body,
                text.count("\n", 0, match.start()) + 1,
                bool(SKIP.search(before)),
            )
        )
    return found


def runnable(page: Path) -> bool:
    return any(not b.skipped and (b.lang in ("console", "python", "pycon") or b.title) for b in blocks(page))


def commands(body: str) -> list[Command]:
    found: list[Command] = []
    pending: str | None = None
    for line in body.splitlines():
        if pending is not None:
            pending += "\n" + line
            if not line.endswith("\\"):
                found.append(Command(pending))
                pending = None
        elif line.startswith("$ "):
            if line.endswith("\\"):
                pending = line[2:]
            else:
                found.append(Command(line[2:]))
        elif found:
            found[-1].output.append(line)
    if pending is not None:
        found.append(Command(pending))
    return found


class Page:
    """One page's examples, run in ``folder``; ``run()`` raises AssertionError naming the
    block and the command that did not do what the page says."""

    def __init__(self, page: Path, folder: Path) -> None:
        self.page, self.folder = page, folder
        self.ports = {str(p): str(free_port()) for p in (*range(7470, 7474), 4222)}
        self.servers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.fresh = page.read_text().startswith(FRESH_VENV)
        bin_dir = Path(sys.executable).parent
        if self.fresh:
            subprocess.run([sys.executable, "-m", "venv", str(folder / ".venv")], check=True)
            bin_dir = folder / ".venv" / "bin"
        self.env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "NO_COLOR": "1"}
        self.env.pop("VIRTUAL_ENV", None)

    def shell(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``args`` run in the page's folder and environment, its output captured."""
        return subprocess.run(
            args, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def run(self) -> int:
        ran = 0
        try:
            for block in blocks(self.page):
                if block.skipped:
                    continue
                body = _PORT.sub(lambda m: self.ports[m.group(0)], block.body)
                where = f"{self.page.name}:{block.line}"
                if block.title:
                    path = self.folder / block.title
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(body)
                elif block.lang == "console":
                    # A block of no commands would pass, running nothing: a misread block.
                    assert commands(body), f"{where}: a console block with no `$ ` command"
                    for command in commands(body):
                        self.command(command, where)
                        ran += 1
                elif block.lang == "python":
                    self.python(body, where)
                    ran += 1
                elif block.lang == "pycon":
                    self.doctest(body, where)
                    ran += 1
        finally:
            self.stop_servers()
        return ran

    def command(self, command: Command, where: str) -> None:
        text = command.text
        if re.match(r"(python -m )?pip install\b", text):
            return self.install(text, where)
        if command.background:
            return self.start_server(text.removesuffix(" &"), where)
        result = self.shell("bash", "-c", text)
        got = result.stdout + result.stderr
        if command.output:
            want = "\n".join(command.output).strip() + "\n"
            got_lines = "\n".join(line.rstrip() for line in got.strip().splitlines()) + "\n"
            assert _CHECKER.check_output(want, got_lines, doctest.ELLIPSIS), (
                f"{where}: `{text}` printed\n{got}\nbut the page shows\n{want}"
            )
        else:
            assert result.returncode == 0, f"{where}: `{text}` exited {result.returncode}:\n{got}"
        return None

    def install(self, text: str, where: str) -> None:
        words = shlex.split(text)[shlex.split(text).index("install") + 1 :]
        if self.fresh:
            local = [re.sub(r"^tasktape(?=\[|$)", str(ROOT), w) for w in words]
            result = self.shell("python", "-m", "pip", "install", "-q", *local, timeout=900)
            assert result.returncode == 0, f"{where}: `{text}` failed:\n{result.stdout}{result.stderr}"
            return
        for word in words:
            if word.startswith("-") or word.startswith(".") or "/" in word:
                continue
            name = re.split(r"[\[<>=!~;]", word, maxsplit=1)[0]
            try:
                importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                raise AssertionError(f"{where}: `{text}` names {name}, which is not a package here") from None

    def start_server(self, text: str, where: str) -> None:
        port = self.listen_port(text)
        if port is None:
            sub = re.search(r"\btasktape (\w+)", text)
            assert sub and sub.group(1) in DEFAULT_PORTS, f"{where}: `{text} &` is not a tasktape server"
            port = self.ports[str(DEFAULT_PORTS[sub.group(1)])]
            option = "--port" if sub.group(1) == "inspect" else "--listen"
            value = port if sub.group(1) == "inspect" else f"127.0.0.1:{port}"
            text = text.replace(sub.group(0), f"{sub.group(0)} {option} {value}", 1)
        out = self.folder / f".server-{len(self.servers)}.out"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                ["bash", "-c", f"exec {text}"], cwd=self.folder, env=self.env, stdout=sink, stderr=sink
            )
        self.servers.append((text, proc, out))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{where}: `{text}` exited {proc.returncode}:\n{out.read_text()}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", int(port))) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError(f"{where}: `{text}` did not listen on {port}:\n{out.read_text()}")

    @staticmethod
    def listen_port(text: str) -> str | None:
        found = re.search(r"--listen[ =](?:\S*:)?(\d+)\b|(?:--port|-p)[ =](\d+)\b", text)
        return next(g for g in found.groups() if g) if found else None

    def stop_servers(self) -> None:
        for _, proc, _ in reversed(self.servers):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        problems = []
        for text, proc, out in self.servers:
            try:
                if proc.wait(timeout=30) != 0:
                    problems.append(f"`{text}` exited {proc.returncode} on Ctrl-C:\n{out.read_text()}")
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                problems.append(f"`{text}` did not stop on Ctrl-C:\n{out.read_text()}")
        assert not problems, "\n".join(problems)

    def python(self, code: str, where: str) -> None:
        result = self.shell("python", "-c", code)
        assert result.returncode == 0, f"{where}: the Python example failed:\n{result.stdout}{result.stderr}"

    def doctest(self, session: str, where: str) -> None:
        path = self.folder / ".session.txt"
        path.write_text(session)
        code = (
            "import doctest, sys; "
            f"r = doctest.testfile({str(path)!r}, module_relative=False, optionflags=doctest.ELLIPSIS); "
            "sys.exit(bool(r.failed))"
        )
        result = self.shell("python", "-c", code)
        assert result.returncode == 0, f"{where}: the session did not go as shown:\n{result.stdout}"
