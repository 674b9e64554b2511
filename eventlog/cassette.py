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
import json
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tasktape.errors import CassetteError
from tasktape.version import __version__

from .http_fields import field_problem
from .outcomes import Outcome
from .producer import LogProducer
from .recorded import Recorded

VERSION = 1
# Offsets and durations become nanoseconds in SQLite INTEGERs: a bound well inside them
# (about 31 years) refuses infinities and absurd values on loading, not when written.
MAX_MS = 1e12
# A CR, LF or NUL in a header would split the response it is replayed in.
_NOT_IN_HEADERS = re.compile(r"[\r\n\x00]")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _sendable_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Response headers are sent again on replay: each must be one HTTP allows."""
    for name, value in headers:
        problem = field_problem(name, value)
        if problem:
            raise ValueError(problem)
    return headers


def _headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    for name, value in headers:
        if not name or _NOT_IN_HEADERS.search(name) or _NOT_IN_HEADERS.search(value):
            raise ValueError(f"header {name!r}: a header needs a name, and holds no CR, LF or NUL")
    return headers


class Request(_Strict):
    method: str = Field(min_length=1)
    path: str = Field(pattern=r"^/")
    query: str | None = None
    headers: list[tuple[str, str]] = []
    body: str | None = None
    body_base64: str | None = None
    body_truncated: bool = False

    _check_headers = field_validator("headers")(_headers)

    @model_validator(mode="after")
    def _one_body(self) -> Request:
        if self.body is not None and self.body_base64 is not None:
            raise ValueError("give the body as 'body' or 'body_base64', not both")
        return self


class Response(_Strict):
    status: int = Field(ge=100, le=599)
    headers: list[tuple[str, str]] = []
    sse: bool | None = None  # default: from the Content-Type
    ttfb_ms: float = Field(default=0.0, ge=0, le=MAX_MS)
    decoded_from: str | None = None
    body_truncated: bool = False

    _check_headers = field_validator("headers")(_sendable_headers)


class Exchange(_Strict):
    request: Request
    response: Response | None = None
    started_at: str | None = None


class Chunk(_Strict):
    offset_ms: float = Field(ge=0, le=MAX_MS)
    text: str | None = None
    base64: str | None = None

    @model_validator(mode="after")
    def _one_spelling(self) -> Chunk:
        if (self.text is None) == (self.base64 is None):
            raise ValueError("give the bytes as exactly one of 'text' or 'base64'")
        return self

    def data(self) -> bytes:
        if self.text is not None:
            return self.text.encode("utf-8")
        return base64.b64decode(self.base64 or "", validate=True)


class Event(_Strict):
    offset_ms: float = Field(ge=0, le=MAX_MS)
    data: str
    id: str | None = None
    event: str | None = None
    retry: int | None = Field(default=None, ge=0)

    def sse(self) -> bytes:
        lines = [
            f"{name}: {value}"
            for name, value in (("id", self.id), ("event", self.event), ("retry", self.retry))
            if value is not None
        ]
        lines += [f"data: {line}" for line in self.data.split("\n")]
        return ("\n".join(lines) + "\n\n").encode("utf-8")


class End(_Strict):
    duration_ms: float | None = Field(default=None, ge=0, le=MAX_MS)
    outcome: str = Outcome.COMPLETE
    error: str | None = None


_LINES: dict[str, type[BaseModel]] = {"exchange": Exchange, "chunk": Chunk, "event": Event, "end": End}


def _ns(ms: float) -> int:
    return round(ms * 1_000_000)


def _ms(ns: int) -> float:
    return round(ns / 1_000_000, 6)


def read_cassette(path: str | Path) -> list[Recorded]:
    """Read and validate a cassette; raises :class:`CassetteError` naming the line.

    Lines end at LF alone, as JSON Lines do: text may hold U+2028 or U+0085 as it is (the
    cassettes tasktape writes do), which ``str.splitlines`` would take for line ends."""
    path = Path(path)
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise CassetteError(f"{path}: cannot read it as a cassette: {exc}") from None
    recorded: list[Recorded] = []
    current: Recorded | None = None
    header_seen = False
    for number, line in enumerate(content.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            doc = _loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise CassetteError(f"{path}:{number}: not JSON: {exc}") from None
        if not header_seen:
            _check_header(doc, f"{path}:{number}")
            header_seen = True
            continue
        chunk = _plain_chunk(doc)
        if chunk is None:  # any other line: read through its model
            where = f"{path}:{number}"
            kind, item = _validated(doc, where)
            if isinstance(item, Exchange):
                try:
                    current = _exchange(item, f"{path.name}:{number}")
                except ValueError as exc:  # a body that has no bytes: bad base64, lone surrogates
                    raise CassetteError(f"{where}: exchange: request body: {exc}") from None
                recorded.append(current)
                continue
            if current is None:
                raise CassetteError(f"{where}: a {kind} line must follow an exchange line")
            if isinstance(item, End):
                current.duration_ns = None if item.duration_ms is None else _ns(item.duration_ms)
                current.outcome, current.error = item.outcome, item.error
                current = None
                continue
            try:
                data = item.sse() if isinstance(item, Event) else item.data()  # type: ignore[attr-defined]
            except ValueError as exc:
                raise CassetteError(f"{where}: {kind}: {exc}") from None
            chunk = (_ns(item.offset_ms), data)  # type: ignore[attr-defined]
        elif current is None:
            raise CassetteError(f"{path}:{number}: a chunk line must follow an exchange line")
        if current.chunks and chunk[0] < current.chunks[-1][0]:
            raise CassetteError(
                f"{path}:{number}: offset_ms goes back in time (the previous chunk was later)"
            )
        current.chunks.append(chunk)
    if not header_seen:
        raise CassetteError(f"{path}: empty; a cassette starts with its header line")
    for r in recorded:
        if r.duration_ns is None:
            r.duration_ns = r.chunks[-1][0] if r.chunks else r.ttfb_ns
        r.outcome = r.outcome or Outcome.COMPLETE
    return recorded


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
    if type(text) is not str or type(offset) not in _NUMBER or not 0 <= offset <= MAX_MS:
        return None
    try:
        return _ns(float(offset)), text.encode("utf-8")  # float: as the model reads it
    except UnicodeEncodeError:  # a lone surrogate, from an escape: the model says so
        return None


def _validated(doc: Any, where: str) -> tuple[str, BaseModel]:
    """A line's kind and its model, or :class:`CassetteError` saying what is wrong."""
    if not isinstance(doc, dict) or len(doc) != 1 or next(iter(doc)) not in _LINES:
        raise CassetteError(f"{where}: expected one of {', '.join(_LINES)} as the line's only key")
    kind, body = next(iter(doc.items()))
    try:
        return kind, _LINES[kind].model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or kind}: {e['msg']}" for e in exc.errors()
        )
        raise CassetteError(f"{where}: {kind}: {problems}") from None
    except ValueError as exc:  # base64 that does not decode
        raise CassetteError(f"{where}: {kind}: {exc}") from None


