"""The A2A v1.0 frames a stream is made of, decoded by msgspec straight into the fields
``classify`` reads, without building the JSON's dicts.

Only exact frames take this path: a ``task``, ``message``, ``statusUpdate`` or
``artifactUpdate`` alone, bare or as a JSON-RPC result, with no member of another type
than the structs say. Anything else (another key, a part that is not an object, JSON
the standard library reads and msgspec does not) is left to ``classify``'s general path,
which gives the same answer for what both read (``tests/test_classify.py``). A member
none of the structs names is skipped unread: an integer in it longer than the standard
library parses (4,300 digits) leaves the frame readable here, where ``classify_json``
calls it not JSON.

The structs are kept out of the garbage collector's sight (``gc=False``): decoded JSON
cannot refer back to them, so they make no cycle, and a frame is decoded per event.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType


class _Part(Struct, gc=False):
    text: Any = None


class _Message(Struct, gc=False):
    taskId: Any = None  # the wire's names
    contextId: Any = None
    parts: list[_Part] | None = None
    metadata: Any = None


class _State(Struct, gc=False):
    state: Any = None
    message: _Message | None = None


class _Status(Struct, gc=False):
    """A task snapshot (its id in ``id``) or a status update (in ``taskId``)."""

    id: Any = None
    taskId: Any = None
    contextId: Any = None
    status: _State | None = None
    metadata: Any = None


class _Artifact(Struct, gc=False):
    artifactId: Any = None
    metadata: Any = None
    parts: list[_Part] | None = None


class _ArtifactUpdate(Struct, gc=False):
    taskId: Any = None
    contextId: Any = None
    append: Any = None
    lastChunk: Any = None
    artifact: _Artifact | None = None
    metadata: Any = None


class Kinds(Struct, forbid_unknown_fields=True, gc=False):
    """A frame's body: which of the four it is (exactly one is set on an exact frame)."""

    task: _Status | UnsetType = UNSET
    message: _Message | UnsetType = UNSET
    statusUpdate: _Status | UnsetType = UNSET
    artifactUpdate: _ArtifactUpdate | UnsetType = UNSET


class Frame(Kinds, forbid_unknown_fields=True, gc=False):
    """A bare frame, or a JSON-RPC response around one."""

    jsonrpc: Any = UNSET
    id: Any = UNSET
    result: Kinds | UnsetType = UNSET


decode = msgspec.json.Decoder(Frame).decode
DecodeError = msgspec.DecodeError  # ValidationError is one too
