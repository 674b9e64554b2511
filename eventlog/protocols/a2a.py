"""A2A v1.0 (REST and JSON-RPC bindings) and the A2A 0.3 shapes still seen in the wild.

The frame model is :mod:`tasktape.eventlog.models`, the per-event classifier
:mod:`tasktape.eventlog.classify`, the request classifier
:mod:`tasktape.eventlog.requests` and the lifecycle rules :mod:`tasktape.eventlog.rules`;
this module is what the registry knows of them. An exchange is A2A when its request is
(an A2A REST route, an A2A JSON-RPC method, the agent card, an ``A2A-Version`` header), or,
when nothing claimed the request, when its first event is an exact A2A frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ..a2a_terms import (
    CARD_PATHS,
    EMPTY_ANSWER_METHODS,
    ENDS_A_STREAM,
    STREAM_KINDS,
    V03_KINDS,
    A2AKind,
    Binding,
    is_jsonrpc,
)
from ..classify import Classification, classify, load_json
from ..requests import A2A_METHODS, READ_METHODS, classify_parsed, rest_operation
from ..rules import RULES
from ..stored_counts import stored_count
from . import a2a_rejoin
from .base import (
    CatchUp,
    Protocol,
    Regenerated,
    Request,
    RequestInfo,
    Resubscription,
    StreamReader,
    Summary,
    among,
)

if TYPE_CHECKING:
    from ..frames import Stream

THINKING = "intermediate-thinking"
_ARTIFACT_UPDATE = A2AKind.ARTIFACT_UPDATE.value  # a plain string: compared per event


class A2A(Protocol):
    name = "a2a"
    kinds = A2AKind
    regenerated: ClassVar[Regenerated] = Regenerated(keys=frozenset({"messageId", "timestamp", "$timestamp"}))
    server_ids: ClassVar[frozenset[str]] = frozenset({"id", "taskId", "contextId", "artifactId", "messageId"})
    read_operations: ClassVar[frozenset[str]] = READ_METHODS
    defaults_are_absent: ClassVar[bool] = True  # its JSON is protobuf JSON
    rules = RULES

    def claims(self, request: Request) -> bool:
        if request.header("A2A-Version") is not None:
            return True
        if request.method == "GET" and request.path.endswith(CARD_PATHS):
            return True
        if rest_operation(request.method, request.path) is not None:
            return True
        body = request.json()
        if not (
            isinstance(body, dict) and body.get("jsonrpc") == "2.0" and among(body.get("method"), A2A_METHODS)
        ):
            return False
        # tasks/get and tasks/cancel are MCP methods too: an MCP client says which it speaks.
        return request.header("MCP-Protocol-Version") is None and request.header("Mcp-Session-Id") is None

    def claims_stream(self, data: str, event_type: str | None) -> bool:
        """An exact frame (or a Task, as a whole body)."""
        try:
            obj = load_json(data) if data else None
        except (ValueError, RecursionError):
            return False
        if isinstance(obj, dict) and is_jsonrpc(obj) and set(obj) <= {"jsonrpc", "id", "result"}:
            obj = obj.get("result")
            if isinstance(obj, dict) and among(obj.get("kind"), V03_KINDS):
                return True
        if not isinstance(obj, dict):
            return False
        return (len(obj) == 1 and _frame_key(obj) is not None) or _bare_task(obj)

    def request_info(self, request: Request) -> RequestInfo:
        return classify_parsed(request.method, request.path, request.json())  # parsed once

    def path_names_operation(self, binding: str | None) -> bool:
        return binding != Binding.JSONRPC  # (REST's paths name theirs: /message:stream)

    def checked(self, info: RequestInfo, is_sse: bool, status: int | None) -> bool:
        """Streams, and the answers of successful operations: an agent card, an error the
        agent answered with, or the empty answer of an operation that returns nothing
        (``"result": null`` over JSON-RPC) has no lifecycle in it."""
        if is_sse:
            return True
        answers = info.rpc_method is not None and info.rpc_method not in EMPTY_ANSWER_METHODS
        return answers and status is not None and 200 <= status < 300

    def reader(self) -> A2AReader:
        return A2AReader()

    def ends_with_close(self, request: Request) -> bool:
        """Every stream of a task runs to a terminal or interrupted state."""
        return True

    def closes(self, data: str, event_type: str | None) -> bool:
        """The status update that ends the run: a terminal or interrupted state."""
        c = classify(data)
        return c.kind == A2AKind.STATUS_UPDATE and c.state in ENDS_A_STREAM

    def ended(self, stream: Stream) -> bool:
        """A stream that carried the status update ending its run owes nothing after it
        (what :meth:`closes` tells, read from each frame's classification)."""
        return any(
            f.complete and f.c.kind == A2AKind.STATUS_UPDATE and f.c.state in ENDS_A_STREAM
            for f in reversed(stream.frames)
        )

    def resubscription(
        self, request: Request, sent: Sequence[str], last_id: str | None
    ) -> Resubscription | None:
        """``tasks/{id}:subscribe`` (or ``SubscribeToTask``) while the task has not ended (a
        subscribe starts from a snapshot, so the agent's event ids are not needed)."""
        return a2a_rejoin.resubscription(request, sent)

    def lookup(self, request: Request, sent: Sequence[str]) -> Resubscription | None:
        """``GET /tasks/{id}`` (or ``GetTask``): a task that has ended is not subscribed to."""
        return a2a_rejoin.lookup(request, sent)

    def catch_up(self, sent: Sequence[str], first: str) -> CatchUp:
        """What the subscribe's Task snapshot holds that clients were not sent."""
        return a2a_rejoin.catch_up(sent, first)

    def delta(self, c: Classification) -> str | None:
        """Every text the stream carries (artifact deltas, status messages, messages) but a
        lastChunk that replaces the deltas: that one restates them."""
        if c.kind == _ARTIFACT_UPDATE and c.last_chunk and not c.append:
            return None
        return c.text

    def artifact_names(self, data: str, c: Classification) -> Sequence[str]:
        """An artifactUpdate's artifact, or a Task's artifacts (a GetTask, a message:send)."""
        if c.kind not in (A2AKind.TASK, A2AKind.ARTIFACT_UPDATE):
            return ()
        try:
            obj = load_json(data)
        except (ValueError, RecursionError):
            return ()
        if isinstance(obj, dict) and is_jsonrpc(obj):
            obj = obj.get("result")
        if not isinstance(obj, dict):
            return ()
        # v1.0 wraps the frame in its kind's key; 0.3 frames and a bare Task do not.
        body = obj[c.kind] if isinstance(obj.get(c.kind), dict) else obj
        artifacts = [body.get("artifact")] if c.kind == A2AKind.ARTIFACT_UPDATE else body.get("artifacts")
        if not isinstance(artifacts, list):
            return ()
        return [a["name"] for a in artifacts if isinstance(a, dict) and isinstance(a.get("name"), str)]


def _frame_key(obj: dict[str, Any]) -> str | None:
    """The one StreamResponse key of an exact v1.0 frame, holding an object."""
    (key,) = obj
    return key if key in STREAM_KINDS and isinstance(obj[key], dict) else None


def _bare_task(obj: dict[str, Any]) -> bool:
    """A Task itself, as GetTask and CancelTask answer: an id and a status with a state."""
    status = obj.get("status")
    return (
        isinstance(obj.get("id"), str) and isinstance(status, dict) and isinstance(status.get("state"), str)
    )


class A2AReader(StreamReader):
    """Task state, usage and the answer: each artifact's lastChunk, else its deltas."""

    def __init__(self) -> None:
        super().__init__()
        self._artifacts: dict[str | None, list[str]] = {}  # artifact id -> its text so far
        self._thinking: set[str | None] = set()

    def event(self, data: str, event_type: str | None) -> Classification:
        c = classify(data)
        self._read(c)
        return c

    def body(self, data: bytes | str) -> Classification:
        c = classify(data, bare_task=True)
        self._read(c)
        return c

    def _read(self, c: Classification) -> None:
        # Runs for every event: the tuple unpacked once, plain strings compared.
        kind, _, _, _, state, artifact_id, artifact_type, append, _, text, usage, _ = c
        if state:
            self.summary.finish = state
        if usage:
            self._usage(usage)
        if kind != _ARTIFACT_UPDATE:
            return
        if artifact_type == THINKING:
            self._thinking.add(artifact_id)
        texts = self._artifacts.get(artifact_id)
        if texts is None:
            self._artifacts[artifact_id] = [text or ""]
        elif append:
            texts.append(text or "")
        else:
            texts[:] = [text or ""]  # a lastChunk's consolidation (or a restart) replaces the deltas

    def _usage(self, usage: dict[str, Any]) -> None:
        """$usage is protobuf JSON: camelCase (snake_case is read too). A count the log
        cannot hold (past 64 bits) is none."""
        s = self.summary
        model = usage.get("model")
        tokens_in = stored_count(usage.get("inputTokens", usage.get("input_tokens")))
        tokens_out = stored_count(usage.get("outputTokens", usage.get("output_tokens")))
        s.model = model if isinstance(model, str) else s.model
        s.input_tokens = s.input_tokens if tokens_in is None else tokens_in
        s.output_tokens = s.output_tokens if tokens_out is None else tokens_out

    def finished(self) -> Summary:
        answer = [
            "".join(texts) for artifact, texts in self._artifacts.items() if artifact not in self._thinking
        ]
        if answer:
            self.summary.answer = "\n".join(answer)
        return self.summary
