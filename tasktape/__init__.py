"""tasktape: record, replay and inspect streaming agent traffic.

The names below are the public Python API (documented in docs/reference/python-api.md).
They load on first use, so ``import tasktape`` costs almost nothing: a test process that
replays cassettes loads neither the log reader nor sqlite-utils, and a recorder loads no
Datasette. The parts live in subpackages: ``tasktape.eventlog`` (the record),
``tasktape.proxy`` (writes it), ``tasktape.replay`` (reads it back as HTTP) and
``tasktape.inspector`` (the Datasette plugin).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .errors import (
    A2AClientError,
    A2AError,
    CassetteError,
    CassetteExpired,
    CheckoutHidesPackage,
    DecoderClosed,
    FaultError,
    FlowFileError,
    FrameError,
    LogBusy,
    LogClosed,
    LogError,
    LogUnwritable,
    MarkerError,
    NotCancelable,
    SchemaTooNew,
    SchemaTooOld,
    SourceError,
    TapeError,
    TasktapeError,
    Unauthorized,
    Unfaithful,
    UnknownEventId,
    UnknownExchange,
    UnknownTape,
    UsageError,
    WriterClosed,
)
from .lazy import lazy_getattr

if TYPE_CHECKING:
    from .eventlog.a2a_terms import TaskState
    from .eventlog.cassette import read_cassette, write_cassette
    from .eventlog.checker import Finding, Report, check_log, check_recorded
    from .eventlog.classify import Classification, classify
    from .eventlog.merge import MergeReport, merge_logs
    from .eventlog.models import StreamResponse, parse_stream_response
    from .eventlog.process_writer import ProcessLogWriter
    from .eventlog.reader import EventLog
    from .eventlog.recorded import Recorded, read_log
    from .eventlog.redact import Redactor
    from .eventlog.schema import SCHEMA_VERSION
    from .eventlog.sse import SSEDecoder, SSEEvent
    from .eventlog.writer import LogWriter
    from .proxy.recorder import RecordingProxy
    from .replay.faults import Faults
    from .replay.matching import MatchRules
    from .replay.modes import ReplayMode
    from .replay.record_mode import RecordMode
    from .replay.server import ReplayServer
    from .replay.source import load
    from .replay.tape import Tape, Tapes
    from .version import __version__

_WHERE = {
    "Classification": ".eventlog.classify",
    "EventLog": ".eventlog.reader",
    "Faults": ".replay.faults",
    "Finding": ".eventlog.checker",
    "LogWriter": ".eventlog.writer",
    "MatchRules": ".replay.matching",
    "MergeReport": ".eventlog.merge",
    "ProcessLogWriter": ".eventlog.process_writer",
    "Recorded": ".eventlog.recorded",
    "RecordingProxy": ".proxy.recorder",
    "RecordMode": ".replay.record_mode",
    "Redactor": ".eventlog.redact",
    "ReplayMode": ".replay.modes",
    "ReplayServer": ".replay.server",
    "Report": ".eventlog.checker",
    "SCHEMA_VERSION": ".eventlog.schema",
    "SSEDecoder": ".eventlog.sse",
    "SSEEvent": ".eventlog.sse",
    "StreamResponse": ".eventlog.models",
    "Tape": ".replay.tape",
    "Tapes": ".replay.tape",
    "TaskState": ".eventlog.a2a_terms",
    "check_log": ".eventlog.checker",
    "check_recorded": ".eventlog.checker",
    "classify": ".eventlog.classify",
    "load": ".replay.source",
    "merge_logs": ".eventlog.merge",
    "parse_stream_response": ".eventlog.models",
    "read_cassette": ".eventlog.cassette",
    "read_log": ".eventlog.recorded",
    "write_cassette": ".eventlog.cassette",
    "__version__": ".version",
}

__all__ = [
    "SCHEMA_VERSION",
    "A2AClientError",
    "A2AError",
    "CassetteError",
    "CassetteExpired",
    "CheckoutHidesPackage",
    "Classification",
    "DecoderClosed",
    "EventLog",
    "FaultError",
    "Faults",
    "Finding",
    "FlowFileError",
    "FrameError",
    "LogBusy",
    "LogClosed",
    "LogError",
    "LogUnwritable",
    "LogWriter",
    "MarkerError",
    "MatchRules",
    "MergeReport",
    "NotCancelable",
    "ProcessLogWriter",
    "RecordMode",
    "Recorded",
    "RecordingProxy",
    "Redactor",
    "ReplayMode",
    "ReplayServer",
    "Report",
    "SSEDecoder",
    "SSEEvent",
    "SchemaTooNew",
    "SchemaTooOld",
    "SourceError",
    "StreamResponse",
    "Tape",
    "TapeError",
    "Tapes",
    "TaskState",
    "TasktapeError",
    "Unauthorized",
    "Unfaithful",
    "UnknownEventId",
    "UnknownExchange",
    "UnknownTape",
    "UsageError",
    "WriterClosed",
    "__version__",
    "check_log",
    "check_recorded",
    "classify",
    "load",
    "merge_logs",
    "parse_stream_response",
    "read_cassette",
    "read_log",
    "write_cassette",
]


__getattr__ = lazy_getattr(__name__, _WHERE)


def _refuse_a_checkout_without_its_parts() -> None:
    """An ImportError that says why and what to do where this is a checkout's tasktape/
    folder and no editable install maps in its subpackages (eventlog/, proxy/... beside it):
    Python started in a checkout's root finds the folder before the installed package."""
    import importlib.util  # noqa: PLC0415 - only in a checkout (an editable install has it loaded)

    if importlib.util.find_spec(".eventlog", __name__) is None:
        raise CheckoutHidesPackage(
            f"tasktape was imported from the source checkout's folder {__path__[0]}, which hides the"
            " installed package: run Python from outside the checkout, or install the checkout"
            " with pip install -e . to work in it"
        )


# (A stat, no import, for an installed package: nothing named eventlog sits beside it.)
if os.path.isfile(os.path.join(os.path.dirname(__path__[0]), "eventlog", "__init__.py")):
    _refuse_a_checkout_without_its_parts()


def __dir__() -> list[str]:
    return sorted(__all__)
