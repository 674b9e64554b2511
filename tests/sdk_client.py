"""Thin async helpers around the official ``a2a-sdk`` (1.x) client, returning plain dicts.

Every call resolves the agent card from ``base_url`` (``<base_url>/.well-known/agent-card.json``),
builds a fresh SDK client, makes one call and closes the client again. Results are protobuf
messages converted with ``google.protobuf.json_format.MessageToDict`` -- camelCase keys and enum
names (``"TASK_STATE_COMPLETED"``), the same shape as the A2A JSON wire format. Stream events are
``StreamResponse`` dicts with exactly one of ``task``, ``message``, ``statusUpdate`` or
``artifactUpdate``.

Binding selection: the SDK picks a transport by matching the card's ``supportedInterfaces``
(``protocolBinding``) against ``ClientConfig.supported_protocol_bindings``. We pass exactly one
binding -- ``"HTTP+JSON"`` for ``binding="rest"``, ``"JSONRPC"`` for ``binding="jsonrpc"`` -- with
``use_client_preference=True``, so the client uses that interface or fails with
``ValueError('no compatible transports found.')``. The request goes to the URL the card lists for
that interface, not to ``base_url``; only the card itself is fetched from ``base_url``.

The SDK adds the header ``A2A-Version: 1.0`` to every request (the server treats a missing header
as protocol 0.3 and rejects 1.0 methods).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
)
from a2a.utils.constants import TransportProtocol
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

Binding = Literal["rest", "jsonrpc"]
Event = dict[str, Any]
OnEvent = Callable[[Event], None]

_PROTOCOL: dict[str, str] = {
    "rest": TransportProtocol.HTTP_JSON.value,
    "jsonrpc": TransportProtocol.JSONRPC.value,
}
TIMEOUT = 30.0


def to_dict(message: ProtoMessage) -> Event:
    """A protobuf message as a JSON-shaped dict (camelCase keys, enum names)."""
    return MessageToDict(message)


@contextlib.asynccontextmanager
async def sdk_client(
    base_url: str, binding: Binding = "rest", *, streaming: bool = True
) -> AsyncIterator[Client]:
    """An SDK client for the agent at ``base_url`` that only speaks ``binding``."""
    if binding not in _PROTOCOL:
        raise ValueError(f"unknown binding {binding!r}; expected 'rest' or 'jsonrpc'")
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        card = await A2ACardResolver(http, base_url).get_agent_card()
        config = ClientConfig(
            streaming=streaming,
            httpx_client=http,  # shared: closed by the ``async with`` above, not by the SDK client
            supported_protocol_bindings=[_PROTOCOL[binding]],
            use_client_preference=True,
        )
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()


def _request(text: str, task_id: str | None = None) -> SendMessageRequest:
    message = new_text_message(text, role=Role.ROLE_USER)
    if task_id:
        message.task_id = task_id  # input for a task that asked for it
    return SendMessageRequest(message=message)


async def _collect(stream: AsyncIterator[StreamResponse], on_event: OnEvent | None) -> list[Event]:
    events: list[Event] = []
    async for response in stream:
        event = to_dict(response)
        events.append(event)
        if on_event is not None:
            on_event(event)
    return events


async def stream_message(
    base_url: str,
    text: str,
    binding: Binding = "rest",
    on_event: OnEvent | None = None,
    task_id: str | None = None,
) -> list[Event]:
    """Send ``text`` as a streaming message; return every ``StreamResponse`` (as a dict) until the end.

    ``on_event`` is called with each event as it arrives (e.g. to grab the task id mid-stream).
    """
    async with sdk_client(base_url, binding) as client:
        return await _collect(client.send_message(_request(text, task_id)), on_event)


async def send_message(base_url: str, text: str, binding: Binding = "rest") -> Event:
    """Send ``text`` without streaming; return the ``StreamResponse`` dict (``{"task": ...}``).

    The server answers ``message:send`` / ``SendMessage`` only once the task is terminal or
    interrupted; the SDK wraps the ``SendMessageResponse`` into a single ``StreamResponse``.
    """
    async with sdk_client(base_url, binding, streaming=False) as client:
        events = [to_dict(response) async for response in client.send_message(_request(text))]
    if len(events) != 1:
        raise AssertionError(f"expected one response to a non-streaming send, got {events!r}")
    return events[0]


async def get_task(base_url: str, task_id: str, binding: Binding = "rest") -> Event:
    """The task ``task_id`` as a dict."""
    async with sdk_client(base_url, binding) as client:
        return to_dict(await client.get_task(GetTaskRequest(id=task_id)))


async def cancel_task(base_url: str, task_id: str, binding: Binding = "rest") -> Event:
    """Cancel ``task_id``; return the task the server answers with (as a dict)."""
    async with sdk_client(base_url, binding) as client:
        return to_dict(await client.cancel_task(CancelTaskRequest(id=task_id)))


async def subscribe(
    base_url: str, task_id: str, binding: Binding = "rest", on_event: OnEvent | None = None
) -> list[Event]:
    """Re-subscribe to a running task; return its events (the current Task snapshot comes first)."""
    async with sdk_client(base_url, binding) as client:
        return await _collect(client.subscribe(SubscribeToTaskRequest(id=task_id)), on_event)
