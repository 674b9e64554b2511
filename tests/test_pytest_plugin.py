"""The pytest plugin, used as a user would: test files in a temporary project, run by a
pytest of their own (``pytester``, in this process) with the official a2a-sdk client."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpcore  # noqa: F401  (kept loaded across the runs below: see the comment in run())
import pytest
from aiohttp import web
from loopback import in_thread, serve

from tasktape.agent import create_agent_app
from tasktape.eventlog.cassette import read_cassette, write_cassette
from tasktape.eventlog.recorded import Recorded

ROOT = Path(__file__).resolve().parent.parent
HELPERS = '''
"""What the tests of this project share: the official a2a-sdk client."""
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import new_text_message
from a2a.types.a2a_pb2 import Role, SendMessageRequest
from google.protobuf.json_format import MessageToDict

BINDINGS = {"rest": "HTTP+JSON", "jsonrpc": "JSONRPC"}


async def ask(url, text, binding="rest", seen=None, headers=None):
    """Stream ``text``; every event as a dict (also appended to ``seen`` as it arrives)."""
    seen = [] if seen is None else seen
    async with httpx.AsyncClient(headers=headers) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        config = ClientConfig(httpx_client=http, supported_protocol_bindings=[BINDINGS[binding]])
        client = ClientFactory(config).create(card)
        request = SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))
        async for event in client.send_message(request):
            seen.append(MessageToDict(event))
    return seen


def final_state(events):
    return [e["statusUpdate"]["status"]["state"] for e in events if "statusUpdate" in e][-1]
'''


@dataclass
class Agent:
    """The demo agent on loopback, counting the requests that reach it."""

    url: str = ""
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    found = Agent()
    app = create_agent_app(pace=0.05)

    async def count(request: web.Request, response: web.StreamResponse) -> None:
        found.requests.append(f"{request.method} {request.path}")

    app.on_response_prepare.append(count)
    with in_thread(app) as found.url:
        yield found


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A temporary project: the shared client helpers, pytest-asyncio in auto mode."""
    pytester.makepyfile(helpers=HELPERS)
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    return pytester


def sample(project: pytest.Pytester, *names: str) -> None:
    (project.path / "cassettes").mkdir(exist_ok=True)
    for name in names:
        shutil.copy(ROOT / "cassettes" / name, project.path / "cassettes" / name)


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    # Each in-process run unloads the modules it imported. httpx loads httpcore lazily and caches
    # its exception classes for good, so an httpcore imported by one run and reloaded by the next
    # would let its errors escape unwrapped; httpcore is therefore imported once, up above.
    return project.runpytest_inprocess("-p", "no:cacheprovider", *args)


def exchanges(cassette: Path) -> list[str]:
    return [r.request_line for r in read_cassette(cassette)]


def test_async_and_sync_tests_with_the_official_client(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl", "completed_jsonrpc.jsonl", "failed.jsonl")
    project.makepyfile(
        test_user="""
        import asyncio
        import pytest
        from helpers import ask, final_state

        QUESTION = "What does J45.909 mean?"

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_async_in_the_tests_loop(tasktape):
            events = await ask(tasktape.url, QUESTION)
            assert final_state(events) == "TASK_STATE_COMPLETED"
            closing = [e for e in events if e.get("artifactUpdate", {}).get("lastChunk")][-1]
            assert "citations" in closing["artifactUpdate"]["artifact"]["parts"][0]["metadata"]
            assert tasktape.served == 2 and tasktape.missed == [] and tasktape.unused == []
            assert len(tasktape.events) == len(events)
            assert tasktape.url.startswith("http://127.0.0.1:")

        @pytest.mark.tasktape("cassettes/completed_jsonrpc.jsonl")
        def test_sync_with_a_server_in_a_thread(tasktape):
            events = asyncio.run(ask(tasktape.url, QUESTION, "jsonrpc"))
            assert final_state(events) == "TASK_STATE_COMPLETED"

        @pytest.mark.asyncio(loop_scope="module")
        class TestInAModuleLoop:
            urls = []

            @pytest.mark.tasktape("cassettes/failed.jsonl")
            async def test_one(self, tasktape):
                assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"
                self.urls.append(tasktape.url)

            @pytest.mark.tasktape("cassettes/failed.jsonl")
            async def test_two_gets_a_server_of_its_own(self, tasktape):
                assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"
                assert tasktape.served == 2 and tasktape.url not in self.urls
        """
    )
    run(project).assert_outcomes(passed=4)
    # The same tests with pytest-asyncio in strict mode: the marked ones still run in its loop.
    run(project, "-o", "asyncio_mode=strict", "-k", "thread or Module").assert_outcomes(passed=3)


def test_a_miss_fails_the_test_naming_the_closest_recordings(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_miss="""
        import httpx
        import pytest
        from helpers import ask

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_something_else(tasktape):
            await ask(tasktape.url, "Something else")

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        def test_a_client_that_shrugs_off_a_404(tasktape):
            response = httpx.get(f"{tasktape.url}/tasks/task.unknown")
            print(response.text)
            assert response.status_code == 404

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        def test_fails_on_its_own(tasktape):
            assert 1 == 2
        """
    )
    result = run(project)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*tasktape: the cassette and the requests disagree",
            "POST /message:stream matches nothing in cassettes/completed.jsonl; the closest recordings:",
            "  POST /message:stream (completed.jsonl:5): body differs at /message/parts/0/text "
            '("Something else" vs "What does J45.909 mean?")',
            "  GET /.well-known/agent-card.json (completed.jsonl:2): method POST vs GET; *",
            "record what is missing with --tasktape-record-mode=new_episodes --tasktape-upstream URL*",
        ]
    )
    # The client's own error stays, traceback and all; the cassette's story is told beside it.
    result.stdout.fnmatch_lines(
        ["E *MethodNotFoundError: Resource not found: *", "*- Captured tasktape call -*", "tasktape: the *"]
    )
    result.stdout.fnmatch_lines(["GET /tasks/task.unknown matches nothing in cassettes/completed.jsonl*"])
    # The answer's own hint names the plugin's options, not the command line's.
    result.stdout.fnmatch_lines(
        ['*"hint": "record what is missing with --tasktape-record-mode=new_episodes --tasktape-upstream URL*']
    )
    # A test failing for its own reasons fails as it would without tasktape.
    result.stdout.fnmatch_lines(["*def test_fails_on_its_own*", "E       assert 1 == 2"])


