"""Whether a recording's Content-Length can frame the body it holds when it is sent again.
A log keeps what the upstream sent, less what the recorder redacted in it; a cassette may
have been edited by hand since: a length that is not the body's would hang the client (too
long) or cut the body (too short)."""

from __future__ import annotations

import re

from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import REDACTED, UNREADABLE

_LENGTH = re.compile(r"[0-9]+")
# Answers without a body, whose Content-Length (if any) says what another answer would hold.
_BODILESS_STATUSES = frozenset({204, 304})
_MARKS = (REDACTED.encode(), UNREADABLE.encode())


def length_problem(recorded: Recorded) -> str | None:
    """Why the recorded Content-Length is not the length of the body the recording holds;
    None when it is, or when there is none to send (the replay drops it anyway)."""
    values = [v for k, v in recorded.response_headers or () if k.lower() == "content-length"]
    if not values or not _sends_it(recorded):
        return None
    size = sum(len(data) for _, data in recorded.chunks)
    if len(values) > 1:
        return f"its Content-Length is given {len(values)} times ({', '.join(map(repr, values))})"
    value = values[0].strip()
    if not _LENGTH.fullmatch(value):
        return f"its Content-Length {value!r} is not a length"
    length = int(value)
    # A response that broke off holds fewer bytes than it announced: it breaks off again.
    if length == size or (recorded.cut_short and length > size):
        return None
    return f"its Content-Length {length} is not the length of the body it holds ({size} bytes)"


def _sends_it(recorded: Recorded) -> bool:
    """Whether the recorded Content-Length goes out with the recorded body: not for an
    answer without a body (to a HEAD, a 1xx, 204 or 304), nor for one sent other than it
    came (decoded from its Content-Encoding, or kept in part)."""
    status = recorded.status or 200
    if recorded.method == "HEAD" or status < 200 or status in _BODILESS_STATUSES:
        return False
    return not (recorded.decoded_from or recorded.response_body_truncated)


def redacted(recorded: Recorded) -> bool:
    """Whether the body holds what the recorder put for what it redacted: its length is not
    the one the upstream announced, as it should not be."""
    return any(mark in data for _, data in recorded.chunks for mark in _MARKS)
