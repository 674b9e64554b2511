"""Shared fixtures: a recording proxy in front of any aiohttp upstream, on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from nats_servers import NatsCluster

from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.content_coding import MAX_DECODED
from tasktape.eventlog.redact import Redactor
from tasktape.proxy import RecordingProxy

pytest_plugins = ["pytester"]  # the pytest plugin's tests run pytest as its users do


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--stress",
        action="store_true",
        help="Run the stress suites at full size (more runs, examples and bytes): minutes, not seconds.",
    )


@pytest.fixture(scope="session")
def stress(request: pytest.FixtureRequest) -> bool:
    """Whether to run at full size (``--stress``); the default sizes keep the suite fast."""
    return bool(request.config.getoption("--stress"))


@dataclass
class Recording:
    """A running proxy: ``url`` to send requests to, ``log()`` to read what it recorded."""

    url: str
    upstream: str
    proxy: RecordingProxy
    writer: LogWriter
    db: Path
    session: aiohttp.ClientSession

    async def log(self) -> EventLog:
        """The log once every exchange so far has ended and been committed."""
        await asyncio.wait_for(self.proxy.wait_idle(), 10)
        await self.writer.aflush()
        return EventLog(self.db)


RecordFactory = Callable[..., Awaitable[Recording]]


@pytest.fixture
async def record(tmp_path: Path) -> AsyncIterator[RecordFactory]:
    """``await record(upstream_app_or_url, **proxy_options)`` starts an upstream (when
    given an app) and a recording proxy in front of it."""
    servers: list[TestServer] = []
    writers: list[LogWriter] = []
    session = aiohttp.ClientSession(auto_decompress=False)

    async def start(
        upstream: web.Application | str,
        *,
        redactor: Redactor | None = None,
        max_body: int = 16 * 1024 * 1024,
        max_decoded: int = MAX_DECODED,
        **options: Any,
    ) -> Recording:
        if isinstance(upstream, web.Application):
            up = TestServer(upstream, host="127.0.0.1")
            await up.start_server()
            servers.append(up)
            upstream_url = str(up.make_url("")).rstrip("/")
        else:
            upstream_url = upstream
        db = tmp_path / f"log{len(writers)}.db"
        writer = LogWriter(db, redactor=redactor, max_body=max_body, max_decoded=max_decoded)
        writers.append(writer)
        proxy = RecordingProxy(upstream_url, writer, max_request_body=max_body, **options)
        server = TestServer(proxy.app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return Recording(str(server.make_url("")).rstrip("/"), upstream_url, proxy, writer, db, session)

    yield start
    await session.close()
    for server in reversed(servers):
        await server.close()
    for writer in writers:
        await writer.aclose()


Serve = Callable[..., Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """``await serve(app)`` -> its base URL on loopback; stopped after the test."""
    servers: list[TestServer] = []

    async def start(app: web.Application) -> str:
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return str(server.make_url("")).rstrip("/")

    yield start
    for server in reversed(servers):
        await server.close()


@pytest.fixture
def nats_node(tmp_path: Path) -> Iterator[NatsCluster]:
    """A running ``nats-server`` with JetStream on loopback, its store under ``tmp_path``."""
    cluster = NatsCluster(tmp_path / "nats", size=1).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three ``nats-server`` nodes with JetStream in one cluster on loopback."""
    cluster = NatsCluster(tmp_path / "nats", size=3).start()
    yield cluster
    cluster.stop()
