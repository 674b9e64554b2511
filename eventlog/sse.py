"""Incremental Server-Sent Events decoder following the W3C EventSource parsing rules.

Unlike a browser, it keeps every byte: each event carries the exact bytes it was
decoded from (``raw``), and ``close()`` hands back an unterminated tail instead of
dropping it, so ``b"".join(e.raw for e in events)`` is always the whole input.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from operator import add, itemgetter

import msgspec

from tasktape.errors import DecoderClosed, UsageError

_BOM = b"\xef\xbb\xbf"
# (Looked for with bytes.startswith, which text and a memoryview have not alike: they fail
# here, before the decoder changes, and feed says what to give it.)
_BOM_FIRST = _BOM[:1]
_LF = 0x0A
_CR = 0x0D
_COLON = 0x3A
_NUL = 0x00
# Lines that begin "data: " (with its space) and only they sort from _DATA on and before
# _NOT_DATA (" " + 1); those that begin "id: ", from _ID on and before _NOT_ID.
_DATA, _NOT_DATA, _ID, _NOT_ID = "data: ", "data:!", "id: ", "id:!"
_AFTER_DATA, _AFTER_ID = itemgetter(slice(6, None)), itemgetter(slice(4, None))
# A chunk this short holds a few events (up to four of 250 bytes): the loop reads them
# faster than the passes of an alike run, whose cost per chunk only more events outweigh.
_FEW_BYTES = 1024
_ONE_BYTES = 4096  # a chunk longer is seldom one event of one line: not looked at as one
# Larger retry values cannot be stored as a SQLite INTEGER; they are ignored like
# any other invalid retry field.
_MAX_RETRY = 2**63 - 1


class SSEEvent(msgspec.Struct, gc=False):
    """One dispatched event (or, with ``complete=False``, the tail of a cut-off stream).
    (A Struct: made in C, for every event recorded; it holds no other object.)"""

    data: str
    event: str | None
    id: str | None
    retry: int | None
    last_event_id: str
    raw: bytes
    complete: bool = True


class SSEDecoder:
    """Turns a byte stream, fed in chunks of any size, into :class:`SSEEvent` objects.

    >>> dec = SSEDecoder()
    >>> [e.data for e in dec.feed(b"data: hello\\n\\nda")]
    ['hello']
    >>> [(e.data, e.complete) for e in dec.close()]
    [('', False)]

    With ``keep_raw=False`` events carry ``raw=b""`` and parsed bytes are dropped at
    once: less work, and memory bounded by the longest line rather than by what came
    since the last event (a stream of nothing but keep-alives, say).
    """

    __slots__ = (
        "_at_start",
        "_between",
        "_buf",
        "_closed",
        "_data",
        "_dropped",
        "_event",
        "_id",
        "_keep_raw",
        "_last_id",
        "_line_start",
        "_retry",
        "_skip_lf",
        "as_written",
    )

    def __init__(self, *, keep_raw: bool = True, start: bool = True) -> None:
        """``start=False``: the bytes fed begin mid-stream, at a block (no byte-order mark
        is looked for)."""
        self._keep_raw = keep_raw
        # Bytes received since the end of the last dispatched event (without keep_raw:
        # since the last parsed line; _dropped counts the ones already let go).
        self._buf = bytearray()
        self._dropped = 0
        # Offset in _buf of the first byte not yet parsed (the start of a partial line).
        self._line_start = 0
        # The last parsed line ended with a CR at the end of a chunk: an LF that
        # starts the next chunk completes that CRLF instead of ending a blank line.
        self._skip_lf = False
        self._at_start = start
        self._closed = False
        self._data: list[bytes] = []
        self._event: bytes | None = None
        self._id: str | None = None
        self._retry: int | None = None
        self._last_id = ""
        # Nothing pending: no bytes, no field of a block read (the first chunk, which may
        # begin with a BOM, is read line by line).
        self._between = False
        # Whether the events the last feed returned are the chunk fed, each in the form
        # ``written`` writes it back (a log need not keep the chunk beside them).
        self.as_written = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode one more chunk; return the events whose blank line it completed. A chunk
        that is not bytes (text, say) is a :class:`UsageError`, and nothing of it is read."""
        try:  # (costs nothing on the way through: a chunk is looked at only on failing)
            self.as_written = False
            if (
                self._at_start
                and chunk
                and not chunk.startswith(_BOM_FIRST)
                and not (self._buf or self._closed)
            ):
                # No byte-order mark: the stream begins between events, as after one.
                self._at_start = False
                self._between = True
            if self._between:
                if len(chunk) <= _ONE_BYTES and type(chunk) is bytes:
                    event = self._one(chunk)
                    if event is not None:
                        self.as_written = True
                        return [event]
                events = self._from_between(chunk)
                if events is not None:
                    return events
            elif not (self._at_start or self._closed):
                # Inside an event: its lines up to the first blank line, then (usually) whole events.
                end = _first_block_end(chunk)
                if 0 < end < len(chunk):
                    events = self._feed_lines(chunk[:end])
                    rest = chunk[end:]
                    more = self._from_between(rest) if self._between else None
                    self.as_written = False  # (events before them)
                    return events + (self._feed_lines(rest) if more is None else more)
            if self._skip_lf or self._at_start or self._closed or _LF in chunk or _CR in chunk:
                return self._feed_lines(chunk)
            self._buf += chunk  # still inside one line: nothing to parse yet
            self._between = False
            return []
        except (TypeError, AttributeError):
            if isinstance(chunk, bytes | bytearray):
                raise  # bytes: a fault of this decoder, not of the chunk
            raise _not_bytes(chunk) from None

    def _from_between(self, chunk: bytes) -> list[SSEEvent] | None:
        """A chunk that begins between events: whole events, then perhaps the start of the
        next one (read line by line). None, and nothing changed, if it is anything else."""
        events = self._whole(chunk)
        if events is not None:
            return events
        end = _last_block_end(chunk)
        if 0 < end < len(chunk):
            events = self._whole(chunk[:end])
            if events is not None:
                self.as_written = False  # (not the whole chunk)
                return events + self._feed_lines(chunk[end:])
        return None

    def _whole(self, chunk: bytes) -> list[SSEEvent] | None:
        """A chunk of whole events (the commonest: a stream's events, sent one or a few at
        a time), read without the line-by-line parse: each a data line, alone or after an
        ``id: `` or ``event: `` line, every line end LF or every one CRLF. None, and
        nothing changed, if the chunk is anything else."""
        if type(chunk) is not bytes:
            chunk = bytes(chunk)
        if chunk.endswith(b"\n\n") and _CR not in chunk:
            text = chunk
        elif chunk.endswith(b"\r\n\r\n"):
            text = chunk.replace(b"\r\n", b"\n")
            if _CR in text or chunk.count(b"\r") != text.count(b"\n"):
                return None  # a CR alone, or an LF alone
        else:
            return None
        keep_raw, crlf = self._keep_raw, text is not chunk
        if len(text) > _FEW_BYTES:
            events = self._alike(chunk, text, crlf)
            if events is not None:
                return events
        blocks = text[:-2].split(b"\n\n")
        last_id = self._last_id  # restored if the chunk turns out to be anything else
        events = []
        # Whether each block is in the form ``written`` writes back: a space after each
        # field's colon, and UTF-8 throughout (else replacement characters stand in).
        as_written = True
        for block in blocks:
            ident = event = None
            if block.startswith(b"data:"):
                line = block
            else:
                first, _, line = block.partition(b"\n")
                if first.startswith(b"id: ") and _NUL not in first:
                    ident = self._last_id = first[4:].decode("utf-8", "replace")
                    as_written = as_written and "\ufffd" not in ident
                elif first.startswith(b"event: "):
                    event = first[7:].decode("utf-8", "replace")
                    as_written = as_written and "\ufffd" not in event
                else:
                    line = b""
            if not line.startswith(b"data:") or _LF in line:
                self._last_id = last_id
                return None
            if line[5:6] == b" ":
                value = line[6:]
            else:
                value, as_written = line[5:], False
            raw = b""
            if keep_raw:  # the event's bytes as they came: the chunk, or its block and line ends
                if len(blocks) == 1:
                    raw = chunk
                elif crlf:
                    raw = block.replace(b"\n", b"\r\n") + b"\r\n\r\n"
                else:
                    raw = block + b"\n\n"
            data = value.decode("utf-8", "replace")
            as_written = as_written and "\ufffd" not in data
            events.append(SSEEvent(data, event, ident, None, self._last_id, raw))
        self._dropped = 0  # (without keep_raw) no byte since these events
        self.as_written = as_written  # (``feed`` says otherwise when they are not the whole chunk)
        return events

    def _one(self, chunk: bytes) -> SSEEvent | None:
        """A chunk that is one whole event (the commonest, live: agents send an event a
        write), read with a few scans: a ``data: `` line, after an ``id: `` line or not,
        ended LF or CRLF. None, and nothing changed, if it is anything else (the loop of
        ``_whole`` reads it, or the line-by-line parse)."""
        first, _, rest = chunk.partition(b"\n")
        head = None
        if rest == b"\n":
            line = first
        elif rest == b"\r\n" and first[-1:] == b"\r":
            line = first[:-1]
        elif first[:4] == b"id: ":
            line, _, rest = rest.partition(b"\n")
            if rest == b"\n":
                head = first
            elif rest == b"\r\n" and first[-1:] == b"\r" and line[-1:] == b"\r":
                head, line = first[:-1], line[:-1]
            else:
                return None
            if _CR in head or _NUL in head:
                return None
        else:
            return None
        if line[:6] != b"data: " or _CR in line:
            return None
        try:
            value = line[6:].decode()
            ident = None if head is None else head[4:].decode()
        except UnicodeDecodeError:
            return None  # (read with replacement characters)
        if ident is not None:
            self._last_id = ident
        self._dropped = 0
        return SSEEvent(value, None, ident, None, self._last_id, chunk if self._keep_raw else b"")

    def _alike(self, chunk: bytes, text: bytes, crlf: bool) -> list[SSEEvent] | None:
        """``_whole``'s events when they are all alike (what agents send): every block a
        ``data: `` line, or every block an ``id: `` line and a ``data: `` line. Read in a
        few passes over them all, in C: no Python code runs per event. None: anything else
        (or bytes that are not UTF-8, which the loop reads with replacement characters)."""
        if _NUL in text and text[:4] == b"id: ":
            return None  # an id with a NUL is ignored: the loop reads it
        try:
            lines = text.decode().split("\n")  # (``text``'s line ends are LF; it ends in a blank line)
        except UnicodeDecodeError:
            return None
        if lines[0][:4] == _ID:
            if len(lines) % 3 != 1 or any(lines[2::3]):
                return None
            heads = lines[0:-1:3]
            if min(heads) < _ID or max(heads) >= _NOT_ID:
                return None
            datas = lines[1::3]
        elif len(lines) % 2 != 1 or any(lines[1::2]):
            return None
        else:
            heads, datas = None, lines[0:-1:2]
        if min(datas) < _DATA or max(datas) >= _NOT_DATA:
            return None
        values = list(map(_AFTER_DATA, datas))
        ids: Iterable[str | None] = repeat(None)
        last_ids: Iterable[str] = repeat(self._last_id)
        if heads is not None:
            ids = last_ids = list(map(_AFTER_ID, heads))
            self._last_id = last_ids[-1]
        raws: Iterable[bytes] = repeat(b"")
        self._dropped = 0  # (without keep_raw) no byte since these events
        if self._keep_raw:
            sep = b"\r\n\r\n" if crlf else b"\n\n"
            raws = map(add, chunk[: -len(sep)].split(sep), repeat(sep))
        self.as_written = True  # (``feed`` says otherwise when they are not the whole chunk)
        return list(map(SSEEvent, values, repeat(None), ids, repeat(None), last_ids, raws))

    def _feed_lines(self, chunk: bytes) -> list[SSEEvent]:
        if self._closed:
            raise DecoderClosed("feed() called on a closed SSEDecoder")
        if not chunk:
            if isinstance(chunk, bytes | bytearray):
                return []
            raise _not_bytes(chunk)  # (None, "", 0: read as no bytes, they were taken)
        buf = self._buf
        buf += chunk
        if self._at_start:
            if len(buf) < 3 and _BOM.startswith(buf):
                return []  # may still turn out to be a leading BOM
            self._at_start = False
            if buf.startswith(_BOM):
                self._line_start = 3
        if self._skip_lf:
            self._skip_lf = False
            if buf[self._line_start] == _LF:
                self._line_start += 1
        return self._parse()

    def take_idle(self) -> bytes:
        """The whole lines received since the last dispatched event that start no event
        (comments, keep-alives, blank lines), handed over now and dropped from the next
        event's ``raw``: a relay that sends events whole need not hold a keep-alive back
        until the next event. Nothing while a block has begun (a data, event, id or retry
        line read), or without ``keep_raw``."""
        start = self._line_start
        if not start or not self._keep_raw or self._data or self._event is not None:
            return b""
        if self._id is not None or self._retry is not None:
            return b""
        idle = bytes(memoryview(self._buf)[:start])
        del self._buf[:start]
        self._line_start = 0
        return idle

    def close(self) -> list[SSEEvent]:
        """End of stream: return the bytes after the last dispatched event, if any,
        as one event with ``complete=False`` (parsed as far as they go)."""
        if self._closed:
            return []
        self._closed = True
        self._between = False
        buf = self._buf
        if not buf and not self._dropped:
            return []
        tail = bytes(buf[self._line_start :])
        if tail:
            self._field(tail)
        event = self._make_event(bytes(buf) if self._keep_raw else b"", complete=False)
        buf.clear()
        return [event]

    def _parse(self) -> list[SSEEvent]:
        buf = self._buf
        start = self._line_start
        # Copy only the unparsed part: the parsed lines of a long pending event are
        # never copied again, so huge events fed in small chunks stay linear.
        text = bytes(memoryview(buf)[start:])
        events: list[SSEEvent] = []
        pos = 0  # end of the last complete line, in text
        cut = -1  # end of the last event dispatched by this call, in text
        data = self._data
        line = b""
        for line in text.splitlines(True):
            end = line[-1]
            if end == _LF:
                body = line[:-2] if len(line) > 1 and line[-2] == _CR else line[:-1]
            elif end == _CR:
                body = line[:-1]
            else:
                break  # unterminated: wait for the rest of the line
            pos += len(line)
            if body:
                # Fast path for the commonest line; everything else goes to _field.
                if body.startswith(b"data:"):
                    data.append(body[6:] if body[5:6] == b" " else body[5:])
                elif body.startswith(b"id: ") and _NUL not in body:
                    self._id = self._last_id = body[4:].decode("utf-8", "replace")
                elif body[0] != _COLON:
                    self._field(body)
                continue
            # A blank line: dispatch the block if it holds data, then reset it.
            if data:
                if not self._keep_raw:
                    raw = b""
                elif cut < 0:
                    raw = bytes(memoryview(buf)[:start]) + text[:pos] if start else text[:pos]
                else:
                    raw = text[cut:pos]
                events.append(self._make_event(raw, complete=True))
                data = self._data
                cut = pos
            else:
                self._event = self._id = self._retry = None
        else:
            if line and line[-1] == _CR:
                self._skip_lf = True
        if not self._keep_raw:
            del buf[: start + pos]
            self._line_start = 0
            self._dropped = pos - cut if cut >= 0 else self._dropped + start + pos
        elif cut < 0:
            self._line_start = start + pos
        else:
            del buf[: start + cut]
            self._line_start = pos - cut
        self._between = (
            not buf
            and not self._skip_lf
            and not data
            and self._event is None
            and self._id is None
            and self._retry is None
        )
        return events

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if not name and colon:
            return  # a comment
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value
        elif name == b"id":
            if b"\x00" not in value:
                self._id = self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            digits = value.lstrip(b"0")
            if len(digits) <= 19 and int(digits or b"0") <= _MAX_RETRY:
                self._retry = int(digits or b"0")

    def _make_event(self, raw: bytes, *, complete: bool) -> SSEEvent:
        data = self._data
        event = self._event
        result = SSEEvent(
            (data[0] if len(data) == 1 else b"\n".join(data)).decode("utf-8", "replace"),
            None if event is None else event.decode("utf-8", "replace"),
            self._id,
            self._retry,
            self._last_id,
            raw,
            complete,
        )
        self._data = []
        self._event = None
        self._id = None
        self._retry = None
        return result


