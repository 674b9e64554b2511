"""JSON-RPC ids in recorded bytes: a request's id (or the ids of a batch's requests), and
the edits that make recorded answers carry another request's id, byte-exact elsewhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .spans import Chunks, StreamEvent, events_in

Edit = tuple[int, int, bytes]  # (position in the body, bytes removed, bytes put there)


NO_ID = object()  # a request that is no JSON-RPC request


def rpc_id(body: bytes | None) -> Any:
    """The id of a JSON-RPC request body, or NO_ID."""
    try:
        obj = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return NO_ID
    if isinstance(obj, dict) and obj.get("jsonrpc") == "2.0" and "method" in obj and "id" in obj:
        return obj["id"]
    return NO_ID


def same_id(a: Any, b: Any) -> bool:
    """Whether two JSON-RPC ids are the same id (1, 1.0, true and "1" are four)."""
    return a == b and type(a) is type(b)


def id_key(rpc_id: Any) -> tuple[str, Any] | None:
    """A JSON-RPC id (or progress token) as a dict key, ids that are ``same_id`` alike. None
    for what is no id: JSON-RPC 2.0 says an id is a string, a number or null."""
    if rpc_id is None or (isinstance(rpc_id, str | int | float) and not isinstance(rpc_id, bool)):
        return (type(rpc_id).__name__, rpc_id)
    return None


def jsonrpc_id_edits(
    chunks: Chunks, events: list[StreamEvent] | None, old_id: object, new_id: object
) -> list[Edit]:
    """Edits making each JSON-RPC response to the recorded request (the body, or each
    event's data whose top-level id is ``old_id``) carry ``new_id``, byte-exact
    elsewhere: notifications, and the server's own requests, keep theirs."""
    if events is not None:
        return value_edits(chunks, events, ("id",), old_id, new_id)
    body = b"".join(data for _, data in chunks)
    span = _pointer_span(0, body.decode("utf-8", "replace"), ("id",))
    if span is None or not _is(body, span, old_id):
        return []
    return [(span[0], span[1] - span[0], json.dumps(new_id).encode())]


def is_batch(body: Any) -> bool:
    """Whether a JSON body is a JSON-RPC batch: a non-empty array of JSON-RPC objects."""
    return isinstance(body, list) and bool(body) and all(isinstance(m, dict) and "jsonrpc" in m for m in body)


def batch_ids(body: Any) -> list[Any] | None:
    """The id of each request of a JSON-RPC batch (a JSON body), message by message: NO_ID
    for a notification, or a response; None for a body that is no batch."""
    if not is_batch(body):
        return None
    return [m["id"] if "method" in m and "id" in m else NO_ID for m in body]


def batch_id_edits(
    chunks: Chunks, events: Sequence[StreamEvent] | None, old_ids: Sequence[Any], new_ids: Sequence[Any]
) -> list[Edit]:
    """Edits making each JSON-RPC response to a request of a recorded batch (``old_ids``,
    as ``batch_ids`` reads them) carry the id of the request in its place in another batch
    (``new_ids``), whatever the order of the responses: in the body (an array of responses,
    or one), or in each event's data (the same); byte-exact elsewhere. The server's own
    requests and notifications keep theirs."""
    renamed = _renamed(old_ids, new_ids)
    if not renamed:
        return []
    body = b"".join(data for _, data in chunks)
    if events is None:
        return _renamed_ids(0, body.decode("utf-8", "replace"), renamed)
    edits = []
    for event in events:
        if "\n" in event.data:
            continue  # a JSON-RPC frame on several data lines: left as recorded
        at = body.find(event.data.encode(), event.start, event.end)
        if at >= 0:
            edits += _renamed_ids(at, event.data, renamed)
    return edits


def _renamed(old_ids: Sequence[Any], new_ids: Sequence[Any]) -> dict[tuple[str, Any], Any]:
    """Each recorded request's id (as ``id_key``) and the id of the request in its place,
    where the two differ (an id the recorded batch repeats: the first request's)."""
    renamed: dict[tuple[str, Any], Any] = {}
    for old, new in zip(old_ids, new_ids, strict=False):
        key = id_key(old)
        if key is not None and new is not NO_ID and not same_id(old, new):
            renamed.setdefault(key, new)
    return renamed


def _renamed_ids(base: int, text: str, renamed: Mapping[tuple[str, Any], Any]) -> list[Edit]:
    """Edits giving each response in the JSON ``text`` (at byte ``base``: one message, or
    an array of them) whose id ``renamed`` names its new id."""
    edits = []
    for start in _messages_at(text):
        span = _member_span(text, start, "id")
        if span is None or _member_span(text, start, "method") is not None:
            continue
        try:
            key = id_key(json.loads(text[span[0] : span[1]]))
        except ValueError:
            continue
        if key in renamed:
            at = base + len(text[: span[0]].encode())
            edits.append((at, len(text[span[0] : span[1]].encode()), json.dumps(renamed[key]).encode()))
    return edits


def _messages_at(text: str) -> list[int]:
    """Where each message of the JSON ``text`` starts: the text's own value, or each item
    of an array (none of an array that cannot be read)."""
    i = _skip(text, 0)
    if not text.startswith("[", i):
        return [i]
    decoder, starts = json.JSONDecoder(), []
    i = _skip(text, i + 1)
    try:
        while text[i] != "]":
            starts.append(i)
            _, end = decoder.raw_decode(text, i)
            i = _skip(text, end)
            if text[i] == ",":
                i = _skip(text, i + 1)
    except (ValueError, IndexError):
        return []
    return starts


def value_edits(
    chunks: Chunks,
    events: Sequence[StreamEvent],
    pointer: tuple[str, ...],
    old: object,
    new: object,
    wanted: Callable[[Any], bool] | None = None,
) -> list[Edit]:
    """Edits making each event whose data has ``old`` at ``pointer`` (object members from
    the top) carry ``new`` there, byte-exact elsewhere; only in the messages ``wanted``
    takes, when given."""
    replacement = json.dumps(new).encode()
    body = b"".join(data for _, data in chunks)
    edits = []
    for event in events:
        raw = body[event.start : event.end]
        if "\n" in event.data:
            continue  # a JSON-RPC frame on several data lines: left as recorded
        at = raw.find(event.data.encode())
        span = _pointer_span(at, event.data, pointer) if at >= 0 else None
        if span and _is(raw, span, old) and (wanted is None or wanted(json.loads(event.data))):
            edits.append((event.start + span[0], span[1] - span[0], replacement))
    return edits


class IdRewriter:
    """Events' bytes made to answer another request's id, one event at a time (a resuming
    recorder's reconnect). Parsed once: an event whose bytes up to the id are those of the
    last one parsed, with the same id there, on one data line, is edited in place."""

    def __init__(self, old_id: object, new_id: object) -> None:
        self.old_id, self.new_id = old_id, new_id
        self._replacement = json.dumps(new_id).encode()
        self._prefix: bytes | None = None  # the bytes before the id, in the last event parsed
        self._value = b""  # the id's bytes there

    def __call__(self, raw: bytes) -> bytes:
        prefix = self._prefix
        if prefix is not None and raw.startswith(prefix) and raw.count(b"data:") == 1:
            end = len(prefix) + len(self._value)
            if raw[len(prefix) : end] == self._value and raw[end : end + 1] in (b",", b"}", b" "):
                return prefix + self._replacement + raw[end:]
        chunks = [(0, raw)]
        edits = jsonrpc_id_edits(chunks, events_in(chunks), self.old_id, self.new_id)
        if len(edits) == 1 and raw.count(b"data:") == 1:
            at, removed, _ = edits[0]
            self._prefix, self._value = raw[:at], raw[at : at + removed]
        for at, removed, inserted in sorted(edits, reverse=True):
            raw = raw[:at] + inserted + raw[at + removed :]
        return raw


def _is(raw: bytes, span: tuple[int, int], rpc_id: object) -> bool:
    """Whether the JSON value at ``span`` is ``rpc_id`` (1 and "1" are different ids)."""
    try:
        value = json.loads(raw[span[0] : span[1]])
    except ValueError:
        return False
    return same_id(value, rpc_id)


def _pointer_span(base: int, text: str, pointer: tuple[str, ...]) -> tuple[int, int] | None:
    """The byte span (``text`` starting at byte ``base``) of the value at ``pointer``
    (object members from the top) of the JSON object ``text``."""
    start, end = 0, None
    for name in pointer:
        span = _member_span(text, start, name)
        if span is None:
            return None
        start, end = span
    if end is None:
        return None
    return base + len(text[:start].encode()), base + len(text[:end].encode())


def _member_span(text: str, i: int, name: str) -> tuple[int, int] | None:
    """The character span of the value of member ``name`` of the JSON object at ``i``."""
    decoder = json.JSONDecoder()
    i = _skip(text, i)
    if i >= len(text) or text[i] != "{":
        return None
    i += 1
    try:
        while True:
            i = _skip(text, i)
            if i < len(text) and text[i] == "}":
                return None
            key, i = decoder.raw_decode(text, i)
            i = _skip(text, i)
            if text[i] != ":":
                return None
            start = _skip(text, i + 1)
            _, end = decoder.raw_decode(text, start)
            if key == name:
                return start, end
            i = _skip(text, end)
            if text[i] != ",":
                return None
            i += 1
    except (ValueError, IndexError):
        return None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
