"""What the pytest plugin does with a cassette older than its age limit (``--tasktape-max-age``)."""

from __future__ import annotations

from enum import StrEnum

from tasktape.choices import parse_choice


class OnExpired(StrEnum):
    WARN = "warn"  # the test runs against it, and a CassetteExpired warning names it
    FAIL = "fail"  # the test fails before it runs, saying how to record it again
    RERECORD = "rerecord"  # the test records it again, as --tasktape-record-mode=all would

    @classmethod
    def parse(cls, value: str) -> OnExpired:
        return parse_choice(cls, value, "a way to treat expired cassettes")
