"""The fault catalogue on the wire: each fault against a real client, its effect checked
in bytes (read off the socket, chunked framing and all), in how the connection ends (a
FIN without the body's end, an RST, or a clean end) and in time; scopes (times, every,
p with a seed, path); where faults come from (--fault, the header), and specs refused."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import RecordFactory, Serve
from llm_servers import anthropic_app, openai_app
from test_replay import events_of, message, recorded_demo, stream_exchange
from yarl import URL

from tasktape.errors import FaultError
from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.replay import Faults, ReplayServer, load
from tasktape.replay.faults import Scope

QUESTION = "What does J45.909 mean?"
MS = 1_000_000


@dataclass
class Wire:
    """An answer as it came off the socket."""

    status: int
    headers: dict[str, str]
    body: bytes  # the chunked body, unframed
    ended: bool  # the terminating chunk came: the body ended as HTTP says
    reset: bool  # the connection ended with an RST, not a FIN
    arrivals: list[float]  # seconds after the request, per read

    @property
    def events(self) -> list[Any]:
        return [e for e in events_of(self.body) if e.complete]


async def wire(url: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Wire:
    """One HTTP/1.1 request on a socket of its own, read to its end however it comes."""
    where = URL(url)
    reader, writer = await asyncio.open_connection(where.host, where.port)
    payload = json.dumps(body).encode() if body is not None else b""
    head = [
        f"{'POST' if body is not None else 'GET'} {path} HTTP/1.1",
        f"Host: {where.host}:{where.port}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
    start = time.perf_counter()
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    raw, arrivals, reset = b"", [], False
    try:
        while data := await reader.read(65536):
            raw += data
            arrivals.append(time.perf_counter() - start)
    except ConnectionResetError:
        reset = True
    writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    fields, _, framed = rest.partition(b"\r\n\r\n")
    headers_got = dict(line.decode().split(": ", 1) for line in fields.split(b"\r\n") if line)
    if headers_got.get("Transfer-Encoding") == "chunked":
        content, ended = _unchunked(framed)
    else:
        content, ended = framed, len(framed) == int(headers_got.get("Content-Length", len(framed)))
    return Wire(int(status_line.split()[1]), headers_got, content, ended, reset, arrivals)


def _unchunked(framed: bytes) -> tuple[bytes, bool]:
    out, position = b"", 0
    while True:
        line_end = framed.find(b"\r\n", position)
        if line_end < 0:
            return out, False
        size = int(framed[position:line_end], 16)
        if size == 0:
            return out, framed[line_end + 2 : line_end + 4] == b"\r\n"
        data = framed[line_end + 2 : line_end + 2 + size]
        out += data
        if len(data) < size:
            return out, False
        position = line_end + 2 + size + 2


@pytest.fixture
async def demo(record: RecordFactory, serve: Serve) -> tuple[Path, bytes]:
    """A recorded demo stream: the log, and the stream's recorded bytes."""
    db, (result,) = await recorded_demo(record, serve, (QUESTION, "rest"), pace=0.05)
    return db, stream_exchange(db, result.task_id).body


async def faulty(serve: Serve, db: Path, spec: str, **options: Any) -> Wire:
    url = await serve(ReplayServer(load([db]), speed=0, **options).app)
    return await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": spec})


