"""What goes over the wire between shippers and collectors: rows of one table of one
capture per message, MessagePack-encoded, on a subject per capture and table.

A row names its capture and exchange by uid (integer ids are local to a log): in a
message, ``exchanges.capture_id`` travels as ``capture_uid``, and ``exchange_id`` (and
``new_exchange_id``) as ``exchange_uid`` (``new_exchange_uid``). Chunks and events
encoded by the log writer as it commits them (see ``hints``) keep their local
``exchange_id`` and carry the map from it to the uid instead, so that the writer never
rebuilds a row: ``decode`` gives every message in the first form. An event's row too big
to travel with its ``text`` (its data's text, which the row holds twice) travels with
``text_from`` instead, the protocol that derives it again: ``decode`` gives it back as
``text``. Each message has an id derived from its encoded rows, which JetStream
deduplicates a resend by.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from enum import StrEnum
from typing import Any

import msgspec

from tasktape.errors import LogError
from tasktape.eventlog.protocols import Protocol, by_name

MSG_ID = "Nats-Msg-Id"  # JetStream's deduplication header


class Table(StrEnum):
    """The tables shipped, in the order a round ships them: what names a row's capture
    and exchange travels before the row."""

    CAPTURES = "captures"
    EXCHANGES = "exchanges"
    STORED_CHUNKS = "stored_chunks"
    EVENTS = "events"
    RESUMES = "resumes"


# What names an exchange-keyed row's exchange in a message, for each local column.
UID_COLUMNS = {
    "capture_id": "capture_uid",
    "exchange_id": "exchange_uid",
    "new_exchange_id": "new_exchange_uid",
}
LOCAL_COLUMNS = {uid: local for local, uid in UID_COLUMNS.items()}  # capture_uid -> capture_id...


def wire_columns(local: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A table's columns as its rows travel, from its columns in a log (name and SQLite
    type): integer ids left out, the uids that name the row's exchange (or capture) first."""
    names = [name for name, _ in local]
    uids = [(UID_COLUMNS[c], "TEXT") for c in UID_COLUMNS if c in names]
    return [*uids, *((c, t) for c, t in local if c not in ("id", *UID_COLUMNS))]


class Rows(msgspec.Struct, array_like=True, frozen=True):
    """One message: rows of ``table``, all of the capture ``capture``, their values in the
    order of ``columns``; with ``exchanges``, their ``exchange_id`` column holds ids local
    to the log they come from, each mapped there to its exchange's uid."""

    table: Table
    capture: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    exchanges: dict[int, str] = {}


class Message(msgspec.Struct, array_like=True, frozen=True):
    """One message ready to publish: ``rows`` rows of ``table`` of ``capture``, encoded;
    ``first`` and ``last`` are the rowids of the first and the last in their log."""

    table: Table
    capture: str
    rows: int
    first: int
    last: int
    payload: bytes


MESSAGE_ROWS = 1000  # rows in one message at most
MESSAGE_BYTES = 512 * 1024  # and at most this many bytes (NATS takes 1 MiB by default)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Rows)


def encode(message: Rows) -> bytes:
    return _encoder.encode(message)


def encoded(rows: Rows, rowids: Sequence[int]) -> Iterator[Message]:
    """Rows (whose rowids in their log are ``rowids``) as messages of at most MESSAGE_ROWS
    rows and MESSAGE_BYTES, halved until they fit (a bigger row goes alone). Encoding is
    cheaper than sizing every value."""
    for at in range(0, len(rows.rows), MESSAGE_ROWS):
        part = msgspec.structs.replace(rows, rows=rows.rows[at : at + MESSAGE_ROWS])
        yield from _fitted(part, MESSAGE_BYTES, rowids[at : at + MESSAGE_ROWS])


def within(message: Message, limit: int) -> Iterator[Message]:
    """``message`` as messages of at most ``limit`` bytes (a server whose ``max_payload`` is
    below MESSAGE_BYTES), halved until they fit. A row alone bigger than ``limit`` comes out
    as it is: it cannot travel. The halves keep their parent's rowids, and their size and
    checksum tell their ids apart."""
    if len(message.payload) <= limit or message.rows == 1:
        yield message
        return
    yield from _fitted(_decoder.decode(message.payload), limit, None, (message.first, message.last))


# The columns of an exchange's row that can be big, cut (the first two marked as cut) when
# the row alone is bigger than a server takes: what the exchange was still travels.
_BODIES = {"request_body": "request_body_truncated", "response_body": "response_body_truncated"}
_SUMMARIES = ("answer", "tool_calls", "error")


