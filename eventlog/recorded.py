"""Recorded exchanges in memory: what replay serves and cassettes hold, loaded from a log
or a cassette alike."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasktape.errors import UsageError

from .content_coding import rest_undecoded
from .listed import header_problem, listed_ids
from .outcomes import Outcome
from .resumes import CarriedResume, ResumeOutcome, ResumeSide
from .uids import iso_ns

if TYPE_CHECKING:
    from .protocols.base import Request
    from .reader import EventLog

Headers = list[tuple[str, str]]

# A body's decoding that says it is kept as sent (the Content-Encoding of no coding).
AS_SENT = "identity"


# Outcomes whose recorded response stops where the connection broke.
CUT_SHORT = frozenset(
    {Outcome.UPSTREAM_DISCONNECTED, Outcome.CLIENT_DISCONNECTED, Outcome.PROXY_STOPPED, Outcome.LOG_CLOSED}
)


@dataclass
class Recorded:
    """One request and its response, as recorded: chunk bytes and offsets exact."""

    method: str
    path: str
    query: str | None = None
    request_headers: Headers = field(default_factory=list)
    request_body: bytes | None = None
    request_body_truncated: bool = False
    # The Content-Encoding the request body was decoded from, as the log keeps it
    # ("identity": kept as sent, though its header names one). None: the body is as the
    # request sent it, which a log decodes by its Content-Encoding.
    request_decoded_from: str | None = None
    status: int | None = None
    response_headers: Headers = field(default_factory=list)
    is_sse: bool = False
    ttfb_ns: int = 0
    chunks: list[tuple[int, bytes]] = field(default_factory=list)  # (offset_ns, data)
    decoded_from: str | None = None  # Content-Encoding the chunks were decoded from
    response_body_truncated: bool = False
    duration_ns: int | None = None
    outcome: str | None = None
    error: str | None = None
    started_at: str | None = None
    # Where it came from (log exchange id, or position in a cassette), for messages.
    origin: str = ""
    task_id: str | None = None
    context_id: str | None = None
    binding: str | None = None
    rpc_method: str | None = None
    protocol: str | None = None  # as the log named it (None: to be recognised)
    # A reconnect a resume gateway answered from a stream it held (a slice of that stream):
    # the exchange of the stream, counted back from this one among those read or written
    # with it (-1: the one before). None: an exchange of its own.
    reconnect_of: int | None = None
    # The node id of the test whose tasktape fixture recorded it (pytest plugin); None for
    # exchanges recorded, exported or written any other way.
    recorded_by: str | None = None
    # The log's uid of the exchange, when it came from a log or a cassette exported from one:
    # written into the cassettes made of it, so that importing one where it is adds nothing.
    uid: str | None = None
    # The rows of ``resumes`` it carries (a reconnect's, a subscribe's; a stream's own for
    # a resume that made no exchange), as exported: imported, they are rows again.
    resumes: list[CarriedResume] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Made by hand, headers or chunks of another shape would fail far from here (served,
        # checked, written) without a word of what to pass.
        problem = self.misshapen()
        if problem is not None:
            raise UsageError(problem)

    def misshapen(self) -> str | None:
        """What keeps its request line, headers and chunks from the shapes they have (None:
        nothing): method and path text, a query text or None, a request body bytes or None,
        ``(name, value)`` pairs of strings, and ``(offset_ns, bytes)`` pairs."""
        return (
            _request_problem(self)
            or header_problem(self.request_headers, "Recorded's request_headers")
            or header_problem(self.response_headers, "Recorded's response_headers")
            or _chunks_problem(self.chunks)
        )

    @property
    def cut_short(self) -> bool:
        """Whether the response broke off mid-way (rather than ending or being refused)."""
        return self.outcome in CUT_SHORT

    @property
    def partly_decoded(self) -> str | None:
        """Why its body is decoded from its Content-Encoding only in part, the rest still
        encoded (no client can read the two as one body); None for a body in one form."""
        return rest_undecoded(self.error) if self.decoded_from else None

    @property
    def still_encoded(self) -> bool:
        """Whether its body is held, in whole or in part, in a Content-Encoding the log could
        not decode (zstd, a broken gzip): bytes no protocol reads as what they say."""
        coded = any(
            name.lower() == "content-encoding" and value.strip().lower() not in ("", "identity")
            for name, value in self.response_headers
        )
        return (coded and not self.decoded_from) or self.partly_decoded is not None

    @property
    def resumed_from(self) -> str | None:
        """The Last-Event-ID the recorded request resumed from."""
        return next((v for k, v in self.request_headers if k.lower() == "last-event-id"), None)

    @property
    def body(self) -> bytes:
        return b"".join(data for _, data in self.chunks)

    @property
    def request_line(self) -> str:
        return f"{self.method} {self.path}" + (f"?{self.query}" if self.query else "")

    def as_request(self) -> Request:
        """The recorded request, as the protocols read one."""
        from .protocols.base import Request  # noqa: PLC0415 - loaded with the protocols

        return Request(self.method, self.path, self.request_headers, self.request_body)


def _request_problem(r: Recorded) -> str | None:
    """What keeps the request line and body from text and bytes (None: nothing): served,
    checked or written, they failed with TypeError far from where they were made."""
    for name in ("method", "path"):
        if not isinstance(getattr(r, name), str):
            return f"Recorded's {name} is text (str), not {type(getattr(r, name)).__name__}"
    if not isinstance(r.query, str | None):
        return f"Recorded's query is the URL's query string (str) or None, not {type(r.query).__name__}"
    if not isinstance(r.request_body, bytes | None):
        hint = ": encode it" if isinstance(r.request_body, str) else ""
        return f"Recorded's request_body is bytes or None, not {type(r.request_body).__name__}{hint}"
    return None


def _chunks_problem(chunks: Any) -> str | None:
    """What keeps ``chunks`` from being ``(offset_ns, bytes)`` pairs in a list or a tuple
    (None: nothing)."""
    if not isinstance(chunks, list | tuple):
        return f"Recorded's chunks are a list of (offset_ns, bytes) pairs, not {type(chunks).__name__}"
    for chunk in chunks:
        if not (isinstance(chunk, tuple | list) and len(chunk) == 2 and _is_chunk(*chunk)):
            hint = ": for text, give its bytes, 'text'.encode()" if _holds_text(chunk) else ""
            return (
                f"Recorded's chunks are (offset_ns, bytes) pairs, an int and bytes, not {chunk!r:.100}{hint}"
            )
    return None


def _is_chunk(offset_ns: Any, data: Any) -> bool:
    return isinstance(offset_ns, int) and not isinstance(offset_ns, bool) and isinstance(data, bytes)


def _holds_text(chunk: Any) -> bool:
    return isinstance(chunk, tuple | list) and any(isinstance(part, str) for part in chunk)


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _request_decoding(x: Any) -> str | None:
    """How a log's request body is stored, for a cassette: the encoding it was decoded
    from; "identity" for one kept as sent though its headers name a Content-Encoding
    (one that could not be decoded); None when neither: it is as sent, with nothing to
    decode."""
    if x["request_body_encoding"] or x["request_body"] is None:
        return x["request_body_encoding"]
    return AS_SENT if encoded(headers_from_json(x["request_headers"])) else None


def encoded(headers: Headers) -> bool:
    """Whether these headers name a Content-Encoding a body is to be decoded from."""
    value = next((v for k, v in headers if k.lower() == "content-encoding"), "")
    return value.strip().lower() not in ("", AS_SENT)


def _carried_resumes(
    log: EventLog, rows: list[Any], position: dict[int, int]
) -> dict[int, list[CarriedResume]]:
    """The resumes of the exchanges ``rows`` (at ``position``), by the exchange that
    carries each: its new exchange, or, with none, the stream resumed. One whose stream
    or new exchange is not among them is left out: a cassette has no name for it."""
    started = {x["id"]: _started_ns(x) for x in rows}
    carried: dict[int, list[CarriedResume]] = {}
    for r in log._rows("SELECT * FROM resumes ORDER BY id"):
        carrier = r["new_exchange_id"] or r["exchange_id"]
        if carrier not in position or r["exchange_id"] not in position:
            continue
        of = position[r["exchange_id"]] - position[carrier]
        if of > 0:  # (a stream after its reconnect: no log holds one)
            continue
        carried.setdefault(carrier, []).append(
            CarriedResume(
                of,
                ResumeSide(r["side"]),
                ResumeOutcome(r["outcome"]),
                offset_ns=max(0, (r["at_ns"] or 0) - started[carrier]),
                last_event_id=r["last_event_id"],
                events_from_log=r["events_from_log"],
                attempts=r["attempts"],
                synthesized=tuple(json.loads(r["synthesized"] or "[]")),
                error=r["error"],
            )
        )
    return carried


def _started_ns(x: Any) -> int:
    """When a log's exchange started, in nanoseconds (a row may give only its text)."""
    return iso_ns(x["started_at"]) if x["started_ns"] is None else x["started_ns"]


