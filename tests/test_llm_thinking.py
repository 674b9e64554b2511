"""What an LLM stream holds beside its answer, in the log and on its stream page: the
model's thinking (Anthropic's thinking blocks, OpenAI's reasoning summaries and the
reasoning of servers that copy the Chat API), every choice of a request for several (``n``),
and a stream too long to list event by event."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from datasette.app import Datasette
from inspector_log import page, rows
from markupsafe import escape

from tasktape.cli import main
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.protocols import by_name
from tasktape.inspector.app import create_datasette

DB = "thinking"
MS = 1_000_000
THOUGHT = "Let me weigh the quokka against the wombat"
ANSWER = "The quokka."
HEAD_ROWS, TAIL_ROWS = 1_000, 20  # the events a long stream's table lists first and last


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    named = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{named}data: {body}\n\n".encode()


def typed(kind: str, **fields: Any) -> bytes:
    """An event that names its type twice, as Anthropic's and the Responses API's do."""
    return sse({"type": kind, **fields}, kind)


def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return sse({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-x", "choices": [choice]})


def record(path: Path, url: str, body: dict[str, Any], events: list[tuple[float, bytes]]) -> int:
    """One streamed exchange written to the log: each event at its time (ms)."""
    with LogWriter(path) as w:
        capture = w.begin_capture(source="test")
        x = w.begin_exchange(
            capture,
            method="POST",
            path=url,
            request_headers=[("content-type", "application/json"), ("anthropic-version", "2023-06-01")],
            request_body=json.dumps(body).encode(),
        )
        w.response_head(
            x, status=200, headers=[("content-type", "text/event-stream")], is_sse=True, ttfb_ns=MS
        )
        for at, data in events:
            w.chunk(x, round(at * MS), data)
        w.end_exchange(x, duration_ns=round((events[-1][0] + 1) * MS)).result()
        w.end_capture(capture)
    with EventLog(path) as log:
        return log.exchanges()[-1]["id"]


def block_delta(index: int, **delta: Any) -> bytes:
    return typed("content_block_delta", index=index, delta=delta)


START = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": []}
TOOL = {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}
# A thinking block, its signature, a text block, a tool's input in two pieces.
THINKING_MESSAGE = [
    (5.0, typed("message_start", message={**START, "usage": {"input_tokens": 9}})),
    (6.0, typed("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""})),
    (11.3, block_delta(0, type="thinking_delta", thinking=THOUGHT)),
    (20.0, block_delta(0, type="signature_delta", signature="sig==")),
    (21.0, typed("content_block_stop", index=0)),
    (22.0, typed("content_block_start", index=1, content_block={"type": "text", "text": ""})),
    (37.7, block_delta(1, type="text_delta", text=ANSWER)),
    (38.0, typed("content_block_stop", index=1)),
    (39.0, typed("content_block_start", index=2, content_block=TOOL)),
    (40.0, block_delta(2, type="input_json_delta", partial_json='{"q":')),
    (41.0, block_delta(2, type="input_json_delta", partial_json='"abc"}')),
    (42.0, typed("content_block_stop", index=2)),
    (43.0, typed("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 42})),
    (44.0, typed("message_stop")),
]


def events_of(path: Path, exchange_id: int) -> list[tuple[str, str | None]]:
    with EventLog(path) as log:
        return [(e["kind"], e["text"]) for e in log.events(exchange_id)]


def summary_of(path: Path) -> dict[str, Any]:
    with EventLog(path) as log:
        return log.stream_summary()[-1]


async def test_anthropic_thinking_is_kept_apart_from_the_answer_and_shown(tmp_path: Path) -> None:
    """A thinking block's deltas are the model's thinking: searchable, no part of the
    answer, on the stream page in a panel of their own; the first token is the thinking's."""
    path = tmp_path / f"{DB}.db"
    x = record(path, "/v1/messages", {"model": "claude-x", "messages": [], "stream": True}, THINKING_MESSAGE)
    assert ("thinking", THOUGHT) in events_of(path, x)
    assert summary_of(path)["answer"] == ANSWER
    ds: Datasette = create_datasette(path)
    found = await rows(ds, f"/{DB}/search_event_text.json?text=quokka+against&_shape=objects")
    assert [(f["exchange_id"], f["kind"]) for f in found] == [(x, "thinking")]
    html = await page(ds, f"/{DB}/-/stream/{x}")
    thinking = html.split("<h2>Thinking</h2>")[1].split("</article>")[0]
    assert f'<p class="tt-text">{escape(THOUGHT)}</p>' in thinking
    answer = html.split("<h2>Answer</h2>")[1].split("</article>")[0]
    assert f'<p class="tt-text">{escape(ANSWER)}</p>' in answer and "reassembled from 1 delta" in answer
    assert re.search(
        r"first token after</span><strong>11.3 ms</strong>\s*"
        r"<small>event #2, the first with text \(thinking\)",
        html,
    )
    assert "first answer token after 37.7 ms (event #6)" in html
    gaps = html.split('<div id="gaps">')[1].split("</div>")[0]
    assert "<h2>Gaps between text deltas</h2>" in gaps and "over 1 gap</p>" in gaps
    assert "Events without text (tool-call arguments, signatures, token counts) are not timed here." in gaps