def trimmed(message: Message, limit: int) -> Message | None:
    """An exchange's row alone bigger than ``limit`` bytes, with its bodies left out
    (flagged as cut, as a body past the recorder's bound is) and then, if need be, its
    answer, tool calls and error: None when it still does not fit, or is no such row."""
    if message.table is not Table.EXCHANGES or message.rows != 1:
        return None
    rows = _decoder.decode(message.payload)
    at = {c: i for i, c in enumerate(rows.columns)}
    row = list(rows.rows[0])
    for column in (*_BODIES, *_SUMMARIES):
        if column not in at or row[at[column]] is None:
            continue
        row[at[column]] = None
        if column in _BODIES and _BODIES[column] in at:
            row[at[_BODIES[column]]] = 1
        payload = encode(msgspec.structs.replace(rows, rows=[tuple(row)]))
        if len(payload) <= limit:
            return msgspec.structs.replace(message, payload=payload)
    return None


# In place of an event's text, in a row too big to travel with it: the protocol (a built-in
# one's name, as ``exchanges.protocol`` has it) whose reader derived it from the row's data.
TEXT_FROM = "text_from"


def without_text(message: Message, limit: int, protocol_of: Callable[[str], str | None]) -> Message | None:
    """An event's row alone bigger than ``limit`` bytes, with its text left out where the
    protocol of its exchange (``protocol_of`` its uid) derives the same text from its data
    again, as ``decode`` does: None when it still does not fit, or the text is not derived
    so, or it is no such row."""
    if message.table is not Table.EVENTS or message.rows != 1:
        return None
    rows = _mapped(_decoder.decode(message.payload), nan_nulls=False)
    if "text" not in rows.columns:
        return None
    row = dict(zip(rows.columns, rows.rows[0], strict=True))
    texts = (row["text"], row["data"], row["event_type"])
    if not all(isinstance(v, str) for v in texts[:2]) or not isinstance(texts[2], str | None):
        return None
    protocol = protocol_of(row["exchange_uid"])
    known = by_name(protocol)
    if known is None or _text(known, row["data"], row["event_type"]) != row["text"]:
        return None
    columns = tuple(TEXT_FROM if c == "text" else c for c in rows.columns)
    values = tuple(protocol if c == "text" else v for c, v in zip(rows.columns, rows.rows[0], strict=True))
    payload = encode(Rows(rows.table, rows.capture, columns, [values]))
    return msgspec.structs.replace(message, payload=payload) if len(payload) <= limit else None


def _text(protocol: Protocol, data: Any, event_type: Any) -> str | None:
    """An event's text as the log writer derives it: what a new reader of its exchange's
    protocol makes of its data and type."""
    data, event_type = (None if _null(v) else v for v in (data, event_type))
    if not isinstance(data, str | None) or not isinstance(event_type, str | None):
        raise msgspec.ValidationError("an event whose data or type is not text")
    return protocol.reader().event(data or "", event_type).text


def _with_text(message: Rows) -> Rows:
    """Rows of events that travel with ``TEXT_FROM``, their text derived again in its place
    (rows as wide as their columns: ``_checked``)."""
    if TEXT_FROM not in message.columns:
        return message
    columns = message.columns
    if message.table is not Table.EVENTS or not {"data", "event_type"} <= set(columns):
        raise msgspec.ValidationError(f"{message.table} rows with {TEXT_FROM} and no event's data and type")
    at, data, event_type = (columns.index(c) for c in (TEXT_FROM, "data", "event_type"))
    rows = []
    for row in message.rows:
        known = by_name(row[at]) if isinstance(row[at], str) else None
        if known is None:
            raise msgspec.ValidationError(f"an event whose text no protocol known here derives ({row[at]!r})")
        rows.append((*row[:at], _text(known, row[data], row[event_type]), *row[at + 1 :]))
    return Rows(message.table, message.capture, (*columns[:at], "text", *columns[at + 1 :]), rows)


def _fitted(
    rows: Rows, limit: int, rowids: Sequence[int] | None, span: tuple[int, int] = (0, 0)
) -> Iterator[Message]:
    """``rows`` halved until each part encodes to at most ``limit`` bytes (or is one row);
    each message names the rowids of its first and last rows, or, without ``rowids``,
    ``span``."""
    payload = encode(rows)
    if len(payload) <= limit or len(rows.rows) == 1:
        first, last = span if rowids is None else (rowids[0], rowids[-1])
        yield Message(rows.table, rows.capture, len(rows.rows), first, last, payload)
        return
    half = len(rows.rows) // 2
    for part, ids in (
        (rows.rows[:half], None if rowids is None else rowids[:half]),
        (rows.rows[half:], None if rowids is None else rowids[half:]),
    ):
        yield from _fitted(msgspec.structs.replace(rows, rows=part), limit, ids, span)


# What names a row, in each table's rows as they travel (an exchange's uid first, as
# ``wire_columns`` orders them): a row without it cannot be written anywhere.
KEYS = {
    Table.CAPTURES: ("uid",),
    Table.EXCHANGES: ("capture_uid", "uid"),
    Table.STORED_CHUNKS: ("exchange_uid", "seq"),
    Table.EVENTS: ("exchange_uid", "seq"),
    Table.RESUMES: ("exchange_uid", "new_exchange_uid"),
}
NULLABLE_KEYS = ("new_exchange_uid",)  # a resume that made no new exchange names none
# What a value may be: what SQLite stores (MessagePack's maps, arrays and extensions are not).
SCALARS = frozenset({type(None), bool, int, float, str, bytes})