async def test_a_clean_answer_for_comparison(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    url = await serve(ReplayServer(load([db]), speed=0).app)
    got = await wire(url, "/message:stream", message(QUESTION))
    assert got.body == recorded and got.ended and not got.reset


async def test_drop_after_closes_without_the_body_end(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, "drop-after=3")
    assert got.body == b"".join(e.raw for e in events[:3])
    assert not got.ended and not got.reset  # a FIN, without the terminating chunk
    # A real client sees a broken transfer.
    url = await serve(ReplayServer(load([db]), speed=0, faults=Faults.parse("drop-after=3")).app)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/message:stream", json=message(QUESTION)) as r,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()


async def test_cut_frame_closes_in_the_middle_of_an_event(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, "cut-frame=3")
    two = b"".join(e.raw for e in events[:2])
    assert got.body.startswith(two) and events[2].raw.startswith(got.body[len(two) :])
    assert 0 < len(got.body) - len(two) < len(events[2].raw)
    assert [e.data for e in got.events] == [e.data for e in events[:2]]  # the third never completes
    assert not got.ended and not got.reset


async def test_reset_after_delivers_exactly_n_events_then_an_rst(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, "reset-after=4")
    assert got.reset and not got.ended
    assert got.body == b"".join(e.raw for e in events[:4])
    url = await serve(ReplayServer(load([db]), speed=0).app)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{url}/message:stream", json=message(QUESTION), headers={"X-Tasktape-Fault": "reset-after=4"}
        ) as r,
    ):
        with pytest.raises(aiohttp.ClientError):
            await r.read()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("duplicate=2", lambda e: [e[0], e[1], e[1], *e[2:]]),
        ("skip=2", lambda e: [e[0], *e[2:]]),
        ("swap=2", lambda e: [e[0], e[2], e[1], *e[3:]]),
    ],
)
async def test_event_faults_end_cleanly(
    serve: Serve, demo: tuple[Path, bytes], spec: str, expected: Any
) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, spec)
    assert got.body == b"".join(e.raw for e in expected(events))
    assert got.ended and not got.reset and "Content-Length" not in got.headers


async def test_corrupt_spoils_one_event_s_data(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, "corrupt=3")
    assert [e.id for e in got.events] == [e.id for e in events]
    with pytest.raises(ValueError):
        json.loads(got.events[2].data)
    assert got.events[2].data == events[2].data[:-1] + "\ufffd"
    assert [e.data for i, e in enumerate(got.events) if i != 2] == [
        e.data for i, e in enumerate(events) if i != 2
    ]
    assert got.ended


