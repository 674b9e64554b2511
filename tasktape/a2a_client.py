"""A small A2A v1.0 client on aiohttp, for the demo: it reads the agent card, then speaks
the REST or the JSON-RPC binding at the URL the card lists, as real clients do."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tasktape.errors import A2AClientError
from tasktape.eventlog import SSEDecoder

from .agent.ids import new_id

PROTOCOLS = {"rest": "HTTP+JSON", "jsonrpc": "JSONRPC"}
HEADERS = {"A2A-Version": "1.0"}


@dataclass
class StreamResult:
    """What one streamed call gave: the events (JSON-RPC envelopes removed), the exact
    bytes, timings, and the error that cut it short, if any."""

    events: list[dict[str, Any]] = field(default_factory=list)
    raw: bytes = b""
    first_event_s: float | None = None
    duration_s: float = 0.0
    error: str | None = None

    @property
    def task_id(self) -> str | None:
        for event in self.events:
            body = next(iter(event.values()))
            if isinstance(body, dict):
                return body.get("id") if "task" in event else body.get("taskId")
        return None

    @property
    def final_state(self) -> str | None:
        states = [s for e in self.events if (s := next(iter(e.values())).get("status", {}).get("state"))]
        return states[-1] if states else None


class A2AClient:
    def __init__(self, session: aiohttp.ClientSession, url: str, binding: str) -> None:
        self.session, self.url, self.binding = session, url.rstrip("/"), binding
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, session: aiohttp.ClientSession, base_url: str, binding: str) -> A2AClient:
        """Read the agent card at ``base_url`` and use the interface it lists for ``binding``."""
        async with session.get(f"{base_url.rstrip('/')}/.well-known/agent-card.json") as response:
            card = await response.json(content_type=None)
        for interface in card.get("supportedInterfaces", []):
            if interface.get("protocolBinding") == PROTOCOLS[binding]:
                return cls(session, interface["url"], binding)
        raise A2AClientError(f"the agent card at {base_url} lists no {PROTOCOLS[binding]} interface")

    def _message(self, text: str, task_id: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {"messageId": new_id("msg"), "role": "ROLE_USER", "parts": [{"text": text}]}
        if task_id:
            message["taskId"] = task_id
        return {"message": message}

    def _rpc(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}

    async def stream(
        self,
        text: str,
        *,
        task_id: str | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> StreamResult:
        """Send a streaming message; read the stream to its end (or until it breaks)."""
        params = self._message(text, task_id)
        if self.binding == "rest":
            url, body = f"{self.url}/message:stream", params
        else:
            url, body = self.url, self._rpc("SendStreamingMessage", params)
        result = StreamResult()
        decoder = SSEDecoder()
        start = time.perf_counter()
        try:
            async with self.session.post(
                url, json=body, headers={**HEADERS, "Accept": "text/event-stream"}
            ) as r:
                async for data in r.content.iter_any():
                    result.raw += data
                    for event in decoder.feed(data):
                        if result.first_event_s is None:
                            result.first_event_s = time.perf_counter() - start
                        frame = json.loads(event.data)
                        frame = frame.get("result", frame) if self.binding == "jsonrpc" else frame
                        result.events.append(frame)
                        if on_event is not None:
                            on_event(frame)
        except aiohttp.ClientError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.duration_s = time.perf_counter() - start
        return result

    async def _call(
        self, rest: tuple[str, str, dict[str, Any] | None], method: str, params: dict[str, Any]
    ) -> Any:
        if self.binding == "rest":
            verb, path, body = rest
            async with self.session.request(verb, f"{self.url}{path}", json=body, headers=HEADERS) as r:
                reply = await r.json(content_type=None)
                if r.status >= 400:
                    raise A2AClientError(reply.get("error", {}).get("message", f"HTTP {r.status}"))
                return reply
        async with self.session.post(self.url, json=self._rpc(method, params), headers=HEADERS) as r:
            reply = await r.json(content_type=None)
        if "error" in reply:
            raise A2AClientError(reply["error"].get("message", "JSON-RPC error"))
        return reply["result"]

    async def send(self, text: str) -> dict[str, Any]:
        """Send a message without streaming; the answer comes once the task settles."""
        params = self._message(text, None)
        return await self._call(("POST", "/message:send", params), "SendMessage", params)

    async def get_task(self, task_id: str) -> dict[str, Any]:
        return await self._call(("GET", f"/tasks/{task_id}", None), "GetTask", {"id": task_id})

    async def cancel(self, task_id: str) -> dict[str, Any]:
        return await self._call(("POST", f"/tasks/{task_id}:cancel", None), "CancelTask", {"id": task_id})
