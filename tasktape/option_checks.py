"""Click callbacks that check an option's value with tasktape's own checks: the value
as the check takes it, or its ``UsageError`` as click's (status 2, naming the option)."""

from __future__ import annotations

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