async def test_openai_reasoning_is_thinking(tmp_path: Path) -> None:
    """A Responses stream's reasoning summary, and a chat delta's reasoning_content (as vLLM
    sends it), are the model's thinking, not its answer."""
    path = tmp_path / f"{DB}.db"
    responses = record(
        path,
        "/v1/responses",
        {"model": "o-x", "input": "Which?", "stream": True},
        [
            (2.0, typed("response.created", response={"id": "r", "model": "o-x", "status": "in_progress"})),
            (
                3.0,
                typed("response.reasoning_summary_text.delta", item_id="rs", output_index=0, delta=THOUGHT),
            ),
            (
                4.0,
                typed(
                    "response.output_text.delta", item_id="m", output_index=1, content_index=0, delta=ANSWER
                ),
            ),
            (5.0, typed("response.completed", response={"id": "r", "model": "o-x", "status": "completed"})),
        ],
    )
    chat = record(
        path,
        "/v1/chat/completions",
        {"model": "gpt-x", "messages": [{"role": "user", "content": "Which?"}], "stream": True},
        [
            (2.0, chunk(0, {"role": "assistant", "reasoning_content": THOUGHT})),
            (3.0, chunk(0, {"content": ANSWER})),
            (4.0, chunk(0, {}, "stop")),
            (5.0, sse("[DONE]")),
        ],
    )
    ds = create_datasette(path)
    for x in (responses, chat):
        assert ("thinking", THOUGHT) in events_of(path, x)
        html = await page(ds, f"/{DB}/-/stream/{x}")
        thinking = html.split("<h2>Thinking</h2>")[1].split("</article>")[0]
        assert f'<p class="tt-text">{escape(THOUGHT)}</p>' in thinking
    with EventLog(path) as log:
        assert [s["answer"] for s in log.stream_summary()] == [ANSWER, ANSWER]


async def test_a_delta_that_ends_the_thinking_and_starts_the_answer_keeps_both(tmp_path: Path) -> None:
    """A chat delta with both reasoning_content and content (vLLM's reasoning parsers send
    one where the thinking ends): its reasoning is thinking, searchable and whole on the
    page; its content is the answer's, and the only part of it the answer takes."""
    path = tmp_path / f"{DB}.db"
    thought, rest = THOUGHT.split(" against")
    x = record(
        path,
        "/v1/chat/completions",
        {"model": "gpt-x", "messages": [{"role": "user", "content": "Which?"}], "stream": True},
        [
            (2.0, chunk(0, {"role": "assistant", "reasoning_content": thought})),
            (3.0, chunk(0, {"reasoning_content": f" against{rest}", "content": "The"})),
            (4.0, chunk(0, {"content": " quokka."}, "stop")),
            (5.0, sse("[DONE]")),
        ],
    )
    assert events_of(path, x) == [
        ("thinking", thought),
        ("delta", f" against{rest}\nThe"),
        ("finish", " quokka."),
        ("done", None),
    ]
    assert summary_of(path)["answer"] == ANSWER
    ds = create_datasette(path)
    found = await rows(ds, f"/{DB}/search_event_text.json?text=against+the+wombat&_shape=objects")
    assert [(f["exchange_id"], f["seq"], f["kind"]) for f in found] == [(x, 1, "delta")]
    html = await page(ds, f"/{DB}/-/stream/{x}")
    thinking = html.split("<h2>Thinking</h2>")[1].split("</article>")[0]
    assert f'<p class="tt-text">{escape(THOUGHT)}</p>' in thinking and "reassembled from 2 deltas" in thinking
    answer = html.split("<h2>Answer</h2>")[1].split("</article>")[0]
    assert f'<p class="tt-text">{escape(ANSWER)}</p>' in answer and "reassembled from 2 deltas" in answer
    assert "first answer token after 3.0 ms (event #1)" in html


