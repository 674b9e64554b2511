"""The A2A event model and the classifier, on the reference frames and on anything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasktape.errors import FrameError
from tasktape.eventlog import (
    Classification,
    JsonRpcResponse,
    SSEDecoder,
    StreamResponse,
    TaskState,
    classify,
    parse_stream_response,
)
from tasktape.eventlog.classify import classify_json

DATA = Path(__file__).resolve().parent / "data"


def frames(name: str) -> list[str]:
    dec = SSEDecoder()
    return [e.data for e in dec.feed((DATA / name).read_bytes()) + dec.close()]


def test_lifecycle_document_examples() -> None:
    got = [classify(d) for d in frames("lifecycle_examples.sse")]
    assert [c.kind for c in got] == [
        "task",
        "artifactUpdate",
        "artifactUpdate",
        "artifactUpdate",
        "statusUpdate",
    ]
    assert {c.binding for c in got} == {"rest"}
    assert {c.task_id for c in got} == {"task.0192f4c8-..."}
    assert {c.context_id for c in got} == {"ctx.0192f4c8-..."}
    assert [c.state for c in got] == ["TASK_STATE_WORKING", None, None, None, "TASK_STATE_COMPLETED"]
    assert [c.append for c in got[1:4]] == [False, True, False]
    assert [c.last_chunk for c in got[1:4]] == [False, False, True]
    assert [c.text for c in got[1:4]] == [
        "J45.909",
        " — mild intermittent asthma.",
        "J45.909 — mild intermittent asthma.",
    ]
    assert {c.artifact_id for c in got[1:4]} == {"art.0192f4c8-..."}
    assert all(c.parse_error is None for c in got)


@pytest.mark.parametrize(
    ("name", "binding"),
    [("rest_message_stream.sse", "rest"), ("jsonrpc_SendStreamingMessage.sse", "jsonrpc")],
)
def test_official_sdk_frames(name: str, binding: str) -> None:
    got = [classify(d) for d in frames(f"wire/{name}")]
    assert [c.kind for c in got] == ["task", "statusUpdate"] + ["artifactUpdate"] * 5 + ["statusUpdate"]
    assert {c.binding for c in got} == {binding}
    assert [c.state for c in got if c.state] == [
        "TASK_STATE_SUBMITTED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    deltas = [c for c in got if c.kind == "artifactUpdate"]
    assert [c.append for c in deltas] == [False, True, True, True, False]
    assert [c.last_chunk for c in deltas] == [False, False, False, False, True]
    assert "".join(c.text for c in deltas[:-1]) == deltas[-1].text == "Echo: hi -- done."
    assert len({c.task_id for c in got}) == 1 and got[0].task_id
    # The first frame is a task snapshot: its text is the status message's, not the history.
    assert got[0].text is None


def test_usage_in_status_metadata() -> None:
    usage = json.loads((DATA / "usage_example.json").read_text())
    frame = {
        "statusUpdate": {
            "taskId": "t",
            "contextId": "c",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "metadata": usage,
        }
    }
    c = classify(json.dumps(frame))
    assert c.usage == usage["$usage"]
    model = parse_stream_response(json.dumps(frame))
    assert isinstance(model, StreamResponse)
    assert model.status_update is not None
    u = model.status_update.usage
    assert u is not None and (u.model, u.total_tokens, u.cached_input_tokens, u.credits) == (
        "corti-default",
        120,
        64,
        1.2,
    )


def test_jsonrpc_error_and_error_event() -> None:
    frame = '{"jsonrpc": "2.0", "id": 3, "error": {"code": -32001, "message": "Task not found"}}'
    assert classify(frame) == Classification("error", "jsonrpc", text="-32001: Task not found")
    parsed = parse_stream_response(frame)
    assert isinstance(parsed, JsonRpcResponse) and parsed.error and parsed.error.code == -32001
    assert classify('{"error": {"message": "bad"}}') == Classification("error", "rest", text="bad")


def test_a2a_v03_shapes() -> None:
    status = {
        "jsonrpc": "2.0",
        "id": "r1",
        "result": {
            "kind": "status-update",
            "taskId": "t1",
            "contextId": "c1",
            "status": {"state": "input-required"},
            "final": True,
        },
    }
    c = classify(json.dumps(status))
    assert (c.kind, c.binding, c.task_id, c.state) == (
        "statusUpdate",
        "jsonrpc",
        "t1",
        "TASK_STATE_INPUT_REQUIRED",
    )
    art = {
        "kind": "artifact-update",
        "taskId": "t1",
        "contextId": "c1",
        "append": True,
        "lastChunk": False,
        "artifact": {
            "artifactId": "a1",
            "parts": [{"kind": "text", "text": "hi"}],
            "metadata": {"type": "intermediate-thinking"},
        },
    }
    c = classify(json.dumps({"jsonrpc": "2.0", "id": 1, "result": art}))
    assert (c.kind, c.artifact_id, c.artifact_type, c.append, c.text) == (
        "artifactUpdate",
        "a1",
        "intermediate-thinking",
        True,
        "hi",
    )
    task = {"kind": "task", "id": "t1", "contextId": "c1", "status": {"state": "working"}}
    c = classify(json.dumps(task))
    assert (c.kind, c.task_id, c.state) == ("task", "t1", "TASK_STATE_WORKING")
    model = parse_stream_response(json.dumps({"jsonrpc": "2.0", "id": "r1", "result": status["result"]}))
    assert isinstance(model, JsonRpcResponse) and model.result is not None
    assert model.result.kind == "statusUpdate"
    assert model.result.status_update and model.result.status_update.status
    assert model.result.status_update.status.state == TaskState.INPUT_REQUIRED


@pytest.mark.parametrize(
    ("data", "kind", "error"),
    [
        ("", "other", None),  # nothing to classify: keep-alives, cut-off tails
        ("12345678901234567890123", "other", "not a JSON object"),
        ("[DONE]", "other", "not JSON"),
        ("null", "other", "not a JSON object"),
        ("[1, 2]", "other", "not a JSON object"),
        ('{"choices": [{"delta": {"content": "hi"}}]}', "other", None),
        ('{"task": 5}', "other", "task is not an object"),
        ('{"task": {}, "message": {}}', "other", "more than one"),
        ('{"kind": ["status-update"]}', "other", None),
        ('{"jsonrpc": "2.0", "id": 1, "result": 7}', "other", "not an object"),
        ("[" * 100_000, "other", "not JSON"),
        ('{"statusUpdate": {"taskId": 7, "status": "x"}}', "statusUpdate", None),
    ],
)
def test_anything_else_is_other_and_never_raises(data: str, kind: str, error: str | None) -> None:
    c = classify(data)
    assert c.kind == kind
    if error is None:
        assert c.parse_error is None
    else:
        assert c.parse_error is not None and error in c.parse_error


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "task",
                    "message",
                    "statusUpdate",
                    "artifactUpdate",
                    "kind",
                    "status",
                    "state",
                    "artifact",
                    "parts",
                    "text",
                    "metadata",
                    "$usage",
                    "jsonrpc",
                    "id",
                    "result",
                    "error",
                    "append",
                    "lastChunk",
                    "taskId",
                    "x",
                ]
            )
            | st.text(max_size=4),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=500, deadline=None)
@given(value=json_values)
def test_classify_never_raises_on_any_json(value: object) -> None:
    c = classify(json.dumps(value))
    assert c.kind in {"task", "message", "statusUpdate", "artifactUpdate", "error", "other"}


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=50))
def test_classify_never_raises_on_any_text(text: str) -> None:
    assert classify(text).kind in {"task", "message", "statusUpdate", "artifactUpdate", "error", "other"}


@pytest.mark.parametrize(
    "data",
    [5, 2.5, True, {"task": {"id": "t1"}}, ["data"], object()],
    ids=["int", "float", "bool", "dict", "list", "object"],
)
def test_classify_never_raises_on_what_is_no_text(data: object) -> None:
    """classify(5) and classify({...}) raised TypeError (a bytes-like object is required)."""
    c = classify(data)  # type: ignore[arg-type]
    assert (c.kind, c.task_id, c.parse_error) == (
        "other",
        None,
        f"not JSON text (str or bytes) but {type(data).__name__}",
    )


def _from_model(data: str) -> tuple:
    parsed = parse_stream_response(data)
    binding = "jsonrpc" if isinstance(parsed, JsonRpcResponse) else "rest"
    if isinstance(parsed, JsonRpcResponse):
        assert parsed.result is not None
        parsed = parsed.result
    p = parsed.payload
    state = getattr(getattr(p, "status", None), "state", None)
    artifact = getattr(p, "artifact", None)
    task_id = p.id if parsed.kind == "task" else p.task_id  # type: ignore[union-attr]
    return (
        parsed.kind,
        binding,
        task_id,
        p.context_id,
        state and str(state),
        artifact and artifact.artifact_id,
        artifact and artifact.type,
    )


@pytest.mark.parametrize(
    "name",
    ["lifecycle_examples.sse", "wire/rest_message_stream.sse", "wire/jsonrpc_SendStreamingMessage.sse"],
)
def test_classifier_agrees_with_the_models(name: str) -> None:
    for data in frames(name):
        c = classify(data)
        assert _from_model(data) == (
            c.kind,
            c.binding,
            c.task_id,
            c.context_id,
            c.state,
            c.artifact_id,
            c.artifact_type,
        )


def test_models_keep_unknown_fields_and_reject_non_frames() -> None:
    frame = '{"task": {"id": "t", "futureField": {"a": 1}, "status": {"state": "TASK_STATE_WORKING"}}}'
    model = parse_stream_response(frame)
    assert isinstance(model, StreamResponse) and model.task is not None
    assert model.task.model_extra == {"futureField": {"a": 1}}
    assert json.loads(model.model_dump_json(exclude_none=True)) == json.loads(frame)
    for bad in ("nope", "[]", '{"task": {}, "message": {}}', "{}"):
        with pytest.raises(FrameError):
            parse_stream_response(bad)


# Frames close to exact ones: each member right, of another JSON type, or missing, with a
# stray key or a JSON-RPC envelope now and then, so that both of classify's paths are taken.
_any_json = st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.just([]) | st.just({})
_maybe_text = st.text(max_size=6) | _any_json
_parts = st.lists(
    st.fixed_dictionaries({}, optional={"text": _maybe_text, "kind": st.just("text")}), max_size=3
)
_metadata = st.none() | st.fixed_dictionaries(
    {}, optional={"type": _maybe_text, "$usage": st.none() | st.just({"model": "m", "inputTokens": 3})}
)
_ids = {"taskId": _maybe_text, "contextId": _maybe_text}
_message = st.fixed_dictionaries({}, optional={**_ids, "parts": _parts | _any_json, "metadata": _metadata})
_status = st.fixed_dictionaries(
    {},
    optional={"state": st.sampled_from(["working", "TASK_STATE_COMPLETED"]) | _any_json, "message": _message},
)
_bodies = {
    "task": st.fixed_dictionaries(
        {}, optional={"id": _maybe_text, **_ids, "status": _status, "metadata": _metadata}
    ),
    "statusUpdate": st.fixed_dictionaries(
        {}, optional={**_ids, "status": _status | _any_json, "metadata": _metadata}
    ),
    "message": _message,
    "artifactUpdate": st.fixed_dictionaries(
        {},
        optional={
            **_ids,
            "append": st.booleans() | _any_json,
            "lastChunk": st.booleans() | _any_json,
            "metadata": _metadata | _any_json,
            "artifact": st.none()
            | st.fixed_dictionaries(
                {},
                optional={
                    "artifactId": _maybe_text,
                    "metadata": _metadata | _any_json,
                    "parts": _parts | _any_json,
                },
            ),
        },
    ),
}
_frames = st.one_of(
    *(st.builds(lambda k, b: {k: b}, st.just(kind), body) for kind, body in _bodies.items())
).flatmap(
    lambda frame: st.sampled_from(
        [
            frame,
            {"jsonrpc": "2.0", "id": 1, "result": frame},
            {"id": "7", "result": frame},
            {"jsonrpc": "2.0", "result": frame},
            {"result": frame},
            {"jsonrpc": "2.0", "id": 1},
            {**frame, "x": 1},
            {**frame, "task": {"id": "t"}},
            {"jsonrpc": "2.0", "id": 1, "result": {**frame, "kind": "task"}},
        ]
    )
)


@settings(max_examples=800, deadline=None)
@given(frame=_frames, duplicate=st.booleans())
def test_exact_frames_classify_as_through_their_dicts(frame: dict, duplicate: bool) -> None:
    """The typed path for exact frames agrees with the general one on every near miss."""
    data = json.dumps(frame)
    if duplicate and data.startswith('{"'):  # a member given twice: the last one counts
        data = '{"x0": 1, ' + data[1:] if "x" in frame else data.replace('{"', '{"taskId": 5, "', 1)
    assert classify(data) == classify_json(data)
