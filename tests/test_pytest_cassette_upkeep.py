"""Keeping cassettes in step with the tests that use them: recording them again (mode all,
rerecord), recordings left by tests that are gone, tests that send nothing, default names of
nested classes, and what the run's summary counts. Run by a pytest of their own in temporary
projects (``pytester``), against the demo agent on loopback, as in test_pytest_plugin.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_pytest_plugin as plugin_tests
from test_pytest_hygiene import age
from test_pytest_plugin import Agent, run

from tasktape.eventlog import LogWriter
from tasktape.eventlog.cassette import read_cassette, read_header, write_cassette
from tasktape.eventlog.resumes import Resume, ResumeOutcome, ResumeSide
from tasktape.replay.tape import recordings_in

# The fixtures the plugin's own tests use: a temporary project, the demo agent.
project = plugin_tests.project
agent = plugin_tests.agent

CARD = "GET /.well-known/agent-card.json"
# Two tests of a module share its cassette, and each reads the agent's card.
SHARED = """
import httpx
import pytest

pytestmark = pytest.mark.tasktape("cassettes/agent.jsonl")

def card(url):
    answer = httpx.get(f"{url}/.well-known/agent-card.json")
    assert answer.status_code == 200
    return answer.json()

def test_a(tasktape):
    card(tasktape.url)

def test_SECOND(tasktape):
    assert card(tasktape.url)["name"]
"""


def recorders(cassette: Path) -> list[str | None]:
    """The test each of the cassette's exchanges names, in order."""
    return [r.recorded_by for r in read_cassette(cassette)]


def test_all_records_what_another_test_s_recording_would_answer(
    project: pytest.Pytester, agent: Agent
) -> None:
    """Once, the second test's card read is answered by the first one's recording; all
    (on it alone, with -k) sends it to the agent and records it, leaving test_a's alone."""
    project.makepyfile(test_shared=SHARED.replace("SECOND", "b"))
    upstream = f"--tasktape-upstream={agent.url}"
    cassette = project.path / "cassettes" / "agent.jsonl"
    run(project, "--tasktape-record-mode=once", upstream).assert_outcomes(passed=2)
    assert recorders(cassette) == ["test_shared.py::test_a"]
    kept = read_cassette(cassette)[0]
    before = len(agent.requests)
    result = run(project, "--tasktape-record-mode=all", upstream, "-k", "test_b")
    result.assert_outcomes(passed=1)
    assert agent.requests[before:] == [CARD]
    result.stdout.fnmatch_lines(["tasktape: 0 served, 0 missed, 0 unused, 0 refused, 1 recorded, *"])
    assert recorders(cassette) == ["test_shared.py::test_a", "test_shared.py::test_b"]
    assert read_cassette(cassette)[0].body == kept.body
    run(project).assert_outcomes(passed=2)


def test_all_records_a_renamed_test(project: pytest.Pytester, agent: Agent) -> None:
    """A renamed test has no recording of its own: all records one for it (and for test_a,
    whose request the old name's recording would have answered), and drops the old name's."""
    project.makepyfile(test_shared=SHARED.replace("SECOND", "b"))
    upstream = f"--tasktape-upstream={agent.url}"
    cassette = project.path / "cassettes" / "agent.jsonl"
    run(project, "--tasktape-record-mode=all", upstream).assert_outcomes(passed=2)
    project.makepyfile(test_shared=SHARED.replace("SECOND", "renamed"))
    before = len(agent.requests)
    run(project, "--tasktape-record-mode=all", upstream).assert_outcomes(passed=2)
    assert agent.requests[before:] == [CARD, CARD]
    assert recorders(cassette) == ["test_shared.py::test_a", "test_shared.py::test_renamed"]
    run(project, "--tasktape-record-mode=all", upstream).assert_outcomes(passed=2)
    assert agent.requests[before:] == [CARD] * 4


def test_rerecord_makes_an_expired_shared_cassette_young(project: pytest.Pytester, agent: Agent) -> None:
    """Recorded again, the cassette gets a new created_at, so the next run replays it."""
    project.makepyfile(test_shared=SHARED.replace("SECOND", "b"))
    upstream = f"--tasktape-upstream={agent.url}"
    cassette = project.path / "cassettes" / "agent.jsonl"
    run(project, "--tasktape-record-mode=once", upstream).assert_outcomes(passed=2)
    created = age(cassette, 40)
    rerecord = ("--tasktape-max-age=30d", "--tasktape-on-expired=rerecord", upstream)
    before = len(agent.requests)
    run(project, *rerecord).assert_outcomes(passed=2)
    assert agent.requests[before:] == [CARD, CARD]
    assert read_header(cassette)["created_at"] != created
    recorded = len(agent.requests)
    run(project, *rerecord).assert_outcomes(passed=2)
    assert len(agent.requests) == recorded


