"""A third-party protocol installed through the ``tasktape.protocols`` entry point: it is
found, asked before the built-in protocols, and used by the log writer (the exchange's
protocol, its events' kinds and text, its stream_summary row) and by the checker; a plug-in
that does not load, or whose reader raises, costs only its classification, never the
recording.

The plug-in is the one docs/protocols.md shows (Quill, JSON lines over SSE): its module,
its pyproject.toml entry point and its cassette are read from the page, so the page and
this test cannot drift apart."""

from __future__ import annotations

import importlib
import logging
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from docs_examples import DOCS, blocks

from tasktape import read_cassette
from tasktape.eventlog import EventLog, LogWriter
from tasktape.eventlog import protocols as registry
from tasktape.eventlog.checker import all_rules, check_log, protocol_names
from tasktape.eventlog.protocols import Request, by_name, protocols, recognise
from tasktape.eventlog.protocols.base import Protocol
from tasktape.eventlog.protocols.guard import Guarded
from tasktape.eventlog.protocols.mcp import MCPKind
from tasktape.eventlog.recorded import Recorded

PAGE = DOCS / "protocols.md"
BUILT_IN = ["a2a", "mcp", "anthropic", "openai"]
QUILL = Request("POST", "/v1/generate", [("Content-Type", "application/json"), ("Quill-Version", "1")], b"{}")


def page_file(title: str) -> str:
    """The block of docs/protocols.md titled ``title``."""
    (block,) = [b for b in blocks(PAGE) if b.title == title]
    return block.body


@dataclass
class Site:
    """A folder on sys.path that plug-ins are installed into, as pip would: modules, and
    a ``*.dist-info`` folder whose entry_points.txt names them."""

    folder: Path
    modules: set[str] = field(default_factory=set)

    def install(self, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
        for name, source in modules.items():
            (self.folder / f"{name}.py").write_text(source)
            self.modules.add(name)
        info = self.folder / f"{dist.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        points = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{points}")
        importlib.invalidate_caches()

    def install_quill(self) -> None:
        """The plug-in exactly as docs/protocols.md packages it."""
        pyproject = tomllib.loads(page_file("pyproject.toml"))
        project = pyproject["project"]
        (module,) = pyproject["tool"]["setuptools"]["py-modules"]
        self.install(
            project["name"],
            project["entry-points"][registry.ENTRY_POINT_GROUP],
            {module: page_file(f"{module}.py")},
        )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Site]:
    """Plug-ins installed for one test; the registry forgets them before and after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    registry.protocols.cache_clear()
    installed = Site(folder)
    yield installed
    registry.protocols.cache_clear()
    for name in installed.modules:
        sys.modules.pop(name, None)


def record(db: Path, recorded: list[Recorded]) -> None:
    """Write exchanges through a LogWriter, the way the recorder does, a few bytes a chunk."""
    with LogWriter(db) as w:
        capture = w.begin_capture(source="test")
        for r in recorded:
            ex = w.begin_exchange(
                capture,
                method=r.method,
                path=r.path,
                request_headers=r.request_headers,
                request_body=r.request_body,
            )
            w.response_head(
                ex, status=r.status or 200, headers=r.response_headers, is_sse=r.is_sse, ttfb_ns=r.ttfb_ns
            )
            for offset, data in r.chunks:
                for i in range(0, len(data), 7):  # events split across chunks
                    w.chunk(ex, offset, data[i : i + 7])
            w.end_exchange(ex, duration_ns=r.duration_ns or 0).result(timeout=10)
        w.end_capture(capture)


def quill_cassette(tmp_path: Path) -> list[Recorded]:
    path = tmp_path / "quill.jsonl"
    path.write_text(page_file("quill.jsonl"))
    return read_cassette(path)


def test_the_page_shows_a_complete_plugin() -> None:
    project = tomllib.loads(page_file("pyproject.toml"))["project"]
    assert project["entry-points"][registry.ENTRY_POINT_GROUP] == {"quill": "quill_tasktape:Quill"}
    assert "class Quill(Protocol):" in page_file("quill_tasktape.py")


def test_an_installed_plugin_is_found_and_asked_before_the_built_in_protocols(site: Site) -> None:
    assert [p.name for p in protocols()] == BUILT_IN
    site.install_quill()
    assert [p.name for p in protocols()] == BUILT_IN  # the registry is read once per process
    registry.protocols.cache_clear()
    assert [p.name for p in protocols()] == ["quill", *BUILT_IN]
    assert recognise(QUILL).name == "quill"
    assert "quill" in protocol_names() and "quill-end-last" in all_rules()
    # An A2A client's header would make it A2A's: the plug-in, asked first, has it.
    both = Request("POST", "/a2a/generate", [*QUILL.headers, ("A2A-Version", "1.0")], b"{}")
    assert by_name("a2a").claims(both)
    assert recognise(both).name == "quill"
    assert recognise(Request("POST", "/a2a/generate", [("A2A-Version", "1.0")], b"{}")).name == "a2a"


def test_the_log_writer_records_the_plugins_exchanges(site: Site, tmp_path: Path) -> None:
    site.install_quill()
    db = tmp_path / "quill.db"
    recorded = quill_cassette(tmp_path)
    record(db, recorded)
    with EventLog(db) as log:
        whole, cut = log.exchanges()
        assert (whole["protocol"], whole["rpc_method"], whole["binding"], whole["session_id"]) == (
            "quill",
            "generate",
            None,
            None,
        )
        events = log.events(whole["id"])
        assert [(e["kind"], e["state"], e["text"]) for e in events] == [
            ("text", None, "Hello"),
            ("text", None, ", world!"),
            ("usage", None, None),
            ("end", "done", None),
        ]
        assert events[2]["usage"] == '{"model":"quill-1","input_tokens":3,"output_tokens":2}'
        assert all(e["parse_error"] is None for e in events)
        assert b"".join(c["data"] for c in log.chunks(whole["id"])) == recorded[0].body
        columns = ("protocol", "model", "answer", "input_tokens", "output_tokens", "finish", "events")
        assert [tuple(r[k] for k in columns) for r in log.stream_summary()] == [
            ("quill", "quill-1", "Hello, world!", 3, 2, "done", 4),
            ("quill", None, "1, 2", None, None, None, 1),
        ]
        # The plug-in's rule runs on its own exchanges.
        findings = check_log(log)
    assert [(f.rule, f.exchange_id, f.seq) for f in findings] == [("quill-end-last", cut["id"], 0)]


BROKEN = "import quill_sdk_not_installed  # what the plug-in needs is missing\n"
THROWS = """
from enum import StrEnum

