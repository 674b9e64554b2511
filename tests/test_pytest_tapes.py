"""A test that talks to several upstreams (an A2A agent, and the LLM API the code under test
calls) gets a tape for each: ``@pytest.mark.tasktape(name=...)`` and the ``tasktapes``
fixture, recorded and replayed by a pytest of its own (``pytester``) with the official
openai SDK and the demo agent."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpcore  # noqa: F401  (kept loaded across the in-process runs: see test_pytest_plugin.run)
import pytest
from aiohttp import web
from llm_servers import openai_app
from loopback import in_thread

from tasktape.agent import create_agent_app
from tasktape.eventlog.cassette import read_cassette

ROOT = Path(__file__).resolve().parent.parent
# What the code under test does: ask the model, then hand its answer to the agent.
CODE = """
import httpx
import openai


def ask_model(llm_url):
    client = openai.OpenAI(base_url=f"{llm_url}/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Say hello"}], stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def hand_over(agent_url, text):
    body = {"message": {"role": "ROLE_USER", "parts": [{"text": text}]}}
    with httpx.stream(
        "POST", f"{agent_url}/message:stream", json=body, headers={"A2A-Version": "1.0"}
    ) as response:
        return response.read().decode()
"""
# A chat completion the model streamed, as a cassette: the replay-only tests' LLM.
CHAT = "\n".join(
    [
        '{"tasktape_cassette": 1}',
        '{"exchange": {"request": {"method": "POST", "path": "/v1/chat/completions", "headers": '
        '[["Content-Type", "application/json"]], "body": "{\\"model\\":\\"gpt-4o-mini\\",\\"messages\\":'
        '[{\\"role\\":\\"user\\",\\"content\\":\\"Say hello\\"}],\\"stream\\":true}"}, "response": '
        '{"status": 200, "headers": [["Content-Type", "text/event-stream"]]}}}',
        '{"event": {"offset_ms": 5, "data": "{\\"id\\":\\"c1\\",\\"object\\":\\"chat.completion.chunk\\",'
        '\\"choices\\":[{\\"index\\":0,\\"delta\\":{\\"content\\":\\"Hello\\"},\\"finish_reason\\":null}]}"}}',
        '{"event": {"offset_ms": 6, "data": "{\\"id\\":\\"c1\\",\\"object\\":\\"chat.completion.chunk\\",'
        '\\"choices\\":[{\\"index\\":0,\\"delta\\":{},\\"finish_reason\\":\\"stop\\"}]}"}}',
        '{"event": {"offset_ms": 7, "data": "[DONE]"}}',
        '{"end": {"duration_ms": 8}}',
        "",
    ]
)


@dataclass
class Upstreams:
    """The demo agent and an OpenAI-like API on loopback, each counting what reaches it."""

    agent: str = ""
    llm: str = ""
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def upstreams() -> Iterator[Upstreams]:
    found = Upstreams()
    agent, llm = create_agent_app(pace=0.02), openai_app(delay=0.001)
    for app in (agent, llm):

        async def count(request: web.Request, response: web.StreamResponse) -> None:
            found.requests.append(f"{request.method} {request.path}")

        app.on_response_prepare.append(count)
    with in_thread(agent) as found.agent, in_thread(llm) as found.llm:
        yield found


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(planner=CODE)
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    (pytester.path / "cassettes").mkdir()
    shutil.copy(ROOT / "cassettes" / "completed.jsonl", pytester.path / "cassettes")
    (pytester.path / "cassettes" / "chat.jsonl").write_text(CHAT)
    return pytester


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return project.runpytest_inprocess("-p", "no:cacheprovider", *args)


def exchanges(cassette: Path) -> list[str]:
    return [r.request_line for r in read_cassette(cassette)]


def test_each_upstream_recorded_into_its_own_cassette_then_replayed(
    project: pytest.Pytester, upstreams: Upstreams
) -> None:
    project.makepyfile(
        test_plan=f"""
        import pytest
        from planner import ask_model, hand_over

        @pytest.mark.tasktape(name="llm", upstream="{upstreams.llm}")
        @pytest.mark.tasktape(name="agent")
        def test_plan(tasktapes):
            text = ask_model(tasktapes["llm"].url)
            answer = hand_over(tasktapes["agent"].url, text)
            assert text == "Hello! How can I help?"
            assert "TASK_STATE_COMPLETED" in answer
            assert sorted(tasktapes) == ["agent", "llm"]
            assert tasktapes["agent"].url != tasktapes["llm"].url
        """
    )
    upstreams.requests.clear()
    recorded = run(project, "--tasktape-record-mode=once", f"--tasktape-upstream=agent={upstreams.agent}")
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines(
        ["tasktape: 0 served, 0 missed, 0 unused, 0 refused, 2 recorded, *2 cassettes"]
    )
    folder = project.path / "cassettes" / "test_plan"
    assert exchanges(folder / "test_plan.llm.jsonl") == ["POST /v1/chat/completions"]
    assert exchanges(folder / "test_plan.agent.jsonl") == ["POST /message:stream"]
    assert not (folder / "test_plan.jsonl").exists()
    assert upstreams.requests == ["POST /v1/chat/completions", "POST /message:stream"]

    upstreams.requests.clear()
    replayed = run(project, "--tasktape-strict")
    replayed.assert_outcomes(passed=1)
    replayed.stdout.fnmatch_lines(
        ["tasktape: 2 served, 0 missed, 0 unused, 0 refused, match rate 100%*2 cassettes"]
    )
    assert upstreams.requests == []


def test_a_miss_names_its_tape_and_the_unnamed_tape_goes_along(project: pytest.Pytester) -> None:
    """In the test's own loop, with the unnamed tape beside the named one; what each tape
    has to say is said under its name, and one tape's miss leaves the other's answers alone."""
    project.makepyfile(
        test_both="""
        import asyncio
        import pytest
        from planner import ask_model, hand_over

        pytestmark = pytest.mark.tasktape(name="llm", cassette="cassettes/chat.jsonl", in_thread=True)

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_the_answer(tasktape, tasktapes):
            text = await asyncio.to_thread(ask_model, tasktapes["llm"].url)
            answer = await asyncio.to_thread(hand_over, tasktape.url, "What does J45.909 mean?")
            assert text == "Hello"
            assert "TASK_STATE_COMPLETED" in answer

        @pytest.mark.tasktape("cassettes/completed.jsonl", strict=True)
        def test_the_model_is_asked_something_else(tasktape, tasktapes):
            import openai
            client = openai.OpenAI(base_url=f"{tasktapes['llm'].url}/v1", api_key="sk-test", max_retries=0)
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="gpt-4o", messages=[], stream=True)
        """
    )
    result = run(project)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "tasktape: the cassette and the requests disagree",
            "recorded but never requested: POST /message:stream (completed.jsonl:*)",
            "tasktape (tape llm): the cassette and the requests disagree",
            "POST /v1/chat/completions matches nothing in cassettes/chat.jsonl; the closest recordings:",
            "*body differs*",
            "record what is missing with --tasktape-record-mode=new_episodes --tasktape-upstream llm=URL, "
            "or ignore what changes between runs with @pytest.mark.tasktape(name='llm', ignore=[...])",
        ]
    )
    result.stdout.fnmatch_lines(
        ["tasktape: 2 served, 1 missed, 1 unused, 0 refused, match rate 66% (3 requests) across 2 cassettes"]
    )


def test_what_a_tape_says_of_its_recordings_hides_the_values_its_misses_hide(
    project: pytest.Pytester,
) -> None:
    """Strict mode's "recorded but never requested" and the note of a recording cut short
    printed their query as recorded (a cassette written by hand with ?key=..., a value of
    redact_query's mode), though a miss beside them hid those values."""
    exchange = (
        '{{"exchange": {{"request": {{"method": "GET", "path": "{}", "query": "{}"}}, '
        '"response": {{"status": 200, "headers": [["Content-Type", "text/plain"]]}}}}}}'
    )
    chunk = '{"chunk": {"offset_ms": 1, "text": "part"}}'
    lines = [
        '{"tasktape_cassette": 2}',
        exchange.format("/a", "key=sk-live-5&mode=sk-live-6&page=2"),
        chunk,
        '{"end": {"duration_ms": 2, "outcome": "complete"}}',
        exchange.format("/b", "mode=sk-live-7"),
        chunk,
        '{"end": {"duration_ms": 2, "outcome": "upstream_disconnected"}}',
        "",
    ]
    (project.path / "cassettes" / "by_hand.jsonl").write_text("\n".join(lines))
    project.makepyfile(
        test_hidden="""
        import urllib.request
        import pytest

        @pytest.mark.tasktape("cassettes/by_hand.jsonl", redact_query=["mode"], strict=True)
        def test_asks_for_b(tasktape):
            try:
                urllib.request.urlopen(tasktape.url + "/b?mode=sk-live-7").read()
            except Exception:
                pass
            assert 0, "the test fails"
        """
    )
    result = run(project)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "recorded but never requested: GET /a?key=[[]REDACTED]&mode=[[]REDACTED]&page=2"
            " (by_hand.jsonl:2)",
            "GET /b?mode=[[]REDACTED] (by_hand.jsonl:5) was recorded cut short (upstream_disconnected)*",
        ]
    )
    out = result.stdout.str()
    assert "sk-live-5" not in out and "sk-live-6" not in out and "GET /b?mode=sk-live-7" not in out


