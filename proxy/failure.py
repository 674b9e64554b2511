"""How the recorder words a failure in the log."""

from __future__ import annotations

import re

# Where aiohttp's description of what it could not read starts quoting what it read (a
# request's or a response's bytes, which may hold a token or a cookie): a quoted string
# after a colon or a space that no more words follow ("Duplicate 'Host' header found."
# names a header, and is kept whole).
# (aiohttp quotes a request line too long as bytearray(b'...').)
_QUOTED = re.compile(r"""(?:[:\s]+|^)(?:bytearray\(|bytes\()?b?(['"])(?:(?!\1\s+\w).)*$""", re.DOTALL)


def unquoted(text: str) -> str:
    """``text`` cut where it starts quoting the bytes it is about."""
    return _QUOTED.split(text, maxsplit=1)[0]


def describe(exc: BaseException) -> str:
    """An exception in one line for the log and for the client, without the bytes its
    message quotes."""
    text = unquoted(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def dropped(why: BaseException | str) -> str:
    """The error of an exchange whose upstream broke off mid-response."""
    return f"the upstream dropped mid-response: {describe(why) if isinstance(why, BaseException) else why}"