def test_a_miss_hides_what_the_marker_redacts(project: pytest.Pytester) -> None:
    """A failing test's output shows no value at a place the marker's ``redact_*=`` names,
    though the cassette (recorded without them) holds none redacted there."""
    rpc = Recorded(
        method="POST",
        path="/rpc",
        query="sess=sk-kept-1&v=1",
        request_body=b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t1"}}',
        status=200,
        chunks=[(0, b"{}")],
        outcome="complete",
    )
    write_cassette(project.path / "rpc.jsonl", [rpc])
    project.makepyfile(
        test_rpc="""
        import httpx
        import pytest

        @pytest.mark.tasktape("rpc.jsonl", redact_query=["sess"], redact_json=["/params/apiKey"])
        def test_miss(tasktape):
            params = {"id": "t1", "apiKey": "sk-live-1"}
            body = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": params}
            assert httpx.post(f"{tasktape.url}/rpc?sess=sk-live-2&v=1", json=body).status_code == 404
        """
    )
    result = run(project)
    result.assert_outcomes(failed=1)
    assert "sk-live" not in result.stdout.str() and "sk-kept" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "POST /rpc?sess=[[]REDACTED]&v=1 matches nothing in rpc.jsonl; the closest recordings:",
            "  POST /rpc?sess=[[]REDACTED]&v=1 (rpc.jsonl:2): query sess=[[]REDACTED]&v=1 vs "
            "sess=[[]REDACTED]&v=1 (a hidden value differs); "
            "body differs at /params/apiKey ((a value) vs (absent))",
        ]
    )


def test_match_headers_through_the_marker(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_headers="""
        import pytest
        from helpers import ask, final_state

        @pytest.mark.tasktape("cassettes/completed.jsonl", match_headers="X-Tenant")
        async def test_absent_from_both(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

        @pytest.mark.tasktape("cassettes/completed.jsonl", match_headers=["X-Tenant"])
        async def test_another_tenant(tasktape):
            await ask(tasktape.url, "What does J45.909 mean?", headers={"X-Tenant": "south"})
        """
    )
    result = run(project)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ['  GET /.well-known/agent-card.json (completed.jsonl:2): header x-tenant "south" vs (absent)']
    )


def test_a_miss_in_a_fixture_is_reported_too(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_fixtures="""
        import httpx
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl")

        @pytest.fixture
        def warm_up(tasktape):
            httpx.get(f"{tasktape.url}/warm-up")  # a 404, shrugged off

        @pytest.fixture
        def strict_warm_up(tasktape):
            assert httpx.get(f"{tasktape.url}/strict-warm-up").status_code == 200

        @pytest.fixture
        def goodbye(tasktape):
            yield
            httpx.get(f"{tasktape.url}/goodbye")

        def test_after_a_warm_up(warm_up):
            pass

        def test_after_a_strict_warm_up(strict_warm_up):
            pass

        def test_before_a_goodbye(goodbye):
            pass
        """
    )
    result = run(project)
    # The shrugged-off miss fails the test; the strict fixture's failure is an error with the
    # cassette's story beside it; the goodbye's miss, after a passing test, errors its teardown.
    result.assert_outcomes(failed=1, passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_after_a_warm_up _*",
            "GET /warm-up matches nothing in cassettes/completed.jsonl; the closest recordings:",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_after_a_strict_warm_up*",
            "E *assert 404 == 200*",
            "*- Captured tasktape setup -*",
            "GET /strict-warm-up matches nothing in cassettes/completed.jsonl; *",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_before_a_goodbye*",
            "GET /goodbye matches nothing in cassettes/completed.jsonl; *",
        ]
    )
    # Each miss is told once in the reports; the short summary (which pytest leaves untruncated
    # when the CI variable is set) repeats failure messages, so it is left out of the count.
    reports = result.stdout.str().split("short test summary info")[0]
    assert reports.count("matches nothing") == 3


