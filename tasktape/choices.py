"""A fixed vocabulary (a str enum) given as text: the member it names, or a usage error
that lists them all."""

from __future__ import annotations

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
