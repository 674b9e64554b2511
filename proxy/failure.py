"""How the recorder words a failure in the log."""

from __future__ import annotations

import re
from collections.abc import Iterator

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

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
    message quotes: it and those it was raised from, each by its type and what it says
    (one that says no more than the exception it caused is left out)."""
    said: list[str] = []
    described: list[str] = []
    for link in _chain(exc):
        text = " ".join(unquoted(_said(link)).split())
        if text and any(text in earlier for earlier in said):
            continue
        said.append(text)
        described.append(f"{type(link).__name__}: {text}" if text else type(link).__name__)
    return "; from ".join(described)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, in turn."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__


# How aiohttp quotes an OSError in another exception's message (a body cut short by a
# reset: "... . ConnectionResetError(104, 'Connection reset by peer')"); the quote would
# be cut as the bytes of a request.
_OS_ERROR = re.compile(r"""\b(\w+Error)\(\d+, (['"])([^'"\\]*)\2\)""")


def _said(exc: BaseException) -> str:
    """What ``exc`` says. An OSError of the system: its strerror. A response aiohttp could not read: its
    parser's message, not its ``str()``, which quotes that message (escaping the quotes of
    the bytes it quotes) and adds the URL, with the client's query the log may redact.
    Another: its ``str()``, less the exception it was raised from (described on its own)
    and with an OSError it quotes named as its type and strerror."""
    if isinstance(exc, OSError) and exc.strerror and not isinstance(exc, aiohttp.ClientError):
        return exc.strerror
    if isinstance(exc, aiohttp.ClientResponseError | HttpProcessingError):
        return exc.message
    text = str(exc)
    if exc.__cause__ is not None:
        text = text.replace(f": {exc.__cause__!r}", "")
    return _OS_ERROR.sub(r"\1: \3", text)


def dropped(why: BaseException | str) -> str:
    """The error of an exchange whose upstream broke off mid-response."""
    return f"the upstream dropped mid-response: {describe(why) if isinstance(why, BaseException) else why}"
