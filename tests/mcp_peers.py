"""A real MCP server and client over Streamable HTTP, on either SDK generation, for tests.

Run as a script::

    python tests/mcp_peers.py server --port P [--event-store] [--retry-ms MS] [--close-stream-after K]
    python tests/mcp_peers.py client --url URL [--mode auto|legacy|2026-07-28] [--count N] [--delay S]

Both sides use whichever ``mcp`` package is importable (``--sdk auto``, the default), or insist on
one generation with ``--sdk 1`` / ``--sdk 2``:

* mcp 1.x (1.30): ``FastMCP``, session-based revisions 2025-06-18 / 2025-11-25 (``initialize``,
  ``Mcp-Session-Id``, the GET stream, event ids and ``Last-Event-ID`` resumption with an event
  store);
* mcp 2.x (2.3): ``MCPServer`` and ``mcp.Client``; the client's default ``mode="auto"`` probes
  ``server/discover`` and speaks the stateless revision 2026-07-28 (no ``initialize``, no session).
  Run it with ``PYTHONPATH=/path/to/mcp2`` ahead of an environment that has mcp 1.x's dependencies
  plus ``httpx2`` and ``opentelemetry-api``, or in an environment of its own.

The server listens on ``127.0.0.1`` (``--port 0`` picks a free port), serves the endpoint ``/mcp``
and prints ``ready http://127.0.0.1:PORT/mcp`` (flushed) once it accepts connections. Its tools:

* ``add(a: int, b: int) -> int``;
* ``slow_count(n: int, delay: float) -> str``: ``n`` times, sleeps ``delay`` s and reports progress
  ``(i, n, "counted i of n")``; returns ``"counted to n"``. With ``--close-stream-after K`` (and
  ``--event-store``) it closes the POST's SSE stream after the K-th report
  (``ctx.close_sse_stream()``, SEP-1699 polling), so the client has to resume with a GET that
  carries ``Last-Event-ID``. Only handshake-era sessions at 2025-11-25 can be cut: the SDK offers
  the callback only then, and a 2026-07-28 request has no event ids to resume from;
* ``sample(q: str) -> str`` (1.x only): asks the client to sample a message for ``q``
  (``ctx.session.create_message``, which mcp 1.x sends on the session's GET stream) and returns
  ``"sampled: <its text>"``.

``--event-store`` gives the server an in-memory ``EventStore`` (SSE ``id:`` lines, a priming event
``id: X`` / ``data:`` and, with ``--retry-ms``, a ``retry:`` line first on each POST stream).

The client connects with the SDK's own streamable HTTP client, initializes (1.x, or 2.x in
``legacy`` mode), lists the tools, calls ``add`` and then ``slow_count`` with a progress callback,
and prints ONE JSON object on stdout: the SDK, the negotiated protocol version, the session id (1.x),
the tool names, and per call its result (wire form), text, the progress notifications received
(``progress``, ``total``, ``message``, ``at`` seconds into the call) and its duration in seconds.

``run_mcp_server()`` and ``run_mcp_client()`` start the script as a subprocess for a test, with an
optional ``pythonpath`` that selects the SDK generation.
"""

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import json
import os
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from processes import stop

ENDPOINT_PATH = "/mcp"
SERVER_NAME = "tasktape-mcp-peer"
DEFAULT_COUNT = 3
DEFAULT_DELAY = 0.2


# --------------------------------------------------------------------------- which SDK


def detect_sdk() -> str:
    """``"2"`` if the importable ``mcp`` has ``MCPServer`` (2.x), else ``"1"``."""
    try:
        importlib.import_module("mcp.server.mcpserver")
    except ImportError:
        importlib.import_module("mcp.server.fastmcp")  # neither: let the ImportError say so
        return "1"
    return "2"


