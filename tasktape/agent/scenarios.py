"""What the demo agent does with a message, chosen by words in its text.

| word in the message | scenario | the stream ends on |
|---|---|---|
| (none of these) | completed: thinking, a cited answer as token deltas, usage | COMPLETED |
| input | the agent needs more input (reply with the task id to resume) | INPUT_REQUIRED |
| auth | a connector needs authentication | AUTH_REQUIRED (REST: FAILED) |
| fail | an error while working, explained in the status message | FAILED |
| reject | rejected before any work (insufficient credits) | REJECTED (REST: FAILED) |
| cancel | a slow answer that waits after its first words for tasks/{id}:cancel | CANCELED |
| long | an answer of 400 token deltas | COMPLETED |
| drop | the stream's connection drops mid-answer; the task still completes | (cut off) |
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from enum import StrEnum

from .ids import new_id
from .tasks import TaskRun

MODEL = "tasktape-demo-1"
THINK_DELAY = 0.3  # seconds before the first token
TOKEN_DELAY = 0.03  # seconds between token deltas
SLOWEST_CANCELABLE_PACE = 0.1  # the cancel scenario's pace, whatever --pace says
CANCEL_WAIT = 30.0  # seconds the cancel scenario waits after its first words, for its cancel


class Scenario(StrEnum):
    COMPLETED = "completed"
    INPUT_REQUIRED = "input"
    AUTH_REQUIRED = "auth"
    FAILED = "fail"
    REJECTED = "reject"
    CANCELED = "cancel"
    LONG = "long"
    DROPPED = "drop"


def choose(text: str) -> Scenario:
    words = set(re.findall(r"[a-z]+", text.lower()))
    for scenario in Scenario:
        if scenario is not Scenario.COMPLETED and any(w.startswith(scenario.value) for w in words):
            return scenario
    return Scenario.COMPLETED


def tokens(text: str) -> list[str]:
    """Words with their leading space: how a model streams text."""
    return re.findall(r"\s*\S+", text)


async def stream_artifact(
    run: TaskRun,
    text: str,
    *,
    name: str,
    kind: str | None = None,
    delay: float = TOKEN_DELAY,
    closing: dict | None = None,
    wait_after_first: float = 0.0,
) -> int:
    """Token deltas (append false, then true), closed by a lastChunk consolidation;
    ``closing`` replaces the consolidated artifact's parts (citations, data parts); with
    ``wait_after_first``, that long a pause after the first delta."""
    artifact_id = new_id("art")
    meta = {"metadata": {"type": kind}} if kind else {}
    pieces = tokens(text)
    for i, piece in enumerate(pieces):
        await run.pause(wait_after_first if i == 1 and wait_after_first else delay)
        run.artifact_update(
            {"artifactId": artifact_id, "name": name, "parts": [{"text": piece}], **meta}, append=i > 0
        )
    parts = closing or [{"text": text}]
    run.artifact_update({"artifactId": artifact_id, "name": name, "parts": parts, **meta}, last_chunk=True)
    return len(pieces)


async def think(run: TaskRun, topic: str) -> int:
    """The narration before the answer, closed as an intermediate-thinking artifact."""
    await run.pause(THINK_DELAY)
    return await stream_artifact(
        run, f"Looking up {topic} in the knowledge base.", name="thinking", kind="intermediate-thinking"
    )


def cited_answer(topic: str, body: str) -> tuple[str, list[dict]]:
    """An answer citing one data part, in the hosted API's shape: the text part's
    metadata holds ``citations`` (data_part_id, offset, locator); the data part is a
    sibling carrying ``metadata.dataPartId``."""
    part_id = new_id("gid")
    text = f"About {topic}: {body} [1]"
    data = {"source": "demo knowledge base", "topic": topic, "confidence": 0.92}
    return text, [
        {
            "text": text,
            "metadata": {
                "citations": [{"data_part_id": part_id, "offset": text.index("[1]"), "locator": "/results/0"}]
            },
        },
        {"data": data, "metadata": {"dataPartId": part_id}},
    ]


def usage(prompt: str, output_tokens: int, *, contexts_seen: int) -> dict:
    input_tokens = 60 + 2 * len(tokens(prompt))
    cached = input_tokens // 2 if contexts_seen > 1 else 0
    total = input_tokens + output_tokens
    return {
        "$usage": {
            "model": MODEL,
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "cachedInputTokens": cached,
            "cacheCreationInputTokens": 0 if cached else input_tokens,
            "totalTokens": total,
            "credits": round(total * 0.01, 2),
        }
    }


def topic_of(text: str) -> str:
    words = [w for w in re.findall(r"[A-Za-z0-9.]+", text) if w.lower() not in {s.value for s in Scenario}]
    return " ".join(words[:6]) or "your question"


Script = Callable[[TaskRun, str], Awaitable[None]]


def script_for(scenario: Scenario, contexts_seen: int) -> Script:
    async def completed(
        run: TaskRun,
        text: str,
        *,
        body: str = "the answer is assembled from the sources "
        "found and summarised here in a few short sentences for the demo.",
        delay: float = TOKEN_DELAY,
        wait_after_first: float = 0.0,
    ) -> None:
        topic = topic_of(text)
        run.set_status("TASK_STATE_WORKING")
        spent = await think(run, topic)
        answer, parts = cited_answer(topic, body)
        spent += await stream_artifact(
            run, answer, name="answer", delay=delay, closing=parts, wait_after_first=wait_after_first
        )
        run.set_status("TASK_STATE_COMPLETED", metadata=usage(text, spent, contexts_seen=contexts_seen))

    async def interrupted(run: TaskRun, text: str) -> None:
        run.set_status("TASK_STATE_WORKING")
        await think(run, topic_of(text))
        if scenario is Scenario.INPUT_REQUIRED:
            run.set_status(
                "TASK_STATE_INPUT_REQUIRED",
                message="Which record should I use? Reply on this task with its number.",
            )
        elif scenario is Scenario.AUTH_REQUIRED:
            run.set_status(
                "TASK_STATE_AUTH_REQUIRED",
                message="The records connector needs authentication before I can continue.",
            )
        else:
            run.set_status(
                "TASK_STATE_FAILED",
                message="The knowledge base connector timed out after 30 s; nothing was answered.",
            )

    async def rejected(run: TaskRun, text: str) -> None:
        await run.pause(0.05)
        run.set_status("TASK_STATE_REJECTED", message="Rejected: this demo account has insufficient credits.")

    async def slow(run: TaskRun, text: str) -> None:
        # This answer is there to be canceled: after its first words it waits for the
        # cancel (never less than a tenth of CANCEL_WAIT, whatever the pace), so a client
        # that cancels on seeing them always cancels it there, and two runs agree.
        run.pace = max(run.pace, SLOWEST_CANCELABLE_PACE)
        body = " ".join(["a slow answer that keeps streaming until it is canceled,"] * 20)
        await completed(run, text, body=body, delay=0.1, wait_after_first=CANCEL_WAIT)

    async def long(run: TaskRun, text: str) -> None:
        body = " ".join(f"token{i}" for i in range(400))
        await completed(run, text, body=body, delay=0.01)

    async def dropped(run: TaskRun, text: str) -> None:
        run.drop_after = 8  # the first stream is cut after its eighth event
        await completed(run, text)

    return {
        Scenario.COMPLETED: completed,
        Scenario.INPUT_REQUIRED: interrupted,
        Scenario.AUTH_REQUIRED: interrupted,
        Scenario.FAILED: interrupted,
        Scenario.REJECTED: rejected,
        Scenario.CANCELED: slow,
        Scenario.LONG: long,
        Scenario.DROPPED: dropped,
    }[scenario]
