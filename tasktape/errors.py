"""Every error tasktape raises on purpose. Catch ``TasktapeError`` for all of them.

TasktapeError
├── UsageError (ValueError)        an argument tasktape cannot act on: an upstream that is
│   │                              not an http(s) URL, a mode or a JSON pointer it does not know
│   ├── FaultError                 a fault spec (--fault, X-Tasktape-Fault) that does not parse
│   ├── MarkerError                @pytest.mark.tasktape arguments that cannot be meant
│   └── Unauthorized               a fleet's servers refused the user and password (or token)
├── DecoderClosed                  feed() after close() on an SSEDecoder
├── FrameError (ValueError)        data that is not an A2A stream frame (parse_stream_response)
├── UnknownEventId (LookupError)   no event with that id (resume after an id never seen)
├── CassetteError (ValueError)     a cassette that cannot be read (or written); names the file
├── SourceError (ValueError)       a replay source that is neither a log nor a cassette
├── FlowFileError (ValueError)     a mitmproxy flow file that cannot be read
├── TapeError                      a test's cassette cannot be served as asked (missing, or
│   │                              recording without an upstream)
│   └── UnknownTape (KeyError)     tasktapes[NAME] of a name the test gave no tape
├── CassetteExpired (UserWarning)  a warning: a test's cassette is older than its age limit
├── Unfaithful (AssertionError)    a replay that was not the recording (Tape.assert_faithful)
├── CheckoutHidesPackage (ImportError) a checkout's tasktape/ folder imported, not the package
├── A2AClientError                 the built-in A2A client got no usable answer
├── A2AError                       an A2A error answer of the demo agent (HTTP and JSON-RPC codes)
│   └── NotCancelable              a cancel of a task that has already ended
└── LogError                       the event log file
    ├── SchemaTooNew               written by a newer tasktape: upgrade tasktape to read it
    ├── SchemaTooOld               an older log opened read-only: opening it to write upgrades it
    ├── LogBusy                    another writer holds the log
    ├── LogUnwritable              SQLite could not write the log: a full disk, a file size limit
    ├── WriterClosed               rows handed to a LogWriter after close()
    ├── LogClosed                  an EventLog read after close()
    └── UnknownExchange (KeyError) no exchange of that id in the log, or none open in a writer

The second bases are there for callers that already catch ``ValueError``, ``LookupError``
or ``KeyError`` (and, for ``CassetteExpired`` and ``Unfaithful``, for warning filters and pytest's
assertion reports).
"""

from __future__ import annotations

from typing import Any


class TasktapeError(Exception):
    """Base class of every error tasktape raises on purpose."""


class UsageError(TasktapeError, ValueError):
    pass


class FaultError(UsageError):
    pass


class MarkerError(UsageError):
    pass


class Unauthorized(UsageError):
    """The servers refused the user and password (or token) given: trying again, with the
    same ones, changes nothing."""


class DecoderClosed(TasktapeError):
    pass


class FrameError(TasktapeError, ValueError):
    pass


class UnknownEventId(TasktapeError, LookupError):
    pass


class CassetteError(TasktapeError, ValueError):
    pass


class SourceError(TasktapeError, ValueError):
    pass


class FlowFileError(TasktapeError, ValueError):
    pass


class TapeError(TasktapeError):
    pass


class UnknownTape(TapeError, KeyError):
    def __str__(self) -> str:
        # KeyError's own __str__ quotes its message as if it were a key.
        return str(self.args[0]) if self.args else ""


class Unfaithful(TasktapeError, AssertionError):
    """A test's replay was not its recording: pytest reports it as the test's failed assertion."""


class CassetteExpired(TasktapeError, UserWarning):
    """Warned, not raised: a cassette older than ``--tasktape-max-age`` (``-W error`` raises it)."""


class CheckoutHidesPackage(TasktapeError, ImportError):
    """Python started in a source checkout's root found its tasktape/ folder before the
    installed package, and no editable install maps in the subpackages beside it."""


class A2AClientError(TasktapeError):
    pass


class A2AError(TasktapeError):
    def __init__(self, http: int, rpc: int, message: str) -> None:
        super().__init__(message)
        self.http, self.rpc, self.message = http, rpc, message

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle remakes an error from its args, (message,) here: __init__ takes the codes too.
        return type(self), (self.http, self.rpc, self.message), self.__dict__


class NotCancelable(A2AError):
    def __init__(self, message: str) -> None:
        super().__init__(409, -32002, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message,), self.__dict__


class LogError(TasktapeError):
    pass


class SchemaTooNew(LogError):
    pass


class SchemaTooOld(LogError):
    pass


class LogBusy(LogError):
    pass


class LogUnwritable(LogError):
    """Writing the log failed (a full disk, a file size limit, an I/O error): a failure,
    not something wrong with what was given."""


class WriterClosed(LogError):
    pass


class LogClosed(LogError):
    pass


class UnknownExchange(LogError, KeyError):
    def __str__(self) -> str:
        # KeyError's own __str__ quotes its message as if it were a key.
        return str(self.args[0]) if self.args else ""
