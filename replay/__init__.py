"""Reads the record back as live HTTP: matching, timing, resume and faults.

Names load on first use, so that pytest, which imports the plugin in every run, does not
pay for the replay server unless a test asks for a cassette.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasktape.lazy import lazy_getattr

if TYPE_CHECKING:
    from .faults import Faults
    from .matching import Incoming, MatchRules, mismatches
    from .modes import ReplayMode
    from .record_mode import RecordMode
    from .server import ReplayServer
    from .source import load
    from .tape import Tape

_WHERE = {
    "Faults": ".faults",
    "Incoming": ".matching",
    "MatchRules": ".matching",
    "RecordMode": ".record_mode",
    "ReplayMode": ".modes",
    "ReplayServer": ".server",
    "Tape": ".tape",
    "load": ".source",
    "mismatches": ".matching",
}
__all__ = [
    "Faults",
    "Incoming",
    "MatchRules",
    "RecordMode",
    "ReplayMode",
    "ReplayServer",
    "Tape",
    "load",
    "mismatches",
]


__getattr__ = lazy_getattr(__name__, _WHERE)
