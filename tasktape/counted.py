"""A count as people read it: ``1 exchange``, ``3 exchanges``."""

from __future__ import annotations


def counted(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"
