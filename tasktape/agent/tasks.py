"""Tasks of the demo agent: their state, the events they emitted, and live fan-out to
every stream watching them (the original ``message:stream`` and any subscribers)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from tasktape.choices import time_scale
from tasktape.errors import NotCancelable, UsageError
from tasktape.eventlog.a2a_terms import INTERRUPTED_STATES as INTERRUPTED
from tasktape.eventlog.a2a_terms import TERMINAL_STATES as TERMINAL

from .ids import new_id
from .protocol import message_text

Frame = dict[str, Any]
Event = tuple[str, Frame]  # (SSE id, StreamResponse)

# The ended tasks (in a terminal state) the agent keeps, for GetTask, ListTasks and
# subscribes; beyond it, the earliest to end are forgotten. Each holds all it emitted (tens
# of kB): kept for good, they grew a long-running agent without bound.
KEPT_ENDED = 1000


def check_pace(value: float) -> float:
    """``value`` as the agent's pace, the factor of every delay: 0 (none) or a finite number
    above it (a NaN or infinite delay never ends, and no task with it would)."""
    return time_scale(value, "pace")


def check_kept(value: int) -> int:
    """``value`` as how many ended tasks the agent keeps: 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"the ended tasks kept are 0 or more, not {value!r}")
    return value


def timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def text_message(role: str, text: str, *, task_id: str, context_id: str) -> Frame:
    return {
        "messageId": new_id("msg"),
        "contextId": context_id,
        "taskId": task_id,
        "role": role,
        "parts": [{"text": text}],
    }