def test_mistakes_get_clear_errors(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_mistakes="""
        import pytest

        def test_no_cassette(tasktape):
            pass

        @pytest.mark.tasktape(upstream="http://127.0.0.1:9")
        def test_without_a_cassette_but_an_upstream(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", sped=0)
        def test_typo_in_an_option(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", faults="drop-afterwards=3")
        def test_bad_fault(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", ignore=["metadata"])
        def test_bad_pointer(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", add_ids="no")
        def test_not_a_flag(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", faults=["drop-after=3"])
        def test_faults_in_a_list(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", cassette="cassettes/other.jsonl")
        def test_two_cassettes(tasktape):
            pass

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        @pytest.mark.tasktape("cassettes/other.jsonl")
        def test_two_markers_two_cassettes(tasktape):
            pass
        """
    )
    result = run(project)
    result.assert_outcomes(errors=9)
    # Each is said once, as the test's failure, not after the error that led to it.
    assert "During handling of the above exception" not in result.stdout.str()
    result.stdout.fnmatch_lines_random(
        [
            "*tasktape: no cassette */cassettes/test_mistakes/test_no_cassette.jsonl; record it with "
            "--tasktape-record-mode=once --tasktape-upstream URL*",
            "*no cassette */test_without_a_cassette_but_an_upstream.jsonl; record it with "
            "--tasktape-record-mode=once, or name an existing one*",
            "*@pytest.mark.tasktape: unknown option(s) sped; known: cassette, name, speed, faults, *",
            "*@pytest.mark.tasktape: unknown fault 'drop-afterwards'*",
            "*@pytest.mark.tasktape: not a JSON pointer (it must start with '/'): 'metadata'*",
            "*@pytest.mark.tasktape: add_ids is True or False, not 'no'*",
            "*@pytest.mark.tasktape: faults are written as a string, such as 'drop-after=3', not ?'drop-*",
            "*@pytest.mark.tasktape: the cassette is given twice (as the argument and as cassette=)*",
            "*@pytest.mark.tasktape: cassette is given twice on test_two_markers_two_cassettes, by two "
            "markers ('cassettes/other.jsonl' and 'cassettes/completed.jsonl'): give it once*",
        ]
    )
    typo = run(project, "--tasktape-record-mode=onse")
    assert typo.ret == pytest.ExitCode.USAGE_ERROR
    typo.stderr.fnmatch_lines(
        [
            "*--tasktape-record-mode: 'onse' is not a tasktape record mode; choose one of none, once, "
            "new_episodes, all"
        ]
    )
    run(project, "--tasktape-record-mode=all", "-k", "typo or no_cassette").stdout.fnmatch_lines(
        [
            "*--tasktape-record-mode=all records */test_no_cassette.jsonl from an agent: give it with "
            "--tasktape-upstream URL*"
        ]
    )
    parallel = run(project, "--tasktape-record-mode=all", "-n", "2")
    assert parallel.ret == pytest.ExitCode.USAGE_ERROR
    parallel.stderr.fnmatch_lines(
        ["*--tasktape-record-mode=all replaces cassettes: run it without pytest-xdist's -n"]
    )
    schemeless = run(project, "--tasktape-record-mode=once", "--tasktape-upstream=127.0.0.1:1")
    assert schemeless.ret == pytest.ExitCode.USAGE_ERROR
    schemeless.stderr.fnmatch_lines(["*--tasktape-upstream: *http:// or https:// URL*"])


RECORDED_TESTS = """
import pytest
from helpers import ask, final_state

@pytest.mark.tasktape(redact_headers="X-Team-Secret")
@pytest.mark.parametrize("binding", ["rest", "jsonrpc"])
async def test_ask(tasktape, binding):
    secret = {"Authorization": "Bearer s3cret", "X-Team-Secret": "hunter2"}
    events = await ask(tasktape.url, "What does J45.909 mean?", binding, headers=secret)
    assert final_state(events) == "TASK_STATE_COMPLETED"
"""


def test_record_once_then_replay_without_the_agent(project: pytest.Pytester, agent: Agent) -> None:
    project.makepyfile(test_recorded=RECORDED_TESTS)
    before = len(agent.requests)
    run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={agent.url}").assert_outcomes(passed=2)
    folder = project.path / "cassettes" / "test_recorded"
    assert sorted(p.name for p in folder.iterdir()) == ["test_ask[jsonrpc].jsonl", "test_ask[rest].jsonl"]
    card = "GET /.well-known/agent-card.json"
    assert exchanges(folder / "test_ask[rest].jsonl") == [card, "POST /message:stream"]
    assert exchanges(folder / "test_ask[jsonrpc].jsonl") == [card, "POST /jsonrpc"]
    text = (folder / "test_ask[rest].jsonl").read_text()
    assert "s3cret" not in text and '["Authorization", "[REDACTED]"]' in text
    assert "hunter2" not in text and '["X-Team-Secret", "[REDACTED]"]' in text
    recorded = len(agent.requests)
    assert recorded - before == 4
    # Replayed: no agent needed, nothing reaches it; `once` leaves existing cassettes alone.
    run(project).assert_outcomes(passed=2)
    run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={agent.url}").assert_outcomes(passed=2)
    assert len(agent.requests) == recorded and (folder / "test_ask[rest].jsonl").read_text() == text


def test_new_episodes_adds_what_missed(project: pytest.Pytester, agent: Agent) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_more="""
        import pytest
        from helpers import ask, final_state

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_two_questions(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"
            assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"
        """
    )
    cassette = project.path / "cassettes" / "completed.jsonl"
    run(project).assert_outcomes(failed=1)
    before = len(agent.requests)
    run(project, "--tasktape-record-mode=new_episodes", f"--tasktape-upstream={agent.url}").assert_outcomes(
        passed=1
    )
    # Only the miss went to the agent (the card is replayed, however often it is read).
    assert agent.requests[before:] == ["POST /message:stream"]
    assert exchanges(cassette) == [
        "GET /.well-known/agent-card.json",
        "POST /message:stream",
        "POST /message:stream",
    ]
    assert read_cassette(cassette)[1].body == read_cassette(ROOT / "cassettes" / "completed.jsonl")[1].body
    run(project).assert_outcomes(passed=1)


def test_all_records_everything_again(project: pytest.Pytester, agent: Agent) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_again="""
        import pytest
        from helpers import ask, final_state

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_first(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_second_shares_the_cassette(tasktape):
            assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"
        """
    )
    cassette = project.path / "cassettes" / "completed.jsonl"
    old = read_cassette(cassette)
    before = len(agent.requests)
    run(project, "--tasktape-record-mode=all", f"--tasktape-upstream={agent.url}")
    # Every request of each test goes to the agent and is recorded anew, the card's too.
    card, stream = "GET /.well-known/agent-card.json", "POST /message:stream"
    assert agent.requests[before:] == [card, stream, card, stream]
    new = read_cassette(cassette)
    assert [r.request_line for r in new] == [card, stream, card, stream]
    assert old[1].body not in (new[1].body, new[3].body)  # new task ids: recorded, not kept
    run(project).assert_outcomes(passed=2)


