"""The record itself: SSE decoding, the A2A event model and the SQLite event log.

Names load on first use: a recorder, which only hands chunks to a writer process, does
not load the log reader, sqlite-utils or what sqlite-utils imports (numpy, pandas).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tasktape.lazy import lazy_getattr

# Imported now: once the classify module is loaded, its name on this package would be
# the module, not the function.
from .classify import Classification, classify

if TYPE_CHECKING:
    from .a2a_terms import TaskState
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
    from .writer import LogWriter

_WHERE = {
    "Artifact": ".models",
    "EventLog": ".reader",
    "ExchangeSummary": ".exchange_rows",
    "JsonRpcError": ".models",
    "JsonRpcResponse": ".models",
    "LogProducer": ".producer",
    "LogWriter": ".writer",
    "Message": ".models",
    "Part": ".models",
    "ProcessLogWriter": ".process_writer",
    "SCHEMA_VERSION": ".schema",
    "SSEDecoder": ".sse",
    "SSEEvent": ".sse",
    "StreamResponse": ".models",
    "Task": ".models",
    "TaskArtifactUpdateEvent": ".models",
    "TaskState": ".a2a_terms",
    "TaskStatus": ".models",
    "TaskStatusUpdateEvent": ".models",
    "Usage": ".models",
    "WriterStats": ".producer",
    "open_db": ".schema",
    "parse_stream_response": ".models",
}
__all__ = [
    "SCHEMA_VERSION",
    "Artifact",
    "Classification",
    "EventLog",
    "ExchangeSummary",
    "JsonRpcError",
    "JsonRpcResponse",
    "LogProducer",
    "LogWriter",
    "Message",
    "Part",
    "ProcessLogWriter",
    "SSEDecoder",
    "SSEEvent",
    "StreamResponse",
    "Task",
    "TaskArtifactUpdateEvent",
    "TaskState",
    "TaskStatus",
    "TaskStatusUpdateEvent",
    "Usage",
    "WriterStats",
    "classify",
    "open_db",
    "parse_stream_response",
]


__getattr__ = lazy_getattr(__name__, _WHERE)
