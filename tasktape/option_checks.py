"""Click callbacks that check an option's value with tasktape's own checks: the value
as the check takes it, or its ``UsageError`` as click's (status 2, naming the option)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tasktape.errors import LogBusy, LogError, UsageError
from tasktape.eventlog.console_text import shown

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
            raise click.BadParameter(shown(str(exc)), ctx=ctx, param=param) from None

    return callback


def each_named(example: str) -> Callable[[click.Context, click.Parameter, tuple[str, ...]], tuple[str, ...]]:
    """A click callback for a repeated option whose every value names something (a header,
    a fault): an empty one (an unset shell variable's) would do nothing, unsaid."""

    def callback(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
        if any(not value.strip() for value in values):
            raise click.BadParameter(f"an empty value names nothing: give {example}", ctx=ctx, param=param)
        return values

    return callback


class FiniteRange(click.FloatRange):
    """A ``FloatRange`` that refuses NaN and infinity, which a range check lets through (NaN
    compares as neither below nor above it): a NaN or infinite time never ends."""

    name = "number"  # (what click's refusal calls it: "'x' is not a valid number.")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


# The longest time an option in seconds takes: a week. A longer one is a typo (1e20), and
# one reaching past the clock's range (a moment that far back has no timestamp) crashed.
MAX_SECONDS = 7 * 24 * 3600


class Seconds(FiniteRange):
    """A time in seconds, finite and at most ``MAX_SECONDS``."""

    name = "time in seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if number > MAX_SECONDS:
            self.fail(
                f"{value} seconds is longer than a week: it is at most {MAX_SECONDS} (7 days).", param, ctx
            )
        return number


def bad_input(message: str) -> click.ClickException:
    """A file an option names that is not what the command takes: a usage error (exit
    status 2, as click's own), said on one line (what it names, as the console shows it)."""
    error = click.ClickException(shown(message))
    error.exit_code = 2
    return error


def refused_log(exc: LogError) -> click.ClickException:
    """A log a writing command cannot write, as every such command says it: held by another
    writer, a failure (exit status 1); no event log to write, or none can be, bad input (2)."""
    return click.ClickException(shown(str(exc))) if isinstance(exc, LogBusy) else bad_input(str(exc))


def clickhouse_url(url: str) -> str:
    """``url`` if it can name a ClickHouse (``checked`` takes it: refused before anything
    is reached, as every option's malformed URL is)."""
    # (Here: the sink's module loads only for the commands that reach ClickHouse.)
    from tasktape.fleet.clickhouse_sink import check_url  # noqa: PLC0415

    return check_url(url)


def log_output(command: str) -> Callable[[click.Context, click.Parameter, Path], Path]:
    """A click callback for the event log ``command`` writes, checked before any work: see
    ``refuse_as_output``."""

    def callback(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
        refuse_as_output(value, command)
        return value

    return callback


def refuse_as_output(output: Path, command: str) -> None:
    """Refuse, as bad input, an output that is no log for ``command`` to write into: a device
    or a pipe (SQLite would write its journal beside it), a name the system refuses (too
    long), a file of another kind (a cassette)."""
    # (Here: a command that writes no log loads none of the log's modules.)
    from tasktape.eventlog.file_kinds import FileKind, kind_of  # noqa: PLC0415
    from tasktape.eventlog.schema import named_kind  # noqa: PLC0415
    from tasktape.eventlog.writer_lock import refuse_unless_file  # noqa: PLC0415

    try:
        refuse_unless_file(output)
    except LogError as exc:
        raise bad_input(str(exc)) from None
    if output.is_file() and kind_of(output) not in (FileKind.LOG, FileKind.EMPTY):
        raise bad_input(f"{output} is {named_kind(output)}: {command} writes an event log, not over it")
