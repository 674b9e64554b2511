"""What a protocol tells tasktape: the hooks a protocol module implements.

A protocol is an instance of a :class:`Protocol` subclass. The registry
(:mod:`tasktape.eventlog.protocols`) asks each protocol in turn whether it claims an
exchange; the one that does classifies the exchange's request and, through a fresh
:class:`StreamReader`, each event of its response, and names what its clients
regenerate on every run (replay matching), what its servers make up on every run and what
its events add to an answer and name (``tasktape diff``), and the lifecycle rules
``tasktape check`` runs on its exchanges.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import orjson

from ..a2a_terms import short_state
from ..classify import Classification, load_json

if TYPE_CHECKING:
    from ..frames import Rule, Stream
    from ..jsonrpc_ids import Edit
    from ..spans import Chunks, StreamEvent


class RequestInfo(NamedTuple):
    """What the log indexes about a request."""

    binding: str | None = None  # A2A's rest / jsonrpc; None for every other protocol
    rpc_method: str | None = None  # the operation (A2A), the JSON-RPC method, or the API call
    task_id: str | None = None
    context_id: str | None = None
    rpc_id: Any = None  # the JSON-RPC request's id
    session_id: str | None = None  # MCP's Mcp-Session-Id


_UNREAD = object()


@dataclass
class Request:
    """A request as a protocol sees it: headers as (name, value) pairs, body decoded."""

    method: str
    path: str
    headers: Sequence[tuple[str, str]] = ()
    body: bytes | str | None = None
    _json: Any = field(default=_UNREAD, repr=False, compare=False)
    _names: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def header(self, name: str) -> str | None:
        """The first value of a header (names compared case-insensitively)."""
        names = self._names
        if names is None:  # made once, however many protocols ask (the first value wins)
            names = self._names = {k.lower(): v for k, v in reversed(self.headers)}
        return names.get(name.lower())

    def json(self) -> Any:
        """The body as JSON, or None when it is not (read once, however many protocols ask)."""
        if self._json is _UNREAD:
            try:
                self._json = load_json(self.body) if self.body else None
            except (ValueError, RecursionError):
                self._json = None
        return self._json


@dataclass
class Summary:
    """What one exchange of a protocol comes to: a row of ``stream_summary``."""

    model: str | None = None  # as the response reports it, not as requested
    answer: str | None = None
    input_tokens: int | None = None  # every input token, the cached ones too
    output_tokens: int | None = None
    finish: str | None = None
    tool_calls: str | None = None  # JSON: the tools the answer calls, as ``ToolCall`` objects
    cached_input_tokens: int | None = None  # of the input tokens, those read from a cache


@dataclass
class ToolCall:
    """A tool an LLM's answer calls: the call's id (what the tool's result answers), the
    tool's name, and its arguments as the model wrote them (JSON text, cut off where the
    stream was)."""

    id: str | None = None
    name: str | None = None
    arguments: str = ""


_new = tuple.__new__


def among(value: Any, names: Collection[str]) -> bool:
    """Whether a JSON value is one of ``names``: hostile JSON puts an object or a list
    where a name goes, which a set cannot even look up."""
    return type(value) is str and value in names


def index_or_id(value: Any) -> int | str | None:
    """A JSON value that tells one of several things apart (an index, an id) as a dict can
    hold it: hostile JSON puts an object or a list there, which is no key; those tell none."""
    return value if type(value) is int or type(value) is str else None


def json_text(value: Any, separators: tuple[str, str] = (",", ":")) -> str | None:
    """JSON read from the traffic written back as text (compact, unless ``separators`` say
    otherwise), or None when it is nested deeper than Python writes. The standard library
    writes what orjson cannot: an integer past 64 bits, nesting past 255 levels."""
    if separators == (",", ":"):
        try:
            return orjson.dumps(value).decode()
        except orjson.JSONEncodeError:
            pass
    try:
        return json.dumps(value, separators=separators, ensure_ascii=False)
    except RecursionError:
        return None


def quoted(value: Any) -> str:
    """A value from the traffic as a finding quotes it (its repr), even one nested too deep
    for a repr."""
    try:
        return repr(value)
    except RecursionError:
        return "(a value nested too deep to show)"


def classified(
    kind: str, text: str | None = None, state: str | None = None, usage: dict[str, Any] | None = None
) -> Classification:
    """A Classification of these fields, built positionally: a reader makes one per event,
    and a NamedTuple built by keyword costs several times more."""
    return _new(Classification, (kind, None, None, None, state, None, None, None, None, text, usage, None))


def parsed(data: bytes | str, other: str) -> dict[str, Any] | Classification:
    """The JSON object an event carries, or its classification as ``other`` saying why not."""
    try:
        obj = orjson.loads(data)  # the common case, once per event: no detour
    except orjson.JSONDecodeError:
        try:
            obj = load_json(data)  # what only the standard library reads, or the error in its words
        except (ValueError, RecursionError) as exc:
            return Classification(other, parse_error=f"not JSON: {exc}"[:500])
    return obj if type(obj) is dict else Classification(other, parse_error="not a JSON object")


def excerpt(text: str, size: int = 120) -> str:
    """Text from the traffic quoted in a finding: as a Python literal, its start alone when long."""
    return repr(text) if len(text) <= size else f"{text[:size]!r}..."


def last_state(stream: Stream, skipped: Collection[str] = ()) -> str | None:
    """The state the last complete frame of a stream (or an answer) that gives one gave,
    frames of the ``skipped`` kinds left out."""
    states = [f.c.state for f in stream.frames if f.complete and f.c.state and f.c.kind not in skipped]
    return states[-1] if states else None


class StreamReader:
    """Reads one exchange's response, event by event (or its whole body): classifies
    each and keeps what the summary needs. One per exchange; it may keep state."""

    def __init__(self) -> None:
        self.summary = Summary()
        self.pieces: list[str] = []  # the answer's text as it came: finished() joins it
        self.calls: dict[Any, ToolCall] = {}  # the tool calls, by the key their protocol gives each

    def event(self, data: str, event_type: str | None) -> Classification:
        """Classify one SSE event (its ``data`` and ``event`` field). Never raises."""
        return Classification("other")

    def body(self, data: bytes | str) -> Classification | None:
        """Classify a whole response body that is not a stream (None: nothing in it)."""
        return None

    def finished(self) -> Summary:
        """The summary once the response has ended."""
        if self.pieces:
            self.summary.answer = "".join(self.pieces)
        if self.calls:
            self.summary.tool_calls = orjson.dumps([vars(c) for c in self.calls.values()]).decode()
        return self.summary


@dataclass(frozen=True)
class Regenerated:
    """What a protocol's clients make up afresh on every run, which replay matching
    ignores in request bodies: keys anywhere, and JSON pointers (``*`` matches any step)."""

    keys: frozenset[str] = frozenset()
    pointers: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Resubscription:
    """The request that follows a stream anew after its connection to the agent broke."""

    method: str
    path: str  # with its query, if any
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()  # set over the original request's


@dataclass(frozen=True)
class CatchUp:
    """What the clients of a rejoined stream are owed, from the new stream's first event."""

    events: tuple[str, ...] = ()  # the data of each event to send them first (made up)
    gaps: tuple[str, ...] = ()  # what they are owed that the first event does not tell
    send_first: bool = False  # whether the first event itself goes out after those


