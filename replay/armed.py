"""Fault specs armed on a replay server: each counts the requests its scope could apply
to (``times``, ``every``, ``p`` with its seed, ``path``), and decides which answers get it."""

from __future__ import annotations

import fnmatch
import random
from typing import Any

from tasktape.errors import FaultError

from .faults import HEADER, Faults


class Armed:
    """A spec armed on a server: it counts the requests its scope could apply to."""

    def __init__(self, faults: Faults, source: str) -> None:
        self.faults = faults
        self.source = source  # where it came from: --fault, the control API, the marker
        self.seen = 0
        self.applied = 0
        self._random = random.Random(faults.scope.seed)

    def could_take(self, path: str, is_stream: bool) -> bool:
        """Whether the faults are for such an answer at all (its path, a stream or not),
        whatever they count or draw."""
        scope = self.faults.scope
        if self.faults.on_streams and not is_stream:
            return False
        return scope.path is None or fnmatch.fnmatchcase(path, scope.path)

    def takes(self, path: str, is_stream: bool) -> bool:
        """Whether this answer gets the faults (and count it, if it could have)."""
        scope = self.faults.scope
        if not self.could_take(path, is_stream):
            return False
        self.seen += 1
        if scope.every is not None and self.seen % scope.every:
            return False
        if scope.times is not None and self.applied >= scope.times:
            return False
        if scope.p is not None and self._random.random() >= scope.p:
            return False
        self.applied += 1
        return True

    def as_json(self) -> dict[str, Any]:
        return {"fault": str(self.faults), "source": self.source, "seen": self.seen, "applied": self.applied}


def for_request(
    armed: list[Armed], header: Faults | None, path: str, is_stream: bool
) -> tuple[Faults, list[Armed]]:
    """What one answer gets: every armed spec whose scope takes it, then the request's own;
    and the armed specs that took it."""
    faults = Faults()
    taken = [spec for spec in armed if spec.takes(path, is_stream)]
    for spec in taken:
        faults = faults.merged(spec.faults)
    if header is not None and Armed(header, HEADER).takes(path, is_stream):
        faults = faults.merged(header)
    return faults, taken


def give_back(taken: list[Armed], made: list[str]) -> None:
    """The specs that took an answer none of whose faults were made (the answer was too
    short for them, or another spec's took their place) keep their count for the next."""
    for spec in taken:
        if not set(made) & set(spec.faults.fault_items()):
            spec.applied -= 1


def header_faults(value: str) -> Faults:
    """The ``X-Tasktape-Fault`` of one request: a request counts nothing, so no times or every."""
    faults = Faults.parse(value)
    if faults.scope.counts:
        raise FaultError(
            "times and every count requests: arm the fault with --fault or POST /_tasktape/faults instead"
        )
    return faults
