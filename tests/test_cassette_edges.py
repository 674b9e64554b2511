"""Cassettes at their edges: exchanges the log holds no end of, times and outcomes that are
no such thing, bodies past the recorder's cap, upstreams, and choices that match nothing;
each through the commands, on real files."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from log_rows import rows_in

from tasktape.cli import main
from tasktape.errors import CassetteError
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import read_cassette, write_cassette
from tasktape.eventlog.recorded import Recorded
from tasktape.eventlog.redact import Redactor
from tasktape.replay import load

ROOT = Path(__file__).resolve().parent.parent
SSE = [("Content-Type", "text/event-stream")]
HEAD = '{"tasktape_cassette": 1}'
GET = '{"exchange": {"request": {"method": "GET", "path": "/"}, "response": {"status": 200}}}'


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def one_error_line(output: str) -> str:
    """The one line a refused command says, never a traceback."""
    assert "Traceback" not in output, output
    (line,) = output.strip().splitlines()
    return line


def started_stream(writer: LogWriter, upstream: str | None = "http://127.0.0.1:9") -> int:
    """A stream begun in a capture of its own, two events in, not ended."""
    capture = writer.begin_capture(source="record", upstream=upstream)
    exchange = writer.begin_exchange(capture, method="POST", path="/message:stream")
    writer.response_head(exchange, status=200, headers=SSE, is_sse=True, ttfb_ns=1_000_000)
    writer.chunk(exchange, 2_000_000, b"id: 1\ndata: {}\n\n")
    writer.chunk(exchange, 3_000_000, b"id: 2\ndata: {}\n\n")
    return exchange


def test_an_exchange_the_log_holds_no_end_of_is_exported_cut_short(tmp_path: Path) -> None:
    """Exported while its recorder was still writing it, a stream was written as complete,
    and replayed and checked as a whole one."""
    log, cassette = tmp_path / "live.db", tmp_path / "live.jsonl"
    writer = LogWriter(log)
    try:
        started_stream(writer)
        writer.flush()
        code, output = cli("export", str(log), "-o", str(cassette))
    finally:
        writer.close()
    assert code == 0, output
    assert "live.db exchange 1 (POST /message:stream) has no end in the log yet" in output
    end = lines(cassette)[-1]["end"]
    assert (end["duration_ms"], end["outcome"]) == (None, "log_closed")
    assert end["error"].startswith("the log held no end of this exchange when it was read")
    (recorded,) = read_cassette(cassette)
    assert recorded.cut_short and recorded.duration_ns is None
    code, output = cli("check", str(cassette))
    assert "cut-short" in output, output
    # Imported and exported again, it is the same line.
    assert cli("import", str(cassette), "--db", str(tmp_path / "copy.db"))[0] == 0
    assert cli("export", str(tmp_path / "copy.db"), "-o", str(tmp_path / "again.jsonl"))[0] == 0
    assert lines(tmp_path / "again.jsonl")[1:] == lines(cassette)[1:]


def test_an_exchange_the_log_holds_no_end_of_is_said_without_a_credential_s_value(tmp_path: Path) -> None:
    """tasktape 0.1.0 stored ``refresh_token``, ``id_token`` and ``access-token`` as sent (they
    are defaults' names since): export's line of such an exchange still under way (its recorder
    killed, or still writing) printed the value, which a replay's miss hides."""
    log = tmp_path / "old.db"
    writer = LogWriter(log, redactor=Redactor(defaults=False))  # (as 0.1.0 stored those names)
    try:
        capture = writer.begin_capture(source="record", upstream="http://127.0.0.1:9")
        exchange = writer.begin_exchange(
            capture, method="GET", path="/events", query="refresh_token=sk-live-3"
        )
        writer.response_head(exchange, status=200, headers=SSE, is_sse=True, ttfb_ns=1_000_000)
        writer.chunk(exchange, 2_000_000, b"id: 1\ndata: {}\n\n")
        writer.flush()
        code, output = cli("export", str(log), "-o", str(tmp_path / "old.jsonl"))
    finally:
        writer.close()
    assert code == 0, output
    assert "old.db exchange 1 (GET /events?refresh_token=[REDACTED]) has no end in the log yet" in output
    assert "sk-live" not in output


def test_an_exchange_without_a_duration_goes_round_trip_unchanged(tmp_path: Path) -> None:
    """A recorder stopped mid-stream leaves it log_closed without a duration: export wrote
    null, import made it the last chunk's offset, and the next export differed."""
    log = tmp_path / "cut.db"
    with LogWriter(log) as writer:
        started_stream(writer)  # closed before it ends: log_closed, no duration
    cassettes = [tmp_path / f"{n}.jsonl" for n in range(3)]
    assert cli("export", str(log), "-o", str(cassettes[0]))[0] == 0
    for n in (1, 2):
        db = tmp_path / f"copy{n}.db"
        assert cli("import", str(cassettes[n - 1]), "--db", str(db))[0] == 0
        assert cli("export", str(db), "-o", str(cassettes[n]))[0] == 0
        with EventLog(db) as copy:
            (row,) = copy.exchanges()
            assert (row["outcome"], row["duration_ns"]) == ("log_closed", None)
    exchanges = [path.read_text().splitlines()[1:] for path in cassettes]
    assert exchanges[0] == exchanges[1] == exchanges[2]
    assert lines(cassettes[0])[-1]["end"]["duration_ms"] is None


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"created_at": 5}, "'created_at' must be a string"),
        ({"created_at": ["2026-11-30T11:00:00Z"]}, "'created_at' must be a string"),
        ({"created_at": "yesterday"}, "'created_at' must be an ISO 8601 time"),
        ({"created_at": "2026-13-45"}, "'created_at' must be an ISO 8601 time"),
        ({"upstream": 7}, "'upstream' must be a string"),
    ],
)
def test_a_header_time_that_is_no_time_is_refused_before_anything_is_written(
    tmp_path: Path, header: dict, message: str
) -> None:
    """A created_at that was no string crashed the import (AttributeError), after the
    files before it on the command line were imported."""
    good, bad, db = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "into.db"
    good.write_text(f"{HEAD}\n{GET}\n")
    bad.write_text(json.dumps({"tasktape_cassette": 1, **header}) + f"\n{GET}\n")
    code, output = cli("import", str(good), str(bad), "--db", str(db))
    line = one_error_line(output)
    assert code == 2 and line.startswith(f"Error: {bad}:1: ") and message in line
    assert not db.exists()  # not even the good one


