"""Cassettes: log -> cassette -> log byte-exact, hand-written events, validation errors
with line numbers, and the export/import commands."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import orjson
import pytest
from a2a_frames import completed_run, sse
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st
from log_rows import left_empty

from tasktape.cli import main
from tasktape.errors import CassetteError, LogError, SourceError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import (
    CUT_OFF,
    CassetteReader,
    _modelled,
    _plain_chunk,
    _plain_line,
    cassette_lines,
    hashed_lines,
    load_into,
    read_cassette,
    write_cassette,
)
from tasktape.eventlog.cassette_models import Chunk
from tasktape.eventlog.recorded import Recorded, from_log
from tasktape.eventlog.redact import Redactor
from tasktape.replay import load


def make_log(path: Path) -> Path:
    """Two tasks on two bindings, a card, a binary chunk, a cut-off stream."""
    with LogWriter(path) as w:
        cap = w.begin_capture(source="record", upstream="http://127.0.0.1:9")
        card = w.begin_exchange(cap, method="GET", path="/.well-known/agent-card.json")
        w.response_head(
            card, status=200, headers=[("Content-Type", "application/json")], is_sse=False, ttfb_ns=1
        )
        w.chunk(card, 2, b'{"supportedInterfaces": [{"url": "http://127.0.0.1:9"}]}')
        w.end_exchange(card, duration_ns=3)
        for n, (path_, rpc) in enumerate([("/message:stream", None), ("/", 7)], 1):
            body = {"message": {"messageId": f"m{n}", "parts": [{"text": f"question {n}"}]}}
            if rpc is not None:
                body = {"jsonrpc": "2.0", "id": rpc, "method": "SendStreamingMessage", "params": body}
            ex = w.begin_exchange(
                cap,
                method="POST",
                path=path_,
                request_headers=[("A2A-Version", "1.0")],
                request_body=json.dumps(body).encode(),
                started_ns=1_800_000_000_123_456_789,
            )
            w.response_head(
                ex,
                status=200,
                headers=[("Content-Type", "text/event-stream")],
                is_sse=True,
                ttfb_ns=1_234_567,
            )
            for i, frame in enumerate(
                sse(completed_run(f"task.{n}", f"ctx.{n}"), ids=f"{n}-", jsonrpc_id=rpc)
            ):
                w.chunk(ex, 10_000_123 * (i + 1), frame)
            if n == 2:
                w.chunk(ex, 200_000_001, b"\xff\xfe\x00binary")
            w.end_exchange(
                ex,
                duration_ns=300_000_001,
                outcome="upstream_disconnected" if n == 2 else "complete",
                error="cut" if n == 2 else None,
            )
    return path


def comparable(r: Recorded) -> tuple:
    return (
        r.method,
        r.path,
        r.query,
        r.request_headers,
        r.request_body,
        r.status,
        r.response_headers,
        r.is_sse,
        r.ttfb_ns,
        r.chunks,
        r.duration_ns,
        r.outcome,
        r.error,
        r.started_at,
    )


def test_log_to_cassette_to_log_is_byte_exact(tmp_path: Path) -> None:
    log_path = make_log(tmp_path / "a.db")
    with EventLog(log_path) as log:
        original = from_log(log)
    write_cassette(tmp_path / "c.jsonl", original)
    text = (tmp_path / "c.jsonl").read_text()
    assert '"text": "id: 1-1\\ndata: {' in text  # reads well in a review
    assert '"base64": "' + base64.b64encode(b"\xff\xfe\x00binary").decode() in text
    back = read_cassette(tmp_path / "c.jsonl")
    assert [comparable(r) for r in back] == [comparable(r) for r in original]
    with LogWriter(tmp_path / "b.db") as w:
        load_into(w, back, w.begin_capture(source="import"))
    with EventLog(tmp_path / "b.db") as log:
        again = from_log(log)
        assert [comparable(r) for r in again] == [comparable(r) for r in original]
        # The events are derived again, the same.
        # (The binary tail, which holds no data line, is in the chunks and no event.)
        assert [e["event_id"] for e in log.events(3)] == [f"2-{i}" for i in range(1, 11)]


def test_requests_refused_as_they_came_go_to_a_cassette_and_back(tmp_path: Path) -> None:
    """A recorder logs a request it refused with the target it was sent, in whatever form:
    a cassette keeps it, so the log goes to a cassette and back whole."""
    targets = ["http://evil.example/x", "evil.example:443", "*", ""]  # absolute, CONNECT, OPTIONS *, unread
    with LogWriter(tmp_path / "a.db") as w:
        capture = w.begin_capture(source="record")
        for target in targets:
            x = w.begin_exchange(capture, method="UNKNOWN" if not target else "GET", path=target)
            w.response_head(x, status=400, headers=None, is_sse=False, ttfb_ns=0)
            w.end_exchange(x, duration_ns=0, outcome="refused", error="refused")
    with EventLog(tmp_path / "a.db") as log:
        original = from_log(log)
    write_cassette(tmp_path / "c.jsonl", original)
    back = read_cassette(tmp_path / "c.jsonl")
    assert [r.path for r in back] == targets
    assert [comparable(r) for r in back] == [comparable(r) for r in original]


def test_hand_written_events(tmp_path: Path) -> None:
    cassette = tmp_path / "hand.jsonl"
    lines = [
        {"tasktape_cassette": 1},
        {
            "exchange": {
                "request": {"method": "POST", "path": "/message:stream", "body": "{}"},
                "response": {"status": 200, "headers": [["Content-Type", "text/event-stream"]]},
            }
        },
        {
            "event": {
                "offset_ms": 5,
                "id": "1",
                "data": '{"task": {"id": "t", "status": {"state": "TASK_STATE_WORKING"}}}',
            }
        },
        {"event": {"offset_ms": 7.5, "event": "note", "data": "two\nlines"}},
        {
            "event": {
                "offset_ms": 9,
                "data": '{"statusUpdate": {"taskId": "t", "status": {"state": "TASK_STATE_COMPLETED"}}}',
            }
        },
    ]
    cassette.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    (r,) = read_cassette(cassette)
    assert r.is_sse and r.outcome == "complete" and r.duration_ns == 9_000_000
    assert r.chunks[1] == (7_500_000, b"event: note\ndata: two\ndata: lines\n\n")
    with LogWriter(tmp_path / "h.db") as w:
        load_into(w, [r], w.begin_capture(source="import"))
    with EventLog(tmp_path / "h.db") as log:
        events = log.events(1)
        assert [(e["event_id"], e["kind"], e["state"]) for e in events] == [
            ("1", "task", "TASK_STATE_WORKING"),
            (None, "other", None),
            (None, "statusUpdate", "TASK_STATE_COMPLETED"),
        ]
        assert events[1]["data"] == "two\nlines" and events[1]["event_type"] == "note"


# Cassettes that are refused: their lines, the line named and what is said of it.
BROKEN = [
    ([], "", "empty"),
    (['{"not": "a header"}'], ":1", "cassette header"),
    (['{"tasktape_cassette": 9}'], ":1", "newer tasktape"),
    (['{"tasktape_cassette": 1}', "{broken"], ":2", "not JSON"),
    (
        ['{"tasktape_cassette": 1}', '{"chunk": {"offset_ms": 1, "text": "x"}}'],
        ":2",
        "must follow an exchange",
    ),
    (['{"tasktape_cassette": 1}', '{"wat": {}}'], ":2", "expected one of exchange, chunk, event, end"),
    (
        ['{"tasktape_cassette": 1}', '{"exchange": {"request": {"method": "GET", "path": "nope"}}}'],
        ":2",
        "request.path",
    ),
    (
        [
            '{"tasktape_cassette": 1}',
            '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
            '{"chunk": {"offset_ms": 1, "base64": "***"}}',
        ],
        ":3",
        "chunk",
    ),
    (
        [
            '{"tasktape_cassette": 1}',
            '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
            '{"chunk": {"offset_ms": 1, "text": "a", "base64": "YQ=="}}',
        ],
        ":3",
        "exactly one of",
    ),
    (
        [
            '{"tasktape_cassette": 1}',
            '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
            '{"chunk": {"offset_ms": 5, "text": "a"}}',
            '{"chunk": {"offset_ms": 2, "text": "b"}}',
        ],
        ":4",
        "back in time",
    ),
    (
        [
            '{"tasktape_cassette": 1}',
            '{"exchange": {"request": {"method": "GET", "path": "/"}, "response": {"status": 99}}}',
        ],
        ":2",
        "response.status",
    ),
    *(
        (
            [
                '{"tasktape_cassette": 1}',
                '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
                json.dumps({"exchange": {"request": {"method": "GET", "path": "/"}, "reconnect_of": of}}),
            ],
            ":3",
            problem,
        )
        for of, problem in (
            (-2, "names an exchange before the first"),
            (0, "reconnect_of"),
            (-0.5, "reconnect_of"),
        )
    ),
    *(
        (
            [
                '{"tasktape_cassette": 1}',
                '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
                json.dumps({"event": {"offset_ms": 1, "data": "x", **field}}),
            ],
            ":3",
            problem,
        )
        for field, problem in (
            ({"id": "a\nb"}, "line break"),
            ({"event": "e\r\nf"}, "line break"),
            ({"id": "a\u0000"}, "NUL"),
            ({"data": "one\r\ntwo"}, "cannot hold a CR"),
        )
    ),
    *(
        (
            [
                '{"tasktape_cassette": 1}',
                '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
                '{"chunk": {"offset_ms": 5, "text": "a"}}',
                '{"end": {"outcome": "complete"}}',
                line,
            ],
            ":5",
            problem,
        )
        for line, problem in (
            ('{"exchange": {"request": {"method": "GET", "path": "/", "body": "\\ud800"}}}', "surrogate"),
            ('{"exchange": {"request": {"method": "GET", "path": "/", "body_base64": "***"}}}', "body"),
            ('{"exchange": {"request": {"method": "GET", "path": "/"}, "uid": "nope"}}', "uid"),
            (
                '{"exchange": {"request": {"method": "GET", "path": "/"}, "reconnect_of": -2}}',
                "before the first",
            ),
            ('{"chunk": {"offset_ms": 6, "text": "b"}}', "must follow an exchange"),
            ('{"end": {"outcome": "complete"}}', "must follow an exchange"),
            ('{"exchange": {"request": {"method": "GET", "path": "/"}}} {}', "not JSON"),
        )
    ),
    (
        [
            '{"tasktape_cassette": 1}',
            '{"exchange": {"request": {"method": "GET", "path": "/"}}}',
            '{"chunk": {"offset_ms": 5, "text": "a"}}',
            '{"chunk": {"offset_ms": 5, "text": "\\udfff"}}',
        ],
        ":4",
        "surrogate",
    ),
]


@pytest.mark.parametrize(("lines", "where", "message"), BROKEN)
def test_broken_cassettes_are_rejected_with_their_line(
    tmp_path: Path, lines: list[str], where: str, message: str
) -> None:
    cassette = tmp_path / "broken.jsonl"
    cassette.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(CassetteError) as caught:
        read_cassette(cassette)
    assert str(caught.value).startswith(f"{cassette}{where}") and message in str(caught.value)


@pytest.mark.parametrize("command", ["import", "replay", "check", "diff"])
def test_a_cassette_s_keys_are_named_with_their_control_characters_escaped(
    tmp_path: Path, command: str
) -> None:
    """What is wrong with a cassette names its keys as written: printed raw, an ESC, BEL or
    NUL in one would clear the terminal or set its title (color=True: printed as to one)."""
    cassette = tmp_path / "hostile.jsonl"
    exchange = {"request": {"method": "GET", "path": "/"}, "bogus\x1b[2J\x1b]0;TITLE\x07\x00key": 1}
    cassette.write_text(f'{{"tasktape_cassette": 1}}\n{json.dumps({"exchange": exchange})}\n')
    args = {"import": ["--db", str(tmp_path / "x.db")], "diff": [str(cassette)]}.get(command, [])
    result = CliRunner().invoke(main, [command, str(cassette), *args], color=True)
    assert result.exit_code == 2, result.output
    said = "hostile.jsonl:2: exchange: bogus\\x1b[2J\\x1b]0;TITLE\\x07\\x00key: Extra inputs"
    assert f"{said} are not permitted" in result.output, result.output
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]", result.output), result.output


@pytest.mark.parametrize(("lines", "where", "message"), BROKEN)
def test_import_refuses_a_cassette_file_as_read_cassette_does_before_writing(
    tmp_path: Path, lines: list[str], where: str, message: str
) -> None:
    """A cassette file is checked through without keeping what it holds, then read again to
    be written: the check must refuse all that reading refuses, saying the same, before
    anything is written (the reading again would say only that it changed)."""
    cassette, db = tmp_path / "broken.jsonl", tmp_path / "into.db"
    cassette.write_text("\n".join(lines) + ("\n" if lines else ""))
    with pytest.raises(CassetteError) as caught:
        read_cassette(cassette)
    result = CliRunner().invoke(main, ["import", str(cassette), "--db", str(db)])
    assert (result.exit_code, result.output) == (2, f"Error: {caught.value}\n")
    assert not db.exists()


def test_the_check_before_an_import_counts_what_reading_gives(tmp_path: Path) -> None:
    """Checked without keeping what it holds, a cassette gives the exchanges and uids that
    reading it gives: a log's, none, and one cut off (which still counts)."""
    log_path = make_log(tmp_path / "a.db")
    cassette = tmp_path / "c.jsonl"
    assert CliRunner().invoke(main, ["export", str(log_path), "-o", str(cassette)]).exit_code == 0
    exported = cassette.read_text().splitlines()
    bare = [
        json.dumps({"exchange": {"request": json.loads(line)["exchange"]["request"]}})
        if line.startswith('{"exchange"')
        else line
        for line in exported
    ]
    for lines in (exported, bare, exported[:-1]):
        content = "\n".join(lines).encode()
        reader = CassetteReader(cassette)
        uids = list(reader.uids(content.split(b"\n")))
        assert uids == [r.uid for r in read_cassette(cassette, content=content)]
        assert reader.header == json.loads(lines[0]) and len(uids) == 3
    assert all(uids)


