"""What goes over the wire between shippers and collectors: rows of one table of one
capture per message, MessagePack-encoded, on a subject per capture and table.

A row names its capture and exchange by uid (integer ids are local to a log): in a
message, ``exchanges.capture_id`` travels as ``capture_uid``, and ``exchange_id`` (and
``new_exchange_id``) as ``exchange_uid`` (``new_exchange_uid``). Each message has an id
derived from the rows it holds, which JetStream deduplicates a resend by.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import msgspec

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


def wire_columns(table: Table, local: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A table's columns as its rows travel, from its columns in a log (name and SQLite
    type): integer ids left out, the uids that name the row's exchange (or capture) first."""
    names = [name for name, _ in local]
    uids = [(UID_COLUMNS[c], "TEXT") for c in UID_COLUMNS if c in names]
    return [*uids, *((c, t) for c, t in local if c not in ("id", *UID_COLUMNS))]


class Rows(msgspec.Struct, array_like=True, frozen=True):
    """One message: rows of ``table``, all of the capture ``capture``, their values in the
    order of ``columns``."""

    table: Table
    capture: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Rows)


def encode(message: Rows) -> bytes:
    return _encoder.encode(message)


def decode(payload: bytes) -> Rows:
    """A message as shipped; ``msgspec.ValidationError`` or ``DecodeError`` for anything else."""
    return _decoder.decode(payload)


def subject(prefix: str, message: Rows) -> str:
    return f"{prefix}.{message.capture}.{message.table}"


def message_id(message: Rows, keys: list[tuple[Any, ...]]) -> str:
    """The same rows (by what keys them: uid and version, or exchange uid and seq) give the
    same id, so a message published again after an unanswered publish is stored once."""
    digest = hashlib.sha256(repr((message.table, message.capture, keys)).encode()).hexdigest()[:32]
    return f"{message.table}.{digest}"