def choices_chunk(*choices: tuple[dict[str, Any], str | None]) -> bytes:
    """A chat chunk that carries several choices: each one's delta and finish, by index."""
    listed = [{"index": i, "delta": d, "finish_reason": finish} for i, (d, finish) in enumerate(choices)]
    return sse({"id": "c1", "object": "chat.completion.chunk", "model": "gpt-x", "choices": listed})


async def test_a_chunk_of_several_choices_has_every_choices_text_searchable(tmp_path: Path) -> None:
    """A chunk that carries choice 0 and choice 1 (n=2) is choice 0's event, choice 1's text
    on it too (its reasoning as well), where search finds it; the answer and the page's
    Thinking stay choice 0's, and the page shows each choice's answer."""
    path = tmp_path / f"{DB}.db"
    x = record(
        path,
        "/v1/chat/completions",
        {"model": "gpt-x", "n": 2, "messages": [{"role": "user", "content": "two"}], "stream": True},
        [
            (2.0, choices_chunk(({"role": "assistant", "content": ""}, None), ({"content": ""}, None))),
            (3.0, choices_chunk(({"content": "A1 "}, None), ({"reasoning": "Bwhy", "content": "B1 "}, None))),
            (4.0, choices_chunk(({"content": "A2"}, "stop"), ({"content": "B2"}, "length"))),
            (5.0, sse("[DONE]")),
        ],
    )
    assert events_of(path, x) == [
        ("delta", None),
        ("delta", "A1 \nBwhy\nB1 "),
        ("finish", "A2\nB2"),
        ("done", None),
    ]
    summary = summary_of(path)
    assert (summary["answer"], summary["finish"]) == ("A1 A2", "stop")
    ds = create_datasette(path)
    for word, seq in (("Bwhy", 1), ("B1", 1), ("B2", 2)):
        found = await rows(ds, f"/{DB}/search_event_text.json?text={word}&_shape=objects")
        assert [(f["exchange_id"], f["seq"]) for f in found] == [(x, seq)], word
    html = await page(ds, f"/{DB}/-/stream/{x}")
    assert "No thinking was streamed." in html  # (choice 1's is no part of it)
    shown = r'choice (\d+)\s*<span class="tt-meta">finish: .*?<p class="tt-text">([^<]*)</p>'
    answers = re.findall(shown, html, re.S)
    assert answers == [("0", "A1 A2"), ("1", "B1 B2")]


def test_what_a_chat_chunk_adds_to_the_answer_is_its_piece_alone() -> None:
    """A chunk's event text holds all it says (for search), but what it adds to the answer,
    as ``tasktape diff`` joins the deltas, is choice 0's content (or refusal) alone: not its
    reasoning, not other choices' text; a whole completion's too."""
    openai = by_name("openai")
    assert openai is not None
    reader = openai.reader()
    said = [
        (chunk(0, {"reasoning_content": "Let me think"}), "Let me think", None),
        (chunk(0, {"reasoning_content": " hard.", "content": "The"}), " hard.\nThe", "The"),
        (chunk(0, {"reasoning": "No.", "refusal": "I can't."}), "No.\nI can't.", "I can't."),
        (
            choices_chunk(({"content": " quokka."}, "stop"), ({"reasoning": "B?", "content": "B"}, None)),
            " quokka.\nB?\nB",
            " quokka.",
        ),
        (choices_chunk(({}, None), ({"content": "B2"}, "stop")), "B2", None),
        (chunk(0, {"content": "Plain"}), "Plain", "Plain"),
    ]
    for event, text, added in said:
        data = event.decode().removeprefix("data: ").strip()
        c = reader.event(data, None)
        assert (c.text, openai.delta(c)) == (text, added), data
    message = {"reasoning_content": THOUGHT, "content": ANSWER}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    whole = {"object": "chat.completion", "model": "gpt-x", "choices": [choice]}
    c = openai.reader().body(json.dumps(whole))
    assert c is not None and (c.text, openai.delta(c)) == (f"{THOUGHT}\n{ANSWER}", ANSWER)