from tasktape.eventlog.protocols import Protocol


class Claimer(Protocol):
    name = "claimer"
    kinds = StrEnum("ClaimerKind", {"OTHER": "other"})

    def claims(self, request):
        raise RuntimeError("claims boom")
"""


def test_a_plugin_that_does_not_load_is_left_out_and_recording_goes_on(
    site: Site, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    site.install_quill()
    site.install("broken-protocol", {"broken": "broken_protocol:Broken"}, {"broken_protocol": BROKEN})
    site.install("claimer-protocol", {"claimer": "claimer_protocol:Claimer"}, {"claimer_protocol": THROWS})
    with caplog.at_level(logging.WARNING, logger="tasktape"):
        names = [p.name for p in protocols()]
        assert recognise(QUILL).name == "quill"
        chat = b'{"model": "gpt-4o-mini", "messages": []}'
        assert recognise(Request("POST", "/v1/chat/completions", [], chat)).name == "openai"
    assert sorted(names) == sorted(["quill", "claimer", *BUILT_IN]) and names[-4:] == BUILT_IN
    warnings = [r.getMessage() for r in caplog.records if r.name == "tasktape"]
    assert any(
        re.search(r"plug-in broken \(broken_protocol:Broken\) does not load: .*quill_sdk_not_installed", w)
        for w in warnings
    ), warnings
    claims_failed = "protocol claimer: its claims hook raised RuntimeError('claims boom')"
    assert any(claims_failed in w for w in warnings), warnings
    db = tmp_path / "quill.db"
    record(db, quill_cassette(tmp_path))
    with EventLog(db) as log:
        assert [x["protocol"] for x in log.exchanges()] == ["quill", "quill"]
        assert [e["kind"] for e in log.events(1)] == ["text", "text", "usage", "end"]


FLAKY = """
from quill_tasktape import Quill, QuillReader


class FlakyReader(QuillReader):
    def event(self, data, event_type):
        if '"usage"' in data:
            raise KeyError("in")
        return super().event(data, event_type)


class Flaky(Quill):
    name = "flaky"

    def reader(self):
        return FlakyReader()
"""


def test_a_plugin_whose_reader_raises_costs_only_that_events_classification(
    site: Site, tmp_path: Path
) -> None:
    # Quill's module, without its entry point: only the flaky protocol is installed.
    site.install("flaky-protocol", {"flaky": "flaky_protocol:Flaky"}, {"flaky_protocol": FLAKY})
    (site.folder / "quill_tasktape.py").write_text(page_file("quill_tasktape.py"))
    site.modules.add("quill_tasktape")
    db = tmp_path / "flaky.db"
    recorded = quill_cassette(tmp_path)
    record(db, recorded[:1])
    with EventLog(db) as log:
        (x,) = log.exchanges()
        assert (x["protocol"], x["outcome"]) == ("flaky", "complete")
        events = log.events(x["id"])
        assert [(e["kind"], e["parse_error"]) for e in events] == [
            ("text", None),
            ("text", None),
            ("other", "protocol flaky failed: KeyError('in')"),
            ("end", None),
        ]
        assert '"op": "usage"' in events[2]["data"]  # the row is kept, data and all
        assert b"".join(c["data"] for c in log.chunks(x["id"])) == recorded[0].body
        (summary,) = log.stream_summary(x["id"])
        assert (summary["protocol"], summary["answer"], summary["finish"], summary["model"]) == (
            "flaky",
            "Hello, world!",
            "done",
            None,
        )


FAILING = """
from tasktape.eventlog.protocols import StreamReader
from quill_tasktape import Quill, QuillReader

