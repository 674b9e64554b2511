"""The answer to a request no recording matches: the closest recordings and why each differs,
with a hint at what to do, said as the request's protocol says an error."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tasktape.eventlog import console_text
from tasktape.eventlog.protocols import recognise

from .choosing import Recordings
from .matching import Incoming, distance, mismatches
from .own_answers import SOURCE, error

log = logging.getLogger("tasktape.replay")
DEFAULT_MISS_STATUS = 404
ALLOW_REPEATS = "--allow-repeats (allow_repeats=True in the pytest marker)"
REPEATS_HINT = f"answer requests more often than recorded with {ALLOW_REPEATS}"
MISS_HINT = "record it (mode record-missing), or ignore fields that change between runs (--ignore)"


@dataclass
class Miss:
    request: str
    closest: list[dict[str, Any]]

    @property
    def alike(self) -> str:
        """What two misses that read the same share: the request line, and the closest
        recordings with why each differs (a client polling a path never recorded)."""
        return f"{self.request}\n{json.dumps(self.closest)}"


def miss(
    recordings: Recordings, incoming: Incoming, last_id: str | None, hint: str, status: int | None
) -> tuple[Miss, web.Response]:
    """The miss of ``incoming`` (``last_id``: its Last-Event-ID), and its answer: at
    ``status`` if given, with ``hint`` (what a miss's answer suggests). Both show requests
    as ``recordings.shown`` does: no credential's value."""
    shown = recordings.shown
    scored = []
    for i, r in enumerate(recordings.recorded):
        facing = recordings.facing(incoming, i)
        reasons = mismatches(facing, r, recordings.rules, shown=shown)
        # The stream the client resumes, ended early: first, saying only what is not there
        # (not that it was served, nor that repeats would help: they would not).
        unrecorded = None if last_id is None else recordings.rest_unrecorded(i, last_id)
        used_up = unrecorded is None and not reasons and not _resume_only(recordings, i, last_id)
        if unrecorded is not None:
            reasons = [unrecorded]
        reasons = reasons or [_why_not_again(recordings, i, last_id)]
        scored.append(((unrecorded is None, distance(facing, r, recordings.rules)), i, reasons, used_up))
    nearest = sorted(scored)[:3]
    closest = [
        {
            "request": shown.request_line(recordings.recorded[i]),
            "recorded": recordings.recorded[i].origin,
            "differs": reasons,
        }
        for _, i, reasons, _ in nearest
    ]
    line = shown.request_line(incoming)
    missed = Miss(line, closest)
    repeated = next((i for _, i, _, used_up in nearest if used_up), None)
    # (the request line as the client sent it, decoded: it may hold any control character)
    said = console_text.shown(line)
    if repeated is None:
        log.warning("tasktape replay: no recording matches %s", said)
    else:  # (a client that shows no answer's body leaves the console the one to say why)
        log.warning(
            "tasktape replay: %s matches %s, already served (%s)",
            said,
            console_text.shown(recordings.recorded[repeated].origin),
            REPEATS_HINT,
        )
    # Said as the request's protocol says an error, at its status, where it has its own.
    request = incoming.as_request()
    protocol = recognise(request)
    message = f"no recorded exchange matches {line}"
    details = {
        "closest": closest,
        "hint": hint if repeated is None else f"{hint}; {REPEATS_HINT}",
    }
    return missed, error(
        status or (protocol and protocol.miss_status) or DEFAULT_MISS_STATUS,
        message,
        answer=protocol and protocol.error_answer(request, message, {"source": SOURCE, **details}),
        **details,
    )


def _resume_only(recordings: Recordings, index: int, last_id: str | None) -> bool:
    """Whether recording ``index`` is of a resume another Last-Event-ID than ``last_id`` made."""
    resumed_from = recordings.recorded[index].resumed_from
    return bool(resumed_from) and resumed_from != last_id


def _why_not_again(recordings: Recordings, index: int, last_id: str | None) -> str:
    """Why a recording the request matches did not answer it (``last_id``: the
    request's Last-Event-ID)."""
    resumed_from = recordings.recorded[index].resumed_from
    if _resume_only(recordings, index, last_id):
        return (
            f"recorded as a resume after event {resumed_from}: only a request with "
            f"Last-Event-ID {resumed_from} gets it"
        )
    return (
        f"already served {recordings.used[index]} time(s); identical requests replay in order, each "
        f"once unless with {ALLOW_REPEATS}"
    )
