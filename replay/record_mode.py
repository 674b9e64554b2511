"""When the pytest plugin records cassettes, as pytest-recording users expect."""

from __future__ import annotations

from enum import StrEnum

from tasktape.choices import parse_choice


class RecordMode(StrEnum):
    NONE = "none"  # replay only: a missing cassette or a miss fails the test
    ONCE = "once"  # record a cassette that does not exist yet; replay one that does
    NEW_EPISODES = "new_episodes"  # replay what matches, record what misses, add it to the cassette
    ALL = "all"  # send every request to the upstream again, replacing the test's own recordings

    @classmethod
    def parse(cls, value: str) -> RecordMode:
        return parse_choice(cls, value, "a tasktape record mode")