def test_the_run_s_unused_recordings_and_warnings_hide_the_values_misses_hide(
    project: pytest.Pytester,
) -> None:
    """The list of unused recordings that ends a run (-v) and the warning of a Content-Length
    edited by hand printed their query as recorded (a cassette written by hand with ?key=...);
    the list hides what any test of the cassette hides (one marker's redact_query names)."""
    exchange = (
        '{{"exchange": {{"request": {{"method": "GET", "path": "{}", "query": "{}"}}, '
        '"response": {{"status": 200, "headers": [["Content-Type", "text/plain"]{}]}}}}}}'
    )
    lines = [
        '{"tasktape_cassette": 2}',
        exchange.format("/a", "key=sk-live-5&mode=sk-live-6&page=2", ""),
        '{"chunk": {"offset_ms": 1, "text": "part"}}',
        '{"end": {"duration_ms": 2, "outcome": "complete"}}',
        exchange.format("/c", "key=sk-live-7", ', ["Content-Length", "99"]'),
        '{"chunk": {"offset_ms": 1, "text": "part"}}',
        '{"end": {"duration_ms": 2, "outcome": "complete"}}',
        "",
    ]
    (project.path / "cassettes" / "by_hand.jsonl").write_text("\n".join(lines))
    project.makepyfile(
        test_hidden="""
        import urllib.request
        import pytest

        @pytest.mark.tasktape("cassettes/by_hand.jsonl", redact_query=["mode"])
        def test_asks_for_c(tasktape):
            assert urllib.request.urlopen(tasktape.url + "/c?key=sk-live-7").read() == b"part"

        @pytest.mark.tasktape("cassettes/by_hand.jsonl")
        def test_asks_for_nothing(tasktape):
            pass
        """
    )
    result = run(project, "-v")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*PytestWarning: tasktape: GET /c?key=[[]REDACTED] (by_hand.jsonl:5): its Content-Length 99 "
            "is not the length of the body it holds (4 bytes); it is left out, and the body sent whole",
            "tasktape: 1 served, 0 missed, 1 unused, 0 refused, *",
            "tasktape: unused recordings:",
            "  GET /a?key=[[]REDACTED]&mode=[[]REDACTED]&page=2 (cassettes/by_hand.jsonl:2)",
        ]
    )
    assert "sk-live" not in result.stdout.str()
    # The tests on two pytest-xdist workers: what each worker's tapes hide is sent along.
    parallel = run(project, "-v", "-n", "2")
    parallel.assert_outcomes(passed=2)
    parallel.stdout.fnmatch_lines(
        ["  GET /a?key=[[]REDACTED]&mode=[[]REDACTED]&page=2 (cassettes/by_hand.jsonl:2)"]
    )
    assert "sk-live" not in parallel.stdout.str()


