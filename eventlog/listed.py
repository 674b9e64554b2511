"""What a caller gives as a list, checked where it is given: exchange ids, and headers as
(name, value) pairs. In another shape they would be read wrong without a word (the string
"12" taken for the ids 1 and 2) or fail far from the call: a usage error says what to pass."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

from tasktape.errors import UsageError

Headers = list[tuple[str, str]]


def listed_ids(ids: Iterable[int], what: str) -> list[int]:
    """``ids``, a list (or any iterable) of exchange ids, as ints. One id alone, or a string
    (its characters would be taken for ids), is a usage error saying how to write it; so is
    an item that is no whole number (a bool is none, though Python counts it one)."""
    alone = _as_id(ids)
    if alone is not None:
        raise UsageError(f"{what} is a list of exchange ids, not one: write [{alone}]")
    if isinstance(ids, str | bytes):
        raise UsageError(f"{what} is a list of exchange ids, not one string: {_written(ids)}")
    if not isinstance(ids, Iterable):
        raise UsageError(f"{what} is a list of exchange ids, not {ids!r}")
    return [_id_in(item, what) for item in ids]


def _as_id(value: Any) -> int | None:
    """``value`` as an exchange id (None: it is none): an int, or what indexes as one."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _id_in(item: Any, what: str) -> int:
    exchange_id = _as_id(item)
    if exchange_id is None:
        raise UsageError(f"{what} is a list of exchange ids, whole numbers such as 12: not {item!r}")
    return exchange_id


def _written(text: str | bytes) -> str:
    """How ids given as one string are written as a list: ``[12]`` for ``"12"``."""
    digits = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    if digits.isdecimal():
        return f"write [{int(digits)}]"
    return f"ids are whole numbers, such as [12], not {text!r}"


def headers_listed(headers: Iterable[tuple[str, str]], what: str) -> Headers:
    """``headers``, (name, value) pairs in a list, a tuple or any iterable, as a list; a dict
    (its names would be taken for pairs) or a string is a usage error saying what to pass."""
    if isinstance(headers, Mapping | str | bytes) or not isinstance(headers, Iterable):
        raise UsageError(_not_pairs(headers, what))
    return list(headers)


def header_problem(headers: Any, what: str) -> str | None:
    """What keeps ``headers`` from being (name, value) pairs of strings in a list or a tuple,
    said of ``what`` (None: nothing)."""
    if not isinstance(headers, list | tuple):
        return _not_pairs(headers, what)
    for pair in headers:
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and _texts(*pair)):
            return f"{what} are (name, value) pairs of strings, not {pair!r}"
    return None


def _texts(name: Any, value: Any) -> bool:
    return isinstance(name, str) and isinstance(value, str)


def _not_pairs(headers: object, what: str) -> str:
    hint = ": pass list(headers.items())" if isinstance(headers, Mapping) else ""
    return f"{what} are a list of (name, value) pairs, not {type(headers).__name__}{hint}"
