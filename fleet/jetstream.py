"""Connecting to NATS and the stream both shippers and collectors use, made by whichever
comes first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import StorageType, StreamConfig

from tasktape.errors import Unauthorized, UsageError

from .names import shown

DUPLICATE_WINDOW = 120.0  # seconds JetStream remembers message ids for
# Seconds a first connection is tried for before its caller hears why: the client's own
# retries (for ever, as asked) would otherwise go on unseen.
FIRST_CONNECT = 5.0

# Errors of a broker that is down, slow or electing a leader: try again, later.
RETRY = (
    nats.errors.TimeoutError,
    nats.errors.NoServersError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
    OSError,
    asyncio.TimeoutError,
)


def failure(exc: BaseException) -> str:
    """Why the broker did not answer, in words: the NATS client's own messages are often
    empty, or all None."""
    if isinstance(exc, nats.js.errors.ServiceUnavailableError | nats.errors.NoRespondersError):
        return "JetStream does not answer: the broker is down, restarting, or runs without JetStream"
    text = str(exc).removeprefix("nats: ")
    if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError):
        return text if text and text != "timeout" else "no answer in time"
    return f"{type(exc).__name__}: {text}" if text and text != type(exc).__name__ else type(exc).__name__


async def connect(servers: list[str], within: float = FIRST_CONNECT) -> Any:
    """A connection that reconnects for ever (to any of ``servers``), quietly: a broker
    that is away shows in what waits, not as tracebacks. The first connection is tried
    for ``within`` seconds (then a TimeoutError, one of RETRY), or Unauthorized if the
    servers refused the credentials given."""
    # The servers' refusal of the credentials, which the client keeps to itself (retrying
    # for ever); its other errors (a connection reset in between) must not hide it.
    refusals: list[Exception] = []

    async def noted(exc: Exception) -> None:
        if refused(exc):
            refusals[:] = [exc]

    connecting = asyncio.wait_for(
        nats.connect(
            servers=servers,
            connect_timeout=2,
            reconnect_time_wait=0.25,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            error_cb=noted,
            disconnected_cb=_nothing,
            reconnected_cb=_nothing,
            closed_cb=_nothing,
        ),
        within,
    )
    try:
        return await connecting
    except TimeoutError:
        if refusals:
            said = str(refusals[0]).removeprefix("nats: ").strip("'")
            raise Unauthorized(f"{shown(servers)} refused the user and password given: {said}") from None
        raise TimeoutError(f"no connection in {within:g} s") from None


def refused(exc: Exception) -> bool:
    """Whether the servers refused the client's credentials (while it connects, the client
    gives the server's words as a plain Error)."""
    return isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower()


async def ensure_stream(js: Any, stream: str, subjects: str, servers: int) -> None:
    """The stream, made if missing: file storage, a replica per server up to three."""
    try:
        await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        config = StreamConfig(
            name=stream,
            subjects=[f"{subjects}.>"],
            num_replicas=min(3, servers),
            duplicate_window=DUPLICATE_WINDOW,
            storage=StorageType.FILE,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError as refused:
            try:
                await js.stream_info(stream)  # made meanwhile by another shipper or collector
            except nats.js.errors.NotFoundError:
                raise UsageError(
                    f"the stream {stream} cannot be made on the broker ({refused.description}): "
                    f"another stream holds its subjects, {subjects}.>?"
                ) from None


async def _nothing() -> None:
    pass


async def stream_ready(
    servers: list[str],
    stream: str,
    subjects: str,
    timeout: float,
    then: Callable[[Any], Awaitable[Any]] | None = None,
    within: float = FIRST_CONNECT,
) -> tuple[Any, Any]:
    """One try at a connection with the stream there (the connection tried for ``within``
    seconds): the connection, and its JetStream context (``timeout`` for each request), or
    what ``then`` makes of it. On an error of RETRY's the connection is closed again, and
    the error raised for the caller to wait and try again."""
    nc = None
    try:
        nc = await connect(servers, within)
        js = nc.jetstream(timeout=timeout)
        await ensure_stream(js, stream, subjects, len(servers))
        return nc, (await then(js) if then is not None else js)
    except RETRY:
        if nc is not None:
            with contextlib.suppress(*RETRY):
                await nc.close()
        raise