def _started_at(x: Any) -> str | None:
    """A log's exchange's start time to the nanosecond (its ``started_at`` keeps six digits
    of the second): a cassette made of it gives a log its ``started_ns`` back."""
    if x["started_ns"] is None:
        return x["started_at"]
    seconds, rest = divmod(x["started_ns"], 1_000_000_000)
    return f"{datetime.fromtimestamp(seconds, UTC):%Y-%m-%dT%H:%M:%S}.{rest:09d}Z"


def headers_from_json(value: str | None) -> Headers:
    """Headers as the log stores them (a JSON list of pairs), as pairs."""
    return [(k, v) for k, v in json.loads(value)] if value else []


def read_log(path: str | Path, exchange_ids: list[int] | None = None) -> list[Recorded]:
    """``from_log`` of the log at ``path``."""
    # Here, not at the top: replaying cassettes never needs the log reader, nor what
    # sqlite-utils imports when installed (numpy, pandas: most of a second to import, in
    # the test process that replays).
    from .reader import EventLog  # noqa: PLC0415

    with EventLog(path) as log:
        return from_log(log, exchange_ids)


def from_log(
    log: EventLog, exchange_ids: list[int] | None = None, *, unread: Collection[int] = ()
) -> list[Recorded]:
    """The exchanges of a log (all, or those ids), in id order, with their chunks (but
    those of the exchanges in ``unread``, which the caller takes from elsewhere)."""
    return list(each_from_log(log, exchange_ids, unread=unread))