@pytest.mark.parametrize("last_lf", [True, False])
def test_a_files_lines_are_hashed_whole_across_the_blocks_read(tmp_path: Path, last_lf: bool) -> None:
    """A file is read a block at a time: a line longer than a block, or cut where one ends,
    is one line, and every byte is hashed once."""
    content = b"a\n" + b"x" * (3 * 2**20 + 7) + b"\n\nb\n" + b"y" * (2**20 - 4) + b"\nlast"
    content += b"\n" if last_lf else b""
    file = tmp_path / "lines.jsonl"
    file.write_bytes(content)
    digest = hashlib.sha256()
    with file.open("rb") as f:
        lines = list(hashed_lines(f, digest.update))
    assert lines == content.removesuffix(b"\n").split(b"\n")
    assert digest.hexdigest() == hashlib.sha256(content).hexdigest()


def test_export_chooses_and_import_reads(tmp_path: Path) -> None:
    log_path = make_log(tmp_path / "a.db")
    runner = CliRunner()
    out = tmp_path / "task2.jsonl"
    result = runner.invoke(main, ["export", str(log_path), "-o", str(out), "--task", "task.2"])
    assert result.exit_code == 0, result.output
    chosen = read_cassette(out)
    assert [r.path for r in chosen] == ["/.well-known/agent-card.json", "/"]  # the card comes along
    header = json.loads(out.read_text().splitlines()[0])
    assert header["tasktape_cassette"] == 2 and header["upstream"] == "http://127.0.0.1:9"
    result = runner.invoke(
        main, ["export", str(log_path), "-o", str(out), "--context", "ctx.1", "--no-cards"]
    )
    assert [r.path for r in read_cassette(out)] == ["/message:stream"]
    result = runner.invoke(main, ["export", str(log_path), "-o", "-", "--exchange", "1"])
    assert result.exit_code == 0 and result.output.count("\n") == 4
    result = runner.invoke(main, ["export", str(log_path), "-o", str(out), "--task", "task.nope"])
    assert result.exit_code == 1 and "nothing matches" in result.output
    result = runner.invoke(main, ["import", str(out), str(out), "--db", str(tmp_path / "new.db")])
    with EventLog(tmp_path / "new.db") as log:
        assert [c["source"] for c in log.captures()] == ["import"]  # the same cassette twice: once
    assert f"{out} is in {tmp_path / 'new.db'} already (capture 1): nothing added" in result.output
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"tasktape_cassette": 1}\n{oops\n')
    result = runner.invoke(main, ["import", str(broken), "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2 and "broken.jsonl:2: not JSON" in result.output
    assert not (tmp_path / "x.db").exists()  # nothing written when a cassette is broken


def many_exchanges(path: Path, size: int) -> Path:
    """A cassette of about ``size`` bytes: the same event stream over and over."""
    payload = "x" * 400
    lines = [
        '{"exchange": {"request": {"method": "POST", "path": "/message:stream"}, '
        '"response": {"status": 200, "headers": [["Content-Type", "text/event-stream"]]}}}'
    ]
    lines += [
        json.dumps({"chunk": {"offset_ms": i, "text": f"id: {i}\ndata: {payload}\n\n"}}) for i in range(50)
    ]
    lines.append('{"end": {"duration_ms": 60, "outcome": "complete"}}')
    block = "\n".join(lines) + "\n"
    path.write_text('{"tasktape_cassette": 1}\n' + block * (size // len(block)))
    return path


# Runs its arguments and says their peak resident memory, in KiB, and their exit status. A
# process forked from this one counts this one's peak as its own (Linux keeps a process's
# peak across exec): the one measured is forked from this small one.
MEASURED = """
import os, subprocess, sys
_, status, usage = os.wait4(subprocess.Popen(sys.argv[1:]).pid, 0)
print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def import_peak_kib(cassette: Path, db: Path) -> tuple[int, str]:
    """The peak resident memory (in KiB) of ``tasktape import cassette --db db``, run as a
    process of its own, and what it said; it must succeed."""
    args = [sys.executable, "-m", "tasktape", "import", str(cassette), "--db", str(db)]
    run = subprocess.run([sys.executable, "-c", MEASURED, *args], capture_output=True, text=True, check=True)
    peak, status = map(int, run.stdout.split())
    assert status == 0, run.stderr
    return peak, run.stderr


def test_an_import_holds_one_exchange_at_a_time_not_the_cassette(tmp_path: Path) -> None:
    """A cassette was held whole in memory, three times over (its bytes, its lines, its
    exchanges): 568 MB for one of 182 MB. It is read twice instead, checked through before
    anything is written and then written an exchange at a time."""
    size = 64 * 2**20
    big = many_exchanges(tmp_path / "big.jsonl", size)
    baseline, _ = import_peak_kib(many_exchanges(tmp_path / "small.jsonl", 0), tmp_path / "small.db")
    peak, said = import_peak_kib(big, tmp_path / "big.db")
    assert peak < baseline + size // 2**10, f"{peak // 2**10} MiB to import a {size // 2**20} MiB cassette"
    exchanges = big.read_bytes().count(b'{"exchange"')
    assert said == f"tasktape import: {exchanges} exchanges from {big} -> {tmp_path / 'big.db'}\n"
    with EventLog(tmp_path / "big.db") as log:
        assert len(log.exchanges()) == exchanges


def test_a_cassette_imported_again_adds_nothing_and_its_logs_merge_as_one(tmp_path: Path) -> None:
    """Its capture's uid follows from its bytes (its exchanges' from that): importing it
    again added it twice, and so did merging two logs that had each imported it."""
    log_path = make_log(tmp_path / "a.db")
    cassette = tmp_path / "c.jsonl"
    runner = CliRunner()
    assert runner.invoke(main, ["export", str(log_path), "-o", str(cassette)]).exit_code == 0
    one, two, merged = tmp_path / "one.db", tmp_path / "two.db", tmp_path / "merged.db"
    said = []
    for db in (one, one, two):
        result = runner.invoke(main, ["import", str(cassette), "--db", str(db)])
        assert result.exit_code == 0, result.output
        said.append("nothing added" in result.output)
    assert said == [False, True, False]
    with EventLog(one) as a, EventLog(two) as b:
        assert len(a.captures()) == len(b.captures()) == 1
        assert [x["uid"] for x in a.exchanges()] == [x["uid"] for x in b.exchanges()]
        exchanges = len(a.exchanges())
    assert runner.invoke(main, ["merge", str(one), str(two), "-o", str(merged)]).exit_code == 0
    with EventLog(merged) as log:
        assert (len(log.captures()), len(log.exchanges())) == (1, exchanges)
    # Another cassette (a byte changed) would be another capture; but its exchanges keep the
    # uids they were exported with, which the log holds: nothing is added.
    cassette.write_bytes(cassette.read_bytes().replace(b'"tasktape_cassette": 2', b'"tasktape_cassette": 2 '))
    result = runner.invoke(main, ["import", str(cassette), "--db", str(one)])
    assert result.exit_code == 0 and f"{exchanges} of {exchanges} exchanges already in {one}" in result.output
    with EventLog(one) as log:
        assert (len(log.captures()), len(log.exchanges())) == (1, exchanges)


def _exported_uids(cassette: Path) -> list[str | None]:
    docs = [json.loads(line) for line in cassette.read_text().splitlines()[1:]]
    return [doc["exchange"].get("uid") for doc in docs if "exchange" in doc]


def test_a_logs_own_cassette_imported_into_it_adds_nothing(tmp_path: Path) -> None:
    """Its capture's uid follows from the cassette's bytes (another at each export), so a
    log's own export imported into it doubled every exchange: an exported exchange carries
    its uid, and one the log holds is not added again."""
    log_path, cassette = make_log(tmp_path / "a.db"), tmp_path / "a.jsonl"
    runner = CliRunner()
    assert runner.invoke(main, ["export", str(log_path), "-o", str(cassette)]).exit_code == 0
    with EventLog(log_path) as log:
        held = [x["uid"] for x in log.exchanges()]
    assert _exported_uids(cassette) == held
    result = runner.invoke(main, ["import", str(cassette), "--db", str(log_path)])
    assert result.exit_code == 0, result.output
    n = len(held)
    assert (
        result.output
        == f"tasktape import: {cassette}: {n} of {n} exchanges already in {log_path}: nothing added\n"
    )
    with EventLog(log_path) as log:
        assert [x["uid"] for x in log.exchanges()] == held and len(log.captures()) == 1


def test_an_exported_cassette_written_again_keeps_its_exchanges_uids(tmp_path: Path) -> None:
    """Read and written again (as the pytest plugin does when it adds to a cassette), an
    exported cassette lost its uids and went back to version 1: imported into its log, it
    doubled every exchange again."""
    log_path, cassette = make_log(tmp_path / "a.db"), tmp_path / "a.jsonl"
    assert CliRunner().invoke(main, ["export", str(log_path), "-o", str(cassette)]).exit_code == 0
    again = tmp_path / "again.jsonl"
    write_cassette(again, [*read_cassette(cassette), Recorded(method="GET", path="/new", status=204)])
    assert json.loads(again.read_text().splitlines()[0])["tasktape_cassette"] == 2
    assert _exported_uids(again)[:-1] == _exported_uids(cassette)
    result = CliRunner().invoke(main, ["import", str(again), "--db", str(log_path)])
    n = len(_exported_uids(cassette))
    assert (
        f"(1 of {n + 1} exchanges" not in result.output
        and f"({n} of {n + 1} exchanges already in" in result.output
    )


def test_an_import_adds_only_the_exchanges_the_log_lacks_and_merges_with_their_source(
    tmp_path: Path,
) -> None:
    """An exchange reached by two routes (an export imported, and a merge of the log it came
    from) is one exchange: imported, it keeps the uid it had in its log."""
    log_path, one, whole = make_log(tmp_path / "a.db"), tmp_path / "one.jsonl", tmp_path / "whole.jsonl"
    copy = tmp_path / "copy.db"
    runner = CliRunner()
    assert (
        runner.invoke(
            main, ["export", str(log_path), "-o", str(one), "--exchange", "2", "--no-cards"]
        ).exit_code
        == 0
    )
    assert runner.invoke(main, ["export", str(log_path), "-o", str(whole)]).exit_code == 0
    assert runner.invoke(main, ["import", str(one), "--db", str(copy)]).exit_code == 0
    result = runner.invoke(main, ["import", str(whole), "--db", str(copy)])
    assert result.exit_code == 0, result.output
    with EventLog(log_path) as log:
        held = [x["uid"] for x in log.exchanges()]
    n = len(held)
    said = f"{n - 1} exchanges from {whole} -> {copy} (1 of {n} exchanges already in {copy}: skipped)"
    assert result.output == f"tasktape import: {said}\n"
    merged = runner.invoke(main, ["merge", str(log_path), "-o", str(copy)])
    assert merged.exit_code == 0, merged.output
    with EventLog(copy) as log:
        assert sorted(x["uid"] for x in log.exchanges()) == sorted(held)


def test_exchange_uids_are_read_as_a_log_holds_them(tmp_path: Path) -> None:
    """A cassette whose exchanges carry no uid is version 1, which tasktape 0.1 reads; one
    whose do is version 2, which it refuses asking for an upgrade (rather than for the key
    it did not know). A uid another spelling of a UUID would match nothing: refused."""
    plain = tmp_path / "plain.jsonl"
    write_cassette(plain, [Recorded(method="GET", path="/", status=204)])
    assert json.loads(plain.read_text().splitlines()[0])["tasktape_cassette"] == 1
    for uid, said in (("0192d4e0-7c1a-7000-8000-00000000000A", "lowercase"), (7, "string")):
        bad = tmp_path / "bad.jsonl"
        exchange = {"request": {"method": "GET", "path": "/"}, "uid": uid}
        bad.write_text('{"tasktape_cassette": 2}\n' + json.dumps({"exchange": exchange}) + "\n")
        with pytest.raises(CassetteError, match=rf"bad\.jsonl:2: exchange: uid: .*{said}"):
            read_cassette(bad)


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        (Recorded(method="GET", path="/", status=200, chunks=[(5, b"b"), (1, b"a")]), "goes back in time"),
        (Recorded(method="GET", path="/", status=200, chunks=[(-1, b"a")]), "offset_ms"),
        (Recorded(method="", path="/"), "method"),
        (Recorded(method="GET", path="no-slash"), "path"),
    ],
)
def test_write_cassette_refuses_what_it_would_not_read_back(
    tmp_path: Path, recorded: Recorded, said: str
) -> None:
    """It wrote cassettes read_cassette then refused; nothing is written now."""
    cassette = tmp_path / "c.jsonl"
    cassette.write_text("kept\n")
    with pytest.raises(CassetteError, match=rf"cannot write .*c\.jsonl: it would not read back: .*{said}"):
        write_cassette(cassette, [recorded])
    assert cassette.read_text() == "kept\n" and list(tmp_path.iterdir()) == [cassette]


def test_write_cassette_keeps_its_header_readable_and_says_what_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header key could replace the version (the file then unreadable); a folder given
    raised a bare ValueError or OSError, not the CassetteError a write failure is."""
    answer = [Recorded(method="GET", path="/", status=204)]
    cassette = tmp_path / "c.jsonl"
    with pytest.raises(CassetteError, match="tasktape_cassette is the writer's to set"):
        write_cassette(cassette, answer, tasktape_cassette=7)
    with pytest.raises(CassetteError, match="'created_at' must be an ISO 8601 time"):
        write_cassette(cassette, answer, created_at="yesterday")
    assert not cassette.exists()
    monkeypatch.chdir(tmp_path)
    for folder in (".", tmp_path):
        with pytest.raises(CassetteError, match="it is a folder"):
            write_cassette(folder, answer)


def test_write_cassette_does_not_write_over_an_event_log(tmp_path: Path) -> None:
    """Given a log's path (the arguments swapped), it replaced the log with a cassette, and
    the writer that had it open went on writing into a file no longer there; `tasktape
    export -o` refused. Another program's database is not written over either."""
    log_path, answer = tmp_path / "a.db", [Recorded(method="GET", path="/", status=204)]
    with LogWriter(log_path) as w:
        capture = w.begin_capture(source="record")
        w.end_exchange(w.begin_exchange(capture, method="GET", path="/before"), duration_ns=1)
        w.flush()
        said = f"{log_path} is an event log: a cassette is not written over it"
        with pytest.raises(CassetteError, match=f"^{re.escape(said)}$"):
            write_cassette(log_path, answer)
        w.end_exchange(w.begin_exchange(capture, method="GET", path="/after"), duration_ns=1)
    with EventLog(log_path) as log:
        assert [x["path"] for x in log.exchanges()] == ["/before", "/after"]
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as conn:
        conn.execute("CREATE TABLE notes (text)")
    said = f"{other} is an SQLite database that is not a tasktape event log"
    with pytest.raises(CassetteError, match=f"^{re.escape(said)}: a cassette is not written over it$"):
        write_cassette(other, answer)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_write_cassette_writes_through_a_link(tmp_path: Path) -> None:
    """A link to a cassette (kept in another folder) was replaced by a file of its own."""
    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    write_cassette(real, [Recorded(method="GET", path="/old", status=204)])
    link.symlink_to(real)
    write_cassette(link, [Recorded(method="GET", path="/new", status=204)])
    assert link.is_symlink() and [r.path for r in read_cassette(real)] == ["/new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "real.jsonl"]


def test_export_writes_into_a_pipe_and_keeps_a_cassettes_mode(tmp_path: Path) -> None:
    """What is no file was replaced by one: a named pipe's reader got nothing (as would
    `-o /dev/stdout`, refused, or a device), and a cassette kept private (0600) became
    readable by all."""
    log_path = make_log(tmp_path / "a.db")
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = subprocess.Popen(["cat", str(pipe)], stdout=subprocess.PIPE)
    try:
        result = CliRunner().invoke(main, ["export", str(log_path), "-o", str(pipe)])
        got, _ = reader.communicate(timeout=5)
    finally:  # (a pipe replaced by a file leaves its reader waiting)
        reader.kill()
        reader.wait()
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(pipe.stat().st_mode) and [r.path for r in read_cassette(pipe, content=got)] != []
    private = tmp_path / "private.jsonl"
    private.write_text("")
    private.chmod(0o600)
    assert CliRunner().invoke(main, ["export", str(log_path), "-o", str(private)]).exit_code == 0
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and read_cassette(private)


def test_a_file_of_another_kind_is_named_for_what_it_is(tmp_path: Path) -> None:
    """A log where a cassette is expected, a flow file where a log or cassette is, an
    empty file: each is said to be what it is, with what to do instead; no log is ever
    written over by a cassette."""
    log_path = make_log(tmp_path / "a.db")
    before = log_path.read_bytes()
    runner = CliRunner()
    result = runner.invoke(main, ["export", str(log_path), "-o", str(log_path)])
    assert result.exit_code == 2 and "is an event log: a cassette is not written over it" in result.output
    assert log_path.read_bytes() == before
    into = tmp_path / "b.db"
    result = runner.invoke(main, ["import", str(log_path), "--db", str(into)])
    assert result.exit_code == 2 and f"tasktape merge {log_path} -o {into}" in result.output
    assert not into.exists()
    flows, empty = tmp_path / "flows.mitm", tmp_path / "empty.db"
    flows.write_bytes(b"12:abcdefghijkl,")
    left_empty(empty)
    with pytest.raises(SourceError, match=r"flows\.mitm is a mitmproxy flow file: import it into a"):
        load([flows])
    with pytest.raises(SourceError, match=r"empty\.db is empty: neither an event log nor a cassette"):
        load([empty])
    with pytest.raises(LogError, match=r"empty\.db is empty: not an event log"):
        EventLog(empty)
    # A cassette where a log is expected: SQLite said only "file is not a database".
    cassette = tmp_path / "c.jsonl"
    write_cassette(cassette, [Recorded(method="GET", path="/", status=204)])
    for args in (["export", str(cassette), "-o", str(tmp_path / "x.jsonl")], ["inspect", str(cassette)]):
        result = runner.invoke(main, args)
        assert result.exit_code == 2
        assert (
            f"{cassette} is a cassette, not an event log: tasktape import {cassette} --db LOG"
            in result.output
        )
    # Read as a cassette (the pytest plug-in's marker names one): what it is, what makes one.
    with pytest.raises(CassetteError, match=rf"a\.db is an event log, not a cassette: .*export {log_path}"):
        read_cassette(log_path)
    with pytest.raises(CassetteError, match=r"flows\.mitm is a mitmproxy flow file, not a cassette"):
        read_cassette(flows)


def test_a_cassette_cut_off_mid_file_is_no_complete_recording(tmp_path: Path) -> None:
    """``head -n 20``, a disk full: the last exchange lost its end line (and maybe chunks),
    and replayed as a whole stream. Where the other exchanges have their end lines, it is
    cut short (log_closed, saying why): replays break off there and check notes it. A
    cassette written by hand with no end line at all is read as it always was."""
    log_path = make_log(tmp_path / "a.db")
    whole = tmp_path / "whole.jsonl"
    assert CliRunner().invoke(main, ["export", str(log_path), "-o", str(whole)]).exit_code == 0
    lines = whole.read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    # The last exchange's end line gone, and its last chunks: the bytes after its final
    # state, and that state (a stream cut after it would have owed its client nothing).
    cut.write_text("".join(lines[:-3]))
    *kept, last = read_cassette(cut)
    assert all(r.outcome == "complete" for r in kept) and last.cut_short
    assert (last.outcome, last.error) == ("log_closed", CUT_OFF)
    result = CliRunner().invoke(main, ["check", str(cut)])
    assert "cut-short" in result.output, result.output
    by_hand = tmp_path / "by_hand.jsonl"
    by_hand.write_text(
        '{"tasktape_cassette": 1}\n'
        '{"exchange": {"request": {"method": "GET", "path": "/"}, "response": {"status": 200}}}\n'
        '{"chunk": {"offset_ms": 1, "text": "hello"}}\n'
    )
    (only,) = read_cassette(by_hand)
    assert only.outcome == "complete" and only.error is None


def test_a_folder_holds_cassettes_in_its_subfolders_too(tmp_path: Path) -> None:
    """As the pytest plug-in keeps them, a folder per test module: each read, in order,
    named by its path in the folder; hidden folders are left out."""
    folder = tmp_path / "cassettes"
    for name in ("top.jsonl", "test_b/test_one.jsonl", "test_a/test_one.jsonl", ".trash/old.jsonl"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        write_cassette(folder / name, [Recorded(method="GET", path=f"/{name}", status=204)])
    read = load([folder])
    assert [r.origin for r in read] == ["test_a/test_one.jsonl:2", "test_b/test_one.jsonl:2", "top.jsonl:2"]
    assert [r.path for r in read] == ["/test_a/test_one.jsonl", "/test_b/test_one.jsonl", "/top.jsonl"]
    (folder / "top.jsonl").unlink()
    (folder / "notes.txt").write_text("")
    assert len(load([folder])) == 2
    # A folder linked to is followed (as the folder it is), a link that loops back is not.
    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    write_cassette(elsewhere / "s.jsonl", [Recorded(method="GET", path="/shared", status=204)])
    (folder / "linked").symlink_to(elsewhere)
    (folder / "test_a" / "loop").symlink_to(folder)
    assert [r.origin for r in load([folder])] == [
        "linked/s.jsonl:2",
        "test_a/test_one.jsonl:2",
        "test_b/test_one.jsonl:2",
    ]
    empty = tmp_path / "empty"
    (empty / ".hidden").mkdir(parents=True)
    (empty / ".hidden" / "x.jsonl").write_text("")
    with pytest.raises(SourceError, match="a folder without cassettes"):
        load([empty])


def test_export_makes_the_cassette_folder_and_explains_what_it_cannot_write(tmp_path: Path) -> None:
    log_path = make_log(tmp_path / "a.db")
    runner = CliRunner()
    out = tmp_path / "cassettes" / "module" / "test.jsonl"
    result = runner.invoke(main, ["export", str(log_path), "-o", str(out), "--task", "task.2"])
    assert result.exit_code == 0 and read_cassette(out)
    under_a_file = log_path / "x.jsonl"
    result = runner.invoke(main, ["export", str(log_path), "-o", str(under_a_file), "--task", "task.2"])
    assert result.exit_code == 2, result.output
    assert f"cannot write {under_a_file}: {log_path} is a file, not a folder" in result.output


def test_text_with_unicode_line_separators_reads_back(tmp_path: Path) -> None:
    """U+2028, U+2029 and U+0085 are line ends to str.splitlines, not to JSON Lines."""
    data = 'data: {"t":"a\u2028b\u2029c\x85d"}\n\n'.encode()
    r = Recorded(
        method="POST",
        path="/",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(1_000_000, data), (2_000_000, data)],
        duration_ns=3_000_000,
        outcome="complete",
    )
    cassette = tmp_path / "separators.jsonl"
    write_cassette(cassette, [r])
    assert "\u2028".encode() in cassette.read_bytes()  # written as it is, not escaped
    (back,) = read_cassette(cassette)
    assert back.chunks == r.chunks
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(cassette.read_bytes().replace(b"\n", b"\r\n"))
    assert read_cassette(crlf)[0].chunks == r.chunks


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
_offsets = (
    st.integers(min_value=-5, max_value=2 * 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.sampled_from(["1.5", "x", None, 10**30, 1e12, 1e12 + 1])
)
_texts = st.text() | st.sampled_from(["\ud800", "a\udfff", 7, None, b"x".decode()])


@settings(max_examples=400, deadline=None)
@given(
    st.fixed_dictionaries(
        {"offset_ms": _offsets, "text": _texts},
        optional={"base64": st.sampled_from(["YQ==", "***"]), "extra": _json_values},
    ),
    st.sampled_from(["chunk", "event", "end"]),
    st.booleans(),
)
@example({"offset_ms": 123456789012.345, "text": "x"}, "chunk", False)  # past 2**53 ns
@example({"offset_ms": 10**12 - 1, "text": "x"}, "chunk", False)  # an int: the model makes it a float
@example({"offset_ms": True, "text": "x"}, "chunk", False)
@example({"offset_ms": 1, "text": "\ud800"}, "chunk", False)
def test_plain_chunks_read_as_their_model_reads_them(body: dict, kind: str, extra_key: bool) -> None:
    """The quick reading of chunk lines takes only lines the model takes, alike."""
    doc = {kind: body, **({"other": 1} if extra_key else {})}
    quick = _plain_chunk(doc)
    if quick is None:
        return
    assert kind == "chunk" and not extra_key
    model = Chunk.model_validate(body)
    assert quick == (round(model.offset_ms * 1_000_000), model.data())


_names = st.sampled_from(["Content-Type", "x-a", "", "bad name", "a\r", "Accept", 7])
_values = st.sampled_from(["text/event-stream", "v", "a\nb", "t\tab", "\x01", "", None])
_pairs = st.lists(_names | _values, min_size=2, max_size=2)
_headers = st.lists(_pairs | _values, max_size=3) | st.sampled_from([None, "x", {}])
_odd = st.sampled_from([None, 0, 1, "true", 2.0, [], {}])
_requests = st.fixed_dictionaries(
    {
        "method": st.sampled_from(["GET", "POST", "", "G\nET", 5]),
        "path": st.sampled_from(["/", "/a", "nope", "", "/a\r\nX: y", 3]),
    },
    optional={
        "query": st.sampled_from(["a=1", "", "a\x00", None, 4]),
        "headers": _headers,
        "body": _texts,
        "body_base64": st.sampled_from(["YQ==", "***"]),
        "body_truncated": st.booleans() | _odd,
        "decoded_from": st.sampled_from(["gzip", "identity", None, 3]),
        "extra": _json_values,
    },
)
_responses = st.fixed_dictionaries(
    {"status": st.sampled_from([200, 204, 99, 600, 200.0, "200", True, None])},
    optional={
        "headers": _headers,
        "sse": st.booleans() | _odd,
        "ttfb_ms": _offsets,
        "decoded_from": st.sampled_from(["gzip", None, 3]),
        "body_truncated": st.booleans() | _odd,
        "extra": _json_values,
    },
)
_exchanges = st.fixed_dictionaries(
    {"request": _requests | _odd},
    optional={
        "response": _responses | _odd,
        "started_at": st.sampled_from(["2026-12-06T12:00Z", "9999-12-31T23:59:59Z", "yesterday", None, 5]),
        "recorded_by": st.sampled_from(["test_a.py::test_a[x]", "", None, 6]),
    },
)
_ends = st.fixed_dictionaries(
    {},
    optional={
        "duration_ms": _offsets,
        "outcome": st.sampled_from(["complete", "client_disconnected", "upstream_disconected", 3, None]),
        "error": st.sampled_from(["cut", None, 4]),
        "extra": _json_values,
    },
)


@settings(max_examples=600, deadline=None)
@given(st.one_of(_exchanges.map(lambda e: {"exchange": e}), _ends.map(lambda e: {"end": e})), st.booleans())
def test_plain_exchange_and_end_lines_read_as_their_models_read_them(doc: dict, extra_key: bool) -> None:
    """The quick reading of exchange and end lines takes only lines the models take, alike."""
    doc = {**doc, **({"other": 1} if extra_key else {})}
    quick = _plain_line(doc, "c.jsonl:2")
    # Unkept (the check before an import), it takes the same lines.
    assert (_plain_line(doc, "c.jsonl:2", keep=False) is None) == (quick is None)
    if quick is not None:
        assert not extra_key
        assert quick == _modelled(doc, "c.jsonl:2", "c.jsonl:2")


def test_the_lines_tasktape_writes_are_read_the_quick_way() -> None:
    """Every exchange and end line of a cassette tasktape wrote, whatever its exchanges."""
    full = Recorded(
        method="POST",
        path="/s",
        query="a=1",
        request_headers=[("A", "1")],
        request_body=b"{}",
        request_body_truncated=True,
        status=200,
        response_headers=[("Content-Type", "text/plain")],
        is_sse=True,
        ttfb_ns=5,
        decoded_from="gzip",
        response_body_truncated=True,
        started_at="2026-12-06T12:00:00Z",
        duration_ns=9,
        outcome="upstream_disconnected",
        error="cut",
        recorded_by="test_s.py::test_s[a]",
    )
    bare = Recorded(method="GET", path="/")  # no response, no body, no duration
    lines = [orjson.loads(line) for line in list(cassette_lines([full, bare]))[1:]]
    for doc in lines:
        if "chunk" not in doc:
            assert _plain_line(doc, "c.jsonl:2") == _modelled(doc, "c.jsonl:2", "c.jsonl:2") is not None


def test_the_test_that_recorded_an_exchange_is_kept_and_optional(tmp_path: Path) -> None:
    """The pytest plugin tags what a test recorded; a cassette without the tag reads as ever."""
    tagged = Recorded(method="GET", path="/a", status=200, recorded_by="test_s.py::test_s[a]")
    write_cassette(tmp_path / "c.jsonl", [tagged, Recorded(method="GET", path="/b", status=200)])
    lines = (tmp_path / "c.jsonl").read_text().splitlines()
    assert '"recorded_by": "test_s.py::test_s[a]"' in lines[1] and "recorded_by" not in lines[3]
    assert [r.recorded_by for r in read_cassette(tmp_path / "c.jsonl")] == ["test_s.py::test_s[a]", None]
    untold = {"exchange": {"request": {"method": "GET", "path": "/"}, "recorded_by": ""}}
    (tmp_path / "c.jsonl").write_text('{"tasktape_cassette": 1}\n' + json.dumps(untold) + "\n")
    with pytest.raises(CassetteError, match=r":2: exchange: recorded_by: "):
        read_cassette(tmp_path / "c.jsonl")


def test_a_cassette_reads_alike_however_its_json_is_spelled(tmp_path: Path) -> None:
    """What orjson refuses (NaN, lone surrogates, huge integers) still gets the model's word."""
    head = '{"tasktape_cassette": 1}\n{"exchange": {"request": {"method": "GET", "path": "/"}}}\n'
    for line, message in (
        ('{"chunk": {"offset_ms": NaN, "text": "a"}}', "finite number"),
        ('{"chunk": {"offset_ms": 1, "text": "\\ud800"}}', "chunk"),
        ('{"chunk": {"offset_ms": 100000000000000000000000, "text": "a"}}', "offset_ms"),
    ):
        cassette = tmp_path / "odd.jsonl"
        cassette.write_text(head + line + "\n")
        with pytest.raises(CassetteError) as caught:
            read_cassette(cassette)
        assert str(caught.value).startswith(f"{cassette}:3: chunk") and message in str(caught.value)
    cassette.write_bytes(head.encode() + b'{"chunk": {"offset_ms": 1, "text": "\xff"}}\n')
    with pytest.raises(CassetteError, match=r":3: not JSON: .*utf-8"):
        read_cassette(cassette)
    for odd in (
        b"\xef\xbb\xbf" + head.encode(),
        head.encode() + '{"chunk": {"offset_ms": 1, "text": "a"}}'.encode("utf-16"),
    ):
        cassette.write_bytes(odd)  # a byte-order mark, UTF-16: not a cassette, as read_header says
        with pytest.raises(CassetteError, match=r"not JSON"):
            read_cassette(cassette)
        spelled = orjson.dumps({"chunk": {"offset_ms": 2.5, "text": "b\u00e9"}}).decode()
    cassette.write_text(head + spelled + "\n" + '{"chunk": {"offset_ms": "3", "text": "c"}}\n')
    (r,) = read_cassette(cassette)
    assert r.chunks == [(2_500_000, "bé".encode()), (3_000_000, b"c")]


IMPORT_SECRET = "sk-import-secret-16180339"


def raw_traffic(path: Path, kind: str) -> Path:
    """A flow file (``mitmdump -w`` keeps the traffic as it was) or a cassette holding a
    credential in a header, the query and a JSON field of the request body."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"apiKey": IMPORT_SECRET, "id": "t1"}}
    if kind == "flow file":
        from mitmproxy import io  # noqa: PLC0415 - only this case needs mitmproxy
        from mitmproxy.test import tflow  # noqa: PLC0415

        flow = tflow.tflow(resp=True)
        flow.request.method, flow.request.path = "POST", f"/rpc?sess={IMPORT_SECRET}&page=2"
        flow.request.headers.update({"X-Tenant": IMPORT_SECRET, "Content-Type": "application/json"})
        flow.request.content = json.dumps(body).encode()
        with path.open("wb") as f:
            io.FlowWriter(f).add(flow)
        return path
    with LogWriter(path.with_suffix(".db"), redactor=Redactor(defaults=False)) as w:
        x = w.begin_exchange(
            w.begin_capture(source="record"),
            method="POST",
            path="/rpc",
            query=f"sess={IMPORT_SECRET}&page=2",
            request_headers=[("X-Tenant", IMPORT_SECRET), ("Content-Type", "application/json")],
            request_body=json.dumps(body).encode(),
        )
        w.response_head(x, status=200, headers=None, is_sse=False, ttfb_ns=1)
        w.end_exchange(x, duration_ns=2)
    result = CliRunner().invoke(main, ["export", str(path.with_suffix(".db")), "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path


@pytest.mark.parametrize("kind", ["flow file", "cassette"])
def test_import_takes_the_redaction_options(tmp_path: Path, kind: str) -> None:
    """A flow file holds the traffic unredacted: import must be able to redact what the
    defaults do not know of, as record does."""
    (tmp_path / "source").mkdir()
    source = raw_traffic(tmp_path / "source" / "traffic", kind)
    db = tmp_path / "log" / "imported.db"
    options = ["--redact-header", "X-Tenant", "--redact-query", "sess", "--redact-json", "/params/apiKey"]
    result = CliRunner().invoke(main, ["import", str(source), "--db", str(db), *options])
    assert result.exit_code == 0, result.output
    with EventLog(db) as log:
        (x,) = log.exchanges()
    assert dict(json.loads(x["request_headers"]))["X-Tenant"] == "[REDACTED]"
    assert x["query"] == "sess=[REDACTED]&page=2"
    assert json.loads(x["request_body"])["params"] == {"apiKey": "[REDACTED]", "id": "t1"}
    for path in db.parent.iterdir():
        assert IMPORT_SECRET.encode() not in path.read_bytes(), path.name


def test_a_logs_start_times_go_to_a_cassette_and_back_to_the_nanosecond(tmp_path: Path) -> None:
    """log -> cassette -> log kept started_ns to the microsecond: export wrote started_at
    with six digits past the second, and import read no more."""
    log_path, cassette, copy = make_log(tmp_path / "a.db"), tmp_path / "c.jsonl", tmp_path / "b.db"
    assert CliRunner().invoke(main, ["export", str(log_path), "-o", str(cassette)]).exit_code == 0
    assert CliRunner().invoke(main, ["import", str(cassette), "--db", str(copy)]).exit_code == 0
    starts = "SELECT uid, started_ns FROM exchanges ORDER BY uid"
    with EventLog(log_path) as log, EventLog(copy) as back:
        assert back.db.execute(starts).fetchall() == log.db.execute(starts).fetchall()
        assert [ns for _, ns in log.db.execute(starts)].count(1_800_000_000_123_456_789) == 2
