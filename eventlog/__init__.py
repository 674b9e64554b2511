"""The record itself: SSE decoding, the A2A event model and the SQLite event log."""

from .classify import Classification, classify
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