def each_from_log(
    log: EventLog, exchange_ids: list[int] | None = None, *, unread: Collection[int] = ()
) -> Iterator[Recorded]:
    """As :func:`from_log`, one at a time: an exchange's chunks are read as it is reached
    (an export of a log of gigabytes holds one exchange's at a time)."""
    if exchange_ids is None:
        rows = log.exchanges()
    else:
        rows = [log.exchange(i) for i in sorted(set(listed_ids(exchange_ids, "exchange_ids")))]
    position = {x["id"]: n for n, x in enumerate(rows)}
    streams = log.reconnects_answered()
    carried = _carried_resumes(log, rows, position)
    for n, x in enumerate(rows):
        stream = position.get(streams.get(x["id"], -1))
        recorded = Recorded(
            method=x["method"],
            path=x["path"],
            query=x["query"],
            request_headers=headers_from_json(x["request_headers"]),
            request_body=_bytes(x["request_body"]),
            request_body_truncated=bool(x["request_body_truncated"]),
            request_decoded_from=_request_decoding(x),
            status=x["status"],
            response_headers=headers_from_json(x["response_headers"]),
            is_sse=bool(x["is_sse"]),
            ttfb_ns=x["ttfb_ns"] or 0,
            decoded_from=x["body_encoding"],
            response_body_truncated=bool(x["response_body_truncated"]),
            duration_ns=x["duration_ns"],
            outcome=x["outcome"],
            error=x["error"],
            started_at=_started_at(x),
            origin=f"{log.path.name} exchange {x['id']}",
            task_id=x["task_id"],
            context_id=x["context_id"],
            binding=x["binding"],
            rpc_method=x["rpc_method"],
            protocol=x["protocol"],
            reconnect_of=None if stream is None else stream - n,
            uid=x["uid"],
            resumes=carried.get(x["id"], []),
        )
        if x["id"] not in unread:
            # Given once it is made: offsets and bytes as the log holds them need no look
            # (one at each of an exchange's thousands of chunks would slow reading it).
            recorded.chunks = [(c["offset_ns"], bytes(c["data"])) for c in log.chunks(x["id"])]
        yield recorded