ASKED = """
import httpx
import pytest

QUESTIONS = {questions}

def ask(tasktape, question, seen):
    \"\"\"Stream ``question``, adding its events' ids to ``seen``; two events in, the tape's
    events start so too (the stream still coming in: what came is there).\"\"\"
    body = {{"message": {{"role": "ROLE_USER", "parts": [{{"text": question}}]}}}}
    url, start = f"{{tasktape.url}}/message:stream", len(seen)
    with httpx.stream("POST", url, json=body, headers={{"A2A-Version": "1.0"}}) as response:
        for line in response.iter_lines():
            seen += [line.removeprefix("id: ")] if line.startswith("id: ") else []
            if not line and len(seen) == start + 2:
                assert [e.id for e in tasktape.events][: len(seen)] == seen

@pytest.mark.tasktape("cassettes/asked.jsonl")
def test_asks(tasktape):
    seen = []
    for question in QUESTIONS:
        ask(tasktape, question, seen)
    assert [e.id for e in tasktape.events] == seen
    assert tasktape.served == len(QUESTIONS)
"""


def test_a_recording_run_counts_and_shows_what_it_recorded(project: pytest.Pytester, agent: Agent) -> None:
    """.events and .served say what the test recorded, as they say what it replays: once
    records the first question; new_episodes replays it and records the second; all records
    both again; the replay serves both. The run's summary counts the recorded apart."""
    upstream = f"--tasktape-upstream={agent.url}"
    first, second = "What does J45.909 mean?", "This will fail"
    project.makepyfile(test_asked=ASKED.format(questions=[first]))
    once = run(project, "--tasktape-record-mode=once", upstream)
    once.assert_outcomes(passed=1)
    once.stdout.fnmatch_lines(["tasktape: 0 served, 0 missed, 0 unused, 0 refused, 1 recorded, *"])
    project.makepyfile(test_asked=ASKED.format(questions=[first, second]))
    run(project, "--tasktape-record-mode=new_episodes", upstream).assert_outcomes(passed=1)
    run(project, "--tasktape-record-mode=all", upstream).assert_outcomes(passed=1)
    assert exchanges(project.path / "cassettes" / "asked.jsonl") == ["POST /message:stream"] * 2
    run(project).assert_outcomes(passed=1)


def test_parallel_workers_record_and_replay_apart(project: pytest.Pytester, agent: Agent) -> None:
    project.makepyfile(
        test_parallel="""
        import pytest
        from helpers import ask, final_state

        @pytest.mark.parametrize("n", range(4))
        async def test_ask(tasktape, n):
            events = await ask(tasktape.url, f"Question {n}")
            assert final_state(events) == "TASK_STATE_COMPLETED"
            assert tasktape.served == 2  # replayed, or forwarded and recorded
        """
    )
    upstream = f"--tasktape-upstream={agent.url}"
    run(project, "-n", "2", "--tasktape-record-mode=once", upstream).assert_outcomes(passed=4)
    folder = project.path / "cassettes" / "test_parallel"
    assert len(list(folder.glob("*.jsonl"))) == 4
    for n in range(4):
        (_, stream) = read_cassette(folder / f"test_ask[{n}].jsonl")
        assert f"Question {n}".encode() in (stream.request_body or b"")
    run(project, "-n", "2").assert_outcomes(passed=4)


def test_a_fault_through_the_marker(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_faults="""
        import pytest
        from a2a.client import A2AClientError
        from helpers import ask

        @pytest.mark.tasktape("cassettes/completed.jsonl", faults="drop-after=3")
        async def test_the_stream_drops_after_three_events(tasktape):
            seen = []
            with pytest.raises(A2AClientError, match="incomplete chunked read"):
                await ask(tasktape.url, "What does J45.909 mean?", seen=seen)
            assert [next(iter(e)) for e in seen] == ["task", "statusUpdate", "artifactUpdate"]

        @pytest.mark.tasktape("cassettes/completed.jsonl", faults="status=503")
        async def test_the_agent_is_unavailable(tasktape):
            with pytest.raises(A2AClientError, match="503"):
                await ask(tasktape.url, "What does J45.909 mean?")

        @pytest.mark.tasktape("cassettes/dropped_connection.jsonl")
        async def test_a_recorded_drop_replays_as_one(tasktape):
            seen = []
            with pytest.raises(A2AClientError, match="incomplete chunked read"):
                await ask(tasktape.url, "Drop the line mid-answer", seen=seen)
            assert len(seen) == sum(e.complete for e in tasktape.events)
        """
    )
    sample(project, "dropped_connection.jsonl")
    run(project).assert_outcomes(passed=3)


