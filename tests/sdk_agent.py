"""An echo agent built on the official ``a2a-sdk`` (1.x), used as a real upstream in tests.

Run as a script::

    python tests/sdk_agent.py --port N [--public-url URL]

It serves on ``127.0.0.1:N``:

* the HTTP+JSON (REST) binding at the root: ``POST /message:send``, ``POST /message:stream``,
  ``GET /tasks/{id}``, ``POST /tasks/{id}:cancel``, ``GET|POST /tasks/{id}:subscribe`` (plus the
  SDK's other REST routes and their ``/{tenant}/...`` twins);
* the JSON-RPC binding at ``POST /`` (no conflict with REST: every REST route has a longer path);
* the agent card at ``GET /.well-known/agent-card.json``, listing one ``HTTP+JSON`` and one
  ``JSONRPC`` interface (protocol version 1.0), both with URL ``--public-url`` (default
  ``http://127.0.0.1:N``). The SDK client dials exactly those URLs, so a proxy in front of the
  agent passes its own address as ``--public-url``.

It prints ``ready`` (flushed) once the server accepts connections.

Executor behaviour for a user message with text ``T``:

1. enqueue the Task (``TASK_STATE_SUBMITTED``, the user message in its history);
2. status update ``TASK_STATE_WORKING``;
3. if ``T`` contains ``input``: status update ``TASK_STATE_INPUT_REQUIRED`` and stop;
4. otherwise the artifact ``answer`` as deltas ``"Echo: "`` (append false), ``T``, ``" -- "``,
   ``"done."`` (append true), then one ``lastChunk=true`` update (append false) carrying the
   full text ``"Echo: T -- done."``;
5. status update ``TASK_STATE_COMPLETED``.

If ``T`` contains ``slow`` the executor sleeps 0.2 s before each event after the Task, so a
cancel or a subscribe can land mid-stream. Cancelling a running task publishes
``TASK_STATE_CANCELED`` from ``AgentExecutor.cancel``.

``run_sdk_agent()`` starts the script as a subprocess on a free loopback port and stops it on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import uvicorn
from a2a.helpers import new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol
from ports import free_port
from processes import stop
from starlette.applications import Starlette

SLOW_DELAY = 0.2
ARTIFACT_NAME = "answer"
CARD_PATH = "/.well-known/agent-card.json"
JSONRPC_PATH = "/"


def echo_chunks(text: str) -> list[str]:
    """The artifact deltas the agent streams for ``text`` (the final chunk is their concatenation)."""
    return ["Echo: ", text, " -- ", "done."]


# --------------------------------------------------------------------------- the agent (server side)


@dataclass
class _Run:
    """Per-task state shared by ``execute`` and ``cancel``."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    cancelled: bool = False


class EchoExecutor(AgentExecutor):
    """The echo behaviour described in the module docstring, built on ``TaskUpdater``."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        text = context.get_user_input()
        slow = "slow" in text
        run = self._runs.setdefault(context.task_id, _Run())
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)

        async def emit(publish: Callable[[], Awaitable[None]]) -> bool:
            """Publish one event unless the task was cancelled; False means stop."""
            if slow:
                await asyncio.sleep(SLOW_DELAY)
            async with run.lock:
                if run.cancelled:
                    return False
                await publish()
                return True

        try:
            if context.current_task is None:
                await event_queue.enqueue_event(new_task_from_user_message(context.message))
            if not await emit(updater.start_work):
                return
            if "input" in text:
                await emit(updater.requires_input)
                return
            artifact_id = f"{context.task_id}-answer"
            chunks = echo_chunks(text)
            for i, chunk in enumerate(chunks):
                ok = await emit(
                    lambda chunk=chunk, i=i: updater.add_artifact(
                        [new_text_part(chunk)], artifact_id=artifact_id, name=ARTIFACT_NAME, append=i > 0
                    )
                )
                if not ok:
                    return
            full = "".join(chunks)
            ok = await emit(
                lambda: updater.add_artifact(
                    [new_text_part(full)],
                    artifact_id=artifact_id,
                    name=ARTIFACT_NAME,
                    append=False,
                    last_chunk=True,
                )
            )
            if ok:
                await emit(updater.complete)
        finally:
            self._runs.pop(context.task_id, None)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        run = self._runs.get(context.task_id)
        if run is None:
            # Not running here (e.g. parked in INPUT_REQUIRED): still publish the terminal state.
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()
            return
        async with run.lock:
            run.cancelled = True
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def _build_app(port: int, public_url: str | None) -> Starlette:
    base = (public_url or f"http://127.0.0.1:{port}").rstrip("/")
    card = AgentCard(
        name="sdk-echo",
        description="Echo agent built on the official a2a-sdk (test fixture).",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=base,
                protocol_binding=TransportProtocol.HTTP_JSON.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            ),
            AgentInterface(
                url=base + JSONRPC_PATH.rstrip("/"),
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            ),
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="echo",
                name="echo",
                description="Echoes the text; 'slow' paces events, 'input' asks for input.",
                tags=["test"],
            )
        ],
    )
    handler = DefaultRequestHandler(
        agent_executor=EchoExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await handler.aclose()

    routes = [
        *create_agent_card_routes(card),
        # JSON-RPC first: Starlette takes the first full match, and the REST ``/{tenant}`` mount
        # must never get a chance at ``POST /``.
        *create_jsonrpc_routes(handler, rpc_url=JSONRPC_PATH),
        *create_rest_routes(handler),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def _serve(port: int, public_url: str | None) -> None:
    app = _build_app(port, public_url)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # re-raise the startup failure
            raise SystemExit(1)
        await asyncio.sleep(0.01)
    print("ready", flush=True)
    await serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--public-url", default=None)
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.public_url))


# --------------------------------------------------------------------------- test helper (client side)


@dataclass(frozen=True)
class SdkAgent:
    """A running ``sdk_agent.py`` subprocess."""

    url: str
    port: int
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def run_sdk_agent(public_url: str | None = None, timeout: float = 20.0) -> Iterator[SdkAgent]:
    """Start the echo agent on a free loopback port; yield it once its card is served; stop it after.

    Usable as ``with run_sdk_agent() as agent:`` in a test or inside a pytest fixture. The process is
    terminated with SIGTERM (SIGKILL after 5 s) and reaped on exit, also when the body raises.
    """
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--port", str(port)]
    if public_url is not None:
        cmd += ["--public-url", public_url]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    agent = SdkAgent(url=f"http://127.0.0.1:{port}", port=port, process=process)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"sdk_agent.py exited early with code {process.returncode}")
            try:
                with urllib.request.urlopen(agent.url + CARD_PATH, timeout=1.0) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"sdk_agent.py did not serve its card within {timeout} s")
            time.sleep(0.05)
        yield agent
    finally:
        stop(process)


if __name__ == "__main__":
    main()