def read_header(path: str | Path) -> dict[str, Any]:
    """A cassette's header line (the rest of the file is not read); raises
    :class:`CassetteError` naming the line."""
    path = Path(path)
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        doc = json.loads(line)
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


def _exchange(item: Exchange, origin: str) -> Recorded:
    req, resp = item.request, item.response
    body = req.body.encode("utf-8") if req.body is not None else None
    if req.body_base64 is not None:
        body = base64.b64decode(req.body_base64, validate=True)
    headers = resp.headers if resp else []
    content_type = next((v for k, v in headers if k.lower() == "content-type"), "")
    return Recorded(
        method=req.method,
        path=req.path,
        query=req.query,
        request_headers=list(req.headers),
        request_body=body,
        request_body_truncated=req.body_truncated,
        status=resp.status if resp else None,
        response_headers=list(headers),
        is_sse=resp.sse if resp and resp.sse is not None else content_type.startswith("text/event-stream"),
        ttfb_ns=_ns(resp.ttfb_ms) if resp else 0,
        decoded_from=resp.decoded_from if resp else None,
        response_body_truncated=resp.body_truncated if resp else False,
        started_at=item.started_at,
        origin=origin,
    )


def _text_or_base64(data: bytes, text_key: str, base64_key: str) -> dict[str, str]:
    try:
        return {text_key: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {base64_key: base64.b64encode(data).decode("ascii")}


def cassette_lines(recorded: Iterable[Recorded], **header: Any) -> Iterable[str]:
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    head = {"tasktape_cassette": VERSION, "created_at": created, "tool_version": __version__, **header}
    yield json.dumps(head, ensure_ascii=False)
    for r in recorded:
        request: dict[str, Any] = {"method": r.method, "path": r.path}
        if r.query:
            request["query"] = r.query
        request["headers"] = r.request_headers
        if r.request_body is not None:
            request |= _text_or_base64(r.request_body, "body", "body_base64")
        if r.request_body_truncated:
            request["body_truncated"] = True
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
        if r.started_at:
            exchange["started_at"] = r.started_at
        yield json.dumps({"exchange": exchange}, ensure_ascii=False)
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
        yield json.dumps({"end": end}, ensure_ascii=False)


def write_cassette(path: str | Path, recorded: Iterable[Recorded], **header: Any) -> None:
    """Write exchanges as a cassette (the header gets the version and ``header``), all at
    once: a reader never sees half a cassette."""
    text = "\n".join(cassette_lines(recorded, **header)) + "\n"
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def load_into(writer: LogProducer, recorded: Iterable[Recorded], capture_id: int) -> list[int]:
    """Write exchanges into a log through ``writer``; returns their new exchange ids."""
    ids = []
    for r in recorded:
        exchange = writer.begin_exchange(
            capture_id,
            method=r.method,
            path=r.path,
            query=r.query,
            request_headers=r.request_headers,
            request_body=r.request_body,
            request_body_truncated=r.request_body_truncated,
            started_ns=_started_ns(r.started_at),
        )
        if r.status is not None:
            writer.response_head(
                exchange,
                status=r.status,
                headers=r.response_headers,
                is_sse=r.is_sse,
                ttfb_ns=r.ttfb_ns,
                decoded_from=r.decoded_from,
            )
        writer.chunks(exchange, r.chunks)
        writer.end_exchange(
            exchange, duration_ns=r.duration_ns or 0, outcome=r.outcome or Outcome.COMPLETE, error=r.error
        )
        ids.append(exchange)
    return ids


def _started_ns(started_at: str | None) -> int | None:
    if not started_at:
        return None
    try:
        moment = datetime.fromisoformat(started_at.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = int(moment.timestamp())
    ns = seconds * 1_000_000_000 + moment.microsecond * 1000
    # Beyond what the log holds (nanoseconds in an INTEGER: the years 1677 to 2262), it is
    # treated as a time that cannot be read: the exchange gets the time it is loaded at.
    return ns if -(2**63) <= ns < 2**63 else None
