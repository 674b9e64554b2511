"""What the replay server does with a request that matches nothing recorded."""

from __future__ import annotations

from enum import StrEnum


class ReplayMode(StrEnum):
    REPLAY = "replay"  # a miss is an error
    RECORD_MISSING = "record-missing"  # a miss goes to the upstream, is recorded, then replays
    PASSTHROUGH = "passthrough"  # everything goes to the upstream; nothing is replayed

    @classmethod
    def parse(cls, value: str) -> ReplayMode:
        """The mode named ``value``; a typo is an error that lists the modes."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not a replay mode; choose one of {', '.join(m.value for m in cls)}"
            ) from None
