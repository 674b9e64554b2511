"""How old a cassette is (its header's ``created_at``), and the age limits it is held to."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from tasktape.errors import UsageError

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
FORMS = "45s, 90m, 12h, 30d or 2w"
_LIMIT = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SPELLED = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def parse_max_age(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w``: a number and its unit; anything else is
    a :class:`UsageError` listing the forms."""
    found = _LIMIT.fullmatch(text.strip())
    if found is None:
        raise UsageError(f"{text!r} is not an age; write a number and its unit: {FORMS}")
    try:
        return timedelta(seconds=float(found[1]) * UNITS[found[2]])
    except OverflowError:
        raise UsageError(f"{text!r} is longer than any age a cassette can have") from None


def created_at(cassette: Path) -> datetime | None:
    """When the cassette's header says it was recorded; None when it does not say (a
    hand-written header). A header whose ``created_at`` is no time raises CassetteError."""
    # Here, not at the top: the plugin loads this module in every run, the cassette
    # reader (and pydantic) only when a test uses a cassette.
    from tasktape.eventlog.cassette import read_header  # noqa: PLC0415
    from tasktape.eventlog.uids import read_time  # noqa: PLC0415

    written = read_header(cassette).get("created_at")
    return None if written is None else read_time(written)


def describe(span: timedelta) -> str:
    """``span`` in its two largest units, as a person says it: "45 days 3 hours"."""
    left = max(0, int(span.total_seconds()))
    said = []
    for name, seconds in _SPELLED:
        count, left = divmod(left, seconds)
        if count or said:
            said.append(f"{count} {name}{'' if count == 1 else 's'}")
    said = [part for part in said[:2] if not part.startswith("0 ")]
    return " ".join(said) or "0 seconds"
