"""Cassettes: recorded exchanges as a portable, diffable JSON Lines file.

The first line is a versioned header; then each exchange is a line with its request and
response head, followed by one line per response chunk (its offset, and its bytes as text
when they are UTF-8, else base64) and an ``end`` line::

    {"tasktape_cassette": 1, "created_at": "2026-11-30T11:00:00Z", "tool_version": "0.1.0"}
    {"exchange": {"request": {"method": "POST", "path": "/message:stream", "headers": [...], "body": "{...}"},
                  "response": {"status": 200, "headers": [...], "ttfb_ms": 1.2}}}
    {"chunk": {"offset_ms": 12.5, "text": "id: 1\\ndata: {...}\\n\\n"}}
    {"end": {"duration_ms": 140.2, "outcome": "complete"}}

A hand-written cassette may give events instead of chunks,
``{"event": {"offset_ms": 10, "data": "{...}", "id": "1"}}``, which become SSE bytes.
Offsets are milliseconds with up to six decimals, so log -> cassette -> log is exact.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from contextlib import nullcontext
from datetime import UTC, datetime
from functools import partial
from http import HTTPStatus
from pathlib import Path, PurePath
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, BinaryIO

import orjson

from tasktape.errors import CassetteError, UsageError
from tasktape.version import __version__

from .file_kinds import FileKind, kind_of, kind_of_bytes
from .http_fields import TOKEN as HTTP_TOKEN
from .http_fields import read_problem
from .outcomes import Outcome
from .producer import MAX_STATUS, MIN_STATUS, LogProducer
from .recorded import Recorded
from .resumes import CarriedResume, Resume, ResumeOutcome, ResumeSide
from .uids import derived_uuid7, iso_ns, moment_ns, read_time

if TYPE_CHECKING:
    from .cassette_models import Exchange

# The version this tasktape reads and writes: 2 when exchanges carry their uids (which
# tasktape 0.1, reading version 1, would refuse as unknown keys: a newer version tells it to
# upgrade instead); a cassette without them is written as version 1, which any reads.
VERSION = 2
_WITHOUT_UIDS = 1
# What a writer sets in the header, not its caller.
_RESERVED = ("tasktape_cassette", "tool_version")
# Offsets and durations become nanoseconds in SQLite INTEGERs: a bound well inside them
# (about 31 years) refuses infinities and absurd values on loading, not when written.
MAX_MS = 1e12
# A CR, LF or NUL in a header, or in a request's method, path or query, would split the
# message it is replayed in or the line it is reported on.
_SPLITS_A_LINE = re.compile(r"[\r\n\x00]")
# A lone surrogate: a byte of a file name that is not UTF-8, as Python decodes it.
_SURROGATE = re.compile("[\ud800-\udfff]")
# The header's keys besides its version, each a string when given (null: not given).
_HEADER_TEXTS = ("created_at", "tool_version", "source", "upstream")
# How a time given in a cassette is to be written, when it cannot be read.
TIME_FORM = "an ISO 8601 time, such as 2026-11-30T11:30:41.740Z"
# The fraction of a second of an ISO 8601 time: the digits after its seconds' "." or ",".
_FRACTION = re.compile(r"\d\d:?\d\d:?\d\d[.,](\d+)")
# The outcomes an end line can give (StrEnum members are found by their values).
_OUTCOMES = frozenset(Outcome)


def unread_header(headers: list[tuple[str, str]]) -> str | None:
    """Why one of these response headers is none a log holds (None: an HTTP parser reads
    each). One replay cannot send again is kept as it came: replay leaves it out."""
    return next(filter(None, (read_problem(name, value) for name, value in headers)), None)


def broken_header(headers: list[tuple[str, str]]) -> str | None:
    """Why one of these request headers is broken (None: each has a name, and none holds a
    CR, LF or NUL)."""
    for name, value in headers:
        if not name or _SPLITS_A_LINE.search(name) or _SPLITS_A_LINE.search(value):
            return f"header {name!r}: a header needs a name, and holds no CR, LF or NUL"
    return None


def splits_a_line(value: str | None) -> bool:
    """Whether a request's method, path or query holds a CR, LF or NUL."""
    return value is not None and _SPLITS_A_LINE.search(value) is not None


def is_method(value: str) -> bool:
    """Whether a request's method is one a request line can hold: an HTTP token (RFC 9110
    section 9.1), no control character nor space among its letters."""
    return HTTP_TOKEN.fullmatch(value) is not None


def is_uid(value: str) -> bool:
    """Whether ``value`` is a uid as a log holds it: a UUID as ``str(uuid.UUID)`` spells it
    (another spelling of the same one would not match it)."""
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def _ns(ms: float) -> int:
    return round(ms * 1_000_000)