def test_a_start_time_that_is_no_time_is_refused(tmp_path: Path) -> None:
    """It was replaced by the time of the import, unsaid."""
    cassette = tmp_path / "started.jsonl"
    for started in ("not a date", "2026-02-30T12:00:00Z"):
        exchange = {"request": {"method": "GET", "path": "/"}, "started_at": started}
        cassette.write_text(f"{HEAD}\n{json.dumps({'exchange': exchange})}\n")
        code, output = cli("import", str(cassette), "--db", str(tmp_path / "into.db"))
        assert code == 2
        line = one_error_line(output)
        assert line.startswith(f"Error: {cassette}:2: exchange: started_at: ") and "ISO 8601" in line
    assert not (tmp_path / "into.db").exists()


def test_a_start_time_to_the_nanosecond_is_imported_to_the_nanosecond(tmp_path: Path) -> None:
    """A start time with nine digits past the second, as a log holds it, was imported with
    six, its last three lost; one with six, as older cassettes give, imports as it did."""
    second = 1_796_035_200 * 10**9  # 2026-11-30T10:40:00Z
    given = {
        "2026-11-30T10:40:00.123456789Z": second + 123_456_789,
        "2026-11-30T11:40:00.987654321+01:00": second + 987_654_321,
        "2026-11-30T10:40:00.1234567Z": second + 123_456_700,
        "2026-11-30T10:40:00.123456Z": second + 123_456_000,
        "2026-11-30T10:40:00Z": second,
    }
    cassette, db = tmp_path / "times.jsonl", tmp_path / "into.db"
    write_cassette(cassette, [Recorded(method="GET", path="/", status=204, started_at=t) for t in given])
    assert cli("import", str(cassette), "--db", str(db))[0] == 0
    with EventLog(db) as log:
        assert [x["started_ns"] for x in log.exchanges()] == list(given.values())


