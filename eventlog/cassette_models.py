"""A cassette's lines as pydantic models: what reads, and words the errors of, every line
that ``cassette``'s own quick readings do not take (a hand-written line, an odd spelling,
a mistake). Loaded only when such a line comes: a cassette tasktape wrote is read without
them.
"""

from __future__ import annotations

import base64

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .cassette import (
    MAX_MS,
    MAX_STATUS,
    MIN_STATUS,
    TIME_FORM,
    broken_header,
    is_method,
    is_uid,
    splits_a_line,
    unread_header,
)
from .outcomes import Outcome
from .resumes import ResumeOutcome, ResumeSide
from .uids import read_time


def _whole_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    problem = broken_header(headers)
    if problem:
        raise ValueError(problem)
    return headers


def _read_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    problem = unread_header(headers)
    if problem:
        raise ValueError(problem)
    return headers


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# A request's target as the log keeps it: a path; or, for a request the recorder refused as
# it came, the target it was sent in another form (absolute "http://host/x", authority
# "host:443", asterisk "*"), or nothing for one that could not be read.
REQUEST_TARGET = r"^(?:/|\*$|$|[A-Za-z][A-Za-z0-9+.-]*://|[^\s/?#]+:[0-9]*$)"


class Request(_Strict):
    method: str = Field(min_length=1)
    path: str = Field(pattern=REQUEST_TARGET)
    query: str | None = None
    headers: list[tuple[str, str]] = []
    body: str | None = None
    body_base64: str | None = None
    body_truncated: bool = False
    # The Content-Encoding the body was decoded from ("identity": kept as sent). Not given:
    # the body is as sent, decoded on import by its Content-Encoding.
    decoded_from: str | None = None

    _check_headers = field_validator("headers")(_whole_headers)

    @field_validator("method", "path", "query")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if splits_a_line(value):
            raise ValueError("cannot hold a CR, LF or NUL, which would split the request line")
        return value

    @field_validator("method")
    @classmethod
    def _a_token(cls, value: str) -> str:
        if not is_method(value):
            raise ValueError("a method is a token (letters, digits and !#$%&'*+-.^_`|~), as HTTP has it")
        return value

    @model_validator(mode="after")
    def _one_body(self) -> Request:
        if self.body is not None and self.body_base64 is not None:
            raise ValueError("give the body as 'body' or 'body_base64', not both")
        return self


class Response(_Strict):
    status: int = Field(ge=MIN_STATUS, le=MAX_STATUS)
    headers: list[tuple[str, str]] = []
    sse: bool | None = None  # default: from the Content-Type
    ttfb_ms: float = Field(default=0.0, ge=0, le=MAX_MS)
    decoded_from: str | None = None
    body_truncated: bool = False

    _check_headers = field_validator("headers")(_read_headers)


class Resume(_Strict):
    # The stream resumed, counted back from this exchange (0: this exchange, for a resume
    # that made no exchange of its own; else this exchange is its reconnect or subscribe).
    of: int = Field(le=0)
    side: ResumeSide
    outcome: ResumeOutcome
    offset_ms: float = Field(default=0.0, ge=0, le=MAX_MS)  # after this exchange started
    last_event_id: str | None = None
    events_from_log: int | None = Field(default=None, ge=0)
    attempts: int | None = Field(default=None, ge=0)
    synthesized: list[str] = []
    error: str | None = None


class Exchange(_Strict):
    request: Request
    response: Response | None = None
    # A reconnect the resume gateway answered from a stream it held: that stream's
    # exchange, counted back from this one (-1: the exchange before).
    reconnect_of: int | None = Field(default=None, lt=0)
    started_at: str | None = None
    # The node id of the test that recorded it (the pytest plugin's cassettes).
    recorded_by: str | None = Field(default=None, min_length=1)
    # The uid of the log's exchange it was exported from: imported, it keeps it.
    uid: str | None = None
    # The rows of the log's resumes it carries.
    resumes: list[Resume] = []

    @field_validator("uid")
    @classmethod
    def _a_uid(cls, value: str | None) -> str | None:
        if value is not None and not is_uid(value):
            raise ValueError("must be a UUID in lowercase, as a log holds it")
        return value

    @field_validator("started_at")
    @classmethod
    def _a_time(cls, value: str | None) -> str | None:
        # Read as the log's time of the exchange (and its uid's): not one to replace quietly.
        if value is not None and read_time(value) is None:
            raise ValueError(f"must be {TIME_FORM}")
        return value


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

    # An event is written as SSE lines: a line break inside a field would end it there
    # (and start a field of its own); data gets one data line per LF, and CR has no place.
    @field_validator("id", "event")
    @classmethod
    def _one_line(cls, value: str | None) -> str | None:
        if value is not None and ("\n" in value or "\r" in value):
            raise ValueError("an SSE field cannot hold a line break (CR or LF)")
        if value is not None and "\0" in value:
            raise ValueError("an SSE field cannot hold a NUL character")
        return value

    @field_validator("data")
    @classmethod
    def _no_cr(cls, value: str) -> str:
        if "\r" in value:
            raise ValueError("SSE data cannot hold a CR: it ends a line (give its lines with LF)")
        return value

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
    outcome: Outcome = Outcome.COMPLETE
    error: str | None = None


LINES: dict[str, type[BaseModel]] = {"exchange": Exchange, "chunk": Chunk, "event": Event, "end": End}


__all__ = ["LINES", "Chunk", "End", "Event", "Exchange", "Request", "Response", "Resume", "ValidationError"]