class Protocol:
    """One protocol. Subclasses set ``name`` and ``kinds`` and override the hooks."""

    name: ClassVar[str]
    kinds: ClassVar[type[StrEnum]]  # the event kinds its classification gives
    regenerated: ClassVar[Regenerated] = Regenerated()
    # The JSON keys under which its responses name what the server makes up on every run
    # (task, message, response ids): ``tasktape diff`` compares those by position.
    server_ids: ClassVar[frozenset[str]] = frozenset()
    # What joins its events' deltas in ``tasktape diff``: nothing for pieces of one text
    # (tokens), a line break for events that are each a message of their own.
    delta_separator: ClassVar[str] = ""
    rules: ClassVar[Mapping[str, Rule]] = {}  # its lifecycle rules, by name
    # Whether its servers take a stream up again themselves after the client's
    # Last-Event-ID (MCP's do): a resuming recorder sends them a reconnect to a stream they
    # ended unfinished. Otherwise the recorder answers it from what it holds, since the
    # request again would start the work anew.
    resumes_streams: ClassVar[bool] = False
    # The status a replay server answers a miss of its requests with, unless told one
    # (None: the server's own, 404): for a protocol whose clients read a 404 as more.
    miss_status: ClassVar[int | None] = None
    # Its operations (``rpc_method``) that only read: asked again, they change nothing (a
    # client polling), so ``tasktape diff`` takes repeats as one run. GETs always read; a
    # request that makes something (a message, a tool call) never does.
    read_operations: ClassVar[frozenset[str]] = frozenset()
    # Whether its request bodies are protobuf JSON, where a field at its default (0,
    # false, "", null, [], {}) says what leaving it out says: replay matching takes them
    # as equal. In any other JSON they say different things.
    defaults_are_absent: ClassVar[bool] = False

    def claims(self, request: Request) -> bool:
        """Whether this request is one of this protocol's (strictly: never on a guess)."""
        raise NotImplementedError

    def claims_stream(self, data: str, event_type: str | None) -> bool:
        """Whether a response whose request no protocol claimed is this protocol's, judged
        by its first event (or, with ``event_type`` None, its whole body)."""
        return False

    def request_info(self, request: Request) -> RequestInfo:
        """What the log indexes about a request this protocol claimed."""
        return RequestInfo()

    def path_names_operation(self, binding: str | None) -> bool:
        """Whether a request's path says what it asks (the operation ``rpc_method`` holds):
        not over JSON-RPC, whose one endpoint takes every method (the recorder's console
        line then names it)."""
        return True

    def checked(self, info: RequestInfo, is_sse: bool, status: int | None) -> bool:
        """Whether ``tasktape check`` reads this exchange (its rules see only those)."""
        return True

    def session(self, response_headers: Sequence[tuple[str, str]]) -> str | None:
        """The session a response opens (MCP's initialize answers with one)."""
        return None

    def reader(self) -> StreamReader:
        """A reader for one exchange's response."""
        return StreamReader()

    def final_state(self, last: str | None, summary: Summary) -> str | None:
        """How an exchange finished, as the recorder's line on it says: by default the
        state its last event (or its answer) gave, ``last``; ``summary`` is what its
        reader made of it."""
        return last

    def state_note(self, stream: Stream) -> str | None:
        """Where a stream (or an answer) last stood, in the words of a note on it (one cut
        short, or followed again): by default its task's last state, ``the task last
        WORKING``; None when no frame gave a state."""
        state = last_state(stream)
        return f"the task last {short_state(state)}" if state else None

    def ended(self, stream: Stream) -> bool:
        """Whether a stream that broke off had carried all it owed its client first (its
        answer): nothing was lost, so ``tasktape check`` notes no cut-short. By default
        never: how it would have gone on is unknown."""
        return False

    def closes(self, data: str, event_type: str | None) -> bool:
        """Whether this event is the one that closes its stream (what replay's
        ``no-final`` fault leaves out)."""
        return False

    def ends_with_close(self, request: Request) -> bool:
        """Whether the stream answering ``request`` ends with an event :meth:`closes`
        tells: one that ends before it ended unfinished (a replay has not its rest)."""
        return False

    def delta(self, c: Classification) -> str | None:
        """The text an event adds as the response streams (None: it adds none), as its
        reader classified it: ``tasktape diff`` joins these into the stream's deltas
        (with ``delta_separator`` between them)."""
        return c.text

    def artifact_names(self, data: str, c: Classification) -> Sequence[str]:
        """The names of the artifacts an event (its ``data``, as its reader classified
        it) carries, for protocols that name their artifacts."""
        return ()

    def resubscription(
        self, request: Request, sent: Sequence[str], last_id: str | None
    ) -> Resubscription | None:
        """How a resuming recorder follows the stream ``request`` opened again, once its
        connection to the agent broke, given the data of the events clients were sent and
        the id the agent gave the last of them (None: it gave that one none). None: it
        cannot be (the stream had ended, or the protocol has no way)."""
        return None

    def answer_edits(
        self, recorded: Request, incoming: Request, chunks: Chunks, events: Sequence[StreamEvent] | None
    ) -> tuple[list[Edit], list[str]]:
        """Edits making the recorded answer (``chunks``; ``events`` when it is a stream) to
        ``recorded`` answer ``incoming``, which replay matched to it, beyond its JSON-RPC id
        (which replay rewrites for every protocol); and what they change, as the fidelity
        report says it."""
        return [], []

    def resumable(self, resuming: Request, recorded: Request) -> bool:
        """Whether ``resuming``, a request with ``Last-Event-ID``, may continue the stream
        that answered ``recorded`` (a request it does not match: a replay server tries
        those it matches first)."""
        return False

    def error_answer(self, request: Request, message: str, details: Mapping[str, Any]) -> Any:
        """The JSON a server of this protocol would answer ``request`` with to say it
        failed (the replay server's answer to a miss), or None: tasktape's own error."""
        return None

    def lookup(self, request: Request, sent: Sequence[str]) -> Resubscription | None:
        """When the agent refuses the resubscription: a request whose answer (not a stream)
        ``catch_up`` can read as the first event, to end the stream if the answer ends it
        (None: there is none)."""
        return None

    def catch_up(self, sent: Sequence[str], first: str) -> CatchUp:
        """What clients that were sent ``sent`` are owed, given the first event of the
        resubscription's stream (by default: that event, as it is)."""
        return CatchUp(send_first=True)