async def test_stall_and_drip_and_delay_keep_the_bytes_and_take_time(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    db, recorded = demo
    stalled = await faulty(serve, db, "stall=2:300")
    assert stalled.body == recorded and stalled.ended
    gaps = [b - a for a, b in zip(stalled.arrivals, stalled.arrivals[1:], strict=False)]
    assert max(gaps) >= 0.29
    rate = len(recorded) * 2  # the body in about half a second
    dripped = await faulty(serve, db, f"drip={rate}")
    assert dripped.body == recorded and dripped.ended
    assert dripped.arrivals[-1] >= 0.45 and len(dripped.arrivals) > 10
    late = await faulty(serve, db, "delay-headers=250")
    assert late.body == recorded and late.arrivals[0] >= 0.25


async def test_status_and_content_type(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    failed = await faulty(serve, db, "status=503")
    assert failed.status == 503 and "fault injected" in json.loads(failed.body)["error"]["message"]
    typed = await faulty(serve, db, "content-type=text/plain")
    assert typed.headers["Content-Type"] == "text/plain" and typed.body == recorded and typed.ended


async def test_no_final_leaves_out_the_closing_event_of_each_protocol(
    record: RecordFactory, serve: Serve, demo: tuple[Path, bytes]
) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, "no-final")
    assert got.body == b"".join(e.raw for e in events[:-1]) and got.ended
    assert "TASK_STATE_COMPLETED" in events[-1].data
    prompt = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
    for app, path, body, closing in (
        (openai_app(), "/v1/chat/completions", {"model": "gpt-4o-mini", **prompt}, "[DONE]"),
        (
            anthropic_app(),
            "/v1/messages",
            {"model": "claude-sonnet-4-5", "max_tokens": 64, **prompt},
            '"type":"message_stop"',
        ),
    ):
        rec = await record(app)
        async with rec.session.post(f"{rec.url}{path}", json=body) as r:
            original = await r.read()
        (await rec.log()).close()
        url = await serve(ReplayServer(load([rec.db]), speed=0).app)
        got = await wire(url, path, body, {"X-Tasktape-Fault": "no-final"})
        kept = events_of(original)
        assert closing in kept[-1].data.replace(" ", "") or closing in kept[-1].data
        assert got.body == b"".join(e.raw for e in kept[:-1]) and got.ended


async def test_a_fault_the_stream_is_too_short_for_is_reported(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    db, recorded = demo
    server = ReplayServer(load([db]), speed=0)
    url = await serve(server.app)
    got = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": "skip=999"})
    assert got.body == recorded
    (stream,) = server.report()["streams"]
    assert stream["identical"] and stream["faults"] == [
        f"not applied: skip=999 (the stream has {len(events_of(recorded))} events)"
    ]


async def test_an_answer_broken_off_after_its_last_byte_is_not_the_recording(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    # Every byte went out, but not the body's end: the client saw an error, which the
    # recording's client did not.
    db, recorded = demo
    server = ReplayServer(load([db]), speed=0)
    url = await serve(server.app)
    count = len(events_of(recorded))
    got = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": f"drop-after={count}"})
    assert got.body == recorded and not got.ended
    (stream,) = server.report()["streams"]
    assert stream["bytes_sent"] == stream["bytes_recorded"] and not stream["finished"]
    assert not stream["identical"] and stream["reasons"] == [f"fault: drop-after={count}"]


def card_and_stream(tmp_path: Path) -> Path:
    """A cassette with an agent card and a stream (each may be asked for again)."""
    card = Recorded(
        method="GET",
        path="/.well-known/agent-card.json",
        status=200,
        response_headers=[("Content-Type", "application/json")],
        chunks=[(MS, b'{"name": "agent"}')],
        outcome="complete",
    )
    body = b"".join(f'id: {n}\ndata: {{"n": {n}}}\n\n'.encode() for n in range(1, 6))
    stream = Recorded(
        method="GET",
        path="/events",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[
            (n * MS, body[i : i + len(body) // 5]) for n, i in enumerate(range(0, len(body), len(body) // 5))
        ],
        outcome="complete",
    )
    path = tmp_path / "c.jsonl"
    write_cassette(path, [card, stream])
    return path


async def test_scopes_times_every_p_and_path(serve: Serve, tmp_path: Path) -> None:
    cassette = card_and_stream(tmp_path)

    async def run(spec: str, asks: list[str]) -> list[int]:
        """How many events each stream answer had (the card: -1)."""
        server = ReplayServer(load([cassette]), speed=0, allow_repeats=True, faults=Faults.parse(spec))
        url = await serve(server.app)
        counts = []
        for path in asks:
            got = await wire(url, path)
            counts.append(len(got.events) if path == "/events" else -1)
        return counts

    # A card neither gets nor counts for a stream fault.
    card, events = "/.well-known/agent-card.json", "/events"
    assert await run("drop-after=2;times=1", [card, events, card, events]) == [-1, 2, -1, 5]
    assert await run("drop-after=2;every=2", [events] * 5) == [5, 2, 5, 2, 5]
    draws = random.Random(7)
    expected = [2 if draws.random() < 0.5 else 5 for _ in range(8)]
    assert await run("drop-after=2;p=0.5;seed=7", [events] * 8) == expected
    assert await run("drop-after=2;path=/other*", [events] * 2) == [5, 5]
    # status is no stream fault: the card counts for it.
    server = ReplayServer(
        load([cassette]), speed=0, allow_repeats=True, faults=Faults.parse("status=500;times=1")
    )
    url = await serve(server.app)
    assert [(await wire(url, p)).status for p in (card, events)] == [500, 200]


async def test_where_specs_are_refused(serve: Serve, tmp_path: Path) -> None:
    url = await serve(ReplayServer(load([card_and_stream(tmp_path)])).app)
    got = await wire(url, "/events", headers={"X-Tasktape-Fault": "drop-after=1;times=1"})
    assert got.status == 400 and "times and every count requests" in got.body.decode()
    for spec, words in (
        ("drop-after=1;reset-after=2", "both end the connection"),
        ("skip=0", "counts events from 1"),
        ("drip=0", "at least 1 byte per second"),
        ("drip=1e-300", "at least 1 byte per second"),
        ("skip=3;swap=3", "skip and swap both change event 3"),
        ("swap=3;corrupt=4", "swap and corrupt both change event 4"),
        ("status=100", "a final status, 200 to 599"),
        ("content-type=text/\x01plain", "no control character"),
        ("p=2;drop-after=1", "probability"),
        ("path=events;drop-after=1", "glob of request paths"),
        ("no-final=maybe", "cannot read"),
        ("no-final=1", "cannot read the fault 'no-final=1': no-final takes no value"),
        ("no-final=", "no-final takes no value"),
    ):
        with pytest.raises(FaultError, match=words):
            Faults.parse(spec)
    assert str(Faults.parse("reset-after=3;times=1;path=/a*")) == "reset-after=3;times=1;path=/a*"
    # content-type takes the rest of the spec, parameters and all.
    typed = Faults.parse("drop-after=2; content-type=text/event-stream; charset=utf-8")
    assert (typed.drop_after, typed.content_type) == (2, "text/event-stream; charset=utf-8")


async def test_faults_built_by_hand_are_checked_as_a_spec_is(serve: Serve, demo: tuple[Path, bytes]) -> None:
    """Faults made in Python, not parsed, are refused where a spec with the same values
    is (they were a 500 on the first request, or a client waiting for ever); a spec given
    as a string is read as one, by the server and by arm()."""
    db, recorded = demo
    recordings = load([db])
    for faults, words in (
        (Faults(drop_after=-5), "drop-after=-5"),
        (Faults(drop_after="x"), "drop-after=x"),  # type: ignore[arg-type]
        (Faults(stall_after=1, stall_ms=float("nan")), "stall=1:nan"),
        (Faults(content_type="a\r\nX: 1"), "no control character"),
        (Faults(status=99), "a final status"),
        (Faults(drop_after=1, cut_frame=2), "both end the connection"),
        (Faults(no_final=1), "True or False"),  # type: ignore[arg-type]
    ):
        with pytest.raises(FaultError, match=words):
            ReplayServer(recordings, faults=faults)
        with pytest.raises(FaultError, match=words):
            ReplayServer(recordings).arm(faults, "test")
    exact = Faults(stall_after=1, stall_ms=12.345678901, scope=Scope(times=2, p=0.123456789))
    assert ReplayServer(recordings, faults=[exact]).armed[0].faults == exact
    events = events_of(recorded)
    server = ReplayServer(load([db]), speed=0, faults="drop-after=3")
    url = await serve(server.app)
    got = await wire(url, "/message:stream", message(QUESTION))
    assert got.body == b"".join(e.raw for e in events[:3]) and not got.ended
    assert server.arm("drop-after=2;times=1", "test").faults == Faults.parse("drop-after=2;times=1")


async def test_a_later_spec_says_how_the_connection_ends(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    events = events_of(recorded)
    server = ReplayServer(load([db]), speed=0, faults=Faults.parse("reset-after=2"))
    url = await serve(server.app)
    got = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": "drop-after=4"})
    assert got.body == b"".join(e.raw for e in events[:4]) and not got.reset
    (stream,) = server.report()["streams"]
    assert stream["faults"] == ["drop-after=4"]


async def test_times_counts_only_answers_that_got_the_fault(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, recorded = demo
    events = events_of(recorded)
    server = ReplayServer(
        load([db]), speed=0, allow_repeats=True, faults=Faults.parse("drop-after=3;times=1")
    )
    url = await serve(server.app)
    refused = await wire(url, "/message:stream", message(QUESTION), {"Last-Event-ID": "evt.never"})
    assert refused.status == 400
    # A resume after the 39th event is too short to drop after the 3rd: the spec waits.
    short = await wire(url, "/message:stream", message(QUESTION), {"Last-Event-ID": events[-2].id})
    assert short.ended and len(short.events) == 1
    assert [(a.seen, a.applied) for a in server.armed] == [(1, 0)]
    dropped = await wire(url, "/message:stream", message(QUESTION))
    assert len(dropped.events) == 3 and not dropped.ended
    assert len((await wire(url, "/message:stream", message(QUESTION))).events) == len(events)


async def test_a_status_fault_takes_no_count_from_the_faults_it_stands_for(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    """An answer a status fault replaced made no drop: "drop once" drops the next stream,
    whether the status came from another armed spec or from the request."""
    db, recorded = demo
    events = events_of(recorded)
    specs = [Faults.parse("drop-after=3;times=1"), Faults.parse("status=503;times=1")]
    server = ReplayServer(load([db]), speed=0, allow_repeats=True, faults=specs)
    url = await serve(server.app)
    assert (await wire(url, "/message:stream", message(QUESTION))).status == 503
    assert [a.applied for a in server.armed] == [0, 1]
    asked = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": "status=500"})
    assert asked.status == 500
    assert [a.applied for a in server.armed] == [0, 1]
    dropped = await wire(url, "/message:stream", message(QUESTION))
    assert dropped.status == 200 and len(dropped.events) == 3 and not dropped.ended
    assert len((await wire(url, "/message:stream", message(QUESTION))).events) == len(events)


async def test_a_status_fault_keeps_its_delay_and_type(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, _ = demo
    got = await faulty(serve, db, "status=503;delay-headers=200;content-type=text/x-error")
    assert got.status == 503 and got.headers["Content-Type"] == "text/x-error" and got.arrivals[0] >= 0.2
    empty = await faulty(serve, db, "status=204")
    assert empty.status == 204 and empty.body == b""


async def test_a_client_gone_before_the_headers_is_told_apart(tmp_path: Path, serve: Serve) -> None:
    late = Recorded(
        method="GET",
        path="/slow",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        ttfb_ns=300 * MS,
        chunks=[(300 * MS, b"data: 1\n\n"), (400 * MS, b"data: 2\n\n")],
        outcome="complete",
    )
    server = ReplayServer([late], speed=1.0)
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.get(f"{url}/slow", timeout=aiohttp.ClientTimeout(total=0.1))
    await asyncio.sleep(0.4)
    (stream,) = server.report()["streams"]
    assert stream["reasons"] == ["client-left: after 0 bytes"] and stream["bytes_sent"] == 0


async def test_a_request_s_fault_wins_over_an_armed_one_on_the_same_event(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    db, recorded = demo
    events = events_of(recorded)
    server = ReplayServer(load([db]), speed=0, allow_repeats=True)
    server.arm(Faults.parse("skip=3;times=1"), "POST /_tasktape/faults")
    url = await serve(server.app)
    swapped = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": "swap=3"})
    assert swapped.body == b"".join(e.raw for e in [*events[:2], events[3], events[2], *events[4:]])
    assert server.report()["streams"][0]["faults"] == ["swap=3"]
    # The armed spec was not made: it keeps its once for the next answer.
    assert [(a.seen, a.applied) for a in server.armed] == [(1, 0)]
    skipped = await wire(url, "/message:stream", message(QUESTION))
    assert skipped.body == b"".join(e.raw for e in [*events[:2], *events[3:]])
    # Two armed specs: the later one says what it names again, event by event.
    later = Faults().merged(Faults.parse("duplicate=4;corrupt=6")).merged(Faults.parse("swap=3"))
    assert (later.duplicate, later.swap, later.corrupt) == (None, 3, 6)


FIRST, SECOND, THIRD = b"id: 1\ndata: a\n\n", b"id: 2\ndata: b\n\n", b"id: 3\ndata: c\n\n"
KEEP_ALIVE = b": ping\n\nretry: 1000\r\n\r\n"  # blocks that dispatch no event
PINGED = FIRST + KEEP_ALIVE + SECOND + THIRD


def with_comments(tmp_path: Path) -> Path:
    """A stream with blocks that dispatch no event before its second: a keep-alive comment
    and a lone retry directive (the decoder counts them as event 2's bytes)."""
    stream = Recorded(
        method="GET",
        path="/events",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(MS, PINGED[:20]), (2 * MS, PINGED[20:])],
        outcome="complete",
    )
    path = tmp_path / "pinged.jsonl"
    write_cassette(path, [stream])
    return path


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("skip=2", FIRST + KEEP_ALIVE + THIRD),
        ("duplicate=2", FIRST + KEEP_ALIVE + SECOND + SECOND + THIRD),
        ("swap=1", SECOND + KEEP_ALIVE + FIRST + THIRD),
        ("swap=2", FIRST + KEEP_ALIVE + THIRD + SECOND),
        ("drop-after=1", FIRST),
        ("cut-frame=2", FIRST + KEEP_ALIVE + SECOND[: len(SECOND) // 2]),
    ],
)
async def test_an_event_s_faults_leave_the_blocks_before_it_alone(
    serve: Serve, tmp_path: Path, spec: str, expected: bytes
) -> None:
    url = await serve(ReplayServer(load([with_comments(tmp_path)]), speed=0).app)
    got = await wire(url, "/events", headers={"X-Tasktape-Fault": spec})
    assert got.body == expected


async def test_a_client_gone_during_a_late_status_fault_left(serve: Serve, demo: tuple[Path, bytes]) -> None:
    db, _ = demo
    server = ReplayServer(load([db]), speed=0)
    url = await serve(server.app)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(asyncio.TimeoutError):
            await session.post(
                f"{url}/message:stream",
                json=message(QUESTION),
                headers={"X-Tasktape-Fault": "status=500;delay-headers=1000"},
                timeout=aiohttp.ClientTimeout(total=0.1),
            )
    await asyncio.sleep(0.2)
    (stream,) = server.report()["streams"]
    assert stream["faults"] == ["status=500", "delay-headers=1000"] and not stream["finished"]
    assert stream["reasons"] == ["fault: status=500, delay-headers=1000", "client-left: after 0 bytes"]


async def test_a_malformed_fault_header_is_refused_and_counted(serve: Serve, tmp_path: Path) -> None:
    server = ReplayServer(load([card_and_stream(tmp_path)]), speed=0)
    url = await serve(server.app)
    got = await wire(url, "/events", headers={"X-Tasktape-Fault": "explode=1"})
    assert got.status == 400 and "unknown fault 'explode'" in got.body.decode()
    (refused,) = server.stats.refused
    assert refused.startswith("GET /events (X-Tasktape-Fault 'explode=1': unknown fault 'explode'; use ")
    assert server.stats.served == 0


@pytest.mark.parametrize("spec", [";", " ; ", ""])
async def test_a_fault_header_naming_no_fault_is_refused(serve: Serve, tmp_path: Path, spec: str) -> None:
    """``X-Tasktape-Fault: $A;$B`` with both unset was served as if the header were not there,
    though the control API refused the same spec: a spec naming no fault is a 400 everywhere."""
    server = ReplayServer(load([card_and_stream(tmp_path)]), speed=0)
    url = await serve(server.app)
    got = await wire(url, "/events", headers={"X-Tasktape-Fault": spec})
    assert got.status == 400 and f"X-Tasktape-Fault: {spec.strip()!r} names no fault" in got.body.decode()
    assert server.stats.served == 0


async def head(
    url: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], float]:
    """A HEAD: its status, its headers, and the seconds they took to come."""
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        async with session.head(f"{url}{path}", headers=headers or {}) as r:
            return r.status, dict(r.headers), time.perf_counter() - start


async def test_a_head_gets_the_faults_on_an_answer_s_head(serve: Serve, tmp_path: Path) -> None:
    """status, delay-headers and content-type apply to any answer: a HEAD answered from a
    recorded GET gets them (from the header or an armed spec), and counts for their scope."""
    server = ReplayServer(load([card_and_stream(tmp_path)]), speed=0)
    url = await serve(server.app)
    card = "/.well-known/agent-card.json"
    assert (await head(url, card, {"X-Tasktape-Fault": "status=503"}))[0] == 503
    status, headers, took = await head(
        url, card, {"X-Tasktape-Fault": "delay-headers=200;content-type=text/foo"}
    )
    assert status == 200 and headers["Content-Type"] == "text/foo" and took >= 0.2
    server.arm(Faults.parse("status=503;times=1"), "test")
    assert [(await head(url, card))[0] for _ in range(2)] == [503, 200]
    assert [(a.seen, a.applied) for a in server.armed] == [(2, 1)]
    streams = server.report()["streams"]
    assert [s["faults"] for s in streams] == [
        ["status=503"],
        ["delay-headers=200", "content-type=text/foo"],
        ["status=503"],
        [],
    ]
    # No body went out to any of them, but only the last got the recording's head.
    assert [s["identical"] for s in streams] == [False, False, False, True]
    # Nor is a body with another Content-Type the recording, nor one only late.
    await wire(url, card, headers={"X-Tasktape-Fault": "content-type=text/plain"})
    await wire(url, card, headers={"X-Tasktape-Fault": "delay-headers=10"})
    assert [s["identical"] for s in server.report()["streams"][-2:]] == [False, True]


async def test_faults_on_a_body_are_not_made_on_a_head_and_said_so(serve: Serve, tmp_path: Path) -> None:
    """A HEAD has no body to drop, drip or edit: those faults are reported not made, and an
    armed spec keeps its count for the GET."""
    server = ReplayServer(load([card_and_stream(tmp_path)]), speed=0, faults="drop-after=2;times=1")
    url = await serve(server.app)
    status, _, _ = await head(url, "/events", {"X-Tasktape-Fault": "drip=100"})
    assert status == 200
    (answer,) = server.report()["streams"]
    assert answer["method"] == "HEAD" and answer["identical"] and answer["bytes_sent"] == 0
    assert answer["faults"] == [
        "not applied: drop-after=2 (a HEAD answer has no body)",
        "not applied: drip=100 (a HEAD answer has no body)",
    ]
    assert [(a.seen, a.applied) for a in server.armed] == [(1, 0)]
    assert len((await wire(url, "/events")).events) == 2
    assert [(a.seen, a.applied) for a in server.armed] == [(2, 1)]


@pytest.mark.parametrize(
    "fault", ["swap={last_but_one}", "duplicate={last}", "corrupt={last}", "skip={last}"]
)
async def test_a_request_s_spec_taking_the_closing_event_twice_is_refused(
    serve: Serve, demo: tuple[Path, bytes], fault: str
) -> None:
    """no-final takes the closing event: a request's spec with another fault on it says
    nothing clear (as skip=3;swap=3 does), and is refused before anything is used up."""
    db, recorded = demo
    events = events_of(recorded)
    last = len(events)
    spec = fault.format(last=last, last_but_one=last - 1) + ";no-final"
    server = ReplayServer(load([db]), speed=0)
    url = await serve(server.app)
    got = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": spec})
    name = fault.partition("=")[0]
    assert got.status == 400 and (
        f"{name} and no-final both change event {last}, the stream's closing one" in got.body.decode()
    )
    assert len(server.stats.refused) == 1 and server.stats.served == 0 and server.report()["streams"] == []
    # The recording was not used up: the same request, without the spec, gets it.
    assert (await wire(url, "/message:stream", message(QUESTION))).body == recorded


async def test_a_spec_whose_path_leaves_the_request_out_is_not_refused(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    """A spec whose own path= does not take the request says nothing of it: it gets its
    recording, however the spec's faults would clash on another stream."""
    db, recorded = demo
    last = len(events_of(recorded))
    server = ReplayServer(load([db]), speed=0)
    url = await serve(server.app)
    spec = f"corrupt={last};no-final;path=/nothing/*"
    got = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": spec})
    assert (got.status, got.body) == (200, recorded) and server.stats.refused == []


async def test_no_final_and_faults_on_other_events_are_all_made(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    db, recorded = demo
    events = events_of(recorded)
    got = await faulty(serve, db, f"swap={len(events) - 2};no-final")
    assert got.body == b"".join(e.raw for e in [*events[:-3], events[-2], events[-3]]) and got.ended


async def test_an_armed_no_final_takes_the_closing_event_from_other_faults(
    serve: Serve, demo: tuple[Path, bytes]
) -> None:
    """An armed spec cannot be refused for what one stream holds: no-final takes the closing
    event, the fault also on it is not made (and said so), and the rest are."""
    db, recorded = demo
    events = events_of(recorded)
    last = len(events)
    server = ReplayServer(load([db]), speed=0, allow_repeats=True, faults=f"corrupt={last};skip=1;no-final")
    url = await serve(server.app)
    got = await wire(url, "/message:stream", message(QUESTION))
    assert got.body == b"".join(e.raw for e in events[1:-1]) and got.ended
    # A request's fault on the closing event meets an armed no-final alike.
    server.reset()
    server.arm("no-final", "test")
    asked = await wire(url, "/message:stream", message(QUESTION), {"X-Tasktape-Fault": f"duplicate={last}"})
    assert asked.body == b"".join(e.raw for e in events[1:-1])
    why = f"(event {last} is the stream's closing event, which no-final leaves out)"
    assert [s["faults"] for s in server.report()["streams"]] == [
        ["no-final", "skip=1", f"not applied: corrupt={last} {why}"],
        ["no-final", "skip=1", f"not applied: duplicate={last} {why}"],
    ]


def framed_stream(tmp_path: Path) -> Path:
    """A stream recorded with its Content-Length: three events."""
    body = FIRST + SECOND + THIRD
    stream = Recorded(
        method="GET",
        path="/events",
        status=200,
        response_headers=[("Content-Type", "text/event-stream"), ("Content-Length", str(len(body)))],
        is_sse=True,
        chunks=[(MS, FIRST), (2 * MS, SECOND), (3 * MS, THIRD)],
        outcome="complete",
    )
    path = tmp_path / "framed.jsonl"
    write_cassette(path, [stream])
    return path


@pytest.mark.parametrize("spec", ["drop-after=2", "cut-frame=2", "reset-after=2", "skip=1;drop-after=1"])
async def test_a_body_a_fault_cuts_keeps_its_length(serve: Serve, tmp_path: Path, spec: str) -> None:
    """A body broken off goes out with the length of the whole body (as recorded, or as
    edited if longer), as a real connection that drops does: the client sees a broken
    transfer, whatever its HTTP version."""
    url = await serve(ReplayServer(load([framed_stream(tmp_path)]), speed=0, allow_repeats=True).app)
    got = await wire(url, "/events", headers={"X-Tasktape-Fault": spec})
    whole = len(FIRST + SECOND + THIRD)
    assert got.headers["Content-Length"] == str(whole) and "Transfer-Encoding" not in got.headers
    assert len(got.body) < whole and not got.ended


DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("spec", "sent", "length"),
    [
        ("drop-after=3", FIRST + SECOND + DONE, None),
        ("reset-after=3", FIRST + SECOND + DONE, None),
        ("duplicate=1;drop-after=4", FIRST + FIRST + SECOND + DONE, None),
        ("no-final;drop-after=2", FIRST + SECOND, len(FIRST + SECOND + DONE)),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
async def test_a_body_broken_off_at_its_end_is_still_a_broken_transfer(
    serve: Serve, tmp_path: Path, spec: str, sent: bytes, length: int | None
) -> None:
    """drop-after=N at the last event of a stream recorded with its Content-Length was a
    clean, complete answer (and no-final;drop-after=N at the one before the closing event),
    though the report said the fault was made. Left out, the closing event keeps its place
    in the length; a break after the body's last byte goes out without a length (chunked),
    whose end never comes."""
    body = FIRST + SECOND + DONE
    stream = Recorded(
        method="POST",
        path="/v1/chat/completions",
        request_headers=[("Content-Type", "application/json")],
        request_body=json.dumps({"model": "m", "stream": True, "messages": []}).encode(),
        status=200,
        response_headers=[("Content-Type", "text/event-stream"), ("Content-Length", str(len(body)))],
        is_sse=True,
        chunks=[(MS, FIRST), (2 * MS, SECOND), (3 * MS, DONE)],
        outcome="complete",
    )
    write_cassette(tmp_path / "framed.jsonl", [stream])
    server = ReplayServer(load([tmp_path / "framed.jsonl"]), speed=0)
    url = await serve(server.app)
    request = {"model": "m", "stream": True, "messages": []}
    got = await wire(url, "/v1/chat/completions", request, {"X-Tasktape-Fault": spec})
    assert got.body == sent and not got.ended
    assert got.headers.get("Content-Length") == (None if length is None else str(length))
    (streamed,) = server.report()["streams"]
    assert streamed["faults"] == spec.split(";") and not streamed["finished"]