def test_resume_with_last_event_id(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl", "sdk_echo.jsonl")
    project.makepyfile(
        test_resume="""
        import httpx
        import pytest

        BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}

        def ids_in(text):
            return [line[4:] for line in text.splitlines() if line.startswith("id: ")]

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_async_resume(tasktape):
            recorded = [e.id for e in tasktape.events]
            async with httpx.AsyncClient() as http:
                response = await http.post(
                    f"{tasktape.url}/message:stream", json=BODY, headers={"Last-Event-ID": recorded[9]}
                )
            assert ids_in(response.text) == recorded[10:]
            assert response.text.encode() == b"".join(e.raw for e in tasktape.events[10:])

        @pytest.mark.tasktape("cassettes/sdk_echo.jsonl", add_ids=True)
        def test_resume_a_stream_recorded_without_ids(tasktape):
            body = {"message": {"role": "ROLE_USER", "parts": [{"text": "hello"}]}}
            first = httpx.post(f"{tasktape.url}/message:stream", json=body).text
            ids = [f"tt2.{n}" for n in range(1, len(tasktape.events) + 1)]  # the card is exchange 1
            assert ids_in(first) == ids == [e.id for e in tasktape.events]  # (the ids add_ids sends)
            rest = httpx.post(f"{tasktape.url}/message:stream", json=body, headers={"Last-Event-ID": "tt2.2"})
            assert ids_in(rest.text) == ids[2:] and "Echo: hello -- done." in rest.text
        """
    )
    run(project).assert_outcomes(passed=2)


def test_unused_recordings(project: pytest.Pytester) -> None:
    """fail_on_unused, strict's older name, still works (strict: tests/test_pytest_hygiene.py)."""
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_unused="""
        import httpx
        import pytest

        @pytest.mark.tasktape("cassettes/completed.jsonl", fail_on_unused=True)
        def test_only_reads_the_card(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        def test_lenient(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json").raise_for_status()
            assert [r.request_line for r in tasktape.unused] == ["POST /message:stream"]
        """
    )
    result = run(project)
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["recorded but never requested: POST /message:stream (completed.jsonl:5)"])
    run(project, "--tasktape-fail-on-unused").assert_outcomes(passed=2, errors=2)


def test_markers_merge_and_other_async_plugins(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl", "failed.jsonl")
    project.makepyfile(
        test_merge="""
        import httpx
        import pytest
        from helpers import ask, final_state

        pytestmark = pytest.mark.tasktape(cassette="cassettes/completed.jsonl")

        @pytest.mark.tasktape(speed=1)
        def test_the_module_names_the_cassette(tasktape):
            assert tasktape.cassette.name == "completed.jsonl"
            assert tasktape.server.speed == 1

        @pytest.mark.tasktape("cassettes/failed.jsonl")
        async def test_the_closest_marker_wins(tasktape):
            assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"

        @pytest.mark.anyio
        async def test_anyio_gets_a_server_it_can_reach(tasktape):
            events = await ask(tasktape.url, "What does J45.909 mean?")
            assert final_state(events) == "TASK_STATE_COMPLETED"

        @pytest.fixture
        def card(tasktape):
            return httpx.get(f"{tasktape.url}/.well-known/agent-card.json").json()

        @pytest.mark.tasktape(in_thread=True)
        async def test_a_blocking_fixture_in_an_async_test(card):
            # Served from the test's own loop, this would deadlock.
            assert card["name"] == "tasktape demo agent"

        @pytest.mark.tasktape("cassettes/completed.jsonl", speed=0)
        class TestBase:
            def test_the_base_cassette(self, tasktape):
                assert tasktape.cassette.name == "completed.jsonl"

        # A subclass's marker says what its base's would: not two markers of one class.
        @pytest.mark.tasktape("cassettes/failed.jsonl")
        class TestOverriding(TestBase):
            def test_the_base_cassette(self, tasktape):
                assert (tasktape.cassette.name, tasktape.server.speed) == ("failed.jsonl", 0)

        # A case's marker says what its test's would.
        @pytest.mark.tasktape("cassettes/completed.jsonl")
        @pytest.mark.parametrize(
            "expected",
            [
                "completed.jsonl",
                pytest.param("failed.jsonl", marks=pytest.mark.tasktape("cassettes/failed.jsonl")),
            ],
        )
        def test_a_case_names_its_cassette(tasktape, expected):
            assert tasktape.cassette.name == expected
        """
    )
    run(project).assert_outcomes(passed=8)


def test_two_markers_of_one_class_that_disagree_fail_its_tests(project: pytest.Pytester) -> None:
    """A class's own two markers clash, as a test's do; a subclass's marker says what its
    base's would, and its own two agreeing do not clash."""
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_classes="""
        import pytest

        @pytest.mark.tasktape("cassettes/completed.jsonl", speed=1)
        @pytest.mark.tasktape("cassettes/completed.jsonl", speed=2)
        class TestTwoSpeeds:
            def test_x(self, tasktape):
                pass

        @pytest.mark.tasktape("cassettes/completed.jsonl", speed=1)
        class TestBase:
            speed = 1

            def test_speed(self, tasktape):
                assert tasktape.server.speed == self.speed

        @pytest.mark.tasktape(speed=2)
        @pytest.mark.tasktape(speed=2, add_ids=True)
        class TestAgreeing(TestBase):
            speed = 2

        @pytest.mark.tasktape(speed=3)
        @pytest.mark.tasktape(speed=4)
        class TestDisagreeing(TestBase):
            speed = 3
        """
    )
    result = run(project)
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "*tasktape: speed is given twice on TestTwoSpeeds, by two markers (2 and 1): give it once",
            "*tasktape: speed is given twice on TestDisagreeing, by two markers (4 and 3): give it once",
        ]
    )


def test_an_async_fixture_in_another_loop_than_its_test_reaches_the_tape(project: pytest.Pytester) -> None:
    """pytest-asyncio runs a fixture and its test in different loops when their loop scopes
    differ, each direction: the test's loop does not run while the fixture awaits, so the
    tape is served from a thread, which both reach."""
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_loops="""
        import httpx
        import pytest
        import pytest_asyncio

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl")

        async def name(url):
            async with httpx.AsyncClient(timeout=5) as http:
                return (await http.get(f"{url}/.well-known/agent-card.json")).json()["name"]

        @pytest_asyncio.fixture
        async def in_the_function_loop(tasktape):
            return await name(tasktape.url)

        @pytest_asyncio.fixture(loop_scope="module")
        async def in_the_module_loop(tasktape):
            return await name(tasktape.url)

        @pytest.fixture
        async def by_default(tasktape):  # auto mode runs it in the function's loop
            return await name(tasktape.url)

        @pytest.mark.asyncio(loop_scope="module")
        async def test_in_the_module_loop(in_the_function_loop, tasktape):
            assert in_the_function_loop == await name(tasktape.url) == "tasktape demo agent"

        async def test_in_the_function_loop(in_the_module_loop):
            assert in_the_module_loop == "tasktape demo agent"

        async def test_in_the_default_loop(by_default):
            assert by_default == "tasktape demo agent"
        """
    )
    run(project).assert_outcomes(passed=3)
    run(project, "-o", "asyncio_default_test_loop_scope=module").assert_outcomes(passed=3)


