"""What a caller chooses: a fixed vocabulary (a str enum) given as text, the member it
names or a usage error that lists them all; and names given as a list."""

from __future__ import annotations

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