def test_new_episodes_of_one_upstream_replay_the_others(
    project: pytest.Pytester, upstreams: Upstreams
) -> None:
    """The tapes given an upstream record what misses; the others, whose agent need not run,
    replay their cassettes. With no upstream at all, the mode still says what it needs."""
    project.makepyfile(
        test_episode="""
        import pytest
        from planner import ask_model, hand_over

        @pytest.mark.tasktape(name="agent", cassette="cassettes/completed.jsonl")
        @pytest.mark.tasktape(name="llm")
        def test_a_new_question_to_the_model(tasktapes):
            assert ask_model(tasktapes["llm"].url) == "Hello! How can I help?"
            assert "TASK_STATE_COMPLETED" in hand_over(tasktapes["agent"].url, "What does J45.909 mean?")
        """
    )
    upstreams.requests.clear()
    recorded = run(project, "--tasktape-record-mode=new_episodes", f"--tasktape-upstream=llm={upstreams.llm}")
    recorded.assert_outcomes(passed=1)
    assert upstreams.requests == ["POST /v1/chat/completions"]
    folder = project.path / "cassettes" / "test_episode"
    assert exchanges(folder / "test_a_new_question_to_the_model.llm.jsonl") == ["POST /v1/chat/completions"]
    alone = run(project, "--tasktape-record-mode=new_episodes")
    alone.assert_outcomes(errors=1)
    alone.stdout.fnmatch_lines(
        ["*records *completed.jsonl from an agent: give it with --tasktape-upstream agent=URL"]
    )