def test_a_mistyped_outcome_is_refused_naming_the_outcomes(tmp_path: Path) -> None:
    """It was read as a stream that ended whole, by check, import and replay alike."""
    cassette = tmp_path / "typo.jsonl"
    cassette.write_text(
        f"{HEAD}\n{GET}\n"
        '{"chunk": {"offset_ms": 1, "text": "data: 1\\n\\n"}}\n'
        '{"end": {"duration_ms": 3, "outcome": "upstream_disconected"}}\n'
    )
    for command in (["check", str(cassette)], ["import", str(cassette), "--db", str(tmp_path / "t.db")]):
        code, output = cli(*command)
        assert code != 0, output
        assert f"{cassette}:4: end: outcome: " in output and "'upstream_disconnected'" in output
        assert "'log_closed'" in output and "Traceback" not in output
    with pytest.raises(CassetteError, match=r"typo\.jsonl:4: end: outcome: .*'complete'"):
        load([cassette])


def test_import_keeps_bodies_past_the_recorders_cap(tmp_path: Path) -> None:
    """A body past 16 MiB (a recorder's cap) was cut to it on import, unsaid, and flagged
    truncated as if the recording had been."""
    size = 17 * 2**20
    cassette, db = tmp_path / "big.jsonl", tmp_path / "big.db"
    exchange = {"request": {"method": "GET", "path": "/big"}, "response": {"status": 200, "sse": False}}
    chunk = {"chunk": {"offset_ms": 1, "text": "x" * size}}
    cassette.write_text(f"{HEAD}\n{json.dumps({'exchange': exchange})}\n{json.dumps(chunk)}\n")
    code, output = cli("import", str(cassette), "--db", str(db))
    assert code == 0, output
    with EventLog(db) as log:
        (row,) = log.exchanges()
        assert len(log.body(row["id"])) == size and not row["response_body_truncated"]


def test_the_cassettes_page_says_importing_again_adds_nothing_and_it_does(tmp_path: Path) -> None:
    """The page said so, and further down that importing one twice adds it twice."""
    page = (ROOT / "docs" / "cassettes.md").read_text()
    assert "importing it again adds nothing" in page
    assert "twice, as two captures" not in page
    cassette, db = tmp_path / "c.jsonl", tmp_path / "c.db"
    cassette.write_text(f"{HEAD}\n{GET}\n")
    assert cli("import", str(cassette), "--db", str(db))[0] == 0
    code, output = cli("import", str(cassette), "--db", str(db))
    assert code == 0 and "nothing added" in output
    with EventLog(db) as log:
        assert len(log.exchanges()) == 1


