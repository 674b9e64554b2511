"""The fixture as a test instrument: faults armed from the test (``tasktape.fault``),
``reset``, the fidelity report, and ``assert_faithful`` failing with the stream and the
reason. Run by a pytest of its own in a temporary project, as in test_pytest_plugin.py."""

from __future__ import annotations

import pytest
import test_pytest_plugin as plugin_tests
from test_pytest_plugin import run, sample

project = plugin_tests.project


def test_faults_from_the_test_and_the_report(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_instrument="""
        import httpx
        import pytest
        from helpers import ask, final_state

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl", allow_repeats=True)
        QUESTION = "What does J45.909 mean?"

        async def test_drop_once_then_whole(tasktape):
            tasktape.fault("drop-after=3;times=1")
            seen = []
            with pytest.raises(Exception):
                await ask(tasktape.url, QUESTION, seen=seen)
            assert len(seen) == 3
            assert final_state(await ask(tasktape.url, QUESTION)) == "TASK_STATE_COMPLETED"
            streams = [s for s in tasktape.report()["streams"] if s["path"] == "/message:stream"]
            assert [s["identical"] for s in streams] == [False, True]
            assert streams[0]["reasons"] == ["fault: drop-after=3"] and not streams[0]["finished"]
            assert streams[1]["lateness_ms"]["max"] >= 0
            tasktape.assert_faithful(allow=["fault", "rewrite"])

        async def test_unfaithful_names_the_stream_and_why(tasktape):
            tasktape.fault("skip=2")
            await ask(tasktape.url, QUESTION)
            tasktape.assert_faithful(allow=["rewrite"])

        async def test_reset_disarms(tasktape):
            tasktape.fault("status=503")
            tasktape.reset()
            assert final_state(await ask(tasktape.url, QUESTION)) == "TASK_STATE_COMPLETED"

        def test_a_typo_is_loud(tasktape):
            tasktape.assert_faithful(allow=["faults"])

        def test_a_bad_spec_is_loud(tasktape):
            tasktape.fault("skip=two")
        """
    )
    result = run(project)
    result.assert_outcomes(passed=2, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*_ test_unfaithful_names_the_stream_and_why _*",
            "*Unfaithful: tasktape: the replay was not the recording:",
            "*POST /message:stream (completed.jsonl:5): fault: skip=2",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*'faults' is not a kind of difference; choose one of fault, resume, rewrite*"]
    )
    result.stdout.fnmatch_lines(["*cannot read the fault 'skip=two'*"])
    # Each at the test's own line: none of tasktape's frames below it.
    out = result.stdout.str()
    assert not any(f"{name}.py:" in out for name in ("tape", "faults", "choices"))


def test_allowing_one_kind_and_a_client_gone_during_a_late_status(project: pytest.Pytester) -> None:
    sample(project, "completed.jsonl")
    project.makepyfile(
        test_allowed="""
        import asyncio
        import httpx
        import pytest

        pytestmark = pytest.mark.tasktape("cassettes/completed.jsonl", allow_repeats=True)
        BODY = {"message": {"role": "ROLE_USER", "parts": [{"text": "What does J45.909 mean?"}]}}

        async def test_one_kind_as_a_string(tasktape):
            tasktape.fault("skip=2")
            async with httpx.AsyncClient() as http:
                await http.post(f"{tasktape.url}/message:stream", json=BODY)
            tasktape.assert_faithful(allow="fault")

        async def test_the_client_left_before_the_late_status(tasktape):
            late = {"X-Tasktape-Fault": "status=500;delay-headers=1000"}
            async with httpx.AsyncClient() as http:
                with pytest.raises(httpx.TimeoutException):
                    await http.post(f"{tasktape.url}/message:stream", json=BODY, headers=late, timeout=0.1)
            await asyncio.sleep(0.2)
            (stream,) = tasktape.report()["streams"]
            assert stream["reasons"][1:] == ["client-left: after 0 bytes"]
            tasktape.assert_faithful(allow=["fault", "client-left"])
        """
    )
    run(project).assert_outcomes(passed=2)