def _ms(ns: int) -> float:
    return round(ns / 1_000_000, 6)


def _exact_ns(started_at: str) -> int | None:
    """An exchange's ``started_at`` (see ``moment_ns``) in nanoseconds, to the nanosecond:
    ``datetime`` keeps six digits of a fraction of a second, and a log's time has nine."""
    ns = moment_ns(started_at)
    fraction = _FRACTION.search(started_at)
    if ns is None or fraction is None:
        return ns
    ns += int(fraction[1][6:9].ljust(3, "0"))
    return ns if ns < 2**63 else None


# The error of a cassette's last exchange that the file ends in (before its end line).
CUT_OFF = "the cassette ends before this exchange's end line: cut off (its other exchanges have theirs)"


def read_cassette(
    path: str | Path, name: str | None = None, *, content: bytes | None = None
) -> list[Recorded]:
    """Read and validate a cassette; raises :class:`CassetteError` naming the line.
    Its exchanges' origins say ``name`` (by default, the file's name) and the line.
    ``content``: the file's bytes, when read already (a pipe can be read only once).

    Lines end at LF alone, as JSON Lines do: text may hold U+2028 or U+0085 as it is (the
    cassettes tasktape writes do), which ``str.splitlines`` would take for line ends."""
    path = Path(path)
    if content is None:
        content = _read(path)
    kind = kind_of_bytes(content[:16])
    if kind is FileKind.LOG:
        raise CassetteError(
            f"{path} is an event log, not a cassette: make one of it with tasktape export {path} -o FILE"
        )
    if kind is FileKind.FLOWS:
        raise CassetteError(
            f"{path} is {kind}, not a cassette: tasktape import {path} --db LOG makes an event log of it"
        )
    return list(CassetteReader(path, name).exchanges(content.split(b"\n")))


def hashed_lines(file: BinaryIO, update: Callable[[bytes], object]) -> Iterator[bytes]:
    """A file's lines as :meth:`CassetteReader.exchanges` takes them (each without the LF
    that ends it, as ``bytes.split`` leaves them), each given to ``update`` (a hash's) as it
    is read: a file of any size, read a block at a time (hashed as one, split in C), and
    the hash of its bytes."""
    pending: list[bytes] = []  # the start of a line that goes on in the next block
    for block in iter(partial(file.read, _BLOCK), b""):
        update(block)
        *whole, part = block.split(b"\n")
        if whole:
            whole[0] = b"".join([*pending, whole[0]])
            pending = []
            yield from whole
        pending.append(part)
    last = b"".join(pending)
    if last:  # (a file that does not end with a LF)
        yield last


# How much of a file ``hashed_lines`` reads at once.
_BLOCK = 2**20


class CassetteReader:
    """A cassette read a line at a time: its exchanges one by one, each as soon as it is
    read whole, and its header once read. Each line is checked as it is read; a bad one is
    a :class:`CassetteError` naming it."""

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.name  # what the exchanges' origins say, with the line
        self.header: dict[str, Any] = {}  # (read with the first line)

    def exchanges(self, lines: Iterable[bytes]) -> Iterator[Recorded]:
        """The exchanges of the cassette whose lines are ``lines`` (their LF taken off)."""
        return self._read(lines, keep=True)

    def uids(self, lines: Iterable[bytes]) -> Iterator[str | None]:
        """The uid of each exchange of the cassette whose lines are ``lines`` (None: it gives
        none), each line checked as :meth:`exchanges` checks it, with the same errors: a check
        of a file read again to be written, which makes no ``Recorded`` and keeps no chunk."""
        return self._read(lines, keep=False)

    def _read(self, lines: Iterable[bytes], keep: bool) -> Iterator[Any]:
        """:meth:`exchanges` (``keep``) or :meth:`uids`: the lines are checked alike either
        way; only what is made of them differs."""
        path = self.path
        done: Callable[[Any], Any] = _ended_whole if keep else _uid
        current: Any = None  # the exchange being read: its Recorded, or unkept, what its line gave
        last: int | None = None  # the offset of its last chunk
        header_seen = False
        exchanges = ends = 0  # exchange and end lines read
        # The line of each exchange read, negative for one that is no event stream: what a
        # reconnect names must be one.
        lines_of: list[int] = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                doc = _loads(line)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
                raise CassetteError(f"{path}:{number}: not JSON: {exc}") from None
            if not header_seen:
                _check_header(doc, f"{path}:{number}")
                self.header, header_seen = doc, True
                continue
            chunk = _plain_chunk(doc)
            if chunk is None:  # any other line: read without its model if it is as tasktape writes it
                where, origin = f"{path}:{number}", f"{self.name}:{number}"
                kind, item = _plain_line(doc, origin, keep=keep) or _modelled(doc, where, origin)
                if kind == "exchange":
                    _check_resumed(item, lines_of, where)
                    lines_of.append(number if _streams(item) else -number)
                    if current is not None:
                        yield done(current)
                    current, last = item, None
                    current.uid = doc["exchange"].get("uid")  # (checked as the line was read)
                    exchanges += 1
                    continue
                if current is None:
                    raise CassetteError(f"{where}: a {kind} line must follow an exchange line")
                if kind == "end":
                    if keep:
                        duration, current.outcome, current.error, timed = item
                        # Without duration_ms, the exchange lasted as long as its chunks; with
                        # null, its length is not known (the log had none), and stays so.
                        current.duration_ns = duration if timed else _last_offset(current)
                    yield done(current)
                    current = None
                    ends += 1
                    continue
                chunk = item
            elif current is None:
                raise CassetteError(f"{path}:{number}: a chunk line must follow an exchange line")
            if last is not None and chunk[0] < last:
                raise CassetteError(
                    f"{path}:{number}: offset_ms goes back in time (the previous chunk was later)"
                )
            last = chunk[0]
            if keep:
                current.chunks.append(chunk)
        if not header_seen:
            raise CassetteError(f"{path}: empty; a cassette starts with its header line")
        if current is not None and ends and keep:
            # Its other exchanges end with an end line, as written: the file was cut off here
            # (a cassette written by hand may have none at all).
            current.outcome, current.error = Outcome.LOG_CLOSED, CUT_OFF
            current.duration_ns = _last_offset(current)
        if current is not None:
            yield done(current)