def test_recording_from_an_upstream_that_is_down(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_down="""
        import httpx

        def test_ask(tasktape):
            assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json").status_code == 502
        """
    )
    result = run(project, "--tasktape-record-mode=once", "--tasktape-upstream=http://127.0.0.1:9")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*tasktape: the upstream failed to answer, so */test_down/test_ask.jsonl did not get:",
            "  GET /.well-known/agent-card.json: upstream http://127.0.0.1:9 failed before answering: *",
        ]
    )
    assert not (project.path / "cassettes").exists()


def test_what_a_recording_run_did_not_get_or_got_cut_short_hides_what_its_cassette_redacts(
    project: pytest.Pytester, agent: Agent
) -> None:
    """A query parameter the cassette holds redacted (``sess=[REDACTED]``, recorded with
    redact_query=["sess"] once) is a credential to the replay's misses; the lines of what the
    upstream failed to answer and of a recording cut short printed its value as sent."""
    (project.path / "cassettes").mkdir()
    (project.path / "cassettes" / "sess.jsonl").write_text(
        '{"tasktape_cassette": 2}\n'
        '{"exchange": {"request": {"method": "GET", "path": "/a", "query": "sess=[REDACTED]"}, '
        '"response": {"status": 204}}}\n'
        '{"end": {"duration_ms": 1, "outcome": "complete"}}\n'
    )
    project.makepyfile(
        test_sess="""
        import os
        import httpx
        import pytest

        BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}
        SESS = "sk-live-" + "8"  # (a failure's source shows no sess=sk-live-...)

        @pytest.mark.tasktape("cassettes/sess.jsonl", upstream="http://127.0.0.1:9")
        def test_down(tasktape):
            assert httpx.get(f"{tasktape.url}/b?sess={SESS}").status_code == 502

        @pytest.mark.tasktape("cassettes/sess.jsonl")
        def test_stream(tasktape):
            url = f"{tasktape.url}/message:stream?sess={SESS}"
            with httpx.stream("POST", url, json=BODY) as response:
                for n, _ in enumerate(response.iter_lines()):
                    if n == 3:
                        raise RuntimeError("a bug in the client")
        """
    )
    result = run(project, "--tasktape-record-mode=new_episodes", f"--tasktape-upstream={agent.url}")
    result.assert_outcomes(passed=1, failed=1, errors=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "  GET /b?sess=[[]REDACTED]: upstream http://127.0.0.1:9 failed before answering: *",
            "*PytestWarning: tasktape: POST /message:stream?sess=[[]REDACTED] (exchange 2 of "
            "cassettes/sess.jsonl) was recorded cut short (client_disconnected)*",
        ]
    )
    assert "sess=sk-live" not in result.stdout.str()