async def test_every_choice_of_a_request_for_several_is_shown(tmp_path: Path) -> None:
    """A chat request with n=2: the page shows both answers and how each finished (the
    second cut at the token limit); the log keeps choice 0's as the exchange's answer and
    the other's text in its events, where search finds it."""
    path = tmp_path / f"{DB}.db"
    x = record(
        path,
        "/v1/chat/completions",
        {"model": "gpt-x", "n": 2, "messages": [{"role": "user", "content": "two"}], "stream": True},
        [
            (2.0, chunk(0, {"content": "A1 "})),
            (3.0, chunk(1, {"content": "B1 "})),
            (4.0, chunk(0, {"content": "A2"})),
            (5.0, chunk(1, {"content": "B2"})),
            (6.0, chunk(0, {}, "stop")),
            (7.0, chunk(1, {}, "length")),
            (8.0, sse("[DONE]")),
        ],
    )
    summary = summary_of(path)
    assert (summary["answer"], summary["finish"]) == ("A1 A2", "stop")
    assert ("choice", "B1 ") in events_of(path, x)
    ds = create_datasette(path)
    html = await page(ds, f"/{DB}/-/stream/{x}")
    assert "2 choices (the request asked for several)" in html
    answers = re.findall(
        r'choice (\d+)\s*<span class="tt-meta">finish: (?:<b class="tt-warn">)?(\w+)(?:</b>)?</span></div>\s*'
        r'<p class="tt-text">([^<]*)</p>',
        html,
    )
    assert answers == [("0", "stop", "A1 A2"), ("1", "length", "B1 B2")]
    assert (
        'class="tt-pill tt-finish-bad" title="how the model stopped choice 1">choice 1: length</span>' in html
    )
    assert "<th>finish</th><td>stop (choice 0) · length (choice 1)</td>" in html


async def test_a_long_stream_lists_its_first_and_last_events(tmp_path: Path) -> None:
    """The events table of a long stream shows its first and last events and says how many
    it leaves out, with a link to them all; a short stream's lists every event."""
    path = tmp_path / f"{DB}.db"
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "count"}], "stream": True}
    many = HEAD_ROWS + TAIL_ROWS + 80
    x = record(
        path,
        "/v1/chat/completions",
        body,
        [(1 + i / 10, chunk(0, {"content": f"w{i} "})) for i in range(many)],
    )
    short = record(
        path, "/v1/chat/completions", body, [(1.0, chunk(0, {"content": "w"})), (2.0, sse("[DONE]"))]
    )
    ds = create_datasette(path)
    html = await page(ds, f"/{DB}/-/stream/{x}")
    table = html.split('<section class="tt-section" id="events">')[1]
    listed = re.findall(rf'<td><a href="/{DB}/events/{x},(\d+)">', table)
    assert listed == [str(seq) for seq in [*range(HEAD_ROWS), *range(many - TAIL_ROWS, many)]]
    assert (
        f'80 events left out here: <a href="/{DB}/events?exchange_id={x}">all 1,100 in the events table</a>'
        in table
    )
    short_html = await page(ds, f"/{DB}/-/stream/{short}")
    assert len(re.findall(rf'<td><a href="/{DB}/events/{short},', short_html)) == 2
    assert "left out" not in short_html


def test_an_older_log_reads_its_thinking_once_upgraded(tmp_path: Path) -> None:
    """A log of schema version 18 held thinking deltas as text-less `content_block_delta`
    events: upgrading it reads its LLM exchanges again, thinking searchable."""
    path = tmp_path / f"{DB}.db"
    x = record(path, "/v1/messages", {"model": "claude-x", "messages": [], "stream": True}, THINKING_MESSAGE)
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE events SET kind = 'content_block_delta', text = NULL WHERE kind = 'thinking'")
        conn.execute("INSERT INTO events_fts (events_fts) VALUES ('rebuild')")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name >= '0019'")  # 0019 and those after it
        conn.execute("PRAGMA user_version = 18")
        assert conn.execute("SELECT count(*) FROM events WHERE kind = 'thinking'").fetchone() == (0,)
    result = CliRunner().invoke(main, ["upgrade", str(path)])
    assert result.exit_code == 0 and "schema version 18 went to" in result.output, result.output
    assert ("thinking", THOUGHT) in events_of(path, x)
    with closing(sqlite3.connect(path)) as conn:
        found = conn.execute("SELECT rowid FROM events_fts WHERE events_fts MATCH 'wombat'").fetchall()
    assert len(found) == 1
