"""The choices of a resuming recorder (``tasktape record --resume``)."""

from __future__ import annotations

from enum import StrEnum

from tasktape.choices import parse_choice


class UnknownResume(StrEnum):
    """What a reconnect gets whose Last-Event-ID names no event of the stream held for it."""

    REFUSE = "refuse"  # a 400 naming the ids held: never a silent restart
    FORWARD = "forward"  # it goes to the agent, as without --resume

    @classmethod
    def parse(cls, value: str) -> UnknownResume:
        return parse_choice(cls, value, "a --resume-unknown choice")