def test_the_upstream_is_that_of_the_exchanges_exported_and_import_keeps_it(tmp_path: Path) -> None:
    """Export named the upstream of every capture of the log; import kept none."""
    log, theirs = tmp_path / "mixed.db", tmp_path / "theirs.jsonl"
    theirs.write_text(json.dumps({"tasktape_cassette": 1, "upstream": "http://agent.example"}) + f"\n{GET}\n")
    with LogWriter(log) as writer:
        ours = started_stream(writer, upstream="http://127.0.0.1:9")
        writer.end_exchange(ours, duration_ns=4_000_000)
    assert cli("import", str(theirs), "--db", str(log))[0] == 0
    with EventLog(log) as opened:
        assert [c["upstream"] for c in opened.captures()] == ["http://127.0.0.1:9", "http://agent.example"]
    for chosen, upstream in (("1", "http://127.0.0.1:9"), ("2", "http://agent.example")):
        out = tmp_path / f"{chosen}.jsonl"
        assert cli("export", str(log), "-o", str(out), "--exchange", chosen, "--no-cards")[0] == 0
        assert lines(out)[0]["upstream"] == upstream
    both = tmp_path / "both.jsonl"
    assert cli("export", str(log), "-o", str(both))[0] == 0
    assert lines(both)[0]["upstream"] is None  # two upstreams: no one of them


def test_export_of_a_log_without_exchanges_says_so(tmp_path: Path) -> None:
    log = tmp_path / "empty.db"
    with LogWriter(log) as writer:
        writer.begin_capture(source="record")
    code, output = cli("export", str(log), "-o", str(tmp_path / "e.jsonl"))
    assert code == 1
    assert one_error_line(output) == f"Error: {log} has no exchanges: there is nothing to export"
    assert not (tmp_path / "e.jsonl").exists()


def test_each_choice_that_matches_nothing_is_an_error(tmp_path: Path) -> None:
    """An unknown task beside a known exchange was left out unsaid."""
    log, out = tmp_path / "one.db", tmp_path / "out.jsonl"
    with LogWriter(log) as writer:
        writer.end_exchange(started_stream(writer), duration_ns=4_000_000)
    for choice in (["--task", "nosuch"], ["--context", "nosuch"], ["--exchange", "9"]):
        code, output = cli("export", str(log), "-o", str(out), "--exchange", "1", *choice)
        assert code == 1
        what = f"{choice[0].removeprefix('--')} {choice[1]}"
        assert one_error_line(output) == f"Error: {log}: nothing matches {what}; nothing written"
        assert not out.exists()
    assert cli("export", str(log), "-o", str(out), "--exchange", "1")[0] == 0


def test_merge_and_import_make_the_folder_they_write_in_as_export_does(tmp_path: Path) -> None:
    log, output = tmp_path / "a.db", tmp_path / "missing" / "dir" / "m.db"
    with LogWriter(log) as writer:
        writer.begin_capture(source="record")
    code, said = cli("merge", str(log), "-o", str(output))
    assert code == 0, said
    assert output.is_file()
    cassette, into = tmp_path / "c.jsonl", tmp_path / "new" / "sub" / "i.db"
    cassette.write_text(f"{HEAD}\n{GET}\n")
    code, said = cli("import", str(cassette), "--db", str(into))
    assert code == 0, said
    assert into.is_file()


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        ({"method": "G\nET", "path": "/"}, "request.method"),
        ({"method": "GET", "path": "/a\r\nX: y"}, "request.path"),
        ({"method": "GET", "path": "/", "query": "a=1\r\nX: y"}, "request.query"),
    ],
)
def test_a_line_break_in_the_request_line_is_refused(tmp_path: Path, request_: dict, field: str) -> None:
    """Only headers were checked for CR and LF."""
    cassette = tmp_path / "split.jsonl"
    cassette.write_text(f"{HEAD}\n{json.dumps({'exchange': {'request': request_}})}\n")
    code, output = cli("import", str(cassette), "--db", str(tmp_path / "s.db"))
    assert code == 2
    line = one_error_line(output)
    assert line.startswith(f"Error: {cassette}:2: exchange: {field}: ") and "CR, LF or NUL" in line
    assert not (tmp_path / "s.db").exists()


