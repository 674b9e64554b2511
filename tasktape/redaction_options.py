"""``--redact-header``, ``--redact-query`` and ``--redact-json``, as record, mitm, replay and
import all take them; and the check of an option's JSON pointers (``--ignore`` too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from tasktape.errors import UsageError
from tasktape.eventlog.redact import parse_pointer

from .option_checks import checked, each_named

F = TypeVar("F", bound=Callable[..., object])


def _pointers(value: tuple[str, ...]) -> tuple[str, ...]:
    """Each value a JSON pointer (``*`` for any key or index) naming a field: the empty
    pointer, the whole document (an unset shell variable's), would make --ignore leave
    request bodies out of matching, unsaid."""
    for pointer in value:
        if not pointer:
            raise UsageError(
                "an empty JSON pointer is the whole body: name a field, e.g. /params/message/metadata/id "
                "or /**/apiKey"
            )
        parse_pointer(pointer)
    return value


json_pointers = checked(_pointers)  # the click callback of the options that take pointers


def redaction_options(within: str = "") -> Callable[[F], F]:
    """The three options; ``within`` names what they redact when it is not all the command
    writes (``"what record-missing records"``), a phrase each help text takes in."""
    of, in_ = (f" of {within}", f" in {within}") if within else ("", "")

    def decorate(command: F) -> F:
        command = click.option(
            "--redact-json",
            multiple=True,
            metavar="POINTER",
            callback=json_pointers,
            help=f"Redact this JSON field in request bodies, response bodies and events{of}: a JSON "
            "pointer, '*' matching any key or index and '**' any depth (repeatable), e.g. "
            "/params/message/metadata/apiKey or /**/apiKey.",
        )(command)
        command = click.option(
            "--redact-query",
            multiple=True,
            metavar="NAME",
            callback=each_named("a query parameter's name, e.g. session"),
            help="Also redact the value of this query parameter and of the form field of "
            f"that name{in_} (repeatable). key, api_key, apikey, api-key, access_token, access-token, "
            "refresh_token, id_token, token, auth, password, secret, client_secret, signature, sig and "
            "the X-Amz-Signature, -Credential and -Security-Token parameters always are.",
        )(command)
        return click.option(
            "--redact-header",
            multiple=True,
            metavar="NAME",
            callback=each_named("a header's name, e.g. X-Session-Token"),
            help=f"Also redact this header{in_} (repeatable). Authorization, Proxy-Authorization, "
            "Cookie, Set-Cookie, X-Api-Key, Api-Key, X-Goog-Api-Key, X-Auth-Token and Private-Token "
            "always are.",
        )(command)

    return decorate
