"""Click callbacks that check an option's value with tasktape's own checks: the value
as the check takes it, or its ``UsageError`` as click's (status 2, naming the option)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tasktape.errors import UsageError

Value = TypeVar("Value")


def checked(check: Callable[[Any], Value]) -> Callable[[click.Context, click.Parameter, Any], Value]:
    """A click callback: the value as ``check`` takes it (None, an option not given, as it
    is), or its usage error as click's."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Value:
        if value is None:
            return value
        try:
            return check(value)
        except UsageError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None

    return callback


class FiniteRange(click.FloatRange):
    """A ``FloatRange`` that refuses NaN and infinity, which a range check lets through (NaN
    compares as neither below nor above it): a NaN or infinite time never ends."""

    name = "float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number