def test_once_leaves_no_cassette_for_a_test_that_did_not_pass_before_any_request(
    project: pytest.Pytester, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that failed (or was skipped) before its first request gets no cassette of
    nothing, which its next runs would replay: they record it. One that passed sending
    nothing (its client answered from a cache) gets one."""
    project.makepyfile(
        test_early="""
        import os
        import httpx
        import pytest

        def test_card(tasktape):
            if not os.environ.get("READY"):
                raise RuntimeError("a bug before the first request")
            assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json").status_code == 200

        def test_skipped(tasktape):
            pytest.skip("not today")

        def test_cached(tasktape):
            pass
        """
    )
    upstream = f"--tasktape-upstream={agent.url}"
    run(project, "--tasktape-record-mode=once", upstream).assert_outcomes(passed=1, failed=1, skipped=1)
    cassettes = project.path / "cassettes" / "test_early"
    assert sorted(p.name for p in cassettes.iterdir()) == ["test_cached.jsonl"]
    assert exchanges(cassettes / "test_cached.jsonl") == []
    monkeypatch.setenv("READY", "1")
    run(project, "--tasktape-record-mode=once", upstream).assert_outcomes(passed=2, skipped=1)
    assert exchanges(cassettes / "test_card.jsonl") == ["GET /.well-known/agent-card.json"]


def test_once_records_a_cassette_two_tests_share(project: pytest.Pytester, agent: Agent) -> None:
    project.makepyfile(
        test_shared="""
        import pytest
        from helpers import ask, final_state

        pytestmark = pytest.mark.tasktape("cassettes/shared.jsonl")

        async def test_first(tasktape):
            assert final_state(await ask(tasktape.url, "What does J45.909 mean?")) == "TASK_STATE_COMPLETED"

        async def test_second(tasktape):
            assert final_state(await ask(tasktape.url, "This will fail")) == "TASK_STATE_FAILED"
        """
    )
    upstream = f"--tasktape-upstream={agent.url}"
    run(project, "--tasktape-record-mode=once", upstream).assert_outcomes(passed=2)
    cassette = project.path / "cassettes" / "shared.jsonl"
    assert exchanges(cassette) == [
        "GET /.well-known/agent-card.json",
        "POST /message:stream",
        "POST /message:stream",
    ]
    # Each exchange names the test that recorded it (the second test read the first one's card).
    first, second = "test_shared.py::test_first", "test_shared.py::test_second"
    assert [r.recorded_by for r in read_cassette(cassette)] == [first, first, second]
    run(project).assert_outcomes(passed=2)
    # Mode all on one of the tests records every request it makes again (the card it read
    # from the other's recording too) and keeps the other's recordings.
    old = read_cassette(cassette)
    run(project, "--tasktape-record-mode=all", upstream, "-k", "second").assert_outcomes(passed=1)
    new = read_cassette(cassette)
    assert [r.recorded_by for r in new] == [first, first, second, second]
    assert [r.body for r in new[:2]] == [r.body for r in old[:2]] and new[3].body != old[2].body
    run(project, "--tasktape-record-mode=all", upstream, "-k", "first").assert_outcomes(passed=1)
    assert [r.recorded_by for r in read_cassette(cassette)] == [second, second, first, first]
    run(project).assert_outcomes(passed=2)


def test_once_under_xdist_adds_to_a_cassette_another_worker_wrote(
    project: pytest.Pytester, agent: Agent
) -> None:
    """The test that comes second, on the other worker, finds the cassette written and adds to it."""
    project.makepyfile(
        test_race="""
        import time
        from pathlib import Path
        import pytest
        from helpers import ask, final_state

        @pytest.fixture
        def second(request):
            if request.node.callspec.params["question"] == "This will fail":
                cassette = Path(__file__).parent / "cassettes" / "race.jsonl"
                deadline = time.monotonic() + 20
                while not cassette.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)

        @pytest.mark.tasktape("cassettes/race.jsonl")
        @pytest.mark.parametrize("question", ["What does J45.909 mean?", "This will fail"])
        async def test_ask(second, tasktape, question):
            assert final_state(await ask(tasktape.url, question)) != "TASK_STATE_WORKING"
        """
    )
    upstream = f"--tasktape-upstream={agent.url}"
    run(project, "-n", "2", "--tasktape-record-mode=once", upstream).assert_outcomes(passed=2)
    assert exchanges(project.path / "cassettes" / "race.jsonl")[1:] == ["POST /message:stream"] * 2
    run(project).assert_outcomes(passed=2)


def test_replaying_cassettes_loads_no_log_reader() -> None:
    """A test process that only replays cassettes does not import the log reader nor
    sqlite-utils, nor the numpy and pandas sqlite-utils imports when they are installed
    (pandas alone takes most of a second)."""
    cassette = str(ROOT / "cassettes" / "completed.jsonl")
    code = (
        "import sys, tasktape.replay.pytest_plugin, tasktape.replay.tape; "
        "from tasktape.replay import ReplayServer, load; "
        f"ReplayServer(load([{cassette!r}])); print(*sys.modules)"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert {"tasktape.replay.server", "tasktape.eventlog.cassette"} <= loaded
    unwanted = {"sqlite_utils", "numpy", "pandas", "tasktape.eventlog.reader", "tasktape.eventlog.writer"}
    assert not loaded & unwanted


def test_a_run_that_uses_no_cassette_loads_neither_the_replay_nor_the_event_log() -> None:
    """pytest imports the plugin in every run: it loads its own few modules, not the replay
    server, the fault parser or the event log's package (and what they import)."""
    code = (
        "import sys, pytest; known = set(sys.modules); import tasktape.replay.pytest_plugin; "
        "print(*set(sys.modules) - known)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = [
        m
        for m in loaded
        if m.startswith(("tasktape.eventlog", "tasktape.replay.faults", "tasktape.replay.server", "aiohttp"))
    ]
    assert "tasktape.replay.marker" in loaded and heavy == []


def test_a_marked_test_without_the_fixture_fails_saying_so(project: pytest.Pytester) -> None:
    """A marker on the test itself promises a cassette; one on its module or class may
    cover tests that do not use one."""
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_forgot="""
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl")

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        def test_forgot_the_fixture():
            pass

        def test_covered_by_the_module_marker_only():
            pass
        """
    )
    result = run(project)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.tasktape on test_forgot_the_fixture serves its cassette*"])


async def test_a_cassette_path_the_file_system_refuses_is_explained(project: pytest.Pytester) -> None:
    name = "x" * 300
    project.makepyfile(
        test_long=f"""
        import urllib.request
        import pytest

        @pytest.mark.tasktape("cassettes/{name}.jsonl")
        def test_long(tasktape):
            urllib.request.urlopen(tasktape.url + "/.well-known/agent-card.json").read()
        """
    )
    async with serve(create_agent_app(pace=0)) as agent:
        args = ("-p", "no:cacheprovider", "--tasktape-record-mode=once", f"--tasktape-upstream={agent}")
        result = await asyncio.to_thread(project.runpytest_subprocess, *args)
    result.assert_outcomes(passed=1, errors=1)  # the test ran; writing its cassette failed
    result.stdout.fnmatch_lines(["*tasktape: cannot use the cassette *: File name too long*"])
    args = ("-p", "no:cacheprovider", "--tasktape-max-age=30d")  # its age is not asked of it first
    aged = await asyncio.to_thread(project.runpytest_subprocess, *args)
    aged.assert_outcomes(errors=1)
    aged.stdout.fnmatch_lines(["*tasktape: cannot use the cassette *: File name too long*"])
    for internal in ("Traceback", "During handling", "OSError"):
        assert internal not in result.stdout.str() + aged.stdout.str()