def test_named_markers_merge_by_name(project: pytest.Pytester) -> None:
    """A module's marker of a tape and a test's marker of the same tape merge, the test's
    saying what both say; a marker that names no tape is not a named tape's."""
    project.makepyfile(
        test_merged="""
        import pytest
        from planner import ask_model

        pytestmark = [
            pytest.mark.tasktape(name="llm", cassette="cassettes/chat.jsonl", faults="drop-after=5"),
            pytest.mark.tasktape(faults="drop-after=0"),
        ]

        @pytest.mark.tasktape(name="llm", faults="drop-after=1")
        def test_the_tests_fault(tasktapes):
            with pytest.raises(Exception, match="incomplete chunked read"):
                ask_model(tasktapes["llm"].url)

        def test_the_modules_fault(tasktapes):
            assert ask_model(tasktapes["llm"].url) == "Hello"
        """
    )
    run(project).assert_outcomes(passed=2)


def test_mistakes_are_named(project: pytest.Pytester, upstreams: Upstreams) -> None:
    project.makepyfile(
        test_mistakes="""
        import pytest

        @pytest.mark.tasktape(name="l l m")
        def test_a_name_with_spaces(tasktapes):
            pass

        def test_no_named_tapes(tasktapes):
            pass

        @pytest.mark.tasktape(name="llm", cassette="cassettes/chat.jsonl")
        def test_named_but_not_asked_for(tasktape):
            pass

        @pytest.mark.tasktape(name="one", cassette="cassettes/chat.jsonl")
        @pytest.mark.tasktape(name="two", cassette="./cassettes/chat.jsonl")
        def test_two_tapes_one_cassette(tasktapes):
            pass

        @pytest.mark.tasktape("cassettes/chat.jsonl")
        @pytest.mark.tasktape(name="llm", cassette="cassettes/chat.jsonl")
        def test_the_unnamed_and_a_named_tape_one_cassette(tasktapes, tasktape):
            pass

        @pytest.mark.tasktape(name="llm", cassette="cassettes/chat.jsonl")
        def test_an_unknown_name(tasktapes):
            tasktapes["agent"]

        @pytest.mark.tasktape(name="tools")
        def test_recorded_without_its_upstream(tasktapes):
            pass
        """
    )
    result = run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={upstreams.agent}")
    result.assert_outcomes(errors=6, failed=1)
    result.stdout.fnmatch_lines_random(
        [
            "*@pytest.mark.tasktape: name is a tape's name (letters, digits, _ and -, starting with a "
            "letter or _), not 'l l m'",
            "*the tasktapes fixture serves a test's named tapes, and this test names none: name each "
            'with @pytest.mark.tasktape(name="...")',
            "*@pytest.mark.tasktape on test_named_but_not_asked_for serves its named tapes to the "
            "tasktapes fixture, which the test does not ask for: add `tasktapes` to its arguments",
            "*tasktape: tape one and tape two share the cassette cassettes/chat.jsonl: give each its own",
            "*tasktape: the unnamed tape and tape llm share the cassette cassettes/chat.jsonl: give *",
            "E * tasktape.errors.UnknownTape: no tape named 'agent'; this test's tapes: llm",
            "*tasktape: --tasktape-record-mode=once records *test_recorded_without_its_upstream.tools.jsonl "
            "from an agent: give it with --tasktape-upstream tools=URL",
        ]
    )