def test_a_cassette_changed_after_it_was_checked_is_not_imported(tmp_path: Path) -> None:
    """A cassette is read twice, checked through before anything is written, then written an
    exchange at a time: one replaced in between would be imported unchecked, under the uid
    of the bytes that were checked."""
    big, small, db = tmp_path / "big.jsonl", tmp_path / "small.jsonl", tmp_path / "into.db"
    chunk = '{"chunk": {"offset_ms": 1, "text": "data: {}\\n\\n"}}'
    big.write_text(f"{HEAD}\n" + f"{GET}\n{chunk}\n" * 10_000)  # written in seconds
    small.write_text(f"{HEAD}\n{GET}\n")
    args = [sys.executable, "-m", "tasktape", "import", str(big), str(small), "--db", str(db)]
    with subprocess.Popen(args, stderr=subprocess.PIPE, text=True) as child:
        while rows_in(db, "exchanges") == 0 and child.poll() is None:
            time.sleep(0.01)
        # Both are checked before anything is written: small.jsonl is changed after.
        small.with_suffix(".new").write_text(f"{HEAD}\n{GET}\n{GET}\n")
        small.with_suffix(".new").replace(small)
        said = child.stderr.read()
    assert child.returncode == 1, said
    assert said.splitlines()[-1] == f"Error: {small} changed after it was checked: not imported"
    assert said.startswith(f"tasktape import: 10000 exchanges from {big} -> {db}\n")
    assert rows_in(db, "captures") == 1 and rows_in(db, "exchanges") == 10_000


def test_export_says_what_is_wrong_with_an_output_name_the_system_refuses(tmp_path: Path) -> None:
    """A name too long for the system printed a traceback."""
    log, output = tmp_path / "a.db", tmp_path / f"{'a' * 260}.jsonl"
    with LogWriter(log) as writer:
        writer.begin_capture(source="record")
    code, said = cli("export", str(log), "-o", str(output))
    assert code == 2
    assert one_error_line(said) == f"Error: cannot write {output}: File name too long"


def test_export_writes_over_a_cassette_but_no_other_file(tmp_path: Path) -> None:
    """`export -o notes.txt` replaced the notes with a cassette, where `merge -o notes.txt`
    refuses: a file that is no cassette is left as it is. A cassette is replaced, as always."""
    log, notes, old = tmp_path / "a.db", tmp_path / "notes.txt", tmp_path / "old.jsonl"
    with LogWriter(log) as writer:
        started_stream(writer)
    notes.write_text("hello notes\n")
    code, said = cli("export", str(log), "-o", str(notes))
    assert code == 2
    assert one_error_line(said) == (
        f"Error: {notes} is a file that is neither an event log nor a cassette: export writes a"
        " cassette, not over it"
    )
    assert notes.read_text() == "hello notes\n"
    old.write_text(f"{HEAD}\n{GET}\n")
    assert cli("export", str(log), "-o", str(old))[0] == 0
    assert [r.path for r in read_cassette(old)] == ["/message:stream"]


def test_a_log_imported_into_itself_is_not_told_to_merge_into_itself(tmp_path: Path) -> None:
    """`import d.db --db d.db` suggested `tasktape merge d.db -o d.db`, which merge refuses."""
    log = tmp_path / "d.db"
    with LogWriter(log) as writer:
        writer.begin_capture(source="record")
    (tmp_path / "link.db").symlink_to(log)
    for given in (log, tmp_path / "link.db"):
        code, said = cli("import", str(given), "--db", str(log))
        assert code == 2
        assert one_error_line(said) == (
            f"Error: {given} is the event log --db names: a log is not imported into itself"
        )


def gzip_request_log(path: Path) -> Path:
    """A log of two requests sent gzip-encoded: one stored decoded, one past max_decoded
    kept as sent (with the error that says so)."""
    small, large = gzip.compress(b'{"a": 1}'), gzip.compress(b"x" * 4096)
    with LogWriter(path, max_decoded=1024) as writer:
        capture = writer.begin_capture(source="record")
        for body in (small, large):
            exchange = writer.begin_exchange(
                capture,
                method="POST",
                path="/echo",
                request_headers=[("Content-Encoding", "gzip"), ("Content-Type", "application/json")],
                request_body=body,
            )
            writer.response_head(exchange, status=204, headers=[], is_sse=False, ttfb_ns=1)
            writer.end_exchange(exchange, duration_ns=2)
    return path


