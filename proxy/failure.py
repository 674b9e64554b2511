"""How the recorder words a failure in the log."""

from __future__ import annotations


def describe(exc: BaseException) -> str:
    text = str(exc) or ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
