"""The ids a resuming recorder gives a held stream's events (``proxy/stamper.py``), checked
against the full SSE decoder on thousands of random streams cut into random chunks: the
same bytes, the same ids, the same event ends, whatever the line ends."""

from __future__ import annotations

import asyncio
import random
import re
from itertools import pairwise

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tasktape.eventlog import SSEDecoder
from tasktape.proxy import stamper as stamper_module
from tasktape.proxy.live import LiveStream
from tasktape.proxy.stamper import Stamper, with_id

PREFIX = "tg7."
ENDS = {"lf": [b"\n"], "crlf": [b"\r\n"], "cr": [b"\r"], "mixed": [b"\n", b"\r\n", b"\r"]}


def random_stream(rng: random.Random, ends: list[bytes]) -> bytes:
    """A stream of events, comments, keep-alives and priming events, in the given line ends."""
    out = [b"\xef\xbb\xbf"] if rng.random() < 0.05 else []
    if rng.random() < 0.3:  # as agents write: every event alike, with an id line or not
        nl, ids = rng.choice(ends), rng.random() < 0.5
        for n in range(rng.randint(1, 30)):
            out.append((b"id: %d" % n + nl if ids else b"") + b"data: {%d}" % n + nl + nl)
        return b"".join(out)
    for _ in range(rng.randint(0, 30)):
        lines: list[bytes] = []
        shape = rng.random()
        if shape < 0.1:
            lines = [b": keep-alive"]
        elif shape < 0.15:
            lines = [b"id: prime" + str(rng.randint(0, 9)).encode()]  # a priming event, no data
        else:
            if rng.random() < 0.4:
                own = [b"id: a", b"id:b", b"id", b"id: c\x00d", b"id: " + str(rng.random()).encode()]
                lines.append(rng.choice(own))
            if rng.random() < 0.2:
                lines.append(b"event: artifactUpdate")
            if rng.random() < 0.1:
                lines.append(b": a comment")
            for _ in range(rng.choice([1, 1, 1, 2, 3])):
                value = rng.choice([b"", b"x", b'{"n": 1}', b"\xc3\xa9"])
                lines.append(rng.choice([b"data: ", b"data:", b"data"]) + value)
            if rng.random() < 0.3:
                rng.shuffle(lines)
            if rng.random() < 0.05:
                lines.append(b"retry: 100")
        blank = rng.choice(ends)
        out.append(b"".join(line + rng.choice(ends) for line in lines) + blank)
        if rng.random() < 0.1:
            out.append(rng.choice(ends))  # a run of blank lines
    if rng.random() < 0.2:
        out.append(b"data: cut off" + rng.choice([b"", rng.choice(ends)]))
    return b"".join(out)


def chunks(rng: random.Random, raw: bytes) -> list[bytes]:
    """``raw`` cut at random points (CRLFs split among them), or by event, as agents write."""
    if rng.random() < 0.3:
        return [raw[i : i + 1] for i in range(len(raw))] if len(raw) < 200 else [raw]
    if rng.random() < 0.3:  # at block ends, a few blocks a chunk
        blocks = re.findall(rb".*?(?:\r\n\r\n|\n\n|\r\r|$)", raw, re.DOTALL)
        inner = sorted(rng.sample(range(1, len(blocks)), min(len(blocks) - 1, rng.randint(0, 6))))
        return [b"".join(blocks[a:b]) for a, b in pairwise([0, *inner, len(blocks)])]
    many = min(len(raw) - 1, rng.randint(0, 12))
    cuts = sorted(rng.sample(range(1, len(raw)), many)) if many > 0 else []
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]


def expected(raw: bytes) -> tuple[bytes, list[str], list[int]]:
    """What clients are sent, each event's id and where it ends, by the full decoder."""
    decoder = SSEDecoder()
    out, ids, ends = [], [], []
    at = 0
    for n, event in enumerate(decoder.feed(raw), 1):
        # An agent's id a client can send back is kept; none, an empty one (a reset) or one
        # HTTP would strip of its spaces gets the recorder's.
        kept = event.id is not None and event.id != "" and event.id == event.id.strip(" \t")
        event_id = event.id if kept else f"{PREFIX}{n}"
        stamped = event.raw if kept else with_id(event.raw, event_id)
        out.append(stamped)
        at += len(stamped)
        ids.append(event_id)
        ends.append(at)
    out += [e.raw for e in decoder.close()]
    return b"".join(out), ids, ends


@pytest.mark.parametrize("ends", sorted(ENDS))
def test_the_stamper_agrees_with_the_decoder(ends: str) -> None:
    rng = random.Random(f"stamper-{ends}")
    for case in range(1500):
        raw = random_stream(rng, ENDS[ends])
        assert_as_decoded(chunks(rng, raw), f"case {case}")


