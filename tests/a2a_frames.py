"""Builders for A2A v1.0 stream frames and SSE bytes, shaped like the lifecycle document."""

from __future__ import annotations

import json
from typing import Any

USAGE = {
    "model": "corti-default",
    "inputTokens": 100,
    "outputTokens": 20,
    "cachedInputTokens": 64,
    "cacheCreationInputTokens": 0,
    "totalTokens": 120,
    "credits": 1.2,
}


def task(task_id: str, ctx: str, state: str = "TASK_STATE_WORKING") -> dict[str, Any]:
    return {"task": {"id": task_id, "contextId": ctx, "status": {"state": state}}}


def status(task_id: str, ctx: str, state: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"taskId": task_id, "contextId": ctx, "status": {"state": state}}
    if usage:
        body["metadata"] = {"$usage": usage}
    return {"statusUpdate": body}


def artifact(
    task_id: str,
    ctx: str,
    art_id: str,
    text: str,
    *,
    append: bool = False,
    last_chunk: bool = False,
    kind: str | None = None,
) -> dict[str, Any]:
    art: dict[str, Any] = {"artifactId": art_id, "parts": [{"text": text}]}
    if kind:
        art["metadata"] = {"type": kind}
    body: dict[str, Any] = {"taskId": task_id, "contextId": ctx, "artifact": art}
    if append:
        body["append"] = True
    if last_chunk:
        body["lastChunk"] = True
    return {"artifactUpdate": body}


def streamed(
    task_id: str, ctx: str, art_id: str, tokens: list[str], kind: str | None = None, close: bool = True
) -> list[dict[str, Any]]:
    """Token deltas (first append false, then true), closed by a lastChunk consolidation."""
    frames = [artifact(task_id, ctx, art_id, t, append=i > 0, kind=kind) for i, t in enumerate(tokens)]
    if close:
        frames.append(artifact(task_id, ctx, art_id, "".join(tokens), last_chunk=True, kind=kind))
    return frames


def completed_run(task_id: str = "task.1", ctx: str = "ctx.1") -> list[dict[str, Any]]:
    return [
        task(task_id, ctx),
        status(task_id, ctx, "TASK_STATE_WORKING"),
        *streamed(task_id, ctx, "art.think", ["Looking ", "it up."], kind="intermediate-thinking"),
        *streamed(task_id, ctx, "art.answer", ["J45.909", " — mild", " intermittent asthma."]),
        status(task_id, ctx, "TASK_STATE_COMPLETED", usage=USAGE),
    ]


def sse(
    frames: list[dict[str, Any]], *, ids: str | None = None, jsonrpc_id: int | None = None, start: int = 1
) -> list[bytes]:
    """One SSE event per frame (compact JSON, LF line ends), optionally with ``id:`` lines."""
    out = []
    for n, frame in enumerate(frames, start):
        body = frame if jsonrpc_id is None else {"jsonrpc": "2.0", "id": jsonrpc_id, "result": frame}
        head = f"id: {ids}{n}\n" if ids is not None else ""
        out.append(f"{head}data: {json.dumps(body, separators=(',', ':'), ensure_ascii=False)}\n\n".encode())
    return out