def test_tests_of_two_folders_share_one_cassette_through_dotdot(
    project: pytest.Pytester, agent: Agent
) -> None:
    """tests/a and tests/b name the same file as ../cassettes/shared.jsonl: one cassette,
    recorded again together (made young), summed up once, nothing of it left unused."""
    test = SHARED.replace("cassettes/agent.jsonl", "../cassettes/shared.jsonl")
    project.makepyfile(
        **{"tests/a/test_a": test.replace("SECOND", "b"), "tests/b/test_b": test.replace("SECOND", "c")}
    )
    upstream = f"--tasktape-upstream={agent.url}"
    cassette = project.path / "tests" / "cassettes" / "shared.jsonl"
    run(project, "--tasktape-record-mode=once", upstream).assert_outcomes(passed=4)
    created = age(cassette, 40)
    rerecorded = run(project, "--tasktape-max-age=30d", "--tasktape-on-expired=rerecord", upstream)
    rerecorded.assert_outcomes(passed=4)
    rerecorded.stdout.fnmatch_lines(["tasktape: * 4 recorded, * across 1 cassette"])
    assert read_header(cassette)["created_at"] != created
    assert len(recorders(cassette)) == 4
    replayed = run(project, "--tasktape-max-age=30d", "--tasktape-on-expired=fail", "--tasktape-strict")
    replayed.assert_outcomes(passed=4)
    replayed.stdout.fnmatch_lines(["tasktape: 4 served, 0 missed, 0 unused, 0 refused, * across 1 cassette"])


def test_a_test_that_sends_nothing_gets_a_cassette_of_no_recordings(
    project: pytest.Pytester, agent: Agent
) -> None:
    """Its client answers from a cache: recorded, the test still gets a cassette, so that its
    next runs replay it instead of asking again for a recording that never comes."""
    project.makepyfile(
        test_cache="""
        import pytest

        CACHE = {"cached": "answer"}

        def test_served_from_cache(tasktape):
            assert CACHE["cached"] == "answer"

        @pytest.mark.tasktape(name="llm")
        def test_a_named_tape_nobody_calls(tasktapes):
            assert CACHE["cached"] == "answer"
        """
    )
    upstream = (f"--tasktape-upstream={agent.url}", f"--tasktape-upstream=llm={agent.url}")
    recorded = run(project, "--tasktape-record-mode=once", *upstream)
    recorded.assert_outcomes(passed=2)
    recorded.stdout.fnmatch_lines(["tasktape: 0 served, * across 2 cassettes"])
    folder = project.path / "cassettes" / "test_cache"
    for name in ("test_served_from_cache.jsonl", "test_a_named_tape_nobody_calls.llm.jsonl"):
        assert read_cassette(folder / name) == []
        assert read_header(folder / name)["source"] == "pytest"
    run(project).assert_outcomes(passed=2)
    run(project, "--tasktape-strict").assert_outcomes(passed=2)


def test_nested_classes_name_their_default_cassettes_by_the_class_path(
    project: pytest.Pytester, agent: Agent
) -> None:
    """A class nested in another and a top-level class of the same name each get a cassette
    of their own; a top-level class's default cassette keeps its name."""
    project.makepyfile(
        test_nested="""
        import httpx

        def ask(url, text):
            body = {"message": {"role": "ROLE_USER", "parts": [{"text": text}]}}
            headers = {"A2A-Version": "1.0"}
            with httpx.stream("POST", f"{url}/message:stream", json=body, headers=headers) as r:
                return r.read().decode()

        class TestOuter:
            class TestInner:
                def test_x(self, tasktape):
                    assert "TASK_STATE_COMPLETED" in ask(tasktape.url, "What does J45.909 mean?")

        class TestInner:
            def test_x(self, tasktape):
                assert "TASK_STATE_FAILED" in ask(tasktape.url, "This will fail")
        """
    )
    run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={agent.url}").assert_outcomes(passed=2)
    folder = project.path / "cassettes" / "test_nested"
    assert sorted(p.name for p in folder.iterdir()) == [
        "TestInner.test_x.jsonl",
        "TestOuter.TestInner.test_x.jsonl",
    ]
    assert recorders(folder / "TestInner.test_x.jsonl") == ["test_nested.py::TestInner::test_x"]
    run(project, "--tasktape-strict").assert_outcomes(passed=2)