def assert_as_decoded(pieces: list[bytes], case: str = "") -> Stamper:
    """The stamper fed ``pieces`` sends what the full decoder reads in them, with the same
    ids, each event ending where the decoder ends it."""
    raw = b"".join(pieces)
    stamper = Stamper(PREFIX)
    returned = b"".join(stamper.feed(piece) for piece in pieces)
    assert returned == b"".join(stamper.segments)
    # The first and last ids, read before the stream is indexed (as a stream let go is
    # named, and a rejoin asks), are the ones the index reads.
    fed = stamper.count  # (closing may end one more)
    edges = [stamper.id_of(1), stamper.id_of(fed), stamper.last_own()] if fed else []
    stamper.close()
    out, ids, event_ends = expected(raw)
    got = b"".join(stamper.segments)
    context = f"{case}: {raw!r} in {pieces!r}"
    assert got == out, context
    # The full decoder ends an event at a CR that ends its blank line, when the LF of
    # that CRLF has not come yet: the LF is then the next piece's first byte.
    at_lf = [end + (got[end - 1 : end + 1] == b"\r\n") for end in stamper.ends]
    assert (stamper.ids(), at_lf) == (ids, event_ends), context
    if fed:
        assert edges == [ids[0], ids[fed - 1], stamper.own.get(fed)], context
    assert stamper.starts == [sum(map(len, stamper.segments[:i])) for i in range(len(stamper.segments))]
    for event_id, end in zip(ids, event_ends, strict=True):
        found = stamper.position(event_id)
        assert found is not None and found <= end, context  # the first event of that id
        assert got[found - 1 : found] in (b"\n", b"\r"), context  # at a line's end
    for end in stamper.positions.values():  # priming events' too
        assert got[end - 1 : end] in (b"\n", b"\r"), context
    return stamper


@pytest.mark.parametrize(
    ("pieces", "decoded"),
    [
        # Whole events, then a line that a CR ends in an LF stream: read from there by the
        # full decoder, which finds the id line after it.
        ([b"data: a\n\n", b"data: b\n\ndata: c\r", b"id: own\n\n"], True),
        ([b"data: a\r\n\r\n", b"data: b\r\n\r\ndata: c\n", b"id: own\r\n\r\n"], True),
        # CRLFs cut after their CR, whole events between them: no need of the full decoder.
        ([b"data: a\r\n\r\ndata: b\r", b"\n\r\ndata: c\r\n\r\ndata: d\r\nid: own\r", b"\n\r\n"], False),
    ],
)
def test_whole_events_then_other_line_ends_are_read_as_the_decoder_reads_them(
    pieces: list[bytes], decoded: bool
) -> None:
    stamper = assert_as_decoded(pieces)
    assert (stamper._decoder is not None) == decoded


@pytest.mark.parametrize("nl", [b"\n", b"\r\n"])
@pytest.mark.parametrize(
    "run",
    [
        b"id: a\ndata: x\n\nid: b\ndata: y\n\n",  # each an id line and a data line: as it came
        b"id: a\ndata: x\n\nid:b\ndata: y\n\n",  # an id line without its space
        b"id: a\ndata: x\nevent: e\nid: b\ndata: y\n\n",  # one block of five lines
        b"id: a\ndata: x\n\ndata: y\n\nid: c\ndata: z\n\n",  # an event without an id among them
        b"id: a\ndata: x\n\nid: b\0\ndata: y\n\n",  # an id with a NUL is ignored
        b"id: a\ndata: x\n\nid: b\ndata: y\r\n\n",  # a CR in a line
        b"id: a\ndata: x\n\nid: b\nevent: y\n\n",  # no data line
    ],
)
def test_a_run_of_events_with_the_agents_ids_is_read_as_the_decoder_reads_it(run: bytes, nl: bytes) -> None:
    assert_as_decoded([b"data: a" + nl + nl, run.replace(b"\n", nl)])


# The pieces of a chunk that may or may not be one event of one data line, with or without
# an id line before it: what the stamper's quick path has to tell apart.
PIECES = [b"\r", b"\n", b"\r\n", b"data:", b"data: x", b"data", b"id: 7", b"id:", b"x", b"\0", b":"]


