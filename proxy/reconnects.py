"""Which requests carrying ``Last-Event-ID`` continue a stream a resuming recorder holds.

Only what the stream's protocol says continues it: the request that opened it again (the
same request line, its query included, and as its protocol reads it the same binding and
operation), the protocol's subscribe to the stream's task on that binding, or what the
protocol takes as a resumption of it (MCP's ``GET`` of the endpoint in the stream's
session). Any other request with the header (a cancel, a read of the task) is the agent's
to answer.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from tasktape.eventlog.protocols import recognise
from tasktape.eventlog.protocols.base import Protocol, Request
from tasktape.eventlog.redact import REDACTED

if TYPE_CHECKING:
    from .live import LiveStream


_QUERY_SEPARATORS = re.compile(r"([&;])")  # as the log's redaction splits a query


# What EventSource polyfills add to a reconnect's URL to carry its Last-Event-ID (as
# event-source-polyfill's lastEventIdQueryParameterName): no part of the stream's line.
RESUME_PARAMETERS = frozenset({"lastEventId"})
# One of them in a query, with the separator before it (``&``, or ``;`` as some servers
# take): what a reconnect's line leaves out.
_RESUME_PARAMETER = re.compile(
    rf"(?:^|[&;])(?:{'|'.join(map(re.escape, sorted(RESUME_PARAMETERS)))})(?:=[^&;]*)?(?=[&;]|$)"
)


def line_of(method: str, target: str) -> str:
    """A request's line as a reconnect repeats it: its method and target, the query
    included (one endpoint may serve several streams by it: ``/events?topic=alpha``) but
    for the parameters that carry a reconnect's id (``RESUME_PARAMETERS``)."""
    return f"{method} {_without_resume_parameters(target)}"


def _without_resume_parameters(target: str) -> str:
    head, question, query = target.partition("?")
    if not question:
        return target
    kept = _RESUME_PARAMETER.sub("", query).lstrip("&;")
    return f"{head}?{kept}" if kept else head


def same_line(held: str, asked: str) -> bool:
    """Whether ``asked`` is the request line ``held`` again. A line read back from the
    log has the credentials of its query redacted (``?token=[REDACTED]``): any value of
    such a parameter repeats it, and is a credential the stream's request carried
    (``redacted_query``), which the agent is asked about as a credential header is."""
    if held == asked:
        return True
    head, question, query = held.partition("?")
    if not question or REDACTED not in query or not asked.startswith(f"{head}?"):
        return False
    mine, theirs = _QUERY_SEPARATORS.split(query), _QUERY_SEPARATORS.split(asked[len(head) + 1 :])
    return len(mine) == len(theirs) and all(map(_same_parameter, mine, theirs))


def _same_parameter(held: str, asked: str) -> bool:
    name, _, value = held.partition("=")
    return held == asked or (value == REDACTED and asked.startswith(f"{name}="))


def redacted_query(target: str) -> bool:
    """Whether a request target read back from the log had credentials in its query:
    a parameter whose value the log redacted (``?token=[REDACTED]``)."""
    query = target.partition("?")[2]
    return any(part.partition("=")[2] == REDACTED for part in _QUERY_SEPARATORS.split(query))


class Opener(NamedTuple):
    """What a reconnect repeats of the request that opened a stream: its line, and as its
    protocol reads it, which protocol, binding and operation (None where none claims it)."""

    line: str
    protocol: str | None = None
    binding: str | None = None
    operation: str | None = None

    def repeated_by(self, other: Opener) -> bool:
        """Whether ``other`` is this request again: the same line and, where a protocol
        claims both (a claim may hang on a header a reconnect leaves out), the same
        protocol, binding and operation."""
        claimed = self.protocol is not None and other.protocol is not None
        return same_line(self.line, other.line) and (not claimed or self[1:] == other[1:])

    def beside_query(self) -> Opener:
        """The same, but for the query of its line."""
        return self._replace(line=self.line.partition("?")[0])


def opener(request: Request) -> Opener:
    """What a request opens (or, with ``Last-Event-ID``, would continue)."""
    request = _as_opened(request)
    line = f"{request.method} {request.path}"
    protocol = recognise(request)
    if protocol is None:
        return Opener(line)
    info = protocol.request_info(request)
    return Opener(line, protocol.name, info.binding, info.rpc_method)


def _as_opened(request: Request) -> Request:
    """A request as its protocol reads it: without the parameters that carry a
    reconnect's id, which make the path none of its operations (``message:stream?lastEventId=7``)."""
    path = _without_resume_parameters(request.path)
    return request if path == request.path else Request(request.method, path, request.headers, request.body)


def continues(resuming: Request, opened: Request, stream: LiveStream) -> bool:
    """Whether ``resuming`` continues ``stream``, which ``opened`` opened."""
    resuming = _as_opened(resuming)
    mine = opener(resuming)
    if opener(opened).repeated_by(mine):
        return True
    protocol = recognise(opened)
    if protocol is None or mine.protocol != protocol.name:
        return False
    return protocol.resumable(resuming, opened) or _subscribes(protocol, resuming, mine, opened, stream)


def _subscribes(
    protocol: Protocol, resuming: Request, mine: Opener, opened: Request, stream: LiveStream
) -> bool:
    """Whether ``resuming`` is the protocol's subscribe to the stream's task, on the
    stream's binding (the request its rejoin would send, from the first event naming it)."""
    task = protocol.request_info(resuming).task_id
    if task is None:
        return False
    reader = protocol.reader()
    named = next((data for data in stream.sent_data() if reader.event(data, None).task_id == task), None)
    plan = None if named is None else protocol.resubscription(opened, [named], None)
    if plan is None:
        return False
    asked = Request(plan.method, plan.path, opened.headers, plan.body)
    # The protocol's subscribe carries no query (the task names the stream): a client's may.
    same = opener(asked).beside_query() == mine.beside_query()
    return same and protocol.request_info(asked).task_id == task