def sdk_version() -> str:
    """The version of the ``mcp`` distribution whose files are imported."""
    import mcp  # noqa: PLC0415 - which one depends on sys.path, decided at run time

    package_dir = Path(mcp.__file__).resolve().parent
    for dist in importlib.metadata.distributions(path=[str(package_dir.parent)]):
        if (dist.metadata["Name"] or "").lower() == "mcp":
            return dist.version
    return "unknown"


def _resolve_sdk(choice: str) -> str:
    found = detect_sdk()
    if choice not in ("auto", found):
        raise SystemExit(f"--sdk {choice} asked for, but the importable mcp is generation {found}")
    return found


# --------------------------------------------------------------------------- the event store


def _make_event_store() -> Any:
    """An in-memory ``EventStore`` (the SDK's interface, either generation): ids are random UUIDs."""
    from mcp.server.streamable_http import EventMessage, EventStore  # noqa: PLC0415

    class InMemoryEventStore(EventStore):
        """Every event kept, in order; a priming event is stored with ``message=None``."""

        def __init__(self) -> None:
            self.events: list[tuple[str, str, Any]] = []  # (event_id, stream_id, message or None)

        async def store_event(self, stream_id: str, message: Any) -> str:
            event_id = uuid.uuid4().hex
            self.events.append((event_id, stream_id, message))
            return event_id

        async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
            index = next((i for i, event in enumerate(self.events) if event[0] == last_event_id), None)
            if index is None:
                return None
            stream_id = self.events[index][1]
            for event_id, sid, message in self.events[index + 1 :]:
                if sid == stream_id and message is not None:
                    await send_callback(EventMessage(message, event_id))
            return stream_id

    return InMemoryEventStore()


# --------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class ServerOptions:
    """How ``serve`` configures the MCP server."""

    port: int = 0
    event_store: bool = False
    retry_ms: int | None = None
    close_stream_after: int | None = None
    stateless: bool = False
    json_response: bool = False
    log_level: str = "warning"


def build_app(sdk: str, options: ServerOptions) -> Any:
    """The SDK's Starlette app for the peer server, with its tools registered."""
    if sdk == "1":
        from mcp.server.fastmcp import Context, FastMCP  # noqa: PLC0415

        server: Any = FastMCP(
            SERVER_NAME,
            event_store=_make_event_store() if options.event_store else None,
            retry_interval=options.retry_ms,
            stateless_http=options.stateless,
            json_response=options.json_response,
            streamable_http_path=ENDPOINT_PATH,
            log_level=options.log_level.upper(),
        )
    else:
        from mcp.server.mcpserver import Context, MCPServer  # noqa: PLC0415

        server = MCPServer(SERVER_NAME, log_level=options.log_level.upper())

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    async def slow_count(n: int, delay: float, ctx: Context) -> str:
        """Count to n, sleeping delay seconds before each step and reporting progress after it."""
        for i in range(1, n + 1):
            await asyncio.sleep(delay)
            await ctx.report_progress(i, n, f"counted {i} of {n}")
            if options.close_stream_after == i:
                await ctx.close_sse_stream()
        return f"counted to {n}"

    if sdk == "1":
        from mcp.types import SamplingMessage, TextContent  # noqa: PLC0415

        @server.tool()
        async def sample(q: str, ctx: Context) -> str:
            """Ask the client's model about q (a sampling request, on the session's GET stream)."""
            message = SamplingMessage(role="user", content=TextContent(type="text", text=q))
            result = await ctx.session.create_message(messages=[message], max_tokens=10)
            return f"sampled: {result.content.text}"

        return server.streamable_http_app()
    return server.streamable_http_app(
        streamable_http_path=ENDPOINT_PATH,
        event_store=_make_event_store() if options.event_store else None,
        retry_interval=options.retry_ms,
        stateless_http=options.stateless,
        json_response=options.json_response,
        host="127.0.0.1",
    )


