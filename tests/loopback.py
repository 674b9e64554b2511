"""Real things on loopback for the tests that run tasktape as users do: its commands as
processes, and aiohttp apps as the agents they talk to."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from a2a_frames import completed_run, sse
from aiohttp import web
from aiohttp.test_utils import TestServer


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free loopback port: its base URL; stopped afterwards."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@contextmanager
def in_thread(app: web.Application) -> Iterator[str]:
    """``app`` on a free loopback port, served from a thread of its own (for a pytest run
    in this one, ``pytester``'s): its base URL; stopped afterwards."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = TestServer(app, host="127.0.0.1")
    asyncio.run_coroutine_threadsafe(server.start_server(), loop).result()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def upstream_app(events: int = 10, delay: float = 0.0) -> web.Application:
    """An agent answering POST /message:stream with ``events`` frames of a completed run
    (ids e1, e2, ...), ``delay`` seconds apart."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        frames = sse((completed_run() * (events // 10 + 1))[:events], ids="e")
        for frame in frames:
            await response.write(frame)
            if delay:
                await asyncio.sleep(delay)
        return response

    app = web.Application()
    app.router.add_post("/message:stream", stream)
    return app


def answering_anything(contacted: list[str]) -> web.Application:
    """An agent answering every request ``upstream``, noting each target it was asked."""

    async def anything(request: web.Request) -> web.Response:
        contacted.append(request.raw_path)
        return web.Response(text="upstream")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@dataclass
class Running:
    proc: asyncio.subprocess.Process
    url: str  # the first URL its first line printed
    printed: list[str] = field(default_factory=list)  # that line; stdout and stderr once stopped


async def _start(args: tuple[str, ...], preexec_fn: Callable[[], None] | None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tasktape",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=preexec_fn,
    )


@asynccontextmanager
async def running(*args: str, preexec_fn: Callable[[], None] | None = None) -> AsyncIterator[Running]:
    """``python -m tasktape ARGS``, once it printed where it serves; killed if still running."""
    proc = await _start(args, preexec_fn)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        found = re.search(r"(http://[^\s/]+:\d+)", line)
        assert found, line + (await proc.stderr.read()).decode()
        yield Running(proc, found.group(1), [line])
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stop(run: Running, sig: signal.Signals = signal.SIGTERM) -> int:
    """``sig`` (SIGTERM, or Ctrl-C's SIGINT); its exit status (what it printed goes to
    ``run.printed``)."""
    run.proc.send_signal(sig)
    out, err = await asyncio.wait_for(run.proc.communicate(), 60)
    run.printed += [out.decode(), err.decode()]
    assert run.proc.returncode is not None
    return run.proc.returncode


async def finished(*args: str) -> tuple[int, str]:
    """``python -m tasktape ARGS`` run to its end (a refusal, an error): status and stderr."""
    proc = await _start(args, None)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:  # (it did not end: it is not left running)
            proc.kill()
            await proc.wait()
    return proc.returncode, err.decode()


RawAnswer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_upstream(answer: RawAnswer) -> AsyncIterator[str]:
    """An upstream that answers each connection with ``answer``, on raw sockets: its URL
    (for answers aiohttp's own server would not send)."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def answering(sent: bytes) -> RawAnswer:
    """A raw answer to any request: once its head is read, ``sent``, then the connection closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(sent)
        await writer.drain()
        writer.close()

    return answer
