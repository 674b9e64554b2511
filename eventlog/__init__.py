"""The record itself: SSE decoding, the A2A event model and the SQLite event log.

Names load on first use: a recorder, which only hands chunks to a writer process, does
not load the log reader, sqlite-utils or what sqlite-utils imports (numpy, pandas).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Imported now: once the classify module is loaded, its name on this package would be
# the module, not the function.
from .classify import Classification, classify

if TYPE_CHECKING:
    from .errors import (
        DecoderClosed,
        FrameError,
        LogBusy,
        LogError,
        SchemaTooNew,
        TasktapeError,
        UnknownEventId,
        WriterClosed,
    )
    from .exchange_rows import ExchangeSummary
    from .models import (
        Artifact,
        JsonRpcError,
        JsonRpcResponse,
        Message,
        Part,
        StreamResponse,
        Task,
        TaskArtifactUpdateEvent,
        TaskState,
        TaskStatus,
        TaskStatusUpdateEvent,
        Usage,
        parse_stream_response,
    )
    from .process_writer import ProcessLogWriter
    from .producer import LogProducer, WriterStats
    from .reader import EventLog
    from .schema import SCHEMA_VERSION, open_db
    from .sse import SSEDecoder, SSEEvent
    from .version import __version__
    from .writer import LogWriter

_WHERE = {
    "Artifact": ".models",
    "DecoderClosed": ".errors",
    "EventLog": ".reader",
    "ExchangeSummary": ".exchange_rows",
    "FrameError": ".errors",
    "JsonRpcError": ".models",
    "JsonRpcResponse": ".models",
    "LogBusy": ".errors",
    "LogError": ".errors",
    "LogProducer": ".producer",
    "LogWriter": ".writer",
    "Message": ".models",
    "Part": ".models",
    "ProcessLogWriter": ".process_writer",
    "SCHEMA_VERSION": ".schema",
    "SSEDecoder": ".sse",
    "SSEEvent": ".sse",
    "SchemaTooNew": ".errors",
    "StreamResponse": ".models",
    "Task": ".models",
    "TaskArtifactUpdateEvent": ".models",
    "TaskState": ".models",
    "TaskStatus": ".models",
    "TaskStatusUpdateEvent": ".models",
    "TasktapeError": ".errors",
    "UnknownEventId": ".errors",
    "Usage": ".models",
    "WriterClosed": ".errors",
    "WriterStats": ".producer",
    "__version__": ".version",
    "open_db": ".schema",
    "parse_stream_response": ".models",
}
__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "Classification",
    "DecoderClosed",
    "EventLog",
    "ExchangeSummary",
    "FrameError",
    "JsonRpcError",
    "JsonRpcResponse",
    "LogBusy",
    "LogError",
    "LogProducer",
    "LogWriter",
    "Message",
    "Part",
    "ProcessLogWriter",
    "SSEDecoder",
    "SSEEvent",
    "SchemaTooNew",
    "StreamResponse",
    "Task",
    "TaskArtifactUpdateEvent",
    "TaskState",
    "TaskStatus",
    "TaskStatusUpdateEvent",
    "TasktapeError",
    "UnknownEventId",
    "Usage",
    "WriterClosed",
    "WriterStats",
    "__version__",
    "classify",
    "open_db",
    "parse_stream_response",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name], __name__), name)