async def serve(sdk: str, options: ServerOptions) -> None:
    """Serve until cancelled; print ``ready URL`` once listening."""
    import uvicorn  # noqa: PLC0415

    app = build_app(sdk, options)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", options.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=options.log_level, lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving  # re-raise the startup failure
            raise SystemExit(1)
        await asyncio.sleep(0.01)
    print(f"ready http://127.0.0.1:{port}{ENDPOINT_PATH}", flush=True)
    await serving


# --------------------------------------------------------------------------- the client


@dataclass
class _Progress:
    """Progress notifications for one call, with their arrival times."""

    started: float = field(default_factory=time.perf_counter)
    received: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.received.append(
            {
                "progress": progress,
                "total": total,
                "message": message,
                "at": round(time.perf_counter() - self.started, 4),
            }
        )


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def _call_report(result: Any, started: float, progress: _Progress | None = None) -> dict[str, Any]:
    wire = _dump(result)
    report: dict[str, Any] = {
        "result": wire,
        "text": "".join(block.get("text", "") for block in wire.get("content", [])),
        "is_error": bool(wire.get("isError", False)),
        "seconds": round(time.perf_counter() - started, 4),
    }
    if progress is not None:
        report["progress"] = progress.received
    return report


async def _client_v1(url: str, count: int, delay: float, a: int, b: int) -> dict[str, Any]:
    from mcp import ClientSession  # noqa: PLC0415
    from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

    out: dict[str, Any] = {}
    started = time.perf_counter()
    async with (
        streamable_http_client(url) as (read, write, get_session_id),
        ClientSession(read, write) as session,
    ):
        init = await session.initialize()
        out["protocol_version"] = str(init.protocolVersion)
        out["server_info"] = _dump(init.serverInfo)
        out["session_id"] = get_session_id()
        out["connect_seconds"] = round(time.perf_counter() - started, 4)
        out.update(await _exercise(session, count, delay, a, b))
    out["total_seconds"] = round(time.perf_counter() - started, 4)
    return out


async def _client_v2(url: str, mode: str, count: int, delay: float, a: int, b: int) -> dict[str, Any]:
    from mcp import Client  # noqa: PLC0415

    out: dict[str, Any] = {}
    started = time.perf_counter()
    async with Client(url, mode=mode) as client:
        out["protocol_version"] = client.protocol_version
        out["server_info"] = _dump(client.server_info) if client.server_info is not None else None
        out["session_id"] = None  # 2.x's Client does not expose it; at 2026-07-28 there is none
        out["connect_seconds"] = round(time.perf_counter() - started, 4)
        out.update(await _exercise(client, count, delay, a, b))
    out["total_seconds"] = round(time.perf_counter() - started, 4)
    return out


async def _exercise(peer: Any, count: int, delay: float, a: int, b: int) -> dict[str, Any]:
    """List the tools, call ``add`` and ``slow_count``: the same calls on a 1.x session or a 2.x client."""
    started = time.perf_counter()
    tools = await peer.list_tools()
    out: dict[str, Any] = {
        "tools": sorted(tool.name for tool in tools.tools),
        "list_tools_seconds": round(time.perf_counter() - started, 4),
        "calls": {},
    }
    started = time.perf_counter()
    result = await peer.call_tool("add", {"a": a, "b": b})
    out["calls"]["add"] = _call_report(result, started)
    progress = _Progress()
    result = await peer.call_tool("slow_count", {"n": count, "delay": delay}, progress_callback=progress)
    out["calls"]["slow_count"] = _call_report(result, progress.started, progress)
    return out


