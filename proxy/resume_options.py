"""The choices of a resuming recorder (``tasktape record --resume``)."""

from __future__ import annotations

from enum import StrEnum

from tasktape.errors import UsageError


class UnknownResume(StrEnum):
    """What a reconnect gets whose Last-Event-ID names no event of the stream held for it."""

    REFUSE = "refuse"  # a 400 naming the ids held: never a silent restart
    FORWARD = "forward"  # it goes to the agent, as without --resume

    @classmethod
    def parse(cls, value: str) -> UnknownResume:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(c.value) for c in cls)
            raise UsageError(f"--resume-unknown must be one of {choices}, not {value!r}") from None
