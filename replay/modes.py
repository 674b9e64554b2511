"""What the replay server does with a request that matches nothing recorded."""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar

from tasktape.errors import UsageError

Choice = TypeVar("Choice", bound=StrEnum)


def parse_choice(cls: type[Choice], value: str, what: str) -> Choice:
    """The member of ``cls`` named ``value``; a typo is an error that lists them all."""
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise UsageError(f"{value!r} is not {what}; choose one of {choices}") from None


class ReplayMode(StrEnum):
    REPLAY = "replay"  # a miss is an error
    RECORD_MISSING = "record-missing"  # a miss goes to the upstream, is recorded, then replays
    PASSTHROUGH = "passthrough"  # everything goes to the upstream; nothing is replayed

    @classmethod
    def parse(cls, value: str) -> ReplayMode:
        return parse_choice(cls, value, "a replay mode")
