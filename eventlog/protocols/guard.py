"""A plug-in protocol with every hook guarded: recording must never fail because of a
third party's code. A hook that raises is logged (the first time it does) and costs only
what it would have told: a claim, a request's index, an event's classification, a
summary, a rule's findings. The built-in protocols are not wrapped: their hooks are
tested not to raise, and the writer calls them for every event."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..classify import Classification
from .base import CatchUp, Protocol, Request, RequestInfo, Resubscription, StreamReader, Summary

if TYPE_CHECKING:
    from ..frames import Stream
    from ..jsonrpc_ids import Edit
    from ..spans import Chunks, StreamEvent

log = logging.getLogger("tasktape")
T = TypeVar("T")


class Guarded(Protocol):
    """``inner``, its hooks guarded."""

    def __init__(self, inner: Protocol) -> None:
        self.inner = inner
        self._told: set[str] = set()  # the hooks whose failure was logged
        self.name = inner.name  # type: ignore[misc]
        self.kinds = inner.kinds  # type: ignore[misc]
        self.regenerated = inner.regenerated  # type: ignore[misc]
        self.server_ids = inner.server_ids  # type: ignore[misc]
        self.delta_separator = inner.delta_separator  # type: ignore[misc]
        self.resumes_streams = inner.resumes_streams  # type: ignore[misc]
        self.miss_status = inner.miss_status  # type: ignore[misc]
        self.read_operations = inner.read_operations  # type: ignore[misc]
        self.defaults_are_absent = inner.defaults_are_absent  # type: ignore[misc]
        self.rules = {n: self._rule(n, r) for n, r in inner.rules.items()}  # type: ignore[misc]

    def failed(self, hook: str, exc: Exception) -> None:
        """Say so, the first time a hook fails."""
        if hook not in self._told:
            self._told.add(hook)
            log.warning(
                "tasktape: protocol %s: its %s hook raised %r; that is left out", self.name, hook, exc
            )

    def safely(self, hook: str, fallback: T, call: Callable[[], T]) -> T:
        """What ``call`` returns, or ``fallback`` when it raises."""
        try:
            return call()
        except Exception as exc:  # the plug-in's bug, never the recording's
            self.failed(hook, exc)
            return fallback

    def _rule(
        self, name: str, rule: Callable[[Sequence[Any]], Iterator[Any]]
    ) -> Callable[..., Iterator[Any]]:
        def guarded(streams: Sequence[Any]) -> Iterator[Any]:
            try:
                yield from rule(streams)
            except Exception as exc:  # the plug-in's bug: its findings so far stand
                self.failed(f"rule {name}", exc)

        guarded.__doc__ = rule.__doc__
        return guarded

    def claims(self, request: Request) -> bool:
        return self.safely("claims", False, lambda: bool(self.inner.claims(request)))

    def claims_stream(self, data: str, event_type: str | None) -> bool:
        return self.safely("claims_stream", False, lambda: bool(self.inner.claims_stream(data, event_type)))

    def request_info(self, request: Request) -> RequestInfo:
        return self.safely("request_info", RequestInfo(), lambda: self.inner.request_info(request))

    def checked(self, info: RequestInfo, is_sse: bool, status: int | None) -> bool:
        return self.safely("checked", True, lambda: bool(self.inner.checked(info, is_sse, status)))

    def session(self, response_headers: Sequence[tuple[str, str]]) -> str | None:
        return self.safely("session", None, lambda: self.inner.session(response_headers))

    def path_names_operation(self, binding: str | None) -> bool:
        return self.safely(
            "path_names_operation", True, lambda: bool(self.inner.path_names_operation(binding))
        )

    def error_answer(self, request: Request, message: str, details: Mapping[str, Any]) -> Any:
        return self.safely("error_answer", None, lambda: self.inner.error_answer(request, message, details))

    def closes(self, data: str, event_type: str | None) -> bool:
        return self.safely("closes", False, lambda: bool(self.inner.closes(data, event_type)))

    def ends_with_close(self, request: Request) -> bool:
        return self.safely("ends_with_close", False, lambda: bool(self.inner.ends_with_close(request)))

    def answer_edits(
        self, recorded: Request, incoming: Request, chunks: Chunks, events: Sequence[StreamEvent] | None
    ) -> tuple[list[Edit], list[str]]:
        return self.safely(
            "answer_edits", ([], []), lambda: self.inner.answer_edits(recorded, incoming, chunks, events)
        )

    def resumable(self, resuming: Request, recorded: Request) -> bool:
        return self.safely("resumable", False, lambda: bool(self.inner.resumable(resuming, recorded)))

    def resubscription(
        self, request: Request, sent: Sequence[str], last_id: str | None
    ) -> Resubscription | None:
        return self.safely("resubscription", None, lambda: self.inner.resubscription(request, sent, last_id))

    def lookup(self, request: Request, sent: Sequence[str]) -> Resubscription | None:
        return self.safely("lookup", None, lambda: self.inner.lookup(request, sent))

    def catch_up(self, sent: Sequence[str], first: str) -> CatchUp:
        return self.safely("catch_up", CatchUp(send_first=True), lambda: self.inner.catch_up(sent, first))

    def reader(self) -> StreamReader:
        inner = self.safely("reader", None, self.inner.reader)
        return StreamReader() if inner is None else GuardedReader(self, inner)

    def final_state(self, last: str | None, summary: Summary) -> str | None:
        return self.safely("final_state", last, lambda: self.inner.final_state(last, summary))

    def state_note(self, stream: Stream) -> str | None:
        return self.safely("state_note", None, lambda: self.inner.state_note(stream))

    def ended(self, stream: Stream) -> bool:
        return self.safely("ended", False, lambda: bool(self.inner.ended(stream)))

    def delta(self, c: Classification) -> str | None:
        return self.safely("delta", None, lambda: self.inner.delta(c))

    def artifact_names(self, data: str, c: Classification) -> Sequence[str]:
        return self.safely("artifact_names", (), lambda: tuple(self.inner.artifact_names(data, c)))


class GuardedReader(StreamReader):
    """A plug-in's reader: an event it fails on is kept, classified ``other`` with the failure."""

    def __init__(self, guard: Guarded, inner: StreamReader) -> None:
        super().__init__()
        self.guard, self.inner = guard, inner

    def event(self, data: str, event_type: str | None) -> Classification:
        try:
            return self.inner.event(data, event_type)
        except Exception as exc:  # the plug-in's bug, never the recording's
            self.guard.failed("event", exc)
            return Classification("other", parse_error=f"protocol {self.guard.name} failed: {exc!r}"[:500])

    def body(self, data: bytes | str) -> Classification | None:
        return self.guard.safely("body", None, lambda: self.inner.body(data))

    def finished(self) -> Summary:
        return self.guard.safely("finished", Summary(), self.inner.finished)
