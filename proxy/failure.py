"""How the recorder words a failure in the log."""

from __future__ import annotations

import re

import aiohttp

# Where aiohttp's description of what it could not read starts quoting what it read (a
# request's or a response's bytes, which may hold a token or a cookie): a bytes literal
# after a colon or a space, whatever follows it (a caret under the bad byte; its quote
# escaped when the message is itself quoted), or a quoted string that no more words follow
# but its own escaped quotes ("Duplicate 'Host' header found." names a header, and is kept
# whole).
# (aiohttp quotes a request line too long as bytearray(b'...').)
_QUOTED = re.compile(
    r"""(?:[:\s]+|^)(?:(?:bytearray\(|bytes\()?b\\?['"].*|(['"])(?:(?!(?<!\\)\1\s+\w).)*$)""", re.DOTALL
)


def unquoted(text: str) -> str:
    """``text`` cut where it starts quoting the bytes it is about."""
    return _QUOTED.split(text, maxsplit=1)[0]


def describe(exc: BaseException) -> str:
    """An exception in one line for the log and for the client, without the bytes its
    message quotes."""
    text = " ".join(unquoted(_said(exc)).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _said(exc: BaseException) -> str:
    """What ``exc`` says. A response aiohttp could not read: its parser's message, not its
    ``str()``, which quotes that message (escaping the quotes of the bytes it quotes) and
    adds the URL, with the client's query the log may redact."""
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.message
    return str(exc)


def dropped(why: BaseException | str) -> str:
    """The error of an exchange whose upstream broke off mid-response."""
    return f"the upstream dropped mid-response: {describe(why) if isinstance(why, BaseException) else why}"
