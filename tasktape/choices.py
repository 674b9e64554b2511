"""What a caller chooses: a fixed vocabulary (a str enum) given as text, the member it
names or a usage error that lists them all; names given as a list; and a factor of time."""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum
from typing import TypeVar

from tasktape.errors import UsageError

Choice = TypeVar("Choice", bound=StrEnum)


def parse_choice(cls: type[Choice], value: str, what: str) -> Choice:
    """The member of ``cls`` named ``value``; a typo is an error that lists them all."""
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise UsageError(f"{value!r} is not {what}; choose one of {choices}") from None


def listed(names: Iterable[str], what: str) -> tuple[str, ...]:
    """``names``, given as a list (or any iterable) of strings: one string alone is refused,
    since its letters would be taken for the names (a header named "X" redacted in place of
    "X-Tenant")."""
    if isinstance(names, str | bytes):
        raise UsageError(f"{what} is a list of names, not one string: write [{names!r}]")
    return tuple(names)


def time_scale(value: float, what: str) -> float:
    """``value`` as a factor of every delay (a replay's speed, the demo agent's pace): 0,
    as fast as possible, or a finite number above it (a NaN or infinite one never ends)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise UsageError(f"the {what} is 0 (as fast as possible) or a finite number above it, not {value!r}")
    return float(value)
