"""What the replay server does with a request that matches nothing recorded."""

from __future__ import annotations

from enum import StrEnum

from tasktape.choices import parse_choice

# Why faults are refused in passthrough (given at start, or armed while it runs).
NOTHING_REPLAYED = "mode passthrough replays nothing: a fault has no answer to be made on"


class ReplayMode(StrEnum):
    REPLAY = "replay"  # a miss is an error
    RECORD_MISSING = "record-missing"  # a miss goes to the upstream, is recorded, then replays
    PASSTHROUGH = "passthrough"  # everything goes to the upstream; nothing is replayed

    @classmethod
    def parse(cls, value: str) -> ReplayMode:
        return parse_choice(cls, value, "a replay mode")
