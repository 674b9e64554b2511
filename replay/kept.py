"""What a long-running replay keeps of its misses, refusals and faults not made: exact
counts, and in full only so many distinct ones."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

# The distinct misses (by request line and closest recordings), refusals and faults not made
# (by what was said of them) a long-running replay keeps in full, each with how often it
# came: a person reads them in the exit summary, and a client polling a path never recorded
# is one of them, not thousands. The others are counted.
KEPT = 50


@dataclass
class Kept(Generic[T]):
    """What a replay keeps of one kind of trouble: how many came, exactly; in full the first
    of each of the first ``KEPT`` distinct ones (by ``key``), with how many times each came;
    the others counted. With ``every`` (a test's server, which lives as long as the test, and
    fails it naming each), every one in full."""

    key: Callable[[T], str]
    every: bool = False
    items: list[T] = field(default_factory=list)
    times: Counter[str] = field(default_factory=Counter)  # of each distinct one kept
    total: int = 0
    others: int = 0  # those past the distinct ones kept

    def add(self, item: T) -> None:
        self.total += 1
        key = self.key(item)
        known = key in self.times
        if known or len(self.times) < KEPT:
            self.times[key] += 1
        else:
            self.others += 1
        if self.every or (not known and key in self.times):
            self.items.append(item)

    def distinct(self) -> list[tuple[T, int]]:
        """The first of each distinct one kept, in the order they came, with how many came."""
        firsts = {self.key(item): item for item in reversed(self.items)}
        return [(firsts[key], n) for key, n in self.times.items()]