def decode(payload: bytes, *, nan_nulls: bool = False) -> Rows:
    """A message as shipped, its rows naming their exchange by uid; ``msgspec.ValidationError``
    or ``DecodeError`` for anything else (rows that are not as wide as their columns, or
    lack what names them, or hold values no sink can store: maps, arrays). The NULLs of
    rows a log writer encoded travel as NaN (as it binds them); with ``nan_nulls`` they stay
    NaN, for a sink that binds them into SQLite, which stores NaN as NULL: a third of the
    cost of decoding them as None. Events that travel without their text (``TEXT_FROM``)
    get it back, derived from their data."""
    return _with_text(_checked(_mapped(_decoder.decode(payload), nan_nulls)))


def _checked(message: Rows) -> Rows:
    columns, width = message.columns, len(message.columns)
    missing = [c for c in KEYS[message.table] if c not in columns]
    if missing:
        raise msgspec.ValidationError(f"{message.table} rows without {', '.join(missing)}")
    if message.table in (Table.STORED_CHUNKS, Table.EVENTS) and columns[0] != "exchange_uid":
        raise msgspec.ValidationError(f"{message.table} rows whose first column is not exchange_uid")
    wrong = next((row for row in message.rows if len(row) != width), None)
    if wrong is not None:
        raise msgspec.ValidationError(f"a {message.table} row of {len(wrong)} values for {width} columns")
    odd = next((v for row in message.rows for v in row if type(v) not in SCALARS), None)
    if odd is not None:
        raise msgspec.ValidationError(
            f"a {message.table} row holds a {type(odd).__name__}, which no sink stores"
        )
    keys = [columns.index(c) for c in KEYS[message.table] if c not in NULLABLE_KEYS]
    unnamed = next((row for row in message.rows if any(_null(row[at]) for at in keys)), None)
    if unnamed is not None:
        named = ", ".join(columns[at] for at in keys)
        raise msgspec.ValidationError(f"a {message.table} row without a value for {named}")
    return message


def _null(value: Any) -> bool:
    """NULL, as decoded or as a log writer encodes it (NaN)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _mapped(message: Rows, nan_nulls: bool) -> Rows:
    """A message whose rows hold local exchange ids (a log writer's), as rows naming their
    exchange by uid."""
    if not message.exchanges:
        return message
    try:
        at = message.columns.index("exchange_id")
        uids = message.exchanges
        if nan_nulls:
            rows = [(*row[:at], uids[row[at]], *row[at + 1 :]) for row in message.rows]
        else:
            rows = [
                tuple(
                    None if isinstance(v, float) and math.isnan(v) else v
                    for v in (*row[:at], uids[row[at]], *row[at + 1 :])
                )
                for row in message.rows
            ]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise msgspec.ValidationError(f"rows name exchanges the message does not map: {exc!r}") from None
    columns = (*message.columns[:at], "exchange_uid", *message.columns[at + 1 :])
    return Rows(message.table, message.capture, columns, rows)


def first_row(message: Message) -> str:
    """The first row of ``message`` in words, by what names it (``KEYS``): the halves of a
    message that was too big keep its rowids, which name none of their rows."""
    rows = decode(message.payload)
    row = dict(zip(rows.columns, rows.rows[0], strict=True))
    keys = ", ".join(f"{c} {row[c]}" for c in KEYS[rows.table] if c not in NULLABLE_KEYS)
    return f"a row of {rows.table} ({keys}"


def refuse_unknown(message: Rows, known: Collection[str], where: str) -> None:
    """A ``LogError`` for rows with columns not ``known`` (as they travel): a newer
    tasktape's, whose values a sink would lose. The collector stops, leaving them
    unacknowledged for a collector that knows them."""
    unknown = sorted(set(message.columns) - set(known))
    if unknown:
        raise LogError(
            f"{where}: {message.table} rows carry columns this tasktape does not know"
            f" ({', '.join(unknown)}): upgrade the collector's tasktape"
        )


def subject(prefix: str, table: Table, capture: str) -> str:
    return f"{prefix}.{capture}.{table}"


def message_id(message: Message) -> str:
    """The id of a message from its capture's uid, the rowids of its first and last rows
    in their log and a checksum of its encoded rows (the encoding is deterministic): the
    same rows published again after an unanswered publish are stored once, and a row
    shipped again because it changed is a new message. (A cryptographic digest of every
    payload would cost a tenth of what recording does.)"""
    m = message
    return f"{m.table}.{m.capture}.{m.first}-{m.last}.{len(m.payload)}.{zlib.crc32(m.payload):08x}"
