"""Exceptions raised by tasktape.

TasktapeError
├── DecoderClosed        feed() after close() on an SSEDecoder
├── FrameError           data that is not an A2A stream frame (parse_stream_response)
├── UnknownEventId       no event with that id (resume after an id never seen)
└── LogError             the event log file
    ├── SchemaTooNew     written by a newer tasktape: upgrade tasktape to read it
    ├── LogBusy          another writer holds the log
    └── WriterClosed     rows handed to a LogWriter after close()
"""

from __future__ import annotations


class TasktapeError(Exception):
    """Base class of every error tasktape raises on purpose."""


class DecoderClosed(TasktapeError):
    pass


class FrameError(TasktapeError, ValueError):
    pass


class UnknownEventId(TasktapeError, LookupError):
    pass


class LogError(TasktapeError):
    pass


class SchemaTooNew(LogError):
    pass


class LogBusy(LogError):
    pass


class WriterClosed(LogError):
    pass