# Classes nested deep, two tests whose names start alike, one of them with a named tape too,
# and a test named in Japanese (3 bytes a letter): every default name is over 200 bytes.
LONG_NAMES = """
import httpx
import pytest

def card(url):
    assert httpx.get(f"{{url}}/.well-known/agent-card.json").status_code == 200

class TestAVeryLongDescriptiveClassNameForTheCheckoutFlowOfTheAgentWithManyWords:
    class TestWhenTheUserAsksForSomethingThatNeedsMoreInputAndThenCancelsTheTask:
        def test_the_agent_reports_the_task_as_canceled_and_sends_a_final_event_1(self, tasktape):
            card(tasktape.url)

        @pytest.mark.tasktape(name="llm")
        def test_the_agent_reports_the_task_as_canceled_and_sends_a_final_event_2(self, tasktape, tasktapes):
            card(tasktape.url)
            card(tasktapes["llm"].url)

def {japanese}(tasktape):
    card(tasktape.url)
"""


def test_default_cassette_names_stay_within_200_bytes(project: pytest.Pytester, agent: Agent) -> None:
    """A default name over 200 bytes in UTF-8 (the classes, the test, its tape's name and
    .jsonl together) is cut there, and ends in a short hash: each test keeps a cassette of
    its own, which a temporary file beside it has room to be written through."""
    project.makepyfile(test_long=LONG_NAMES.format(japanese="test_" + "日本語のテストの名前" * 9))
    upstreams = (f"--tasktape-upstream={agent.url}", f"--tasktape-upstream=llm={agent.url}")
    run(project, "--tasktape-record-mode=once", *upstreams).assert_outcomes(passed=3)
    names = [p.name for p in (project.path / "cassettes" / "test_long").iterdir()]
    assert len(names) == 4
    assert all(len(name.encode()) <= 200 and name.endswith(".jsonl") for name in names)
    run(project, "--tasktape-strict").assert_outcomes(passed=3)


STREAMING = """
import httpx
import pytest

pytestmark = pytest.mark.tasktape("cassettes/agent.jsonl")

def test_a(tasktape):
    assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json").status_code == 200
"""
STREAM_B = """
def test_b(tasktape):
    body = {"message": {"role": "ROLE_USER", "parts": [{"text": "This will fail"}]}}
    headers = {"A2A-Version": "1.0"}
    with httpx.stream("POST", f"{tasktape.url}/message:stream", json=body, headers=headers) as r:
        assert "TASK_STATE_FAILED" in r.read().decode()
"""


def test_strict_holds_a_test_to_recordings_left_by_a_test_that_is_gone(
    project: pytest.Pytester, agent: Agent
) -> None:
    """test_b is deleted: nothing will ask for its recording again, so strict mode fails the
    tests of its cassette on it, naming it; while test_b exists (deselected, or in a file
    not collected) it is its own."""
    project.makepyfile(test_shared=STREAMING + STREAM_B, test_other=STREAMING.replace("test_a", "test_o"))
    upstream = f"--tasktape-upstream={agent.url}"
    run(project, "--tasktape-record-mode=once", upstream, "test_shared.py").assert_outcomes(passed=2)
    assert recorders(project.path / "cassettes" / "agent.jsonl") == [
        "test_shared.py::test_a",
        "test_shared.py::test_b",
    ]
    run(project, "--tasktape-strict", "-k", "test_a").assert_outcomes(passed=1)
    run(project, "--tasktape-strict", "test_other.py").assert_outcomes(passed=1)
    run(project, "--tasktape-strict", "test_shared.py::test_a").assert_outcomes(passed=1)
    run(project, "--tasktape-strict", "-n", "2", "-k", "test_a").assert_outcomes(passed=1)
    project.makepyfile(test_shared=STREAMING)  # test_b is gone
    result = run(project, "--tasktape-strict")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "recorded but never requested: POST /message:stream (agent.jsonl:5), by "
            "test_shared.py::test_b, which is no test any more",
            "tasktape: 2 served, 0 missed, 1 unused, 0 refused, *",
            "tasktape: unused recordings:",
            "  POST /message:stream (cassettes/agent.jsonl:5)",
        ]
    )
    # Each pytest-xdist worker collects every test, so it knows test_b is gone too.
    run(project, "--tasktape-strict", "-n", "2").assert_outcomes(passed=2, errors=2)
    # Not strict, the summary names it under -v.
    run(project).assert_outcomes(passed=2)
    verbose = run(project, "-v")
    verbose.stdout.fnmatch_lines(
        ["tasktape: unused recordings:", "  POST /message:stream (cassettes/agent.jsonl:5)"]
    )


