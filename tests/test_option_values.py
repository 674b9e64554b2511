"""Option values that meant nothing, or something not asked for, refused as usage errors
(status 2) saying what a value looks like: an empty one (an unset shell variable's), a
time in seconds no one means, an empty address to listen on. And what options take, as
their help says it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tasktape.cli import main

ROOT = Path(__file__).resolve().parent.parent
COMPLETED = ROOT / "cassettes" / "completed.jsonl"
RECORD = ("record", "--upstream", "http://127.0.0.1:9", "--listen", "0")


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [*map(str, args)])


def tasktape(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The command run to its end, as a shell runs it (one that would serve is stopped)."""
    command = [sys.executable, "-m", "tasktape", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("replay", COMPLETED, "--listen", "0", "--ignore", ""),
            "an empty JSON pointer is the whole body: name a field",
        ),
        (("diff", COMPLETED, COMPLETED, "--ignore", ""), "an empty JSON pointer is the whole body"),
        (
            ("replay", COMPLETED, "--listen", "0", "--redact-json", ""),
            "an empty JSON pointer is the whole body",
        ),
        (
            ("replay", COMPLETED, "--listen", "0", "--match-header", ""),
            "an empty value names nothing: give a header's name",
        ),
        (
            ("replay", COMPLETED, "--listen", "0", "--fault", ""),
            "an empty value names nothing: give a fault spec",
        ),
        (
            ("replay", COMPLETED, "--listen", "0", "--redact-header", ""),
            "an empty value names nothing: give a header's name",
        ),
        (
            ("replay", COMPLETED, "--listen", "0", "--redact-query", " "),
            "an empty value names nothing: give a query parameter",
        ),
        (("import", COMPLETED, "--db", "x.db", "--redact-header", ""), "an empty value names nothing"),
    ],
    ids=[
        "replay-ignore",
        "diff-ignore",
        "redact-json",
        "match-header",
        "fault",
        "redact-header",
        "query",
        "import",
    ],
)
def test_an_empty_value_of_a_repeated_option_is_refused(
    tmp_path: Path, args: tuple[str | Path, ...], said: str
) -> None:
    """An empty --ignore was the whole document, so request bodies stopped mattering to
    matching; the other options took an empty value and did nothing."""
    done = tasktape(*(tmp_path / a if a == "x.db" else a for a in args))
    assert not (tmp_path / "x.db").exists()
    assert done.returncode == 2, done.stderr
    assert said in " ".join(done.stderr.split())


@pytest.mark.parametrize("option", ["--hold", "--rejoin-for"])
@pytest.mark.parametrize("seconds", ["1e20", "1e300", "604801"])
def test_a_resume_time_past_a_week_is_refused(tmp_path: Path, option: str, seconds: str) -> None:
    """--hold 1e300 crashed (OverflowError) when a resuming recorder read its log, 1e20
    with a timestamp out of range."""
    done = tasktape(*RECORD, "--db", tmp_path / "r.db", "--resume", option, seconds)
    assert done.returncode == 2, done.stderr
    assert f"{seconds} seconds is longer than a week: it is at most 604800" in done.stderr
    assert not (tmp_path / "r.db").exists()


def test_a_time_that_is_no_number_is_said_as_a_time() -> None:
    """click words it by the type's name: "'soon' is not a valid seconds." read badly."""
    done = tasktape(*RECORD, "--hold", "soon")
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--hold': 'soon' is not a valid time in seconds." in done.stderr


def test_the_drain_time_past_a_week_is_refused(tmp_path: Path) -> None:
    done = tasktape(
        *RECORD, "--db", tmp_path / "r.db", "--ship", "nats://127.0.0.1:9", "--ship-drain", "1e20"
    )
    assert done.returncode == 2, done.stderr
    assert "1e20 seconds is longer than a week" in done.stderr


def test_inspect_refuses_an_empty_host(tmp_path: Path) -> None:
    """An empty --host listened on every interface and printed URLs without a host."""
    db = tmp_path / "c.db"
    assert run("import", COMPLETED, "--db", db).exit_code == 0
    done = tasktape("inspect", db, "--host", "", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "Invalid value for '--host': an address is needed: 127.0.0.1" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("option", ["--ack-wait", "--until-idle"])
def test_a_collectors_time_past_a_week_is_refused(tmp_path: Path, option: str) -> None:
    """Seconds as every command takes them: before the broker is asked (it took 1e300 as
    nanoseconds past 64 bits)."""
    done = tasktape("collect", "nats://127.0.0.1:9", "--db", tmp_path / "c.db", option, "1e300")
    assert done.returncode == 2, done.stderr
    assert "1e300 seconds is longer than a week" in done.stderr
    assert not (tmp_path / "c.db").exists()


def helped(*args: str) -> str:
    """A command's --help, on lines long enough that no word is broken at its hyphen."""
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=10_000, max_content_width=10_000)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_replays_redaction_options_say_what_they_redact_in_one_sentence() -> None:
    """Each read "In what record-missing records and what misses report: Also redact this
    header": a prefix, then a sentence of its own."""
    text = helped("replay")
    where = "what record-missing records and what misses report"
    assert f"Also redact this header in {where} (repeatable)." in text
    assert (
        f"Also redact the value of this query parameter and of the form field of that name in {where}" in text
    )
    assert f"Redact this JSON field in request bodies, response bodies and events of {where}: a JSON" in text
    assert "report: Also" not in text


def test_export_makes_the_folder_of_its_output_as_its_help_says(tmp_path: Path) -> None:
    """It made missing folders, said in import's and merge's help but not in export's."""
    assert "The cassette to write, its folder created if needed" in helped("export")
    db, cassette = tmp_path / "c.db", tmp_path / "cassettes" / "new" / "c.jsonl"
    assert run("import", COMPLETED, "--db", db).exit_code == 0
    result = run("export", db, "-o", cassette)
    assert result.exit_code == 0, result.output
    assert cassette.read_text().startswith('{"tasktape_cassette"')