@given(
    st.sampled_from([b"\n", b"\r\n"]),
    st.lists(st.sampled_from(PIECES), max_size=9),
    st.sampled_from([b"", b"\n", b"\n\n", b"\r\n", b"\r\n\r\n"]),
)
@example(b"\n", [b"data: x", b"\n"], b"\n")  # one event, no id
@example(b"\r\n", [b"id: 7", b"\r\n", b"data: x", b"\r\n"], b"\r\n")  # one event with an id
@example(b"\n", [b"data: x", b"\r"], b"\n\n")  # a CR ends a line in an LF stream too
@example(b"\r\n", [b"id: 7", b"\n", b"data: x"], b"\r\n\r\n")  # an LF alone in a CRLF stream
@example(b"\r\n", [b"id: 7", b"\r", b"\n", b"data: x"], b"\r\n\r\n")  # a CR, then an LF
@example(b"\n", [b"id: 7", b"\0", b"\n", b"data: x"], b"\n\n")  # an id with a NUL is ignored
@example(b"\n", [b"id: 7", b"\n"], b"\n")  # an id alone (a priming event)
@example(b"\n", [b"id: 7", b"\n", b"data: x", b"\n", b"data: x"], b"\n\n")  # two data lines
@example(b"\r\n", [b"data: x", b"\n"], b"\r\n\r\n")  # an LF alone: a blank line before the id
@example(b"\n", [b"id: 7", b"\n", b"data: x", b"\r", b"\r", b"\n"], b"\n")  # the event ends sooner
@example(b"\n", [b"id: 7", b"\n", b"data: x", b"\n", b"\n", b"data: x"], b"\n\n")  # two events
@example(b"\n", [b"data: x", b"\n", b"x", b"\n"], b"")  # a line after the data line: not one event yet
@example(b"\r\n", [b"id: 7", b"\r\n", b"data: x", b"\n"], b"\r\n\r\n")  # an LF alone after the id
@example(b"\r\n", [b"id: 7", b"\r", b"x", b"data: x"], b"\r\n\r\n")  # a CR alone: no data line
def test_a_chunk_that_may_be_one_event_is_stamped_as_the_decoder_reads_it(
    nl: bytes, pieces: list[bytes], end: bytes
) -> None:
    # The first event tells the stamper how the stream ends its lines: the chunk after it
    # is what may be stamped without being split into lines (or may not, and is split).
    first = b"data: a" + nl + nl
    chunk = b"".join(pieces) + end
    stamper = Stamper(PREFIX)
    fed = [stamper.feed(piece) for piece in (first, chunk, first)]
    stamper.close()
    raw = first + chunk + first
    out, ids, event_ends = expected(raw)
    got = b"".join(stamper.segments)
    assert got.startswith(b"".join(fed))  # and close() sent on what was cut off
    assert got == out, raw
    assert stamper.ids() == ids, raw
    for event_id, end_at in zip(ids, event_ends, strict=True):
        found = stamper.position(event_id)
        assert found is not None and found <= end_at, raw


def test_an_agent_chunk_whose_events_have_ids_goes_out_as_it_came() -> None:
    for nl in (b"\n", b"\r\n"):
        stamper = Stamper(PREFIX)
        for lf in (b"id: 1\ndata: a\n\n", b"id: 2\ndata: b\n\nid: 3\ndata: c\n\n", b"id: 4\ndata: d\n\n"):
            chunk = lf.replace(b"\n", nl)
            assert stamper.feed(chunk) is chunk
        assert stamper.ids() == ["1", "2", "3", "4"]