def is_event(complete: bool, data: str) -> bool:
    """Whether a decoded block (or the tail ``close`` returns) is an event: one ended by its
    blank line, or one cut off after its data began. Bytes after the last event that no
    client dispatches (a comment, the LF of a CRLF cut from its CR, a block without data)
    are not."""
    return complete or bool(data)


def written(data: str, ident: str | None, event: str | None, crlf: bool) -> bytes:
    """An event's bytes in the one form the log can write back from its fields (an
    ``id: `` line, an ``event: `` line, one ``data: `` line, a blank line; LF or CRLF):
    a chunk equal to this need not be stored beside its event. ``schema.CHUNKS`` writes
    the same bytes in SQL."""
    eol = "\r\n" if crlf else "\n"
    head = ("" if ident is None else f"id: {ident}{eol}") + ("" if event is None else f"event: {event}{eol}")
    return f"{head}data: {data}{eol}{eol}".encode()


def _not_bytes(chunk: object) -> UsageError:
    """The error of a chunk fed that is no bytes, saying what to feed."""
    how = {str: ": feed(text.encode())", memoryview: ": feed(bytes(chunk))"}.get(type(chunk), "")
    return UsageError(f"SSEDecoder.feed takes bytes, as received, not {type(chunk).__name__}{how}")


def _first_block_end(chunk: bytes) -> int:
    """Where the first blank line (LF or CRLF) of ``chunk`` ends (0: it has none)."""
    ends = [at + size for at, size in ((chunk.find(b"\n\n"), 2), (chunk.find(b"\n\r\n"), 3)) if at >= 0]
    return min(ends, default=0)


def _last_block_end(chunk: bytes) -> int:
    """Where the last blank line (LF or CRLF) of ``chunk`` ends (0: it has none)."""
    lf, crlf = chunk.rfind(b"\n\n"), chunk.rfind(b"\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