def test_a_miss_on_a_cassette_of_no_recordings_says_so(project: pytest.Pytester) -> None:
    """With nothing to be close to, the report says the cassette is empty, not an empty list."""
    (project.path / "cassettes").mkdir()
    (project.path / "cassettes" / "empty.jsonl").write_text('{"tasktape_cassette": 1}\n')
    project.makepyfile(
        test_empty="""
        import httpx
        import pytest

        @pytest.mark.tasktape("cassettes/empty.jsonl")
        def test_card(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json")
        """
    )
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "tasktape: the cassette and the requests disagree",
            f"{CARD} matches nothing in cassettes/empty.jsonl, which holds no recordings",
            "record what is missing with *",
        ]
    )


def test_the_summary_counts_what_was_written_not_what_was_sent(project: pytest.Pytester) -> None:
    """The upstream is down: nothing is written, so the summary counts nothing recorded."""
    project.makepyfile(
        test_down="""
        import httpx

        def test_down(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json")
        """
    )
    result = run(project, "--tasktape-record-mode=once", "--tasktape-upstream=http://127.0.0.1:9")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        ["tasktape: 0 served, 0 missed, 0 unused, 0 refused, match rate n/a (0 requests) across 0 cassettes"]
    )
    assert not (project.path / "cassettes").exists()


def test_a_refusal_left_out_of_a_cassette_shifts_no_reconnect(tmp_path: Path) -> None:
    """A tape's cassette leaves out the recorder's refusals; left out of the list read whole,
    they shifted the place by which a later reconnect names its stream, and the cassette
    could not be written (its reconnect named the agent card)."""
    db, sse = tmp_path / "recording.db", [("Content-Type", "text/event-stream")]
    with LogWriter(db) as w:
        capture = w.begin_capture(source="record")
        card = w.begin_exchange(capture, method="GET", path="/.well-known/agent-card.json")
        w.response_head(card, status=200, headers=[], is_sse=False, ttfb_ns=1)
        w.end_exchange(card, duration_ns=2)
        stream = w.begin_exchange(capture, method="GET", path="/events")
        w.response_head(stream, status=200, headers=sse, is_sse=True, ttfb_ns=1)
        w.chunk(stream, 2, b"id: 1\ndata: a\n\nid: 2\ndata: b\n\n")
        w.end_exchange(stream, duration_ns=5)
        refused = w.begin_exchange(capture, method="GET", path="/events")
        w.response_head(refused, status=400, headers=[], is_sse=False, ttfb_ns=0)
        w.end_exchange(refused, duration_ns=0, outcome="refused", error="names no event")
        w.resume(
            Resume(
                stream, ResumeSide.CLIENT, ResumeOutcome.REFUSED, last_event_id="zz", new_exchange_id=refused
            )
        )
        again = w.begin_exchange(capture, method="GET", path="/events")
        w.response_head(again, status=200, headers=sse, is_sse=True, ttfb_ns=1)
        w.chunk(again, 2, b"id: 2\ndata: b\n\n")
        w.end_exchange(again, duration_ns=3)
        w.resume(
            Resume(stream, ResumeSide.CLIENT, ResumeOutcome.RESUMED, last_event_id="1", new_exchange_id=again)
        )
    kept, failed = recordings_in(db)
    assert failed == ["GET /events: names no event"]
    assert [(r.path, r.reconnect_of) for r in kept] == [
        ("/.well-known/agent-card.json", None),
        ("/events", None),
        ("/events", -1),
    ]
    write_cassette(tmp_path / "t.jsonl", kept)
    assert [r.reconnect_of for r in read_cassette(tmp_path / "t.jsonl")] == [None, None, -1]