def test_the_agents_ids_are_read_when_asked_the_first_and_last_where_they_are() -> None:
    stamper = Stamper(PREFIX)
    stamper.feed(b": ping\n\n")  # a segment without events, before the quick ways'
    for n in range(1, 8):
        stamper.feed(b"".join(b"id: e%d\ndata: x\n\n" % k for k in range(n * (n - 1) // 2, n * (n + 1) // 2)))
    stamper.feed(b"data: y\n\n")
    assert (stamper.id_of(1), stamper.id_of(29), stamper.last_own()) == ("e0", "tg7.29", None)
    assert stamper.own == {n: f"e{n - 1}" for n in range(1, 29)}
    assert stamper.position("e27") == stamper.ends[27] and stamper.position("tg7.29") == stamper.size


def test_a_chunk_of_events_without_ids_gets_the_recorders_in_order() -> None:
    stamper = Stamper(PREFIX)
    assert stamper.feed(b"data: a\r\n\r\ndata: b\r\n\r\ndata: c\r\n\r") == (
        b"data: a\r\nid: tg7.1\r\n\r\ndata: b\r\nid: tg7.2\r\n\r\n"
    )
    assert stamper.feed(b"\n") == b"data: c\r\nid: tg7.3\r\n\r\n"
    # LFs in a CRLF stream: the full decoder takes over, and ends the id line as the line before.
    assert stamper.feed(b"data: d\r\n\n") == b"data: d\r\nid: tg7.4\r\n\n"
    assert stamper.feed(b"data: cut off") == b""
    stamper.close()
    assert stamper.ids() == ["tg7.1", "tg7.2", "tg7.3", "tg7.4"]
    assert stamper.segments[-1] == b"data: cut off"  # a tail cut off goes as it came


def test_ids_past_the_numbers_kept_are_made_as_they_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stamper_module, "_NUMBERS", [])
    monkeypatch.setattr(stamper_module, "NUMBERS_KEPT", 4)
    stamper = Stamper(PREFIX)
    out = [stamper.feed(b"data: %d\n\n" % n) for n in range(1, 7)]
    out.append(stamper.feed(b"".join(b"data: %d\n\n" % n for n in range(7, 12))))
    assert b"".join(out) == b"".join(b"data: %d\nid: tg7.%d\n\n" % (n, n) for n in range(1, 12))
    assert stamper_module._NUMBERS == [b"0", b"1", b"2", b"3"]


def test_a_keep_alive_goes_out_before_its_block_is_whole() -> None:
    stamper = Stamper(PREFIX)
    assert stamper.feed(b": ping\n") == b": ping\n"
    assert stamper.feed(b"data: a\n") == b""
    assert stamper.feed(b"\n") == b"data: a\nid: tg7.1\n\n"
    # After whole events in the same chunk, as before them.
    assert (
        stamper.feed(b"data: b\n\ndata: c\n\n: ping\n")
        == b"data: b\nid: tg7.2\n\ndata: c\nid: tg7.3\n\n: ping\n"
    )


def test_a_rejoined_streams_first_event_is_given_to_its_catch_up() -> None:
    stamper = Stamper(PREFIX)
    stamper.feed(b"data: a\n\ndata: cut")
    seen = []

    def first(event: object) -> bool:
        seen.append(event)
        stamper.made("made up", b"\n")
        return False  # the snapshot itself is not sent on

    stamper.restart(first)
    assert stamper.feed(b": hi\n\ndata: snapshot\n\ndata: b\n\n") == (
        b": hi\n\ndata: made up\nid: tg7.2\n\ndata: b\nid: tg7.3\n\n"
    )
    assert [e.data for e in seen] == ["snapshot"]  # type: ignore[attr-defined]
    assert stamper.ids() == ["tg7.1", "tg7.2", "tg7.3"]
    # Whole events, each one data line, as the quick ways take them; then a rejoin whose
    # response ends its lines otherwise: the first event still goes to the catch-up, and the
    # events before it end where they did.
    assert stamper.feed(b"data: d\n\ndata: e\n\n") == b"data: d\nid: tg7.4\n\ndata: e\nid: tg7.5\n\n"
    stamper.restart(first)
    assert stamper.feed(b"data: again\r\n\r\ndata: f\r\n\r\n") == (
        b"data: made up\nid: tg7.6\n\ndata: f\r\nid: tg7.7\r\n\r\n"
    )
    assert [e.data for e in seen] == ["snapshot", "again"]  # type: ignore[attr-defined]
    whole = b"".join(stamper.segments)
    assert [whole[:end].rsplit(b"id: ", 1)[1] for end in stamper.ends] == [
        *(b"tg7.%d\n\n" % n for n in range(1, 7)),
        b"tg7.7\r\n\r\n",
    ]


async def test_a_follower_gets_the_bytes_after_any_event_then_the_live_tail() -> None:
    stream = LiveStream(7, "POST /message:stream", None, [], "k")
    stream.feed(b"data: a\n\ndata: b\n\n")
    stream.feed(b"id: x\ndata: c\n\n")
    whole = stream.since(0)
    assert stream.ids() == ["tg7-k.1", "tg7-k.2", "x"]
    assert stream.last_id() == "x" and stream.last_data() == "c"
    for event_id in stream.ids()[:-1]:  # (after the last, a follower waits for more)
        position = stream.position(event_id)
        assert position is not None
        follower = stream.follow(position)
        assert b"".join(await anext(follower)) == whole[position:]
        pieces = stream.events_in(whole[position:], position)
        assert b"".join(pieces) == whole[position:] and len(pieces) == stream.events_after(position)
        await follower.aclose()

    async def tail() -> bytes:
        return b"".join([b"".join(batch) async for batch in stream.follow(stream.size)])

    following = asyncio.create_task(tail())
    await asyncio.sleep(0)
    stream.feed(b"data: d\n\n")
    stream.end("complete")
    assert await following == b"data: d\nid: tg7-k.4\n\n"
    assert stream.sent_data() == ["a", "b", "c", "d"]
