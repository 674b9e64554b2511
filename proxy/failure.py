"""How the recorder words a failure in the log."""

from __future__ import annotations


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def dropped(why: BaseException | str) -> str:
    """The error of an exchange whose upstream broke off mid-response."""
    return f"the upstream dropped mid-response: {describe(why) if isinstance(why, BaseException) else why}"