def _check_resumed(item: Any, lines_of: list[int], where: str) -> None:
    """The streams an exchange line says it resumed are exchanges of the cassette (at the
    lines ``lines_of`` of those before it, negative for one that is no event stream); a
    reconnect's is an event stream, as it was in the log (an exchange taken out from
    between would make it name another: the agent card)."""
    if item.reconnect_of is not None:
        _check_stream(item.reconnect_of, lines_of, f"{where}: reconnect_of {item.reconnect_of}")
    for resume in getattr(item, "resumes", ()):
        if resume.of < 0:  # (0: the exchange itself, the stream)
            _check_stream(resume.of, lines_of, f"{where}: resumes: of {resume.of}")


def _check_stream(back: int, lines_of: list[int], what: str) -> None:
    """The exchange ``back`` before the one being read is an event stream."""
    if len(lines_of) + back < 0:
        raise CassetteError(f"{what} names an exchange before the first")
    line = lines_of[len(lines_of) + back]
    if line < 0:
        raise CassetteError(
            f"{what} names the exchange of line {-line}, which is no event stream: a reconnect"
            " resumes a stream (was the stream left out?)"
        )


def _streams(item: Any) -> bool:
    """Whether an exchange line, as read (its ``Recorded``, or unkept its fields), is of an
    event stream."""
    if isinstance(item, Recorded):
        return item.is_sse
    return _is_sse(item.response)


def _ended_whole(r: Recorded) -> Recorded:
    """An exchange as read: one with no end line (written by hand) ended whole, with its
    last chunk."""
    if r.outcome is None:
        r.outcome, r.duration_ns = Outcome.COMPLETE, _last_offset(r)
    return r


def _uid(r: Any) -> str | None:
    """An exchange read unkept: only its uid is said."""
    return r.uid


def _last_offset(r: Recorded) -> int:
    """How long an exchange whose end gives no duration lasted: to its last chunk."""
    return r.chunks[-1][0] if r.chunks else r.ttfb_ns