async def run_client(
    sdk: str, url: str, mode: str, count: int, delay: float, a: int, b: int
) -> dict[str, Any]:
    """One client run against ``url``; the JSON-able report."""
    if sdk == "1":
        if mode != "auto":
            raise SystemExit("--mode is for mcp 2.x; mcp 1.x always initializes")
        report = await _client_v1(url, count, delay, a, b)
    else:
        report = await _client_v2(url, mode, count, delay, a, b)
    return {"sdk": sdk, "mcp_version": sdk_version(), "url": url, **report}


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    """``server`` or ``client``, as the module docstring describes."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sdk", choices=["auto", "1", "2"], default="auto")
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="serve the peer MCP server")
    server.add_argument("--sdk", choices=["auto", "1", "2"], default=argparse.SUPPRESS)
    server.add_argument("--port", type=int, required=True, help="0 for a free port")
    server.add_argument("--event-store", action="store_true", help="in-memory EventStore")
    server.add_argument("--retry-ms", type=int, default=None, help="SSE retry: on each priming event")
    server.add_argument("--close-stream-after", type=int, default=None, metavar="K")
    server.add_argument("--stateless", action="store_true", help="stateless_http for the handshake era")
    server.add_argument("--json-response", action="store_true", help="JSON responses instead of SSE")
    server.add_argument("--log-level", default="warning")

    client = commands.add_parser("client", help="run the peer MCP client once; print one JSON object")
    client.add_argument("--sdk", choices=["auto", "1", "2"], default=argparse.SUPPRESS)
    client.add_argument("--url", required=True)
    client.add_argument("--mode", default="auto", help="mcp 2.x Client mode: auto, legacy or 2026-07-28")
    client.add_argument("--count", type=int, default=DEFAULT_COUNT)
    client.add_argument("--delay", type=float, default=DEFAULT_DELAY)
    client.add_argument("--a", type=int, default=2)
    client.add_argument("--b", type=int, default=3)

    args = parser.parse_args(argv)
    sdk = _resolve_sdk(args.sdk)
    if args.command == "server":
        options = ServerOptions(
            port=args.port,
            event_store=args.event_store,
            retry_ms=args.retry_ms,
            close_stream_after=args.close_stream_after,
            stateless=args.stateless,
            json_response=args.json_response,
            log_level=args.log_level,
        )
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(sdk, options))
    else:
        report = asyncio.run(run_client(sdk, args.url, args.mode, args.count, args.delay, args.a, args.b))
        print(json.dumps(report), flush=True)


# --------------------------------------------------------------------------- test helpers


@dataclass(frozen=True)
class McpServer:
    """A running ``mcp_peers.py server`` subprocess."""

    url: str
    process: subprocess.Popen[str]


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    return env


@contextlib.contextmanager
def run_mcp_server(
    *args: str,
    sdk: str = "auto",
    pythonpath: str | None = None,
    python: str = sys.executable,
    timeout: float = 20.0,
) -> Iterator[McpServer]:
    """Start the peer server on a free loopback port (extra ``args``: ``--event-store`` ...); stop it after.

    ``pythonpath`` is put first on the child's ``PYTHONPATH`` (a ``pip install --target`` folder
    holding the other SDK generation); ``python`` picks another interpreter (another venv).
    """
    cmd = [python, os.path.abspath(__file__), "--sdk", sdk, "server", "--port", "0", *args]
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=_env(pythonpath)
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        while not select.select([process.stdout], [], [], 0.05)[0]:
            if process.poll() is not None:
                raise RuntimeError(f"mcp_peers.py server exited early with code {process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"mcp_peers.py server was not ready within {timeout} s")
        line = process.stdout.readline()
        if not line.startswith("ready "):
            raise RuntimeError(f"mcp_peers.py server printed {line!r} instead of 'ready URL'")
        yield McpServer(url=line.removeprefix("ready ").strip(), process=process)
    finally:
        stop(process)


def run_mcp_client(
    url: str,
    *args: str,
    sdk: str = "auto",
    pythonpath: str | None = None,
    python: str = sys.executable,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Run the peer client once against ``url`` (extra ``args``: ``--count`` ...); its JSON report."""
    cmd = [python, os.path.abspath(__file__), "--sdk", sdk, "client", "--url", url, *args]
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=_env(pythonpath),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"mcp_peers.py client failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)


if __name__ == "__main__":
    main()