HOOK = {hook!r}


def boom(*args, **kwargs):
    raise RuntimeError("boom in " + HOOK)


class FailingReader(QuillReader):
    event = boom if HOOK == "event" else QuillReader.event
    finished = boom if HOOK == "finished" else QuillReader.finished


class Failing(Quill):
    name = "failing"
    for _hook in ("claims_stream", "request_info", "session", "checked"):
        if HOOK == _hook:
            locals()[_hook] = boom

    def reader(self):
        if HOOK == "reader":
            boom()
        return FailingReader()

    rules = {{name: boom if HOOK == "rule" else rule for name, rule in Quill.rules.items()}}
"""
HOOKS = ["request_info", "session", "reader", "event", "finished", "checked", "rule"]  # Quill only streams


@pytest.mark.parametrize("hook", HOOKS)
def test_a_plugin_hook_that_raises_costs_only_what_it_would_have_told(
    site: Site, tmp_path: Path, caplog: pytest.LogCaptureFixture, hook: str
) -> None:
    site.install_quill()
    source = FAILING.format(hook=hook)
    site.install("failing-protocol", {"failing": "failing_protocol:Failing"}, {"failing_protocol": source})
    recorded = quill_cassette(tmp_path)
    db = tmp_path / "failing.db"
    with caplog.at_level(logging.WARNING, logger="tasktape"):
        record(db, recorded)
        with EventLog(db) as log:
            xs = log.exchanges()
            findings = check_log(log)
            chunks = [b"".join(c["data"] for c in log.chunks(x["id"])) for x in xs]
            outcomes = [x["outcome"] for x in xs]
    # Every exchange and every byte is there, whatever the plug-in did.
    assert chunks == [r.body for r in recorded]
    assert outcomes == [r.outcome for r in recorded]
    assert {x["protocol"] for x in xs} == {"failing"}
    assert isinstance(findings, list)
    told = [r.getMessage() for r in caplog.records if "protocol failing" in r.getMessage()]
    assert any(f"boom in {hook}" in t for t in told), told


def test_a_guarded_plugin_keeps_its_settings_and_its_new_hooks_are_guarded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a plug-in declares (its servers take streams up again, its misses' status)
    passes through the guard; its error_answer and path_names_operation raising cost a
    protocol-shaped miss answer and the operation's mention, nothing more."""

    class Polling(Protocol):
        name = "polling"
        kinds = MCPKind
        resumes_streams = True
        miss_status = 409
        read_operations = frozenset({"poll"})

        def claims(self, request: Request) -> bool:
            return True

        def error_answer(self, request: Request, message: str, details: Any) -> Any:
            raise RuntimeError("boom in error_answer")

        def path_names_operation(self, binding: str | None) -> bool:
            raise RuntimeError("boom in path_names_operation")

        def resumable(self, resuming: Request, recorded: Request) -> bool:
            return recorded.method == "POST"

        def answer_edits(self, recorded: Any, incoming: Any, chunks: Any, events: Any) -> Any:
            raise RuntimeError("boom in answer_edits")

        def ended(self, stream: Any) -> bool:
            return True

    guarded = Guarded(Polling())
    # (ended: whether a stream that broke off had carried its answer; check notes no cut-short)
    assert guarded.ended(None) is True
    # What it answers reaches replay through the guard (it was the base class's False).
    assert guarded.resumable(Request("GET", "/"), Request("POST", "/")) is True
    assert (guarded.resumes_streams, guarded.miss_status, guarded.read_operations) == (True, 409, {"poll"})
    with caplog.at_level(logging.WARNING, logger="tasktape"):
        assert guarded.error_answer(Request("POST", "/"), "no", {}) is None
        assert guarded.path_names_operation(None) is True
        assert guarded.answer_edits(Request("POST", "/"), Request("POST", "/"), [], None) == ([], [])
    told = " ".join(r.getMessage() for r in caplog.records)
    assert "its error_answer hook raised" in told and "its path_names_operation hook raised" in told
    assert "its answer_edits hook raised" in told