def test_a_cassette_that_cannot_be_written_is_explained(project: pytest.Pytester, agent: Agent) -> None:
    """Mode all cannot read a folder as the cassette it records again, and says so; writing
    it fails the test's teardown, saying why, without tasktape's traceback."""
    (project.path / "cassettes" / "folder.jsonl").mkdir(parents=True)
    project.makepyfile(
        test_folder="""
        import httpx
        import pytest

        @pytest.mark.tasktape("cassettes/folder.jsonl")
        def test_card(tasktape):
            assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json").status_code == 200
        """
    )
    result = run(project, "--tasktape-record-mode=all", f"--tasktape-upstream={agent.url}")
    result.assert_outcomes(passed=1, errors=1, warnings=1)
    result.stdout.fnmatch_lines(
        [
            "*_ ERROR at teardown of test_card _*",
            "tasktape: cannot write */cassettes/folder.jsonl: it is a folder",
            "*PytestWarning: tasktape: */folder.jsonl: cannot read it as a cassette: *Is a directory*; "
            "recorded anew, it keeps nothing of what was there",
            "tasktape: 0 served, * across 0 cassettes",
        ]
    )
    assert "CassetteError" not in result.stdout.str()


def test_a_recording_cut_short_is_kept_and_said_so(
    project: pytest.Pytester, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that fails mid-stream while recording leaves the stream cut short: it is what
    happened, so it is kept, with a warning; its replays break off there, and say why."""
    project.makepyfile(
        test_cut="""
        import os
        import httpx

        BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}

        def test_stream(tasktape):
            with httpx.stream("POST", f"{tasktape.url}/message:stream", json=BODY) as response:
                for n, _ in enumerate(response.iter_lines()):
                    if n == 3 and os.environ.get("CLIENT_BUG"):
                        raise RuntimeError("a bug in the client")
        """
    )
    monkeypatch.setenv("CLIENT_BUG", "1")
    recorded = run(project, "--tasktape-record-mode=once", f"--tasktape-upstream={agent.url}")
    recorded.assert_outcomes(failed=1, warnings=1)
    recorded.stdout.fnmatch_lines(
        [
            "*PytestWarning: tasktape: POST /message:stream (exchange 1 of "
            "cassettes/test_cut/test_stream.jsonl) was recorded cut short (client_disconnected); it is kept "
            "as it happened, so its replays break off at the same byte: *"
        ]
    )
    monkeypatch.delenv("CLIENT_BUG")
    replayed = run(project)
    replayed.assert_outcomes(failed=1)
    replayed.stdout.fnmatch_lines(
        [
            "E *RemoteProtocolError: *incomplete chunked read*",
            "*- Captured tasktape notes call -*",
            "POST /message:stream (test_stream.jsonl:2) was recorded cut short (client_disconnected): its "
            "replay breaks off at the same byte; *",
        ]
    )


def test_a_blocking_client_in_an_async_test_is_named_beside_its_failure(project: pytest.Pytester) -> None:
    """The tape is served in the test's own loop: a synchronous client there blocks the loop
    that would answer it, and waits for its own timeout. The failure says why."""
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_blocking="""
        import httpx
        import pytest

        @pytest.mark.tasktape("cassettes/completed.jsonl")
        async def test_sync_client(tasktape):
            httpx.get(f"{tasktape.url}/.well-known/agent-card.json", timeout=1.5)

        @pytest.mark.tasktape("cassettes/completed.jsonl", in_thread=True)
        async def test_sync_client_in_thread(tasktape):
            assert httpx.get(f"{tasktape.url}/.well-known/agent-card.json", timeout=5).status_code == 200
        """
    )
    result = run(project)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(
        [
            "E *ReadTimeout*",
            "*- Captured tasktape notes call -*",
            "the test's event loop, which serves the cassette, did not run for 1.* s: a blocking call in "
            "the async test (a synchronous HTTP client?) *@pytest.mark.tasktape(in_thread=True)",
        ]
    )


def test_a_sync_fixture_of_an_async_test_reaches_the_tape(project: pytest.Pytester) -> None:
    """A sync fixture runs while the test's loop does not: the tape is served from a thread
    for it. An async fixture blocking the loop that serves the tape fails its setup, and
    the failure says why, as the test's own would."""
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_fixtures="""
        import httpx
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl")

        @pytest.fixture
        def card(tasktape):
            return httpx.get(f"{tasktape.url}/.well-known/agent-card.json", timeout=5).json()

        async def test_a_sync_fixture(card):
            assert card["name"] == "tasktape demo agent"

        @pytest.fixture
        async def blocking(tasktape):  # auto mode: run in the test's loop, which it blocks
            return httpx.get(f"{tasktape.url}/.well-known/agent-card.json", timeout=1.5)

        async def test_a_blocking_async_fixture(blocking):
            pass
        """
    )
    result = run(project)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "E *ReadTimeout*",
            "*- Captured tasktape notes setup -*",
            "the test's event loop, which serves the cassette, did not run for 1.* s: *",
        ]
    )


def test_a_marker_names_its_upstream(project: pytest.Pytester, agent: Agent) -> None:
    """The marker's upstream wins over the command line's, and is checked as that one is."""
    project.makepyfile(
        test_upstreams=f"""
        import httpx
        import pytest

        @pytest.mark.tasktape(upstream="{agent.url}")
        def test_its_own_agent(tasktape):
            assert httpx.get(f"{{tasktape.url}}/.well-known/agent-card.json").status_code == 200

        @pytest.mark.tasktape(upstream="ftp://me:s3cret@example.com/agent")
        def test_not_http(tasktape):
            pass

        @pytest.mark.tasktape(upstream=8000)
        def test_not_a_string(tasktape):
            pass
        """
    )
    result = run(project, "--tasktape-record-mode=once", "--tasktape-upstream=http://127.0.0.1:9")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines_random(
        [
            "*@pytest.mark.tasktape: upstream: the upstream must be an http:// or https:// URL, not "
            "'ftp://example.com/agent'*",
            "*@pytest.mark.tasktape: upstream is a URL written as a string, not int*",
        ]
    )
    assert "s3cret" not in result.stdout.str()
    cassette = project.path / "cassettes" / "test_upstreams" / "test_its_own_agent.jsonl"
    assert exchanges(cassette) == ["GET /.well-known/agent-card.json"]
