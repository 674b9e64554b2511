"""What the ``tasktape`` command loads: sqlite-utils without the numpy and pandas it
imports when they are installed (a third of a second no command has a use for), and only
for commands that open a log."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from tasktape.eventlog.cassette import write_cassette
from tasktape.eventlog.recorded import Recorded


def imported_by(*args: str) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tasktape", *args],
        check=False,
        capture_output=True,
        text=True,
    )
    # diff and check find differences (1); a cassette the command refuses is a usage error (2)
    assert result.returncode in (0, 1, 2), result.stderr[-2000:]
    return {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()}


def test_commands_that_open_a_log_load_sqlite_utils_without_numpy_or_pandas(tmp_path: Path) -> None:
    assert importlib.util.find_spec("numpy") is not None  # else this shows nothing
    cassette, db, out = tmp_path / "c.jsonl", tmp_path / "c.db", tmp_path / "out.jsonl"
    write_cassette(cassette, [Recorded(method="GET", path="/", status=200, chunks=[(0, b"hi")])])
    for args in (
        ["import", str(cassette), "--db", str(db)],
        ["export", str(db), "-o", str(out)],
        ["check", str(db)],
        ["diff", str(db), str(db)],
    ):
        imported = imported_by(*args)
        assert "sqlite_utils" in imported and not imported & {"numpy", "pandas"}, args
    assert "sqlite_utils" not in imported_by("diff", str(cassette), str(out))  # cassettes alone


def test_they_are_hidden_from_sqlite_utils_alone() -> None:
    """What imports them afterwards (a protocol plug-in) still can; what imported them
    before keeps them."""
    code = (
        "import sys; sys.argv[1:] = ['export', '--help']\n"
        "from tasktape.cli import run\n"
        "try:\n    run()\nexcept SystemExit:\n    pass\n"
        "import numpy, sqlite_utils.db\n"
        "assert sqlite_utils.db.np is None and numpy.zeros(1).size == 1"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    code = (
        "import sys, numpy; sys.argv[1:] = ['export', '--help']\n"
        "from tasktape.cli import run\n"
        "try:\n    run()\nexcept SystemExit:\n    pass\n"
        "import sqlite_utils.db\n"
        "assert sqlite_utils.db.np is numpy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_a_cassette_tasktape_wrote_is_imported_without_pydantic(tmp_path: Path) -> None:
    """Its lines are read without the cassette's models (pydantic, a tenth of a second of
    start-up); a hand-written line, or a wrong one, loads them to read it or word why not."""
    cassette, db = tmp_path / "c.jsonl", tmp_path / "c.db"
    r = Recorded(
        method="POST",
        path="/s",
        query="a=1",
        request_headers=[("Accept", "*/*")],
        request_body=b"{}",
        status=200,
        response_headers=[("Content-Type", "text/event-stream")],
        is_sse=True,
        chunks=[(1, b"x")],
    )
    cut = Recorded(method="GET", path="/", error="cut", outcome="client_disconnected")
    write_cassette(cassette, [r, cut])
    imported = imported_by("import", str(cassette), "--db", str(db))
    assert "tasktape.eventlog.cassette" in imported and "pydantic" not in imported
    lines = cassette.read_text().splitlines()
    lines.insert(2, '{"event": {"offset_ms": 2, "data": "by hand"}}')
    cassette.write_text("\n".join(lines) + "\n")
    assert "pydantic" in imported_by("import", str(cassette), "--db", str(tmp_path / "d.db"))