def test_upstreams_on_the_command_line_are_checked(project: pytest.Pytester) -> None:
    project.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = run(project, "--tasktape-upstream=llm=ftp://me:s3cret@h/x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --tasktape-upstream llm=: the upstream must be an http:// or https:// URL*"]
    )
    assert "s3cret" not in result.stderr.str()


def test_the_last_upstream_given_for_a_name_wins(project: pytest.Pytester, upstreams: Upstreams) -> None:
    """As with every option, the command line's upstream wins over the one in addopts, for
    the unnamed tape and for a named one alike."""
    down = "http://127.0.0.1:9"
    project.makeini(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        f"addopts = --tasktape-upstream {down} --tasktape-upstream llm={down}\n"
    )
    project.makepyfile(
        test_plan="""
        import pytest
        from planner import ask_model, hand_over

        @pytest.mark.tasktape(name="llm")
        def test_plan(tasktapes, tasktape):
            assert ask_model(tasktapes["llm"].url) == "Hello! How can I help?"
            assert "TASK_STATE_COMPLETED" in hand_over(tasktape.url, "What does J45.909 mean?")
        """
    )
    upstreams.requests.clear()
    given = (f"--tasktape-upstream={upstreams.agent}", f"--tasktape-upstream=llm={upstreams.llm}")
    run(project, "--tasktape-record-mode=once", *given).assert_outcomes(passed=1)
    assert upstreams.requests == ["POST /v1/chat/completions", "POST /message:stream"]


def test_a_tape_s_events_carry_the_ids_add_ids_sends(project: pytest.Pytester) -> None:
    """The ids a client resumes with are those of ``tasktape.events``: with add_ids, the ones
    the replay adds to events recorded without an id."""
    project.makepyfile(
        test_ids="""
        import httpx
        import pytest

        MESSAGES = [{"role": "user", "content": "Say hello"}]
        BODY = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}

        @pytest.mark.tasktape("cassettes/chat.jsonl", add_ids=True)
        def test_ids(tasktape):
            with httpx.stream("POST", f"{tasktape.url}/v1/chat/completions", json=BODY) as response:
                seen = [line[4:] for line in response.iter_lines() if line.startswith("id: ")]
            assert seen == ["tt1.1", "tt1.2", "tt1.3"]
            assert [event.id for event in tasktape.events] == seen

        @pytest.mark.tasktape("cassettes/chat.jsonl")
        def test_no_ids(tasktape):
            httpx.post(f"{tasktape.url}/v1/chat/completions", json=BODY)
            assert [event.id for event in tasktape.events] == [None, None, None]
        """
    )
    run(project).assert_outcomes(passed=2)


def test_assert_faithful_refuses_arguments_it_cannot_use(project: pytest.Pytester) -> None:
    """Before any stream is served too: a mistake shows at once, not on a later run."""
    project.makepyfile(
        test_faithful="""
        import pytest

        @pytest.mark.tasktape("cassettes/chat.jsonl", allow_repeats=True)
        @pytest.mark.parametrize(
            "given", [{"allow": None}, {"allow": 3}, {"allow": ["fault", 3]}, {"max_lateness_ms": "5"},
                      {"max_lateness_ms": float("nan")}, {"max_lateness_ms": True}, {"max_lateness_ms": -1}]
        )
        def test_refused(tasktape, given):
            tasktape.assert_faithful(**given)

        @pytest.mark.tasktape("cassettes/chat.jsonl", allow_repeats=True)
        def test_accepted(tasktape):
            tasktape.assert_faithful(allow=("fault", "resume"), max_lateness_ms=0)
            tasktape.assert_faithful(allow="fault", max_lateness_ms=2.5)
        """
    )
    result = run(project)
    result.assert_outcomes(failed=7, passed=1)
    result.stdout.fnmatch_lines_random(
        [
            "E *UsageError: allow=None: give a kind of difference (a str) or an iterable of them",
            "E *UsageError: allow=3: give a kind of difference (a str) or an iterable of them",
            "E *UsageError: allow=['fault', 3]: give a kind of difference (a str) or an *",
            "E *UsageError: max_lateness_ms='5': give a finite number of milliseconds, 0 or *",
            "E *UsageError: max_lateness_ms=nan: give a finite number of milliseconds, 0 or *",
            "E *UsageError: max_lateness_ms=True: give a finite number of milliseconds, 0 or *",
            "E *UsageError: max_lateness_ms=-1: give a finite number of milliseconds, 0 or *",
        ]
    )
