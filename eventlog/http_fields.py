"""What HTTP allows in a header field (RFC 9110 sections 5.1 and 5.5): a name is a token,
a value holds no control character but HTAB. A response header outside these rules cannot
be sent again: replay leaves it out. A log keeps what an HTTP parser read, which is laxer
(a value may hold other control characters, never CR, LF or NUL), and so do cassettes."""

from __future__ import annotations

import re
from collections.abc import Iterable

TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_SPLITS = re.compile(r"[\r\n\x00]")


def unsendable(value: str) -> bool:
    """Whether ``value`` cannot be sent in a response's head (a header value, or the reason
    phrase of its status line): it holds a control character but tab."""
    return _CONTROL.search(value) is not None


def joined(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    """All the lines of a list-valued header as one value (RFC 9110 section 5.3: two
    ``Content-Encoding: gzip`` lines say ``gzip, gzip``); None without one."""
    name = name.lower()
    return ", ".join(value for key, value in headers if key.lower() == name) or None


def field_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` cannot be sent as a header, or None when it can."""
    return _problem(name, value, _CONTROL, "no control character but tab")


def read_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` is no response header an HTTP parser reads (and a log holds), or None."""
    return _problem(name, value, _SPLITS, "no CR, LF or NUL")


def _problem(name: str, value: str, refused: re.Pattern[str], rule: str) -> str | None:
    if not TOKEN.fullmatch(name):
        return f"header {name!r}: a header name is a token (letters, digits and !#$%&'*+-.^_`|~)"
    if refused.search(value):
        return f"header {name!r}: a header value holds {rule}"
    return None
