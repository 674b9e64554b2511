"""The ids a resuming recorder gives the events of a held stream, and where each event
ends in the bytes its clients are sent.

A stream whose lines all end alike (LF, or CRLF, as the a2a-sdk's do) is cut into blocks
by bytes scans alone, and an event without an id gets an ``id:`` line spliced in before
its blank line; an upstream chunk whose events all have ids, and that ends where an event
does, goes out as the very bytes object it came in. A run of events that are each one data
line (what agents send most) is split into lines once, checked by a few calls into C
(``min`` and ``max`` of the lines tell whether each is a data line) and joined with its
ids in one go: no Python code runs per event. A run of events that each have an id line
and a data line goes out as it came, after the same few checks. Where each event ends, and
which ids the agent gave, is worked out only when a reconnect (or a rejoin) asks. Only a
stream whose line ends are mixed, or that begins with a byte-order mark, is read by the
full ``SSEDecoder``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate, repeat
from typing import NamedTuple

from tasktape.eventlog import SSEDecoder, SSEEvent

_BOM_START = 0xEF  # the first byte of a UTF-8 byte-order mark
_CR, _LF, _NUL = 0x0D, 0x0A, 0x00  # as ints, ``in`` finds them with memchr
# Lines that begin b"data:" and only they sort from DATA on and before NOT_DATA (":" + 1);
# lines that begin b"id: ", from ID on and before NOT_ID (" " + 1).
DATA, NOT_DATA = b"data:", b"data;"
ID, NOT_ID = b"id: ", b"id:!"
SPACED_ID = b"id: !"  # below it: an id line empty, or with a space or control character first
# The numbers of the recorder's ids, b"0", b"1"...: made once for every stream (up to
# NUMBERS_KEPT of them; a stream longer than that has its later ones made as it goes).
_NUMBERS: list[bytes] = []
NUMBERS_KEPT = 1 << 17
# The most digits of a number the recorder gives in an id (an exchange's, an event's): no
# more than SQLite's integers have. Past them a client's id names nothing (and Python reads
# no number of over 4,300 digits).
MOST_DIGITS = 19


def numbered(text: str) -> int | None:
    """The number ``text`` is, in ASCII digits (None: not one the recorder gives)."""
    return int(text) if len(text) <= MOST_DIGITS and text.isascii() and text.isdigit() else None


class Lines(NamedTuple):
    """How a response ends its lines, and what that makes of the marks looked for."""

    nl: bytes
    cut: bytes  # the first byte of a line end: partition() finds one byte with memchr
    lead: bytes  # the rest of a line end, after the cut
    tail: bytes  # what follows the cut of a block's last line: the rest of its end, a blank line
    sep: bytes  # the end of a block: a line end, then a blank line
    id_line: bytes  # a line that begins "id", after the first
    data_line: bytes


LF = Lines(b"\n", b"\n", b"", b"\n", b"\n\n", b"\nid", b"\ndata")
CRLF = Lines(b"\r\n", b"\r", b"\n", b"\n\r\n", b"\r\n\r\n", b"\r\nid", b"\r\ndata")


class Stamper:
    """Gives every event of one stream an id (its own, or ``prefix<n>``, ``n`` counting
    the stream's events from 1) and indexes where each ends, in the bytes clients are sent:
    ``segments``, one per upstream chunk that completed a block (or per event of the
    recorder's own), each beginning at the byte offset in ``starts``. An event is a block
    with a data line, as an EventSource dispatches it.

    Where the events end, and the agent's ids, are worked out when asked (``ends``,
    ``own``): the segments the quick ways stamp end an event at each blank line, and each
    event in them that begins with an id line has the agent's id; the others, the recorder's."""

    __slots__ = (
        "_again",
        "_cr_end",
        "_decoder",
        "_ends",
        "_first",
        "_fresh",
        "_id_head",
        "_indexed",
        "_lines",
        "_measured",
        "_own",
        "_pending",
        "_positions",
        "_quick",
        "_size",
        "_starts",
        "count",
        "on_new",
        "prefix",
        "segments",
    )

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.segments: list[bytes] = []
        # Where each segment begins, and the bytes so far, as far as worked out: the quick
        # ways only add segments, and the rest is measured when asked (few ask, and at the
        # end of a stream only its size).
        self._starts: list[int] = []
        self._measured = 0  # the segments whose starts those are
        self._size = 0  # their bytes
        self.count = 0  # events so far
        self._ends: list[int] = []  # where each event ends, as far as worked out
        # The segments whose events those are: each after them (the quick ways') ends an
        # event at each of its blank lines.
        self._indexed = 0
        # The agent's ids in those (the recorder's, prefix<n>, are not stored): where the
        # first event of each ends (a priming event's too), and the number of each event
        # that has one.
        self._positions: dict[str, int] = {}
        self._own: dict[int, str] = {}
        # How many events had each of those ids that more than one had (an agent that gives
        # all its events one id): a reconnect after one cannot be placed.
        self._again: dict[str, int] = {}
        self.on_new: Callable[[], None] | None = None  # told when clients have more bytes
        self.restart(None)

    def id_of(self, n: int) -> str:
        """The id of the ``n``-th event (from 1)."""
        own = self._own_of(n)
        return f"{self.prefix}{n}" if own is None else own

    def ids(self) -> list[str]:
        """Every event's id, in order."""
        return [self.id_of(n) for n in range(1, self.count + 1)]

    def last_own(self) -> str | None:
        """The agent's id of the last event (None: it gave that one none)."""
        return self._own_of(self.count)

    def _own_of(self, n: int) -> str | None:
        """The agent's id of the ``n``-th event (None: it gave none). The first and the
        last of those not indexed yet are read where they are, the rest left unindexed
        (a stream let go names them, a rejoin asks for the last)."""
        indexed = len(self._ends)
        if n <= indexed or indexed + 1 < n < self.count:
            return self.own.get(n)
        # In a quick way's segment: each of its blocks an event.
        nl, sep = self._lines.nl, self._lines.sep  # type: ignore[union-attr]  # the quick ways know them
        if n == indexed + 1:
            first = self.segments[self._indexed]
            block = first[: first.find(sep)]
        else:
            last = self.segments[-1]
            before = last.rfind(sep, 0, len(last) - len(sep))
            block = last if before < 0 else last[before + len(sep) :]
        return _quick_own(block, nl) if block[:4] == ID else None

    @property
    def own(self) -> dict[int, str]:
        """The agent's id of each event that has one, by the event's number."""
        if self._indexed < len(self.segments):
            self._index()
        return self._own

    @property
    def positions(self) -> dict[str, int]:
        """Where the first event of each of the agent's ids ends (a priming event's too)."""
        if self._indexed < len(self.segments):
            self._index()
        return self._positions

    def times_given(self, event_id: str) -> int:
        """How many events the agent gave that id."""
        positions = self.positions
        return self._again.get(event_id, int(event_id in positions))

    def _given(self, own: str, end: int) -> None:
        """An event of the agent's id ``own`` ends at ``end``: where its first one does is
        kept, and how many had it."""
        if self._positions.setdefault(own, end) != end:
            self._again[own] = self._again.get(own, 1) + 1

    def position(self, event_id: str) -> int | None:
        """Where the (first) event of that id ends; None: there is none."""
        found = self.positions.get(event_id)
        if found is not None or not event_id.startswith(self.prefix):
            return found
        number = event_id[len(self.prefix) :]
        n = numbered(number)
        if n is None or number[0] == "0":
            return None
        return self._ends[n - 1] if n <= self.count and n not in self._own else None

    @property
    def starts(self) -> list[int]:
        """Where each segment begins."""
        if self._measured < len(self.segments):
            self._measure()
        return self._starts

    @property
    def size(self) -> int:
        """The bytes so far."""
        if self._measured < len(self.segments):
            self._measure()
        return self._size

    def _measure(self) -> None:
        new = self.segments[self._measured :]
        self._starts += accumulate(map(len, new[:-1]), initial=self._size)
        self._size += sum(map(len, new))
        self._measured = len(self.segments)

    @property
    def ends(self) -> list[int]:
        """Where each event ends."""
        if self._indexed < len(self.segments):
            self._index()
        return self._ends

    def _index(self) -> None:
        """The ends, and the agent's ids, of the events in the segments not yet indexed."""
        nl, sep = self._lines.nl, self._lines.sep  # type: ignore[union-attr]  # the quick ways know them
        ends, own, given, starts = self._ends, self._own, self._given, self.starts
        for i in range(self._indexed, len(self.segments)):
            at = starts[i]
            for block in self.segments[i].split(sep)[:-1]:  # the last: b"", after the last blank line
                at += len(block) + len(sep)
                ends.append(at)
                if block[:4] == ID:
                    agents = own[len(ends)] = _quick_own(block, nl)
                    given(agents, at)
        self._indexed = len(self.segments)

    def restart(self, first: Callable[[SSEEvent], bool] | None) -> None:
        """A new upstream response goes on with the stream: what the last one cut off
        mid-event is dropped (no client was sent it). ``first`` is given the new one's first
        event and says whether it is sent on."""
        if self._indexed < len(self.segments):  # by its own line ends, before the next response's
            self._index()
        self._pending: list[bytes] = []  # bytes after the last whole block
        self._lines: Lines | None = None  # how the response ends its lines, once one came
        self._cr_end = False  # (CRLF) the last byte read was a CR
        self._decoder: SSEDecoder | None = None  # a response with mixed line ends
        self._fresh = True  # none of the response read yet (it may begin with a BOM)
        self._first = first
        self._id_head = b""  # the id line's, up to its number, once the line ends are known
        # While a chunk may be one event: the lines' cut (and the other byte of a line
        # end), lead and tail, and the id line's head and end.
        self._quick: tuple[bytes, int, bytes, bytes, bytes, bytes] | None = None

    def feed(self, data: bytes) -> bytes:
        """Bytes from the upstream: what they complete for clients (b"" if nothing)."""
        quick = self._quick
        # A chunk that is one whole event of one data line, after an id line or not (the
        # commonest, when the agent paces its events), ended as the response's lines are,
        # is stamped here with a few scans (partition, and ``in`` with an int, which are
        # memchr; in Python 3.11 find and startswith cost more in parsing their arguments).
        if quick is not None:
            cut, other, lead, tail, head, sep = quick
            line, _, rest = data.partition(cut)
            stamped = None
            if other not in line:  # no other line end before the first
                if rest == tail:  # one line, then a blank line
                    if line[:5] == b"data:":  # no id: one is spliced in
                        n = self.count + 1
                        try:
                            number = _NUMBERS[n]
                        except IndexError:  # past those made so far
                            number = _numbers(n, 1)[0]
                        stamped = b"".join((line, head, number, sep))
                elif (
                    line[:4] == b"id: "
                    and line[4:5] > b" "
                    and line[-1:] > b" "
                    and _NUL not in line
                    and (not lead or rest[:1] == lead)
                ):
                    # An id line (a NUL in it, or one empty or with spaces around it: the
                    # slow way), then the data line.
                    second, _, rest = (rest[1:] if lead else rest).partition(cut)
                    if rest == tail and other not in second and second[:5] == b"data:":
                        stamped = data  # its id is read when asked (_index)
            if stamped is not None:  # _plain's work, done here: calls less
                self.segments.append(stamped)
                self.count += 1
                if self.on_new is not None:
                    self.on_new()
                return stamped
            if rest and (line[:5] == DATA or line[:4] == ID) and data[-1] == _LF:  # several events?
                stamped = self._plain(data)
                if stamped is not None:
                    if self.on_new is not None:
                        self.on_new()
                    return stamped
        if not data:
            return b""
        lines = self._lines
        if lines is not None and self._decoder is None and self._first is None:
            stamped = self._fast(data, lines)  # whole events, cut anywhere
            if stamped is not None:
                self._arm()
                if self.on_new is not None:
                    self.on_new()
                return stamped
        before = len(self.segments)
        self._feed(data)
        self._arm()
        new = self.segments[before:]
        if not new:
            return b""
        if self.on_new is not None:
            self.on_new()
        return new[0] if len(new) == 1 else b"".join(new)

    def _arm(self) -> None:
        """The quick path is taken while no bytes pend and the line ends are known alike."""
        lines = self._lines
        self._quick = None
        if lines is not None and not self._pending and self._decoder is None and self._first is None:
            other = _CR if lines is LF else _LF  # the byte of a line end that the cut is not
            self._quick = (lines.cut, other, lines.lead, lines.tail, self._id_head, lines.sep)

    def _feed(self, data: bytes) -> None:
        if self._fresh:
            self._fresh = False
            if data[0] == _BOM_START:
                self._decoder = SSEDecoder()
        if self._decoder is None:
            lines = self._lines
            if lines is None:
                lines = CRLF if b"\r" in data else LF if b"\n" in data else None
                self._lines = lines
                if lines is None:
                    self._pending.append(data)  # no line end yet
                    return
                # After an event's data line: _next_id's id line (this, then the number),
                # then the blank line.
                self._id_head = lines.nl + f"id: {self.prefix}".encode()
                if self._first is None and self._fast(data, lines) is not None:
                    return  # (feed tries the quick ways itself once the line ends are known)
            if self._fits(data, lines):
                self._split(data, lines)
                return
            self._decode_from_here()
        self._decoded(data)

    def close(self) -> None:
        """The upstream ended: a tail it cut off goes out as it came."""
        if self._decoder is None:
            if not self._pending:
                return
            self._decode_from_here()  # a CR at the very end ends a line
        tail = b"".join(e.raw for e in self._decoder.close())
        if tail:
            self._out(tail)

    def _decode_from_here(self) -> None:
        """The full decoder reads the response from the block pending on."""
        pending, self._pending = self._pending, []
        self._decoder = SSEDecoder(start=False)
        self._decoded(b"".join(pending))

    def _next_id(self) -> str:
        return f"{self.prefix}{self.count + 1}"

    def made(self, data: str, end: bytes) -> str:
        """An event of the recorder's own (``data``, lines ended by ``end``): its id."""
        event_id = self._next_id()
        lines = [b"data: " + line.encode() for line in data.split("\n")]
        raw = end.join([*lines, f"id: {event_id}".encode(), b"", b""])
        self._out(raw)
        self._event(self.size)
        return event_id

    def _fits(self, data: bytes, lines: Lines) -> bool:
        """Whether ``data`` ends its lines as the response did so far."""
        if lines is LF:
            return b"\r" not in data
        crlf = data.count(b"\r\n")
        lead = self._cr_end and data[0] == 0x0A  # the LF of a CRLF the last chunk began
        if self._cr_end and not lead:
            return False
        self._cr_end = data[-1] == 0x0D
        return data.count(b"\n") == crlf + lead and data.count(b"\r") == crlf + self._cr_end

    def _split(self, data: bytes, lines: Lines) -> None:
        sep = lines.sep
        pending = self._pending
        end = data.rfind(sep)
        if end >= 0:
            end += len(sep)
        elif pending:  # a blank line begun in the bytes before
            tail = _tail(pending, len(sep) - 1)
            found = (tail + data[: len(sep) - 1]).rfind(sep)
            end = found + len(sep) - len(tail) if found >= 0 else -1
        if end < 0:
            pending.append(data)
            if len(pending) == 1 and data[:1] == b":":
                self._idle(lines.nl)
            return
        whole = data if end == len(data) else data[:end]
        if pending:
            whole = b"".join([*pending, whole])
        self._pending = [data[end:]] if end < len(data) else []
        self._blocks(whole, lines)
        if self._pending and data[end : end + 1] == b":":
            self._idle(lines.nl)

    def _blocks(self, whole: bytes, lines: Lines) -> None:
        """Emit ``whole`` (ending in a blank line), an id spliced into each event without one."""
        nl, sep, id_line = lines.nl, lines.sep, lines.id_line
        blocks = whole.split(sep)
        rest = blocks.pop()  # b"", or the last blank line of an odd run of line ends
        if not rest and self._first is None and self._plain(whole) is not None:
            return
        parts: list[bytes] | None = None  # None while ``whole`` goes out untouched
        at = self.size
        if self._indexed < len(self.segments):  # (the events before these first)
            self._index()
        for i, block in enumerate(blocks):
            own = _own_id(block, nl) if block.startswith(b"id") or id_line in block else None
            if not _has_data(block, lines):
                at += len(block) + len(sep)
                if parts is not None:
                    parts.append(block + sep)
                if own is not None:  # an id without data (a priming event) is resumed from too
                    self._given(own, at)
                continue
            if self._first is not None:
                before = b"".join(parts) if parts is not None else sep.join(blocks[:i]) + sep if i else b""
                if before:
                    self._out(before)
                parts = []
                sent_on = self._take_first(block + sep)
                at = self.size
                if not sent_on:
                    continue
            if own is None:
                if parts is None:
                    parts = [sep.join(blocks[:i]) + sep] if i else []
                stamped = b"".join((block, self._id_head, _numbers(self.count + 1, 1)[0], sep))
                parts.append(stamped)
                at += len(stamped)
                self._event(at)
            else:
                at += len(block) + len(sep)
                if parts is not None:
                    parts.append(block + sep)
                self._event(at, own)
        if parts is None:
            self._out(whole)
        elif parts or rest:
            parts.append(rest)
            self._out(b"".join(parts))

    def _fast(self, data: bytes, lines: Lines) -> bytes | None:
        """The blocks ``data`` completes (with the bytes pending before it), stamped if
        ``_plain`` takes them: the commonest chunk of an agent sending faster than it is
        read, cut anywhere. What follows its last blank line pends, as ``_split`` keeps it.
        None: nothing done, ``data`` goes the slow way (a rejoin's first event too, to
        ``_take_first``)."""
        sep = lines.sep
        end = data.rfind(sep) + len(sep)
        if end < len(sep):
            return None  # no blank line ends in it
        pending = self._pending
        stamped = self._plain(b"".join([*pending, data[:end]]) if pending else data[:end])
        if stamped is None:
            return None
        rest = data[end:]
        self._pending = [rest] if rest else []
        self._cr_end = False  # the blank line ended in an LF
        if not rest:
            return stamped
        before = len(self.segments)
        if not self._fits(rest, lines):  # what follows has mixed line ends: decoded from here on
            self._decode_from_here()
        elif rest[:1] == b":":
            self._idle(lines.nl)
        if len(self.segments) == before:
            return stamped
        return b"".join([stamped, *self.segments[before:]])  # and a keep-alive after it, at once

    def _plain(self, whole: bytes) -> bytes | None:
        """``whole`` (whole blocks) stamped and emitted, if every block is one data line
        without an id, or every block an id line and a data line, ended as the response's
        lines are; else None, and nothing done. One split, and the rest in C: no call per
        event."""
        lines = self._lines
        if lines is LF:
            if _CR in whole:
                return None
            split = whole.split(b"\n")
        else:
            split = whole.split(b"\r\n")
        if whole[:4] == ID:
            stamped = self._owned(whole, split, lines)
            if stamped is None:
                return None
        elif len(split) == 3:  # one event (chunks are small when many streams share the CPU)
            line, blank, last = split
            if blank or last or line[:5] != DATA or (lines is not LF and (_CR in line or _LF in line)):
                return None
            n = self.count + 1
            number = _NUMBERS[n] if n < len(_NUMBERS) else _numbers(n, 1)[0]
            stamped = b"".join((line, self._id_head, number, lines.sep))
            self.count = n
        else:
            stamped = self._run(split, lines)
            if stamped is None:
                return None
        self.segments.append(stamped)
        return stamped

    def _owned(self, whole: bytes, split: list[bytes], lines: Lines) -> bytes | None:
        """``_plain``'s events with ids of the agent's own, their lines split: ``whole``
        as it came, or None. Their ids are read when asked (``_index``)."""
        # Each block an id line and a data line, then a blank line: every third piece
        # empty, the last too.
        if len(split) % 3 != 1 or split[-1] or any(split[2::3]) or _NUL in whole:
            return None
        if lines is not LF and not whole.count(b"\r") == whole.count(b"\n") == len(split) - 1:
            return None  # a CR or LF but in the CRLFs
        ids, datas = split[0:-1:3], split[1::3]
        if min(ids) < SPACED_ID or max(ids) >= NOT_ID or min(datas) < DATA or max(datas) >= NOT_DATA:
            return None
        if b" " + lines.nl in whole or b"\t" + lines.nl in whole:  # an id with spaces after it, perhaps
            return None
        self.count += len(datas)
        return whole

    def _run(self, split: list[bytes], lines: Lines) -> bytes | None:
        """``_plain``'s several events, their lines split: stamped, or None."""
        datas = split[::2]
        # Each block one line, then a blank line: every other piece empty, the last too.
        if not len(split) % 2 or datas.pop() or any(split[1::2]):
            return None
        if lines is not LF:  # no CR or LF but in the CRLFs
            joined = b"".join(datas)
            if _CR in joined or _LF in joined:
                return None
        if min(datas) < DATA or max(datas) >= NOT_DATA:  # each a data line
            return None
        k = len(datas)
        parts = [self._id_head] * (4 * k)  # data line, id line to its number, number, blank line
        parts[::4] = datas
        parts[2::4] = _numbers(self.count + 1, k)
        parts[3::4] = repeat(lines.sep, k)
        self.count += k
        return b"".join(parts)

    def _take_first(self, raw: bytes) -> bool:
        """A rejoined response's first event, given to ``first``: whether it is sent on."""
        first, self._first = self._first, None
        assert first is not None
        return first(SSEDecoder(start=False).feed(raw)[0])

    def _idle(self, nl: bytes) -> None:
        """Whole comment lines before any field of a block (keep-alives) go out at once."""
        (pending,) = self._pending
        cut = pending.rfind(nl) + len(nl)
        if cut >= len(nl) and all(line[:1] == b":" for line in pending[:cut].split(nl)[:-1]):
            self._pending = [pending[cut:]] if cut < len(pending) else []
            self._out(pending[:cut])

    def _decoded(self, data: bytes) -> None:
        """The full decoder's way, for a response whose line ends are mixed."""
        decoder = self._decoder
        assert decoder is not None
        parts: list[bytes] = []
        at = self.size
        for event in decoder.feed(data):
            raw, own = event.raw, sendable(event.id)
            if self._first is not None:
                if parts:
                    self._out(b"".join(parts))
                    parts = []
                sent_on = self._take_first(raw)
                at = self.size
                if not sent_on:
                    continue
            if own is None:
                raw = with_id(raw, self._next_id())
            parts.append(raw)
            at += len(raw)
            self._event(at, own)
        idle = decoder.take_idle()
        if idle:  # a keep-alive goes out at once, as without --resume
            parts.append(idle)
        if parts:
            self._out(b"".join(parts))

    def _event(self, end: int, own: str | None = None) -> None:
        """One more event, ending at ``end``: with the agent's id ``own``, or the recorder's."""
        ends = self.ends  # after the events before it
        self.count += 1
        if own is not None:
            self._own[self.count] = own
            self._given(own, end)
        ends.append(end)

    def _out(self, segment: bytes) -> None:
        """A segment whose events (if any) the caller notes in ``ends``."""
        if self._indexed < len(self.segments):
            self._index()
        self._starts.append(self.size)  # (measured first)
        self._size += len(segment)
        self.segments.append(segment)
        self._measured = self._indexed = len(self.segments)


def _numbers(first: int, k: int) -> list[bytes]:
    """The numbers ``first`` to ``first + k - 1``, as bytes."""
    last = first + k
    if last > len(_NUMBERS) and len(_NUMBERS) < NUMBERS_KEPT:
        more = min(max(last, 2 * len(_NUMBERS), 1024), NUMBERS_KEPT)
        _NUMBERS.extend(map(b"%d".__mod__, range(len(_NUMBERS), more)))
    if last <= len(_NUMBERS):
        return _NUMBERS[first:last]
    return list(map(b"%d".__mod__, range(first, last)))


def _tail(parts: list[bytes], n: int) -> bytes:
    """The last ``n`` bytes of ``parts`` joined (without joining them all)."""
    tail, i = b"", len(parts)
    while len(tail) < n and i:
        i -= 1
        tail = parts[i][-(n - len(tail)) :] + tail
    return tail


def _has_data(block: bytes, lines: Lines) -> bool:
    """Whether a line of the block is a data field (``data``, or ``data:`` and a value)."""
    if block.startswith(b"data:"):
        return True
    if not block.startswith(b"data") and lines.data_line not in block:
        return False
    return any(line == b"data" or line.startswith(b"data:") for line in block.split(lines.nl))


def _quick_own(block: bytes, nl: bytes) -> str:
    """The agent's id of a block the quick ways took that begins with an id line."""
    return block[4 : block.find(nl)].decode("utf-8", "replace")


def _own_id(block: bytes, nl: bytes) -> str | None:
    """The id a block's id lines give it (the last without NUL), as ``SSEDecoder`` reads it;
    None where a client could not send it back in ``Last-Event-ID``: empty (a client takes
    it as a reset, and reconnects without one), or with spaces or tabs around it (which
    HTTP strips from a header's value). Such an event gets the recorder's id, as one with
    none does."""
    found = None
    for line in block.split(nl):
        if line == b"id" or line.startswith(b"id:"):
            value = line[4:] if line[3:4] == b" " else line[3:]
            if b"\x00" not in value:
                found = sendable(value.decode("utf-8", "replace"))
    return found


def sendable(event_id: str | None) -> str | None:
    """An agent's id, where a client can send it back in ``Last-Event-ID`` (None: not)."""
    return event_id if event_id and event_id == event_id.strip(" \t") else None


def with_id(raw: bytes, event_id: str) -> bytes:
    """The event's bytes with an id line last in its block, before the blank line, ended
    as the line before it is (a block may end in any of CR, LF and CRLF, mixed)."""
    blank = line_end(raw)
    before = line_end(raw[: -len(blank)]) if blank else b""
    if not blank or not before:
        return raw  # not a whole event: it cannot be given an id
    return raw[: -len(blank)] + f"id: {event_id}".encode() + before + blank


def line_end(raw: bytes) -> bytes:
    """The line end ``raw`` ends with (b"" if none)."""
    if raw.endswith(b"\r\n"):
        return b"\r\n"
    return raw[-1:] if raw[-1:] in (b"\r", b"\n") else b""