def request_rows(db: Path) -> list[tuple]:
    with EventLog(db) as log:
        return [(x["request_body"], x["request_body_encoding"], x["error"]) for x in log.exchanges()]


@pytest.mark.parametrize("redact", [[], ["--redact-json", "/a"]])
def test_a_request_body_decoded_or_kept_as_sent_goes_round_trip_unchanged(
    tmp_path: Path, redact: list[str]
) -> None:
    """Its Content-Encoding was lost in the cassette: import decoded the decoded body again
    (a new error, and with --redact-json no body), and a body kept as sent was decoded."""
    log = gzip_request_log(tmp_path / "gz.db")
    assert cli("export", str(log), "-o", str(tmp_path / "gz.jsonl"))[0] == 0
    cassette_requests = [line["exchange"]["request"] for line in lines(tmp_path / "gz.jsonl")[1::2]]
    assert [r.get("decoded_from") for r in cassette_requests] == ["gzip", "identity"]
    original = request_rows(log)
    assert original[0] == ('{"a": 1}', "gzip", None)
    copy = tmp_path / "copy.db"
    assert cli("import", str(tmp_path / "gz.jsonl"), "--db", str(copy), *redact)[0] == 0
    if not redact:
        assert request_rows(copy) == original
        assert cli("export", str(copy), "-o", str(tmp_path / "again.jsonl"))[0] == 0
        assert lines(tmp_path / "again.jsonl")[1:] == lines(tmp_path / "gz.jsonl")[1:]
        return
    decoded, as_sent = request_rows(copy)
    assert (json.loads(decoded[0]), *decoded[1:]) == ({"a": "[REDACTED]"}, "gzip", None)
    # Kept as sent, it cannot be redacted: it is not stored, as a recording would not.
    assert as_sent[0] is None and "it is not stored, since it could not be redacted" in as_sent[2]


def test_a_body_the_recorder_cut_stays_cut_through_import(tmp_path: Path) -> None:
    """Imported, a body cut at max_body lost its flag: replay served it as whole."""
    log, cassette, copy = tmp_path / "cut.db", tmp_path / "cut.jsonl", tmp_path / "copy.db"
    with LogWriter(log, max_body=4) as writer:
        exchange = writer.begin_exchange(writer.begin_capture(source="record"), method="GET", path="/big")
        writer.response_head(exchange, status=200, headers=[], is_sse=False, ttfb_ns=1)
        writer.chunk(exchange, 2, b"0123456789")
        writer.end_exchange(exchange, duration_ns=3)
    assert cli("export", str(log), "-o", str(cassette))[0] == 0
    assert lines(cassette)[1]["exchange"]["response"]["body_truncated"] is True
    assert cli("import", str(cassette), "--db", str(copy))[0] == 0
    with EventLog(copy) as imported:
        (row,) = imported.exchanges()
        assert (imported.body(row["id"]), row["response_body_truncated"]) == (b"0123", 1)
    (replayed,) = load([copy])
    assert replayed.response_body_truncated


