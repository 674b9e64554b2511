"""The incremental SSE decoder against the W3C EventSource rules and any chunking."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tasktape.errors import DecoderClosed, UsageError
from tasktape.eventlog import SSEDecoder, SSEEvent
from tasktape.eventlog.sse import written

WIRE = Path(__file__).resolve().parent / "data" / "wire"


def reference(stream: bytes) -> tuple[list[tuple], list[int]]:
    """A deliberately plain reading of the W3C rules over the whole input at once.

    Returns the dispatched events as (data, event, id, retry, last_event_id) and
    the byte offsets just after each dispatching blank line."""
    body_start = 3 if stream.startswith(b"\xef\xbb\xbf") else 0
    events, ends = [], []
    data: list[str] = []
    event = ident = retry = None
    last_id = ""
    pos = body_start
    for m in re.finditer(rb"\r\n|\r|\n", stream[body_start:]):
        line = stream[pos : body_start + m.start()].decode("utf-8", "replace")
        pos = body_start + m.end()
        if line == "":
            if data:
                events.append(("\n".join(data), event, ident, retry, last_id))
                ends.append(pos)
            data, event, ident, retry = [], None, None, None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id" and "\x00" not in value:
            ident = last_id = value
        elif name == "retry" and value and all(c in "0123456789" for c in value):
            retry = int(value)
    return events, ends


def decode(chunks: list[bytes]) -> list[SSEEvent]:
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for c in chunks:
        out += dec.feed(c)
    return out + dec.close()


def fed_as_written(dec: SSEDecoder, chunk: bytes) -> list[SSEEvent]:
    """``dec.feed(chunk)``, checking that the chunk is its events as ``written`` writes them
    back whenever the decoder says so."""
    events = dec.feed(chunk)
    if dec.as_written:
        crlf = chunk.endswith(b"\r\n\r\n")
        assert b"".join(written(e.data, e.id, e.event, crlf) for e in events) == chunk
    return events


def fields(e: SSEEvent) -> tuple:
    return (e.data, e.event, e.id, e.retry, e.last_event_id)


def split(stream: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(stream) + 1) for c in cuts})
    bounds = [0, *points, len(stream)]
    return [stream[a:b] for a, b in pairwise(bounds)]


# Fragments that make SSE interesting: every line end, field names with and
# without colon/space, comments, NUL, digits, multi-byte and invalid UTF-8, BOMs.
FRAGMENTS = [
    b"data",
    b"data:",
    b"data: ",
    b"id",
    b"id:",
    b"id: ",
    b"event:",
    b"event: ",
    b"retry:",
    b"retry: ",
    b":",
    b": ping",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b" ",
    b"x",
    b'{"task":1}',
    b"0",
    b"42",
    b"\x00",
    "é".encode(),
    "€".encode(),
    "𝄞".encode(),
    b"\xe2\x82",
    b"\xff",
    b"\x80",
    b"\xef\xbb\xbf",
    b"dat",
    b"a:",
]
streams = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map(b"".join)
cut_lists = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)


@settings(max_examples=600, deadline=None)
@given(stream=streams, cuts=cut_lists)
@example(stream=b"data: a\r\n\r\ndata: b\r\n\r\n", cuts=[10])
@example(stream=b"\xef\xbb\xbfdata: x\n\n", cuts=[1, 2])
@example(stream="data: é\n\n".encode(), cuts=[7])
def test_matches_the_w3c_reference_for_any_chunking(stream: bytes, cuts: list[int]) -> None:
    chunks = split(stream, cuts)
    got = decode(chunks)
    expected, ends = reference(stream)
    complete = [e for e in got if e.complete]
    assert [fields(e) for e in complete] == expected
    assert b"".join(e.raw for e in got) == stream
    assert all(not e.complete for e in got[len(complete) :])
    assert len(got) - len(complete) <= 1
    assert_raw_boundaries(complete, chunks, ends)


def assert_raw_boundaries(complete: list[SSEEvent], chunks: list[bytes], ends: list[int]) -> None:
    """Raw boundaries sit just after each dispatching blank line, except that an LF that
    arrives in the chunk after its CR belongs to the next event."""
    stream = b"".join(chunks)
    boundaries, total = [], 0
    for e in complete:
        total += len(e.raw)
        boundaries.append(total)
    chunk_starts, at = set(), 0
    for c in chunks:
        chunk_starts.add(at)
        at += len(c)
    for b, end in zip(boundaries, ends, strict=True):
        assert b == end or (b == end - 1 and stream[b : b + 1] == b"\n" and b in chunk_starts)


@settings(max_examples=300, deadline=None)
@given(stream=streams, cuts=cut_lists)
def test_one_byte_chunks_equal_one_chunk(stream: bytes, cuts: list[int]) -> None:
    whole = [e for e in decode([stream]) if e.complete]
    bytewise = [e for e in decode([bytes([b]) for b in stream]) if e.complete]
    assert [fields(e) for e in bytewise] == [fields(e) for e in whole]


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.binary(max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b)))
def test_decoding_line_by_line_equals_decoding_the_whole_stream(lines: list[bytes]) -> None:
    # The decoder decodes UTF-8 per line; this holds because CR and LF always end
    # an invalid UTF-8 sequence, so the replacement characters come out the same.
    assert "\n".join(x.decode("utf-8", "replace") for x in lines) == b"\n".join(lines).decode(
        "utf-8", "replace"
    )


def test_fields_of_one_block() -> None:
    (e,) = decode([b"event: update\nid: 7\nretry: 1500\ndata: a\ndata:b\ndata\n\n"])
    assert (e.data, e.event, e.id, e.retry, e.last_event_id) == ("a\nb\n", "update", "7", 1500, "7")
    assert e.complete and e.raw.endswith(b"data\n\n")


def test_id_and_last_event_id() -> None:
    a, b, c = decode([b"id: 1\ndata: a\n\nid\n\ndata: b\n\nid: x\x00y\ndata: c\n\n"])
    assert (a.id, a.last_event_id) == ("1", "1")
    # An id-only block resets the last event id (here to "") without dispatching.
    assert (b.id, b.last_event_id) == (None, "")
    # An id containing NUL is ignored.
    assert (c.id, c.last_event_id) == (None, "")
    (d,) = decode([b"id:\ndata: x\n\n"])
    assert (d.id, d.last_event_id) == ("", "")


def test_retry_needs_ascii_digits() -> None:
    events = decode([b"retry: 12a\ndata: a\n\nretry: -1\ndata: b\n\nretry:\ndata: c\n\n"])
    assert [e.retry for e in events] == [None, None, None]
    big = decode([b"retry: " + b"9" * 5000 + b"\ndata: x\n\nretry: 000" + b"0" * 5000 + b"5\ndata: y\n\n"])
    assert [e.retry for e in big] == [None, 5]


def test_blank_line_without_data_dispatches_nothing() -> None:
    events = decode([b": keep-alive\n\nevent: x\n\ndata: y\n\n"])
    assert len(events) == 1
    assert events[0].event is None  # the event type was reset by the empty block
    assert events[0].raw == b": keep-alive\n\nevent: x\n\ndata: y\n\n"


def test_leading_bom_dropped_once() -> None:
    (e,) = decode([b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\ndata: y\n\n"])
    # The second BOM is part of the field name, which is then unknown.
    assert e.data == "y"
    (f,) = decode([b"\xef", b"\xbb", b"\xbf", b"data: x\n\n"])
    assert f.data == "x" and f.raw == b"\xef\xbb\xbfdata: x\n\n"


def test_cr_at_chunk_end_dispatches_at_once() -> None:
    dec = SSEDecoder()
    (e,) = dec.feed(b"data: x\r\n\r")
    assert e.raw == b"data: x\r\n\r"
    assert dec.feed(b"\ndata: y\r") == []
    (f,) = dec.feed(b"\r")
    assert f.raw == b"\ndata: y\r\r" and f.data == "y"
    assert dec.close() == []


def test_close_returns_the_unterminated_tail() -> None:
    dec = SSEDecoder()
    assert dec.feed(b'data: one\n\nid: 9\ndata: {"par') == [
        SSEEvent("one", None, None, None, "", b"data: one\n\n")
    ]
    (tail,) = dec.close()
    assert tail == SSEEvent('{"par', None, "9", None, "9", b'id: 9\ndata: {"par', complete=False)
    assert SSEDecoder().close() == []
    with pytest.raises(DecoderClosed):
        dec.feed(b"more")
    assert dec.close() == []


@pytest.mark.parametrize(
    ("before", "after", "data"),
    [
        (b"", b"\xef\xbb\xbfdata: b\n\n", ["b"]),
        (b"data: a", b"\n\n", ["a"]),
        (b"data: a\n\n", b"data: b\n\n", ["a", "b"]),
    ],
    ids=["at the start", "in an event", "between events"],
)
def test_text_fed_is_refused_and_leaves_the_stream_as_it_was(
    before: bytes, after: bytes, data: list[str]
) -> None:
    """A str raised TypeError (string argument without an encoding), and, at the start,
    left the decoder past the byte-order mark it would have dropped."""
    dec = SSEDecoder()
    events = dec.feed(before)
    said = "SSEDecoder.feed takes bytes, as received, not str: feed(text.encode())"
    with pytest.raises(UsageError, match=re.escape(said)):
        dec.feed("data: b\n\n")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"SSEDecoder.feed takes bytes, as received, not int$"):
        dec.feed(5)  # type: ignore[arg-type]
    events += dec.feed(after)
    assert [e.data for e in events] == data


def test_replacement_of_invalid_utf8() -> None:
    (e,) = decode([b"data: \xff\xe2\x82 ok\n\n"])
    assert e.data == "\ufffd\ufffd ok"


def test_huge_event_in_small_chunks_is_linear() -> None:
    line = b"data: " + b"x" * 4096 + b"\n"
    stream = line * 4096 + b"\n"  # a 16 MiB event of 4096 lines
    dec = SSEDecoder()
    out: list[SSEEvent] = []
    for i in range(0, len(stream), 1000):
        out += dec.feed(stream[i : i + 1000])
    (e,) = out
    assert len(e.data) == 4096 * 4096 + 4095 and e.raw == stream


@pytest.mark.parametrize("name", ["rest_message_stream.sse", "jsonrpc_SendStreamingMessage.sse"])
def test_official_sdk_wire_bytes(name: str) -> None:
    stream = (WIRE / name).read_bytes()
    events = decode([stream[i : i + 7] for i in range(0, len(stream), 7)])
    assert len(events) == 8 and all(e.complete for e in events)
    assert b"".join(e.raw for e in events) == stream
    assert all(e.id is None and e.event is None for e in events)
    assert events[0].data.startswith(('{"task"', '{"result": {"task"'))


@settings(max_examples=400, deadline=None)
@given(stream=streams, cuts=cut_lists)
def test_without_raw_the_same_events(stream: bytes, cuts: list[int]) -> None:
    chunks = split(stream, cuts)
    dec = SSEDecoder(keep_raw=False)
    lean: list[SSEEvent] = []
    for c in chunks:
        lean += dec.feed(c)
    lean += dec.close()
    full = decode(chunks)
    assert [(fields(e), e.complete) for e in lean] == [(fields(e), e.complete) for e in full]
    assert all(e.raw == b"" for e in lean)


def test_without_raw_memory_stays_bounded() -> None:
    dec = SSEDecoder(keep_raw=False)
    for _ in range(100_000):
        dec.feed(b": keep-alive\n\n")
    assert len(dec._buf) == 0
    (tail,) = dec.close()  # the keep-alives since the last event are still reported
    assert not tail.complete and tail.data == ""


# Whole events, and near misses, in the shapes streams send one chunk at a time: a data
# line after an id or event line or not, LF or CRLF, with what the one-event path must
# leave to the line-by-line one (a field without its space, NUL, a lone CR or LF, two
# data lines, a comment, a BOM, a block without data).
LINES = [
    b"data: x",
    b"data:x",
    b"data: ",
    b"data:",
    b'data: {"task":1}',
    "data: é".encode(),
    b"data: \xff",
    b"id: 7",
    b"id: ",
    b"id:7",
    b"id: a\x00b",
    b"event: delta",
    b"event:delta",
    b"event: ",
    b"retry: 5",
    b": ping",
    b"data: a\rb",
    b"data: a\nb",
    b"\xef\xbb\xbfdata: x",
    b"",
]
ENDS = [b"\n", b"\r\n", b"\r"]
blocks = st.builds(
    lambda lines, end, blank: end.join(lines) + end + blank,
    st.lists(st.sampled_from(LINES), min_size=1, max_size=3),
    st.sampled_from(ENDS),
    st.sampled_from(ENDS),
)

# Blocks the whole-events path takes, so that chunks of several of them are common.
plain_blocks = st.builds(
    lambda first, data, end: end.join([*first, data]) + end + end,
    st.sampled_from([[], [b"id: 7"], [b"id: "], [b"event: delta"]]),
    st.sampled_from([b"data: x", b"data:x", b'data: {"task":1}', "data: é".encode()]),
    st.sampled_from([b"\n", b"\r\n"]),
)


@settings(max_examples=1500, deadline=None)
@given(
    events=st.lists(st.one_of(blocks, plain_blocks), max_size=12),
    starts=st.lists(st.booleans(), max_size=12),
    cuts=cut_lists,
    keep_raw=st.booleans(),
)
@example(
    events=[b"data: a\n\n", b"id: 1\ndata: b\n\n", b"event: e\ndata: c\n\n"],
    starts=[],
    cuts=[],
    keep_raw=True,
)
@example(events=[b"data: a\r\n\r\n", b"id: 1\r\ndata: b\r\n\r\n"], starts=[], cuts=[], keep_raw=False)
@example(events=[b"data: a\n\n", b"id: a\x00b\ndata: x\n\n"], starts=[], cuts=[], keep_raw=True)  # NUL: no id
@example(
    events=[b"data: a\n\n", b"id: a\rb\ndata: x\n\n"], starts=[], cuts=[], keep_raw=True
)  # a CR ends a line
@example(
    events=[b"data: a\r\n\r\n", b"id: 1\ndata: b\r\n\r\n"], starts=[], cuts=[], keep_raw=True
)  # LF, CRLF
@example(
    events=[b"data: a\n\n", b"id: a\rbc\ndata: x\r\n\r\n"], starts=[], cuts=[], keep_raw=True
)  # lone CR, LF
@example(
    events=[b"data: a\r\n\r\n", b"id: 1\r\ndata: b\r\n\r\n"], starts=[False, False], cuts=[], keep_raw=True
)
@example(
    events=[b"data: a\n\n", b"data: b\n\n\n"], starts=[False, False], cuts=[], keep_raw=True
)  # a blank line more
@example(
    events=[b"data: a\n\n", b"id: 1\ndata: b\n\n", b"event: c\ndata: d\n\n"],
    starts=[False] * 3,
    cuts=[],
    keep_raw=True,
)
@example(events=[b"id: 1\n\n", b"data: b\n\n"], starts=[False, False], cuts=[5], keep_raw=True)  # no data
# As many CRs as LFs, not all in pairs.
@example(events=[b"data: a\n\n", b"id: 7\nz\r\ndata: a\rb\r\n\r\n"], starts=[], cuts=[], keep_raw=True)
def test_whole_events_in_a_chunk_decode_as_the_whole_stream(
    events: list[bytes], starts: list[bool], cuts: list[int], keep_raw: bool
) -> None:
    # Blocks grouped into chunks (each block starting a chunk of its own unless ``starts``
    # says it goes on the last one), where the whole-events path reads them: against the
    # reference and against the stream fed a byte at a time (so, line by line).
    def read(chunks: list[bytes]) -> list[SSEEvent]:
        dec = SSEDecoder(keep_raw=keep_raw)
        out: list[SSEEvent] = []
        for c in chunks:
            out += fed_as_written(dec, c)
        return out + dec.close()

    chunks: list[bytes] = []
    for i, block in enumerate(events):
        if chunks and i < len(starts) and not starts[i]:
            chunks[-1] += block
        else:
            chunks.append(block)
    stream = b"".join(events)
    # A byte at a time, but a CRLF kept together (split, it leaves an LF for close()).
    cuts = [i for i in range(1, len(stream)) if stream[i - 1 : i + 1] != b"\r\n"]
    bytewise = [stream[i:j] for i, j in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    chunked, whole = read(chunks), read(bytewise if stream else [])
    expected, ends = reference(stream)
    assert [fields(e) for e in chunked if e.complete] == expected
    assert [fields(e) for e in chunked] == [fields(e) for e in whole]
    assert [e.complete for e in chunked] == [e.complete for e in whole]
    if keep_raw:
        assert b"".join(e.raw for e in chunked) == stream
    # Cut anywhere too: whole events after the rest of one, or before the start of one.
    pieces = split(stream, cuts)
    cut = read(pieces)
    assert [fields(e) for e in cut if e.complete] == expected
    if keep_raw:
        assert b"".join(e.raw for e in cut) == stream
        assert_raw_boundaries([e for e in cut if e.complete], pieces, ends)
        assert all(type(e.raw) is bytes for e in chunked)


@pytest.mark.parametrize(
    ("chunk", "said"),
    [
        (b"data: a\n\nid: 1\ndata: b\n\n", True),
        (b"event: c\r\ndata: d\r\n\r\nid: 2\r\ndata: e\r\n\r\n", True),
        (b"data:a\n\ndata: b\n\n", False),  # written back with a space after the colon
        (b"data: a\n\nid: \xff\ndata: b\n\n", False),  # not UTF-8: read with a replacement character
        (b"data: a\n\nevent: \xff\ndata: b\n\n", False),
        ("data: \ufffd\n\ndata: b\n\n".encode(), False),  # as if it were: told by writing it back
    ],
)
def test_a_few_whole_events_say_whether_the_chunk_is_their_written_form(chunk: bytes, said: bool) -> None:
    # Short chunks of several events (the loop, not the alike run) tell the log whether it
    # may write the chunk back from the events' rows rather than keep it.
    dec = SSEDecoder()
    assert len(fed_as_written(dec, chunk)) == 2
    assert dec.as_written is said


# Runs of alike events long enough for the whole-events path to read them all at once,
# and the blocks that make a run anything else.
ALIKE_DATA = [b'data: {"n": %d}', b"data: x", b"data:x%d", "data: é%d".encode(), b"data: \xff%d"]
ALIKE_DATA.append(b"data: a\x00b")
ALIKE_HEADS = [None, b"id: %d", b"id:%d", b"id: a\x00%d", b"id: ", b"event: e%d"]


@settings(max_examples=400, deadline=None)
@given(
    data=st.sampled_from(ALIKE_DATA),
    head=st.sampled_from(ALIKE_HEADS),
    n=st.integers(30, 90),  # (a run of more than _FEW_BYTES)
    odd=st.none() | st.tuples(st.integers(0, 90), st.lists(st.sampled_from(LINES), min_size=1, max_size=5)),
    end=st.sampled_from([b"\n", b"\r\n"]),
    keep_raw=st.booleans(),
    after=st.booleans(),
    cut=st.sampled_from(["none", "head", "tail"]),
)
@example(
    data=b'data: {"n": %d}', head=b"id: %d", n=60, odd=None, end=b"\n", keep_raw=True, after=False, cut="none"
)
@example(
    data=b"data: %d",
    head=None,
    n=90,
    odd=(89, [b"id: 7"]),
    end=b"\r\n",
    keep_raw=False,
    after=True,
    cut="none",
)
@example(
    data=b"data: %d",
    head=b"id: %d",
    n=50,
    odd=(9, [b"id:7", b"data: x"]),
    end=b"\n",
    keep_raw=True,
    after=True,
    cut="none",
)
# One block of five lines, that split by lines looks like two of an id line and a data line.
@example(
    data=b"data: %d",
    head=b"id: %d",
    n=50,
    odd=(9, [b"id: 7", b"data: x", b"data: w", b"id: 8", b"data: q"]),
    end=b"\n",
    keep_raw=False,
    after=False,
    cut="none",
)
@example(
    data=b"data: %d",
    head=None,
    n=50,
    odd=(9, [b": ping"]),
    end=b"\n",
    keep_raw=False,
    after=False,
    cut="none",
)
def test_a_run_of_alike_events_decodes_as_the_whole_stream(
    data: bytes,
    head: bytes | None,
    n: int,
    odd: tuple[int, list[bytes]] | None,
    end: bytes,
    keep_raw: bool,
    after: bool,
    cut: str,
) -> None:
    def filled(template: bytes, k: int) -> bytes:
        return template % k if b"%d" in template else template

    blocks = [end.join([*([filled(head, k)] if head else []), filled(data, k)]) + end + end for k in range(n)]
    if odd is not None:
        blocks.insert(odd[0] % (n + 1), end.join(odd[1]) + end + end)
    chunks = [b"data: a" + end + end] if after else []  # the run after an event, or first
    run, tail = b"".join(blocks), b"data: z" + end + end  # (after the last id of the run)
    if cut == "head":  # the run's chunk begins inside its first event
        chunks += [run[:3], run[3:], tail]
    elif cut == "tail":  # and ends inside the event after it
        chunks += [run + tail[:4], tail[4:]]
    else:
        chunks += [run, tail]
    stream = b"".join(chunks)
    dec = SSEDecoder(keep_raw=keep_raw)
    got = [e for c in chunks for e in fed_as_written(dec, c)] + dec.close()
    expected, ends = reference(stream)
    assert [fields(e) for e in got if e.complete] == expected
    assert len(got) == len(expected) + (len(got) > len(expected))
    if keep_raw:
        assert b"".join(e.raw for e in got) == stream
        assert_raw_boundaries([e for e in got if e.complete], chunks, ends)
