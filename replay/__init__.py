"""Reads the record back as live HTTP: matching, timing, resume and faults."""

from .faults import Faults
from .matching import BodyRules, Incoming, mismatches
from .modes import ReplayMode
from .server import ReplayServer
from .source import load

__all__ = ["BodyRules", "Faults", "Incoming", "ReplayMode", "ReplayServer", "load", "mismatches"]
