"""A resume gateway's log exported as a cassette keeps which exchanges the gateway answered
from a stream it held (a reconnect's slice of that stream): the cassette checks as the log
does, and imported, its log has the reconnect in ``resumes`` again."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from conftest import RecordFactory
from test_resume_gateway import reconnected_once

from tasktape.cli import main
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.checker import report_log, report_recorded
from tasktape.eventlog.merge import merge_logs
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide


async def test_a_gateway_cassette_checks_and_imports_as_its_log(
    record: RecordFactory, tmp_path: Path
) -> None:
    rec = await reconnected_once(record)
    with await rec.log() as log:
        original = report_log(log)
        resumed = log.db.execute(
            "SELECT exchange_id, new_exchange_id, last_event_id, outcome FROM resumes"
        ).fetchall()
    assert (original.findings, original.reconnects, original.streams) == ([], 1, 1)
    cassette = tmp_path / "gateway.jsonl"
    runner = CliRunner()
    assert runner.invoke(main, ["export", str(rec.db), "-o", str(cassette)]).exit_code == 0
    lines = [json.loads(line) for line in cassette.read_text().splitlines()[1:]]
    exchanges = [line["exchange"] for line in lines if "exchange" in line]
    assert [x.get("reconnect_of") for x in exchanges] == [None, -1]  # the stream, then its reconnect
    report = report_recorded(read_cassette(cassette))
    assert (report.findings, report.reconnects, report.streams) == ([], 1, 1)

    imported = tmp_path / "imported.db"
    assert runner.invoke(main, ["import", str(cassette), "--db", str(imported)]).exit_code == 0
    with EventLog(imported) as log:
        again = report_log(log)
        rows = log.db.execute(
            "SELECT exchange_id, new_exchange_id, last_event_id, outcome, at_ns FROM resumes"
        )
        ((stream, reconnect, last_id, outcome, at_ns),) = rows.fetchall()
        started = log.db.execute("SELECT started_ns FROM exchanges WHERE id = ?", (reconnect,)).fetchone()[0]
    assert (again.findings, again.reconnects, again.streams) == ([], 1, 1)
    assert [(stream, reconnect, last_id, outcome)] == resumed
    assert started <= at_ns < started + 10**9  # when the reconnect was answered, not when imported
    result = runner.invoke(main, ["check", str(cassette)])
    assert result.exit_code == 0 and "1 reconnect" in result.output, result.output


def resumed_log(path: Path) -> Path:
    """A stream, a client's reconnect the gateway answered from it, one it refused, and the
    agent's side given up on: each kind of row of ``resumes``."""
    sse = [("Content-Type", "text/event-stream")]
    with LogWriter(path) as w:
        capture = w.begin_capture(source="record")
        start = 1_800_000_000_000_000_000
        exchanges = []
        for n, last_id in enumerate([None, "e1", "bogus"]):
            headers = [] if last_id is None else [("Last-Event-ID", last_id)]
            x = w.begin_exchange(
                capture, method="GET", path="/stream", request_headers=headers, started_ns=start + n * 10**9
            )
            w.response_head(x, status=200 if n < 2 else 400, headers=sse, is_sse=n < 2, ttfb_ns=1000)
            if n < 2:
                w.chunk(x, 2000, b"id: e2\ndata: {}\n\n")
            w.end_exchange(x, duration_ns=3000)
            exchanges.append(x)
        stream, reconnect, refused = exchanges
        w.resume(
            Resume(stream, ResumeSide.CLIENT, ResumeOutcome.RESUMED, "e1", 1, reconnect),
            at_ns=start + 10**9 + 1_234_567,
        )
        w.resume(
            Resume(
                stream,
                ResumeSide.CLIENT,
                ResumeOutcome.REFUSED,
                "bogus",
                None,
                refused,
                error="no such event",
            ),
            at_ns=start + 2 * 10**9 + 7_000,
        )
        w.resume(
            Resume(stream, ResumeSide.UPSTREAM, ResumeOutcome.GAVE_UP, "e2", attempts=3, error="refused"),
            at_ns=start + 5 * 10**9,
        )
    return path


def resume_rows(path: Path) -> list[tuple]:
    """Its resumes, exchanges named by uid."""
    with EventLog(path) as log:
        return log.db.execute(
            "SELECT s.uid, n.uid, r.side, r.outcome, r.last_event_id, r.events_from_log, r.attempts,"
            " r.error, r.at_ns FROM resumes r JOIN exchanges s ON s.id = r.exchange_id"
            " LEFT JOIN exchanges n ON n.id = r.new_exchange_id ORDER BY r.at_ns"
        ).fetchall()


def test_every_resume_row_survives_export_and_import_and_merges_once(tmp_path: Path) -> None:
    """Only a reconnect answered was written, rebuilt without what it sent; a refusal and
    the agent's side were lost; merged with its original, the reconnect was there twice."""
    log, cassette, copy = resumed_log(tmp_path / "r.db"), tmp_path / "r.jsonl", tmp_path / "copy.db"
    runner = CliRunner()
    assert runner.invoke(main, ["export", str(log), "-o", str(cassette)]).exit_code == 0
    assert runner.invoke(main, ["import", str(cassette), "--db", str(copy)]).exit_code == 0
    assert resume_rows(copy) == resume_rows(log)
    assert len(resume_rows(log)) == 3
    (report,) = merge_logs([log], copy)
    assert report.resumes == 0 and len(resume_rows(copy)) == 3


def test_a_reconnect_imported_from_an_older_cassette_merges_with_its_original_once(tmp_path: Path) -> None:
    """A cassette that gives only reconnect_of makes the reconnect's row anew, at another
    time: merge took it for another resume and held it twice."""
    log, cassette, copy = resumed_log(tmp_path / "r.db"), tmp_path / "r.jsonl", tmp_path / "copy.db"
    assert CliRunner().invoke(main, ["export", str(log), "-o", str(cassette)]).exit_code == 0
    older = [json.loads(line) for line in cassette.read_text().splitlines()]
    for line in older:
        line.get("exchange", {}).pop("resumes", None)
    cassette.write_text("".join(json.dumps(line) + "\n" for line in older))
    assert CliRunner().invoke(main, ["import", str(cassette), "--db", str(copy)]).exit_code == 0
    (report,) = merge_logs([log], copy)
    assert report.resumes == 2  # the refusal and the agent's side, which it lacked
    outcomes = sorted(row[3] for row in resume_rows(copy))
    assert outcomes == ["gave_up", "refused", "resumed"]


def test_a_reconnect_exported_alone_brings_the_stream_it_resumed(tmp_path: Path) -> None:
    """Exported alone, a reconnect was written as an ordinary stream, with no word, and
    checked as one (findings its log has not)."""
    log, cassette = resumed_log(tmp_path / "r.db"), tmp_path / "one.jsonl"
    result = CliRunner().invoke(main, ["export", str(log), "--exchange", "2", "-o", str(cassette)])
    assert result.exit_code == 0, result.output
    assert "2 exchanges from" in result.output
    exchanges = [
        line["exchange"] for line in map(json.loads, cassette.read_text().splitlines()) if "exchange" in line
    ]
    assert [(x["request"]["headers"], x.get("reconnect_of")) for x in exchanges] == [
        ([], None),
        ([["Last-Event-ID", "e1"]], -1),
    ]
    assert report_recorded(read_cassette(cassette)).reconnects == 1