class TaskRun:
    """One task: everything it emitted, and the streams watching it."""

    def __init__(self, context_id: str, pace: float) -> None:
        self.id = new_id("task")
        self.context_id = context_id
        self.pace = pace
        self.state = "TASK_STATE_SUBMITTED"
        self.updated = datetime.now(UTC)  # when the status last changed: its timestamp, the list order
        self.status_message: Frame | None = None
        self.history: list[Frame] = []
        self.artifacts: dict[str, Frame] = {}
        self.metadata: dict[str, Any] = {}
        self.events: list[Event] = []
        self.watchers: set[asyncio.Queue[Event | None]] = set()
        self.drop_after: int | None = None  # the "drop" scenario cuts its stream here
        self.on_ended: Callable[[TaskRun], None] | None = None  # told once it reaches a terminal state
        self._runner: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # terminal or interrupted

    # -- what the agent does -----------------------------------------------------------------

    def start(self, message: Frame, script: Callable[[TaskRun, str], Awaitable[None]]) -> None:
        """Run ``script`` for this user message (a first message, or input that resumes
        an interrupted task)."""
        message = {**message, "taskId": self.id, "contextId": self.context_id}
        self.history.append(message)
        self._settled.clear()
        self._runner = asyncio.get_running_loop().create_task(self._run(script, message_text(message)))

    @property
    def takes_input(self) -> bool:
        """Whether a message may resume it: it is interrupted, and no run is under way. A
        resume starts a run at once, though the run's WORKING comes at its first step: a
        second resume in between must not start another (both answered, history doubled)."""
        return self.state in INTERRUPTED and (self._runner is None or self._runner.done())

    async def _run(self, script: Callable[[TaskRun, str], Awaitable[None]], text: str) -> None:
        try:
            await script(self, text)
        finally:
            self._settle()

    async def pause(self, seconds: float) -> None:
        if self.pace:
            await asyncio.sleep(seconds * self.pace)

    def emit(self, frame: Frame) -> None:
        event = (new_id("evt"), frame)
        self.events.append(event)
        for watcher in self.watchers:
            watcher.put_nowait(event)

    def snapshot_event(self) -> None:
        self.emit({"task": self.snapshot()})

    def set_status(
        self, state: str, *, message: str | None = None, metadata: dict[str, Any] | None = None
    ) -> None:
        ends = state in TERMINAL and self.state not in TERMINAL
        self.state = state
        self.updated = datetime.now(UTC)
        self.status_message = (
            text_message("ROLE_AGENT", message, task_id=self.id, context_id=self.context_id)
            if message
            else None
        )
        if self.status_message:
            self.history.append(self.status_message)
        if metadata:
            self.metadata.update(metadata)
        body: Frame = {"taskId": self.id, "contextId": self.context_id, "status": self._status()}
        if metadata:
            body["metadata"] = metadata
        self.emit({"statusUpdate": body})
        if state in TERMINAL or state in INTERRUPTED:
            self._settle()
        if ends and self.on_ended is not None:
            self.on_ended(self)

    def artifact_update(self, artifact: Frame, *, append: bool = False, last_chunk: bool = False) -> None:
        body: Frame = {"taskId": self.id, "contextId": self.context_id, "artifact": artifact}
        # Protobuf JSON leaves false out, as the hosted API does.
        if append:
            body["append"] = True
        if last_chunk:
            body["lastChunk"] = True
        # The task holds its artifacts as they grow, as the SDK's task manager does: a
        # subscriber's snapshot carries the text streamed so far.
        held = self.artifacts.get(artifact["artifactId"])
        if append and held is not None:
            artifact = {**held, "parts": [*held.get("parts", []), *artifact.get("parts", [])]}
        self.artifacts[artifact["artifactId"]] = artifact
        self.emit({"artifactUpdate": body})

    def cancel(self) -> None:
        if self.state in TERMINAL:
            raise NotCancelable(f"task {self.id} is {self.state}: a terminal task cannot be canceled")
        if self._runner is not None:
            self._runner.cancel()
        self.set_status("TASK_STATE_CANCELED", message="Canceled at the client's request.")

    # -- what clients see --------------------------------------------------------------------

    def _status(self) -> Frame:
        status: Frame = {"state": self.state, "timestamp": timestamp(self.updated)}
        if self.status_message:
            status["message"] = self.status_message
        return status

    def snapshot(self, *, history_length: int | None = None, artifacts: bool = True) -> Frame:
        """The task as clients see it; ``history_length``: at most that many of the most
        recent messages (0: no ``history`` at all); ``artifacts``: False leaves them out."""
        task: Frame = {"id": self.id, "contextId": self.context_id, "status": self._status()}
        if history_length is None:
            task["history"] = list(self.history)
        elif history_length:
            task["history"] = self.history[-history_length:]
        if self.artifacts and artifacts:
            task["artifacts"] = list(self.artifacts.values())
        if self.metadata:
            task["metadata"] = dict(self.metadata)
        return task

    def watch(self) -> asyncio.Queue[Event | None]:
        """A queue of the events from now on, ending with None once the task settles."""
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        if self._settled.is_set():
            queue.put_nowait(None)
        else:
            self.watchers.add(queue)
        return queue

    def unwatch(self, queue: asyncio.Queue[Event | None]) -> None:
        self.watchers.discard(queue)

    async def settled(self) -> None:
        await self._settled.wait()

    def _settle(self) -> None:
        if self._settled.is_set():
            return
        self._settled.set()
        for watcher in self.watchers:
            watcher.put_nowait(None)
        self.watchers.clear()

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner


class TaskStore:
    """The tasks the agent knows: every one still running or interrupted, and the last
    ``kept_ended`` to end (the earlier ones are forgotten, as if never made)."""

    def __init__(self, pace: float, kept_ended: int = KEPT_ENDED) -> None:
        self.pace = check_pace(pace)
        self.kept_ended = check_kept(kept_ended)
        self.tasks: dict[str, TaskRun] = {}
        self.contexts: dict[str, list[str]] = {}
        self._ended: dict[str, None] = {}  # the ended tasks' ids, the earliest to end first

    def new(self, context_id: str | None) -> TaskRun:
        run = TaskRun(context_id or new_id("ctx"), self.pace)
        run.on_ended = self._ended_one
        self.tasks[run.id] = run
        self.contexts.setdefault(run.context_id, []).append(run.id)
        return run

    def _ended_one(self, run: TaskRun) -> None:
        self._ended[run.id] = None
        while len(self._ended) > self.kept_ended:
            self._forget(next(iter(self._ended)))

    def _forget(self, task_id: str) -> None:
        del self._ended[task_id]
        run = self.tasks.pop(task_id)
        siblings = self.contexts[run.context_id]
        siblings.remove(task_id)
        if not siblings:
            del self.contexts[run.context_id]

    def get(self, task_id: str) -> TaskRun | None:
        return self.tasks.get(task_id)

    async def close(self) -> None:
        # (A copy: a task that ends while another stops is forgotten, out of self.tasks.)
        for run in list(self.tasks.values()):
            await run.stop()
