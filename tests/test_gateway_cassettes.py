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
from tasktape.eventlog import EventLog
from tasktape.eventlog.cassette import read_cassette
from tasktape.eventlog.checker import report_log, report_recorded


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