def test_a_reconnect_whose_stream_was_left_out_is_refused_not_rebound(tmp_path: Path) -> None:
    """reconnect_of counts back: with its stream taken out it named the agent card, and
    the card was imported as the stream resumed."""
    card = Recorded(method="GET", path="/.well-known/agent-card.json", status=200, chunks=[(1, b"{}")])
    stream = Recorded(method="POST", path="/message:stream", status=200, is_sse=True)
    reconnect = Recorded(
        method="GET", path="/tasks/t:subscribe", status=200, is_sse=True, reconnect_of=-1, chunks=[(1, b"x")]
    )
    whole = tmp_path / "whole.jsonl"
    write_cassette(whole, [card, stream, reconnect])
    kept = [line for line in whole.read_text().splitlines() if "/message:stream" not in line]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(kept[:4] + kept[5:]) + "\n")  # its end line out too
    code, output = cli("import", str(cut), "--db", str(tmp_path / "cut.db"))
    assert code != 0
    assert one_error_line(output).endswith(
        "cut.jsonl:5: reconnect_of -1 names the exchange of line 2, which is no event stream:"
        " a reconnect resumes a stream (was the stream left out?)"
    )
    with pytest.raises(
        CassetteError, match="reconnect_of -1 names the exchange of line 2, which is no event"
    ):
        write_cassette(tmp_path / "two.jsonl", [card, reconnect])
    assert not (tmp_path / "two.jsonl").exists()


@pytest.mark.parametrize("method", ["GE\x1b]0;PWN\x07T", "GE T", "GET\x7f", "G\u00cbT"], ids=ascii)
def test_a_method_that_is_no_http_token_is_refused(tmp_path: Path, method: str) -> None:
    """A method holding ESC and BEL (a terminal's title, set as the exchange was printed)
    was imported: a method is a token, as the line of every request sent holds it."""
    cassette = tmp_path / "method.jsonl"
    cassette.write_text(f"{HEAD}\n{json.dumps({'exchange': {'request': {'method': method, 'path': '/'}}})}\n")
    code, output = cli("import", str(cassette), "--db", str(tmp_path / "m.db"))
    assert code == 2
    line = one_error_line(output)
    assert line.startswith(f"Error: {cassette}:2: exchange: request.method: ")
    assert "a method is a token" in line
    assert not (tmp_path / "m.db").exists()
    with pytest.raises(CassetteError, match="a method is a token"):
        read_cassette(cassette)


def test_a_log_whose_name_is_not_utf8_is_exported_its_name_escaped_in_json(tmp_path: Path) -> None:
    """Exported, a log whose file name is no UTF-8 (byte 0xfe) ended in a traceback
    (UnicodeEncodeError): the header's source held the name as Python decodes it. The byte
    is written as a JSON escape, which reads back as the same name."""
    log = tmp_path / os.fsdecode(b"bad\xfe.db")
    with LogWriter(log) as writer:
        exchange = started_stream(writer)
        writer.end_exchange(exchange, duration_ns=4_000_000)
    cassette = tmp_path / os.fsdecode(b"out\xfe.jsonl")
    code, output = cli("export", str(log), "-o", str(cassette))
    assert code == 0, output
    said = f"tasktape export: 1 exchange from {tmp_path}/bad\\udcfe.db -> {tmp_path}/out\\udcfe.jsonl\n"
    assert output == said
    header = cassette.read_bytes().split(b"\n")[0]
    assert b'"source": "bad\\udcfe.db"' in header
    assert os.fsencode(json.loads(header)["source"]) == b"bad\xfe.db"
    code, output = cli("import", str(cassette), "--db", str(tmp_path / "again.db"))
    assert code == 0, output
    assert rows_in(tmp_path / "again.db", "exchanges") == 1


def test_the_pytest_plugin_says_a_cassette_error_as_a_console_line(pytester: pytest.Pytester) -> None:
    """A cassette that cannot be read failed its test with the error as it came: a control
    character in its name (or in what the error quotes of it) reached the terminal."""
    (pytester.path / "cassettes").mkdir()
    (pytester.path / "cassettes" / "bad\x1b[31m.jsonl").write_text("not json\n")
    pytester.makepyfile(
        test_bad="""
        import pytest

        @pytest.mark.tasktape("cassettes/bad\\x1b[31m.jsonl")
        def test_card(tasktape):
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    said = result.stdout.str()
    assert "\x1b" not in said and "bad\\x1b[31m.jsonl:1: not JSON" in said, said
