"""What a long-running replay keeps of what it says in its summary (misses, refusals,
faults not made, answers that differed): exact counts, and in full only so many distinct
ones, each with how often it came."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tasktape.counted import counted

T = TypeVar("T")

# The distinct misses (by request line and closest recordings), refusals and faults not made
# (by what was said of them) a long-running replay keeps in full, each with how often it
# came: a person reads them in the exit summary, and a client polling a path never recorded
# is one of them, not thousands. The others are counted.
KEPT = 50


@dataclass
class Kept(Generic[T]):
    """What a replay keeps of one kind of trouble: how many came, exactly; in full the first
    of each of the first ``bound`` distinct ones (by ``key``), with how many times each came;
    the others counted. With ``every`` (a test's server, which lives as long as the test, and
    fails it naming each), every one in full."""

    key: Callable[[T], str]
    every: bool = False
    bound: int = KEPT
    items: list[T] = field(default_factory=list)
    times: Counter[str] = field(default_factory=Counter)  # of each distinct one kept
    total: int = 0
    others: int = 0  # those past the distinct ones kept

    def add(self, item: T) -> None:
        self.total += 1
        key = self.key(item)
        known = key in self.times
        if known or len(self.times) < self.bound:
            self.times[key] += 1
        else:
            self.others += 1
        if self.every or (not known and key in self.times):
            self.items.append(item)

    def distinct(self) -> list[tuple[T, int]]:
        """The first of each distinct one kept, in the order they came, with how many came."""
        firsts = {self.key(item): item for item in reversed(self.items)}
        return [(firsts[key], n) for key, n in self.times.items()]

    def rest(self, thing: str, how: str) -> list[str]:
        """A summary's last line of this kind, for those past the distinct ones it names
        (``and 3 more requests that missed otherwise``); none when there are none."""
        return [f"and {counted(self.others, f'more {thing}')} {how}"] if self.others else []


def times(n: int) -> str:
    """How a summary line says how often it came (``(x3,000)``), when more than once."""
    return f" (x{n:,})" if n > 1 else ""
