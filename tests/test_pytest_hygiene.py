"""The pytest plugin's hygiene, as users of record-replay tools expect it: strictness about
unused recordings, refused requests, cassettes' age limits, and the line that sums up a run.
Run by a pytest of their own in temporary projects, as in test_pytest_plugin.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import test_pytest_plugin as plugin_tests
from test_pytest_plugin import ROOT, Agent, exchanges, run, sample

from tasktape.eventlog.cassette import read_cassette, read_header, write_cassette
from tasktape.eventlog.recorded import Recorded

# The fixtures the plugin's own tests use: a project with the a2a-sdk helpers, the demo agent.
project = plugin_tests.project
agent = plugin_tests.agent

CARD = "GET /.well-known/agent-card.json"
QUESTION = "What does J45.909 mean?"


def age(cassette: Path, days: float) -> str:
    """Make ``cassette`` ``days`` old by editing its header, as a person could; its created_at."""
    header, *rest = cassette.read_text().splitlines(keepends=True)
    doc = json.loads(header)
    doc["created_at"] = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cassette.write_text(json.dumps(doc) + "\n" + "".join(rest))
    return doc["created_at"]


def test_strict_fails_a_test_that_left_recordings_unused(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_strict="""
        import httpx
        import pytest
        from helpers import ask, final_state

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl")

        async def test_uses_everything(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

        def test_only_reads_the_card(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()

        @pytest.mark.tasktape(strict=False)
        def test_lenient_on_purpose(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()

        @pytest.mark.tasktape(strict=True)
        def test_strict_on_its_own(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()
        """
    )
    # Told once its fixtures are torn down (a fixture's cleanup may ask for a recording yet).
    result = run(project)
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_strict_on_its_own _*",
            "tasktape: the cassette and the requests disagree",
            "recorded but never requested: POST /message:stream (completed.jsonl:5)",
        ]
    )
    # For every test; the marker's strict=False still wins.
    strict = run(project, "--tasktape-strict")
    strict.assert_outcomes(passed=4, errors=2)
    strict.stdout.fnmatch_lines(["ERROR *test_only_reads_the_card*", "ERROR *test_strict_on_its_own*"])


def test_strict_counts_what_a_fixture_asks_for_in_its_teardown(
    project: pytest.Pytester, agent: Agent
) -> None:
    """A client's cleanup, sent as its fixture is torn down, uses its recording: strict mode
    judges the recordings once every fixture of the test is torn down."""
    project.makepyfile(
        test_cleanup="""
        import httpx
        import pytest

        def ask(url, text):
            body = {"message": {"role": "ROLE_USER", "parts": [{"text": text}]}}
            with httpx.stream("POST", f"{url}/message:stream", json=body) as response:
                return response.read().decode()

        @pytest.fixture
        def session(tasktape):
            yield tasktape.url
            assert "TASK_STATE_COMPLETED" in ask(tasktape.url, "goodbye")

        def test_with_cleanup(session):
            assert "TASK_STATE_COMPLETED" in ask(session, "hello")
        """
    )
    run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={agent.url}").assert_outcomes(passed=1)
    result = run(project, "--tasktape-strict")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tasktape: 2 served, 0 missed, 0 unused, 0 refused, *"])


def answer(path: str, text: str, recorded_by: str | None = None) -> Recorded:
    """A recorded GET answered with ``text``, as the test ``recorded_by`` recorded it."""
    headers = [("Content-Type", "text/plain")]
    chunks = [(0, text.encode())]
    return Recorded("GET", path, status=200, response_headers=headers, chunks=chunks, recorded_by=recorded_by)


def test_tests_sharing_a_cassette_are_held_to_their_own_recordings(project: pytest.Pytester) -> None:
    """Each test gets the recordings it recorded first, strict mode holds it to them (and to
    those no test is named for), and the run counts unused what no test requested."""
    cassettes = project.path / "cassettes"
    cassettes.mkdir()
    write_cassette(
        cassettes / "shared.jsonl",
        [
            answer("/answer", "b's answer", "test_shared.py::test_b"),
            answer("/answer", "a's answer", "test_shared.py::test_a"),
            answer("/by-hand", "no test's"),
        ],
    )
    project.makepyfile(
        test_shared="""
        import httpx
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/shared.jsonl")

        def test_a(tasktape):
            assert httpx.get(f"{tasktape.url}/answer").text == "a's answer"
            assert httpx.get(f"{tasktape.url}/by-hand").text == "no test's"

        def test_b(tasktape):
            assert httpx.get(f"{tasktape.url}/answer").text == "b's answer"
        """
    )
    result = run(project, "--tasktape-strict")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_b _*",
            "tasktape: the cassette and the requests disagree",
            "recorded but never requested: GET /by-hand (shared.jsonl:8)",
            "tasktape: 3 served, 0 missed, 0 unused, 0 refused, *",
        ]
    )
    assert "recorded but never requested: GET /answer" not in result.stdout.str()
    # A run of one of them does not count the other's recording unused: no test of the run asked.
    alone = run(project, "-v", "-k", "test_b")
    alone.assert_outcomes(passed=1)
    alone.stdout.fnmatch_lines(
        [
            "tasktape: 1 served, 0 missed, 1 unused, 0 refused, *",
            "tasktape: unused recordings:",
            "  GET /by-hand (cassettes/shared.jsonl:8)",
        ]
    )
    assert "GET /answer (cassettes" not in alone.stdout.str()


def test_strict_and_its_older_name_merge_as_one_option(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_names="""
        import httpx
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl", strict=True)

        def read_card(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()

        @pytest.mark.tasktape(fail_on_unused=False)
        def test_the_closest_says_it_under_the_older_name(tasktape):
            read_card(tasktape)

        @pytest.mark.tasktape(strict=True, fail_on_unused=True)
        def test_both_names(tasktape):
            pass

        @pytest.mark.tasktape(strict="yes")
        def test_not_a_flag(tasktape):
            pass
        """
    )
    result = run(project)
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "*@pytest.mark.tasktape: strict is given twice (as strict= and as fail_on_unused=, its older "
            "name)*",
            "*@pytest.mark.tasktape: strict is True or False, not 'yes'*",
        ]
    )


def test_a_card_read_once_uses_all_its_recordings_but_a_card_never_read_is_unused(
    project: pytest.Pytester,
) -> None:
    """A card is the same however often it is read: recorded twice, one read uses both.
    A card nobody read is a recording the test did not need."""
    cassettes = project.path / "cassettes"
    cassettes.mkdir()
    twice = read_cassette(ROOT / "cassettes" / "completed.jsonl") + read_cassette(
        ROOT / "cassettes" / "failed.jsonl"
    )
    assert [r.request_line for r in twice] == [CARD, "POST /message:stream"] * 2
    write_cassette(cassettes / "two_cards.jsonl", twice)
    project.makepyfile(
        test_cards="""
        import httpx
        import pytest
        from helpers import ask, final_state

        pytestmark = pytest.mark.tasktape("cassettes/two_cards.jsonl", strict=True)

        async def test_both_questions_read_the_card_twice(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"
            assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"

        async def test_one_question_reads_it_once(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

        def test_never_reads_it(tasktape):
            for text in ("What does J45.909 mean?", "This will fail"):
                body = {"message": {"role": "ROLE_USER", "parts": [{"text": text}]}}
                httpx.post(f"{tasktape.url}/message:stream", json=body).raise_for_status()
        """
    )
    result = run(project)
    result.assert_outcomes(passed=3, errors=2)
    out = result.stdout.str()
    once = out.split(" of test_one_question_reads_it_once _")[1].split(" of test_never_reads_it _")[0]
    assert "recorded but never requested: POST /message:stream (two_cards.jsonl:" in once
    assert CARD not in once
    never = out.split(" of test_never_reads_it _")[1].split("short test summary")[0]
    assert never.count(f"recorded but never requested: {CARD}") == 2
    assert "POST /message:stream" not in never


def test_a_content_length_edited_by_hand_is_a_warning(project: pytest.Pytester) -> None:
    """The replay sends the body whole without it; the warnings of the test it was sent to
    say so, not only its log (not those of a test of the cassette that never asked for it)."""
    cassettes = project.path / "cassettes"
    cassettes.mkdir()
    text = (ROOT / "cassettes" / "completed.jsonl").read_text()
    assert text.count('["Content-Length", "700"]') == 1
    (cassettes / "edited.jsonl").write_text(
        text.replace('["Content-Length", "700"]', '["Content-Length", "70"]')
    )
    project.makepyfile(
        test_edited="""
        import httpx
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/edited.jsonl")

        def test_card(tasktape):
            assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json").json()["name"]

        def test_no_card(tasktape):
            pass
        """
    )
    result = run(project)
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "test_edited.py::test_card",
            "*PytestWarning: tasktape: GET /.well-known/agent-card.json (edited.jsonl:2): its Content-Length "
            "70 is not the length of the body it holds (700 bytes); it is left out, and the body sent whole",
        ]
    )


def test_a_body_cut_when_recorded_is_a_warning(project: pytest.Pytester) -> None:
    """Replayed cut, as recorded: the test's warnings say so, not only the replay's log."""
    cassettes = project.path / "cassettes"
    cassettes.mkdir()
    text = (ROOT / "cassettes" / "completed.jsonl").read_text()
    assert text.count('"sse": false,') >= 1
    (cassettes / "cut.jsonl").write_text(
        text.replace('"sse": false,', '"sse": false, "body_truncated": true,', 1)
    )
    project.makepyfile(
        test_cut="""
        import httpx
        import pytest

        @pytest.mark.tasktape("cassettes/cut.jsonl")
        def test_card(tasktape):
            assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json").status_code == 200
        """
    )
    result = run(project)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*PytestWarning: tasktape: GET /.well-known/agent-card.json (cut.jsonl:2): its body was cut "
            "when recorded (--max-body), 700 bytes kept: it is replayed cut"
        ]
    )


def test_a_refused_request_fails_the_test_strict_or_not(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_refused="""
        import httpx
        import pytest

        BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        def test_resume_from_an_id_never_recorded(tasktape):
            unknown = {"Last-Event-ID": "nope"}
            response = httpx.post(f"{tasktape.url}/message:stream", json=BODY, headers=unknown)
            assert response.status_code == 400 and "names no event of the recorded stream" in response.text
            assert tasktape.refused == ["POST /message:stream (Last-Event-ID 'nope')"]
            assert tasktape.served == 0 and tasktape.missed == []
        """
    )
    for args in ((), ("--tasktape-strict",)):
        result = run(project, *args)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(
            [
                "tasktape: the cassette and the requests disagree",
                "the replay refused POST /message:stream (Last-Event-ID 'nope'), answering with an error "
                "of its own, not a recording",
            ]
        )
        # Told once, not again by the teardown.
        assert result.stdout.str().split("short test summary")[0].count("the replay refused") == 1


def test_a_malformed_fault_header_is_refused(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_bad_header="""
        import httpx
        import pytest

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        def test_a_count_in_a_request_s_fault(tasktape):
            counted = {"X-Tasktape-Fault": "drop-after=1;times=1"}
            response = httpx.post(f"{tasktape.url}/message:stream", json={}, headers=counted)
            assert response.status_code == 400
        """
    )
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "the replay refused POST /message:stream (X-Tasktape-Fault 'drop-after=1;times=1': times and "
            "every count requests: *), answering with an error of its own, not a recording",
            "tasktape: 0 served, 0 missed, 2 unused, 1 refused, *",
        ]
    )


def test_a_fault_a_recording_run_could_not_make_fails_the_test(
    project: pytest.Pytester, agent: Agent
) -> None:
    """Recorded live, the answer got no fault: the test says so (what it saw says nothing of
    how its client copes), the cassette keeps no X-Tasktape-Fault, and the next run replays
    it with the fault."""
    project.makepyfile(
        test_recorded_fault="""
        import httpx
        import pytest

        BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}

        def test_a_drop(tasktape):
            headers = {"X-Tasktape-Fault": "drop-after=3", "A2A-Version": "1.0"}
            with httpx.stream("POST", f"{tasktape.url}/message:stream", json=BODY, headers=headers) as r:
                with pytest.raises(httpx.RemoteProtocolError):
                    r.read()
        """
    )
    result = run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={agent.url}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "X-Tasktape-Fault drop-after=3 of POST /message:stream not applied: the request was forwarded "
            "live to the upstream, and faults are made on replayed answers only; run the test again to "
            "replay it with them"
        ]
    )
    cassette = project.path / "cassettes" / "test_recorded_fault" / "test_a_drop.jsonl"
    assert exchanges(cassette) == ["POST /message:stream"]
    assert "x-tasktape-fault" not in cassette.read_text().lower()
    run(project).assert_outcomes(passed=1)


AGED_TESTS = """
import pytest
from helpers import ask, final_state

pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl")

async def test_first(tasktape):
    assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

async def test_second_shares_the_cassette(tasktape):
    assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"
"""


def test_an_expired_cassette_warns_by_default(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl", "failed.jsonl")
    created = age(project.path / "cassettes" / "completed.jsonl", 40)
    hours_ago = age(project.path / "cassettes" / "failed.jsonl", 2 / 24)
    project.makepyfile(
        test_aged="""
        import pytest
        from helpers import ask, final_state

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_old(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

        @pytest.mark.tasktape("cassettes/failed.jsonl")
        async def test_fresh(tasktape):
            assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"

        @pytest.mark.tasktape("cassettes/failed.jsonl", max_age=3600)
        def test_its_own_limit_in_seconds(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", max_age="6w")
        def test_its_own_longer_limit(tasktape):
            pass
        """
    )
    result = run(project, "--tasktape-max-age", "30d")
    result.assert_outcomes(passed=4, warnings=2)
    result.stdout.fnmatch_lines_random(
        [
            "test_aged.py::test_old",
            "*CassetteExpired: tasktape: cassettes/completed.jsonl is 40 days old "
            f"(created_at {created}), past the limit of 30 days",
            "test_aged.py::test_its_own_limit_in_seconds",
            "*CassetteExpired: tasktape: cassettes/failed.jsonl is 2 hours old "
            f"(created_at {hours_ago}), past the limit of 1 hour",
        ]
    )
    run(project).assert_outcomes(passed=4)  # no limit, no warnings
    # The warning is one pytest's filters know: as an error it stops the test before it runs.
    strict = run(
        project,
        "--tasktape-max-age=30d",
        "-W",
        "error::tasktape.CassetteExpired",
    )
    strict.assert_outcomes(passed=2, errors=2)


def test_an_expired_cassette_can_fail_the_test_before_it_runs(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    cassette = project.path / "cassettes" / "completed.jsonl"
    created = age(cassette, 12)
    project.makepyfile(test_aged=AGED_TESTS)
    result = run(project, "--tasktape-max-age=1w", "--tasktape-on-expired=fail")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_first*",
            f"*tasktape: cassettes/completed.jsonl is 12 days old (created_at {created}), past the limit of "
            "7 days; record it again with --tasktape-on-expired=rerecord --tasktape-upstream URL (or every "
            "cassette with --tasktape-record-mode=all)",
        ]
    )
    run(project, "--tasktape-max-age=2w", "--tasktape-on-expired=fail").assert_outcomes(passed=1, failed=1)


def test_a_cassette_that_does_not_say_its_age_has_expired(project: pytest.Pytester) -> None:
    """A hand-written header without created_at cannot show that it is young enough."""
    cassettes = project.path / "cassettes"
    cassettes.mkdir()
    text = (ROOT / "cassettes" / "completed.jsonl").read_text().split("\n", 1)[1]
    (cassettes / "by_hand.jsonl").write_text('{"tasktape_cassette": 1}\n' + text)
    project.makepyfile(
        test_by_hand="""
        import pytest

        @pytest.mark.tasktape("cassettes/by_hand.jsonl")
        def test_by_hand(tasktape):
            pass
        """
    )
    result = run(project, "--tasktape-max-age=520w", "--tasktape-on-expired=fail")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*tasktape: cassettes/by_hand.jsonl has no created_at in its header to tell its age by "
            "(the limit is 3640 days); record it again *"
        ]
    )
    run(project, "--tasktape-max-age=520w").assert_outcomes(passed=1)  # without a limit: served as ever


def test_an_expired_cassette_is_recorded_again(project: pytest.Pytester, agent: Agent) -> None:
    sample(project, "completed.jsonl")
    cassette = project.path / "cassettes" / "completed.jsonl"
    project.makepyfile(test_aged=AGED_TESTS)
    old = read_cassette(cassette)
    created = age(cassette, 40)
    rerecord = ("--tasktape-max-age=30d", "--tasktape-on-expired=rerecord")
    # Without an agent to record from, the test says what is missing.
    without = run(project, *rerecord)
    without.assert_outcomes(errors=2)
    without.stdout.fnmatch_lines(
        [
            f"*tasktape: cassettes/completed.jsonl is 40 days old (created_at {created}), past the limit "
            "of 30 days; --tasktape-on-expired=rerecord records it again from an agent: give it with "
            "--tasktape-upstream URL"
        ]
    )
    before = len(agent.requests)
    result = run(project, *rerecord, f"--tasktape-upstream={agent.url}")
    result.assert_outcomes(passed=2)
    # As mode all: the first test replaces the cassette, the second adds to what it recorded;
    # each sends every request to the agent.
    assert agent.requests[before:] == [CARD, "POST /message:stream"] * 2
    assert exchanges(cassette) == [CARD, "POST /message:stream"] * 2
    assert old[1].body != read_cassette(cassette)[1].body
    fresh = datetime.fromisoformat(read_header(cassette)["created_at"])
    assert datetime.now(UTC) - fresh < timedelta(minutes=5)
    result.stdout.fnmatch_lines(
        [
            "tasktape: 0 served, 0 missed, 0 unused, 0 refused, 4 recorded, match rate n/a (0 requests) "
            "across 1 cassette"
        ]
    )
    # Young again: replayed, nothing reaches the agent.
    recorded = len(agent.requests)
    run(project, *rerecord, f"--tasktape-upstream={agent.url}").assert_outcomes(passed=2)
    assert len(agent.requests) == recorded
    parallel = run(project, *rerecord, "-n", "2")
    assert parallel.ret == pytest.ExitCode.USAGE_ERROR
    parallel.stderr.fnmatch_lines(
        ["*--tasktape-on-expired=rerecord replaces cassettes: run it without pytest-xdist's -n"]
    )


def test_recording_modes_and_the_age_limit(project: pytest.Pytester, agent: Agent) -> None:
    """Mode all records every cassette again: no age to check. new_episodes adds to a cassette
    and keeps its age, since what it kept is as old as it was."""
    sample(project, "completed.jsonl")
    cassette = project.path / "cassettes" / "completed.jsonl"
    project.makepyfile(test_aged=AGED_TESTS)
    created = age(cassette, 40)
    upstream = f"--tasktape-upstream={agent.url}"
    expired = ("--tasktape-max-age=30d", "--tasktape-on-expired=fail")
    run(project, *expired, "--tasktape-record-mode=new_episodes", upstream).assert_outcomes(errors=2)
    added = run(project, "--tasktape-record-mode=new_episodes", upstream)
    added.assert_outcomes(passed=2)
    assert exchanges(cassette) == [CARD, "POST /message:stream", "POST /message:stream"]
    assert read_header(cassette)["created_at"] == created
    run(project, *expired, "--tasktape-record-mode=all", upstream).assert_outcomes(passed=2)
    assert read_header(cassette)["created_at"] != created
    run(project, *expired).assert_outcomes(passed=2)


def test_age_limit_typos_are_loud(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_limits="""
        import pytest

        @pytest.mark.tasktape("cassettes/completed.jsonl", max_age="30 days")
        def test_spelt_out(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", max_age=-1)
        def test_negative(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", max_age=True)
        def test_a_flag(tasktape):
            pass
        """
    )
    result = run(project)
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines_random(
        [
            "*@pytest.mark.tasktape: max_age: '30 days' is not an age; write a number and its unit: "
            "45s, 90m, 12h, 30d or 2w",
            "*@pytest.mark.tasktape: max_age is an age such as 45s, 90m, 12h, 30d or 2w, or a number of "
            "seconds, not -1",
            "*@pytest.mark.tasktape: max_age is an age such as *, not True",
        ]
    )
    for args, message in [
        (
            ("--tasktape-max-age=30x",),
            "*--tasktape-max-age: '30x' is not an age; write a number and its unit: 45s, 90m, 12h, 30d or 2w",
        ),
        (
            ("--tasktape-on-expired=warm",),
            "*--tasktape-on-expired: 'warm' is not a way to treat expired cassettes; choose one of warn, "
            "fail, rerecord",
        ),
    ]:
        typo = run(project, *args)
        assert typo.ret == pytest.ExitCode.USAGE_ERROR
        typo.stderr.fnmatch_lines([message])


SUMMED_TESTS = """
import httpx
import pytest
from helpers import ask, final_state

BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}

@pytest.mark.tasktape("cassettes/completed.jsonl")
async def test_served_twice(tasktape):
    assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

@pytest.mark.tasktape("cassettes/failed.jsonl")
async def test_served_twice_from_another_cassette(tasktape):
    assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"

@pytest.mark.tasktape("cassettes/completed.jsonl")
def test_served_once_one_unused(tasktape):
    httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()

@pytest.mark.tasktape("cassettes/completed.jsonl")
async def test_served_once_missed_once_one_unused(tasktape):
    await ask(tasktape.url, "Something else")

@pytest.mark.tasktape("cassettes/completed.jsonl")
def test_refused_once_two_unused(tasktape):
    httpx.post(f"{tasktape.url}/message:stream", json=BODY, headers={"Last-Event-ID": "nope"})

def test_without_a_tape():
    pass
"""
# Every recording was requested by some test (test_served_twice uses all of completed.jsonl):
# what the others left unused is none.
SUMMARY = "tasktape: 6 served, 1 missed, 0 unused, 1 refused, match rate 85% (7 requests) across 2 cassettes"


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_the_run_ends_with_one_line_summing_up_the_tapes(
    project: pytest.Pytester, workers: tuple[str, ...]
) -> None:
    sample(project, "completed.jsonl", "failed.jsonl")
    project.makepyfile(test_summed=SUMMED_TESTS)
    result = run(project, *workers)
    result.assert_outcomes(passed=4, failed=2)
    result.stdout.fnmatch_lines([SUMMARY, "*short test summary info*"])
    assert result.stdout.str().count("tasktape: 6 served") == 1
    # A run where no test used a tape says nothing of tapes.
    quiet = run(project, *workers, "-k", "without_a_tape")
    quiet.assert_outcomes(passed=1)
    assert "served" not in quiet.stdout.str()