def _loads(line: bytes) -> Any:
    """A line's JSON. What orjson refuses, the json module may still take (NaN, lone
    surrogates, integers past 64 bits), for the models to judge; and what neither takes, the
    json module's error tells. Given text, not bytes: from bytes it would also take a
    byte-order mark or UTF-16, which a cassette is not (and ``read_header`` refuses)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line.decode("utf-8"))


_NUMBER = (int, float)


def _plain_chunk(doc: Any) -> tuple[int, bytes] | None:
    """A chunk line in the form tasktape writes, ``{"chunk": {"offset_ms": N, "text": S}}``,
    read without its model (most lines of a cassette are these): its offset in
    nanoseconds and its bytes. None for any other line, which its model reads (and
    explains, when it is wrong): the two agree on every line this takes."""
    if type(doc) is not dict or len(doc) != 1:
        return None
    body = doc.get("chunk")
    if type(body) is not dict or len(body) != 2:
        return None
    offset, text = body.get("offset_ms"), body.get("text")
    if type(text) is not str or not _in_range(offset):
        return None
    try:
        return _ns(float(offset)), text.encode("utf-8")  # float: as the model reads it
    except UnicodeEncodeError:  # a lone surrogate, from an escape: the model says so
        return None


def _plain_line(doc: Any, origin: str, *, keep: bool = True) -> tuple[str, Any] | None:
    """An exchange or end line in the form tasktape writes, read without its model: its
    kind, and what ``_modelled`` gives for it (unless ``keep``, an exchange's is only its
    fields, checked alike). None for any other line, which its model reads (and explains,
    when it is wrong): the two agree on every line this takes."""
    if type(doc) is not dict or len(doc) != 1:
        return None
    body = doc.get("exchange")
    if body is not None:
        recorded = _plain_exchange(body, origin, keep=keep)
        return None if recorded is None else ("exchange", recorded)
    body = doc.get("end")
    if type(body) is not dict or not body.keys() <= _END_KEYS:
        return None
    duration, outcome, error = (
        body.get("duration_ms"),
        body.get("outcome", Outcome.COMPLETE),
        body.get("error"),
    )
    if duration is not None and not _in_range(duration):
        return None
    if type(outcome) is not str or outcome not in _OUTCOMES or (error is not None and type(error) is not str):
        return None
    timed = "duration_ms" in body
    return "end", (None if duration is None else _ns(float(duration)), outcome, error, timed)


_REQUEST_KEYS = frozenset({"method", "path", "query", "headers", "body", "body_truncated", "decoded_from"})
_RESPONSE_KEYS = frozenset({"status", "headers", "sse", "ttfb_ms", "decoded_from", "body_truncated"})
# (an exchange that carries ``resumes`` is read through its model: few do)
_EXCHANGE_KEYS = frozenset({"request", "response", "reconnect_of", "started_at", "recorded_by", "uid"})
_END_KEYS = frozenset({"duration_ms", "outcome", "error"})


def _plain_exchange(body: Any, origin: str, *, keep: bool = True) -> Recorded | SimpleNamespace | None:
    """``_plain_line``'s exchange: a request with its body as text (or none), every field
    of the type its model says, no other key. Unless ``keep``, its fields as read (checked
    as they are for its ``Recorded``), which is not made."""
    if type(body) is not dict or not body.keys() <= _EXCHANGE_KEYS:
        return None
    req, resp, started_at = body.get("request"), body.get("response"), body.get("started_at")
    if type(req) is not dict or not req.keys() <= _REQUEST_KEYS or not _optional_str(started_at):
        return None
    if started_at is not None and read_time(started_at) is None:
        return None
    recorded_by = body.get("recorded_by")
    if recorded_by is not None and (type(recorded_by) is not str or not recorded_by):
        return None
    reconnect_of = body.get("reconnect_of")
    if reconnect_of is not None and (type(reconnect_of) is not int or reconnect_of >= 0):
        return None
    uid = body.get("uid")
    if uid is not None and (type(uid) is not str or not is_uid(uid)):
        return None
    method, path, query, text = req.get("method"), req.get("path"), req.get("query"), req.get("body")
    if type(method) is not str or not is_method(method) or type(path) is not str or not path.startswith("/"):
        return None
    if not (_optional_str(query) and _optional_str(text)):
        return None
    if splits_a_line(method) or splits_a_line(path) or splits_a_line(query):
        return None
    request_headers = _plain_headers(req.get("headers", []), broken_header)
    truncated, request_decoded = req.get("body_truncated", False), req.get("decoded_from")
    if request_headers is None or type(truncated) is not bool or not _optional_str(request_decoded):
        return None
    request = SimpleNamespace(
        method=method,
        path=path,
        query=query,
        headers=request_headers,
        body=text,
        body_base64=None,
        body_truncated=truncated,
        decoded_from=request_decoded,
    )
    response = None
    if resp is not None:
        if type(resp) is not dict or not resp.keys() <= _RESPONSE_KEYS:
            return None
        status, sse, ttfb, decoded_from = (
            resp.get("status"),
            resp.get("sse"),
            resp.get("ttfb_ms", 0.0),
            resp.get("decoded_from"),
        )
        response_headers = _plain_headers(resp.get("headers", []), unread_header)
        truncated = resp.get("body_truncated", False)
        if type(status) is not int or not MIN_STATUS <= status <= MAX_STATUS or response_headers is None:
            return None
        if not (sse is None or type(sse) is bool) or not _in_range(ttfb) or not _optional_str(decoded_from):
            return None
        if type(truncated) is not bool:
            return None
        response = SimpleNamespace(
            status=status,
            headers=response_headers,
            sse=sse,
            ttfb_ms=float(ttfb),  # as the model reads it
            decoded_from=decoded_from,
            body_truncated=truncated,
        )
    item = SimpleNamespace(
        request=request,
        response=response,
        reconnect_of=reconnect_of,
        started_at=started_at,
        recorded_by=recorded_by,
        resumes=[],
    )
    try:
        if not keep:
            _request_body(request)  # (only what may fail of making its Recorded)
            return item
        return _exchange(item, origin)
    except ValueError:  # a lone surrogate in the body, from an escape: the model's reading says so
        return None


def _optional_str(value: Any) -> bool:
    return value is None or type(value) is str


def _in_range(ms: Any) -> bool:
    """An offset or a duration its model takes: a number from 0 to MAX_MS (not NaN)."""
    return type(ms) in _NUMBER and 0 <= ms <= MAX_MS


def _plain_headers(
    headers: Any, problem: Callable[[list[tuple[str, str]]], str | None]
) -> list[tuple[str, str]] | None:
    """Headers as pairs of strings in which ``problem`` finds none; None for anything else."""
    if type(headers) is not list:
        return None
    pairs = []
    for pair in headers:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not str:
            return None
        pairs.append((pair[0], pair[1]))
    return None if problem(pairs) else pairs


def _modelled(doc: Any, where: str, origin: str) -> tuple[str, Any]:
    """A line read through its model: its kind, and what it holds (an exchange's
    ``Recorded``; an end's duration, outcome and error; a chunk's or an event's offset
    and bytes), or :class:`CassetteError` saying what is wrong."""
    from .cassette_models import LINES, ValidationError  # noqa: PLC0415 - pydantic, only when needed

    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in LINES:
        raise CassetteError(f"{where}: expected one of {', '.join(LINES)} as the line's only key")
    kind, body = next(iter(doc.items()))
    try:
        item = LINES[kind].model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or kind}: {e['msg']}" for e in exc.errors()
        )
        raise CassetteError(f"{where}: {kind}: {problems}") from None
    except ValueError as exc:  # base64 that does not decode
        raise CassetteError(f"{where}: {kind}: {exc}") from None
    if kind == "end":
        duration = None if item.duration_ms is None else _ns(item.duration_ms)
        return kind, (duration, item.outcome, item.error, "duration_ms" in item.model_fields_set)
    try:
        if kind == "exchange":
            return kind, _exchange(item, origin)
        return kind, (_ns(item.offset_ms), item.sse() if kind == "event" else item.data())
    except ValueError as exc:  # bytes it cannot have: bad base64, lone surrogates
        what = f"{kind}: request body" if kind == "exchange" else kind
        raise CassetteError(f"{where}: {what}: {exc}") from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CassetteError(f"{path}: cannot read it as a cassette: {exc}") from None


def read_header(path: str | Path, *, content: bytes | None = None) -> dict[str, Any]:
    """A cassette's header line (of a file, the rest is not read; or of its ``content``,
    read already); raises :class:`CassetteError` naming the line."""
    path = Path(path)
    try:
        with path.open("rb") if content is None else nullcontext(content.split(b"\n")) as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    text = line.decode("utf-8")
                    try:
                        doc = json.loads(text)
                    except (ValueError, RecursionError) as exc:
                        raise CassetteError(f"{path}:{number}: not JSON: {exc}") from None
                    _check_header(doc, f"{path}:{number}")
                    return doc
    except (OSError, UnicodeDecodeError) as exc:
        raise CassetteError(f"{path}: cannot read it as a cassette: {exc}") from None
    raise CassetteError(f"{path}: empty; a cassette starts with its header line")


def _check_header(doc: Any, where: str) -> None:
    if not isinstance(doc, dict) or "tasktape_cassette" not in doc:
        raise CassetteError(f"{where}: the first line must be the cassette header, with 'tasktape_cassette'")
    version = doc["tasktape_cassette"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CassetteError(f"{where}: 'tasktape_cassette' must be a version number")
    if version > VERSION:
        raise CassetteError(
            f"{where}: cassette version {version} was written by a newer tasktape (this one reads "
            f"version {VERSION}); upgrade tasktape"
        )
    for key in _HEADER_TEXTS:
        if not _optional_str(doc.get(key)):
            raise CassetteError(f"{where}: '{key}' must be a string")
    created = doc.get("created_at")
    if created is not None and read_time(created) is None:
        raise CassetteError(f"{where}: 'created_at' must be {TIME_FORM}")


def _exchange(item: Exchange | SimpleNamespace, origin: str) -> Recorded:
    """An exchange line's ``Recorded``: from its model, or from ``_plain_exchange``'s
    reading of it (the same fields, checked alike)."""
    req, resp = item.request, item.response
    return Recorded(
        method=req.method,
        path=req.path,
        query=req.query,
        request_headers=list(req.headers),
        request_body=_request_body(req),
        request_body_truncated=req.body_truncated,
        request_decoded_from=req.decoded_from,
        status=resp.status if resp else None,
        response_headers=list(resp.headers) if resp else [],
        is_sse=_is_sse(resp),
        ttfb_ns=_ns(resp.ttfb_ms) if resp else 0,
        decoded_from=resp.decoded_from if resp else None,
        response_body_truncated=resp.body_truncated if resp else False,
        started_at=item.started_at,
        origin=origin,
        reconnect_of=item.reconnect_of,
        recorded_by=item.recorded_by,
        resumes=[_carried(line) for line in item.resumes],
    )


def _is_sse(resp: Any) -> bool:
    """Whether a response line's body is an event stream: as it says, else as its
    Content-Type does."""
    if resp is None:
        return False
    if resp.sse is not None:
        return resp.sse
    content_type = next((v for k, v in resp.headers if k.lower() == "content-type"), "")
    return content_type.startswith("text/event-stream")


def _carried(line: Any) -> CarriedResume:
    """A resume as an exchange line gives it."""
    return CarriedResume(
        line.of,
        line.side,
        line.outcome,
        offset_ns=_ns(line.offset_ms),
        last_event_id=line.last_event_id,
        events_from_log=line.events_from_log,
        attempts=line.attempts,
        synthesized=tuple(line.synthesized),
        error=line.error,
    )


def _resume_line(resume: CarriedResume) -> dict[str, Any]:
    """A resume as an exchange line holds it: what it does not say left out."""
    line: dict[str, Any] = {"of": resume.of, "side": str(resume.side), "outcome": str(resume.outcome)}
    if resume.offset_ns:
        line["offset_ms"] = _ms(resume.offset_ns)
    optional = {
        "last_event_id": resume.last_event_id,
        "events_from_log": resume.events_from_log,
        "attempts": resume.attempts,
        "synthesized": list(resume.synthesized) or None,
        "error": resume.error,
    }
    return line | {key: value for key, value in optional.items() if value is not None}


def _request_body(req: Any) -> bytes | None:
    """A request's body as bytes (None: it has none); ValueError for text or base64 that
    gives none (lone surrogates, bad base64)."""
    body = req.body.encode("utf-8") if req.body is not None else None
    if req.body_base64 is not None:
        body = base64.b64decode(req.body_base64, validate=True)
    return body


def _text_or_base64(data: bytes, text_key: str, base64_key: str) -> dict[str, str]:
    try:
        return {text_key: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {base64_key: base64.b64encode(data).decode("ascii")}


def cassette_lines(
    recorded: Iterable[Recorded], *, carries_uids: bool | None = None, **header: Any
) -> Iterable[str]:
    """A cassette's lines: its header (the version and ``header``), then its exchanges',
    each with its uid where it has one (the log's: importing it again adds nothing twice).
    ``carries_uids`` says whether any has one, for a ``recorded`` read once as it is
    written (an export); None: ``recorded`` is read first to tell."""
    reserved = [key for key in _RESERVED if key in header]
    if reserved:
        raise CassetteError(f"the header's {', '.join(reserved)} is the writer's to set, not given")
    for key, value in header.items():
        _check_json(value, f"the header's {key}")
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if carries_uids is None:
        recorded = list(recorded)
        carries_uids = any(r.uid for r in recorded)
    version = VERSION if carries_uids else _WITHOUT_UIDS
    head = {"tasktape_cassette": version, "created_at": created, "tool_version": __version__, **header}
    yield _line(head)
    for r in recorded:
        request: dict[str, Any] = {"method": r.method, "path": r.path}
        if r.query:
            request["query"] = r.query
        request["headers"] = r.request_headers
        if r.request_body is not None:
            request |= _text_or_base64(r.request_body, "body", "body_base64")
        if r.request_body_truncated:
            request["body_truncated"] = True
        if r.request_decoded_from and r.request_body is not None:
            request["decoded_from"] = r.request_decoded_from
        exchange: dict[str, Any] = {"request": request}
        if r.status is not None:
            response: dict[str, Any] = {
                "status": r.status,
                "headers": r.response_headers,
                "sse": r.is_sse,
                "ttfb_ms": _ms(r.ttfb_ns),
            }
            if r.decoded_from:
                response["decoded_from"] = r.decoded_from
            if r.response_body_truncated:
                response["body_truncated"] = True
            exchange["response"] = response
        if r.reconnect_of is not None:
            exchange["reconnect_of"] = r.reconnect_of
        if r.started_at:
            exchange["started_at"] = r.started_at
        if r.recorded_by:
            exchange["recorded_by"] = r.recorded_by
        if r.uid:
            exchange["uid"] = r.uid
        if r.resumes:
            exchange["resumes"] = [_resume_line(resume) for resume in r.resumes]
        yield _line({"exchange": exchange})
        for offset, data in r.chunks:
            yield json.dumps(
                {"chunk": {"offset_ms": _ms(offset), **_text_or_base64(data, "text", "base64")}},
                ensure_ascii=False,
            )
        end: dict[str, Any] = {
            "duration_ms": None if r.duration_ns is None else _ms(r.duration_ns),
            "outcome": r.outcome or Outcome.COMPLETE,
        }
        if r.error:
            end["error"] = r.error
        yield _line({"end": end})


def _line(value: dict[str, Any]) -> str:
    """A cassette line's JSON, UTF-8 text as it is but lone surrogates, which UTF-8 has no
    form for, as JSON escapes (``\\udcfe``): a file name that is not UTF-8 (the header's
    ``source``), as Python decodes it, read back as the same name."""
    return _SURROGATE.sub(_escaped, json.dumps(value, ensure_ascii=False))


def _escaped(m: re.Match[str]) -> str:
    return f"\\u{ord(m[0]):04x}"


def _check_json(value: Any, what: str) -> None:
    """A value written into a cassette as it is: one JSON has no form for (a datetime, NaN or
    infinity, which Python would write as no JSON reader takes) is a :class:`CassetteError`
    naming it."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:  # (ValueError: a list that holds itself)
        raise CassetteError(f"{what} is written as JSON, which has no form for it: {exc}") from None


def write_cassette(path: str | Path, recorded: Iterable[Recorded], **header: Any) -> None:
    """Write exchanges as a cassette (the header gets the version and ``header``), all at
    once: a reader never sees half a cassette. What it would not read back (a chunk before
    the one it follows, a request without a method, a header value that is no JSON...) is
    a :class:`CassetteError`, and nothing is written; so is a file that cannot be written.
    ``recorded`` is a list of them: one ``Recorded`` alone is a usage error. A symbolic
    link is written through, to the file it names."""
    target = Path(path)
    exchanges = _writable(recorded, target)
    try:
        text = "\n".join(cassette_lines(exchanges, **header)) + "\n"
    except CassetteError as exc:
        raise CassetteError(f"cannot write {target}: {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:  # a field of a type it has no form for
        raise CassetteError(
            f"cannot write {target}: an exchange holds what a cassette cannot: {exc}"
        ) from exc
    try:
        read_cassette(target, content=text.encode("utf-8"))
    except CassetteError as exc:
        raise CassetteError(f"cannot write {target}: it would not read back: {exc}") from None
    replace_with(target, [text])


def _writable(recorded: Iterable[Recorded], target: Path) -> list[Recorded]:
    """The exchanges to write, each a :class:`Recorded` whose headers and chunks have their
    shapes (changed since it was made, they may not)."""
    if isinstance(recorded, Recorded):
        raise UsageError("write_cassette takes a list of Recorded exchanges, not one: write [recorded]")
    if isinstance(recorded, str | bytes | PurePath) or not isinstance(recorded, Iterable):
        raise UsageError(f"write_cassette takes a list of Recorded exchanges, not {type(recorded).__name__}")
    exchanges = list(recorded)
    for n, r in enumerate(exchanges, 1):
        if not isinstance(r, Recorded):
            raise UsageError(
                f"write_cassette takes a list of Recorded exchanges: item {n} is {type(r).__name__}"
            )
        problem = r.misshapen()
        if problem is not None:
            raise CassetteError(f"cannot write {target}: exchange {n}: {problem}")
    return exchanges


def replace_with(target: Path, pieces: Iterable[str]) -> None:
    """``target`` made to hold the text of ``pieces`` at once: written beside it as they
    come, then moved over it (over the file a link names, the link kept; with the mode the
    file had). What is no file (a pipe, ``/dev/stdout``, a device) is written to as it is:
    there is nothing to replace, and replaced it would no longer be what it was."""
    if target.is_dir():
        raise CassetteError(f"cannot write {target}: it is a folder")
    if not target.parent.is_dir():  # (said of the cassette, not of the file written first)
        raise CassetteError(f"cannot write {target}: its folder {target.parent} does not exist")
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise CassetteError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        if mode is not None and not stat.S_ISREG(mode):
            with target.open("w", encoding="utf-8") as out:
                out.writelines(pieces)
            return
    except OSError as exc:
        raise CassetteError(f"cannot write {target}: {exc.strerror or exc}") from None
    if mode is not None:
        _refuse_database(target)
    real = target.resolve()
    # Named apart from the cassette: a cassette's name may take all the bytes a name can.
    partial = real.with_name(f".tasktape-{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    try:
        with partial.open("x", encoding="utf-8") as out:
            out.writelines(pieces)
        if mode is not None:  # (a cassette kept private stays so)
            partial.chmod(stat.S_IMODE(mode))
        partial.replace(real)
    except OSError as exc:
        raise CassetteError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)


def _refuse_database(target: Path) -> None:
    """Refuse to write over an event log (or another SQLite database): its path given for
    the cassette's, the log would be lost, and a writer that has it open would write on
    into a file no longer there. (One that cannot be read is left to the write.)"""
    try:
        kind = kind_of(target)
    except OSError:
        return
    if kind is FileKind.LOG:
        from .schema import named_kind  # noqa: PLC0415 - sqlite-utils, only for an SQLite file

        raise CassetteError(f"{target} is {named_kind(target)}: a cassette is not written over it")


def imported_uid(content: bytes, created_at: str | None = None) -> str:
    """The uid of the capture that imports a file of these bytes (a cassette, a flow file):
    the same for the same bytes, so that importing it again adds nothing twice, and logs
    that imported it merge as one (its exchanges' uids follow from it)."""
    return digest_uid(hashlib.sha256(content).hexdigest(), created_at)


def digest_uid(sha256: str, created_at: str | None = None) -> str:
    """:func:`imported_uid` of a file whose bytes' SHA-256 (in hex) is ``sha256``: hashed
    as it was read, never in memory whole."""
    return derived_uuid7(iso_ns(created_at), "cassette", sha256)


def load_into(
    writer: LogProducer,
    recorded: Iterable[Recorded],
    capture_id: int,
    capture_uid: str | None = None,
    held: MutableMapping[str, int] | None = None,
) -> list[int]:
    """Write exchanges into a log through ``writer``; returns their exchange ids. A
    reconnect the resume gateway answered is a row of ``resumes`` again, as it was.
    ``held``: the exchange ids of the uids the log holds (an import): given, an exchange
    keeps its uid (a cassette's, exported from a log), and one among them is not written
    again (its id is the one held; those written are added to it). Not given, each gets a
    uid of its own, as a copy loaded beside its original must. Without a uid, one follows,
    with ``capture_uid`` (a cassette's, :func:`imported_uid`), from it and the exchange's
    place in the cassette: held too, it is not written again (an import finished after it
    was stopped part-way)."""
    keeps_uids = held is not None
    held = {} if held is None else held
    ids: list[int] = []
    for n, r in enumerate(recorded):
        # A time the log cannot hold (or, in a Recorded made in Python, no time at all) leaves
        # the exchange the time it is loaded at: loaded, not lost.
        started_ns = _exact_ns(r.started_at) if r.started_at else None
        uid = r.uid if keeps_uids else None
        if uid is None and capture_uid is not None:
            # (From the time to the microsecond, as ever: imported again, the same uid.)
            uid = derived_uuid7(iso_ns(r.started_at), "exchange", capture_uid, n)
        if uid in held:  # (a derived uid too: the capture's, written before it was left unfinished)
            ids.append(held[uid])
            continue
        exchange = writer.begin_exchange(
            capture_id,
            method=r.method,
            path=r.path,
            query=r.query,
            request_headers=r.request_headers,
            request_body=r.request_body,
            request_body_truncated=r.request_body_truncated,
            request_decoded_from=r.request_decoded_from,
            started_ns=started_ns,
            uid=uid,
        )
        if r.status is not None:
            writer.response_head(
                exchange,
                status=r.status,
                headers=r.response_headers,
                is_sse=r.is_sse,
                ttfb_ns=r.ttfb_ns,
                decoded_from=r.decoded_from,
                body_truncated=r.response_body_truncated,
            )
        writer.chunks(exchange, r.chunks)
        writer.end_exchange(
            exchange, duration_ns=r.duration_ns, outcome=r.outcome or Outcome.COMPLETE, error=r.error
        )
        if r.resumes:
            base = started_ns or time.time_ns()  # (the time it was loaded at, as the writer gives it)
            for carried in r.resumes:
                stream = exchange if carried.of == 0 else ids[len(ids) + carried.of]
                writer.resume(carried.row(stream, exchange), at_ns=base + carried.offset_ns)
        elif r.reconnect_of is not None:  # (a cassette that gives only what it resumed)
            answered = ResumeOutcome.ENDED if r.status == HTTPStatus.NO_CONTENT else ResumeOutcome.RESUMED
            resume = Resume(
                ids[len(ids) + r.reconnect_of],
                ResumeSide.CLIENT,
                answered,
                last_event_id=r.resumed_from,
                new_exchange_id=exchange,
            )
            writer.resume(resume, at_ns=None if started_ns is None else started_ns + r.ttfb_ns)
        ids.append(exchange)
        if uid is not None:
            held[uid] = exchange
    return ids
