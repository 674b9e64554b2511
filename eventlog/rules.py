"""The lifecycle rules, one plain function each, registered by name in ``RULES``.

Every rule reads all the exchanges checked together (a task's state carries from one
to the next) and yields a :class:`Problem` for each place it is broken; its docstring is
the one line that explains it. The rules come from the A2A v1.0 task lifecycle.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .a2a_terms import ENDS_A_STREAM, TERMINAL_STATES, A2AKind, Binding, TaskState, from_v03, short_state
from .frames import Frame, Problem, Repeats, Rule, Stream, readable
from .protocols.base import quoted
from .requests import SUBSCRIBE_METHODS

S = TaskState
LEGAL: dict[str, frozenset[str]] = {
    S.SUBMITTED: frozenset({S.WORKING, S.REJECTED, S.AUTH_REQUIRED, S.CANCELED}),
    S.WORKING: frozenset({S.COMPLETED, S.FAILED, S.INPUT_REQUIRED, S.AUTH_REQUIRED, S.CANCELED}),
    S.INPUT_REQUIRED: frozenset({S.WORKING, S.CANCELED}),
    S.AUTH_REQUIRED: frozenset({S.WORKING, S.CANCELED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELED: frozenset(),
    S.REJECTED: frozenset(),
}
# REST shows REJECTED and AUTH_REQUIRED as FAILED, so SUBMITTED -> REJECTED there reads
# SUBMITTED -> FAILED (and SUBMITTED -> AUTH_REQUIRED too, where an agent maps it).
REST_ONLY = {S.SUBMITTED: frozenset({S.FAILED})}
_STATEFUL = (A2AKind.TASK, A2AKind.STATUS_UPDATE)  # the frames that carry a task's state


def _describe(frame: Frame) -> str:
    c = frame.c
    if c.kind in _STATEFUL:
        return f"a {c.kind} in {c.state or 'no state'}"
    if c.kind == A2AKind.ERROR:
        return f"an error frame ({c.text or 'no message'})"
    if c.kind == A2AKind.OTHER:
        return "a frame that is not A2A"
    return f"an {c.kind}" if c.kind[0] in "aeiou" else f"a {c.kind}"


def transition(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Each task moves between states only as the lifecycle allows (same state again is fine)."""
    frames = [(s, f) for s in streams for f in s.frames if f.c.kind in _STATEFUL and f.c.state]
    if all(f.at_ns is not None for _, f in frames):
        # Exchanges overlap (a cancel during a stream, a resubscribe): go by arrival time.
        frames.sort(key=lambda sf: sf[1].at_ns or 0)
    last: dict[str | None, tuple[str, Stream, Frame]] = {}
    for stream, frame in frames:
        state = frame.c.state or ""
        if state not in LEGAL:
            yield Problem(stream, frame, f"{state!r} is not a task state of the lifecycle")
            continue
        before = last.get(frame.task_id)
        last[frame.task_id] = (state, stream, frame)
        if before is None or before[0] == state:
            continue
        allowed = LEGAL[before[0]] | (
            REST_ONLY.get(before[0], frozenset()) if frame.c.binding == Binding.REST else set()
        )
        if state not in allowed:
            was = "" if before[1] is stream else f" (in {before[1].label(before[2])})"
            can = ", ".join(sorted(short_state(s) for s in LEGAL[before[0]]))
            why = f"allowed: {can}" if can else "a terminal state is final"
            yield Problem(
                stream,
                frame,
                f"{short_state(before[0])}{was} -> {short_state(state)} is not a legal transition ({why})",
            )


def after_terminal(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Once a task reaches a terminal state, its stream sends nothing more for it."""
    for stream in streams:
        ended: dict[str | None, Frame] = {}
        for frame in stream.frames:
            if frame.task_id in ended:
                end = ended[frame.task_id]
                yield Problem(
                    stream,
                    frame,
                    f"{_describe(frame)} after the task ended {short_state(end.c.state)} at event {end.seq}",
                )
            elif frame.c.kind in _STATEFUL and frame.c.state in TERMINAL_STATES:
                ended[frame.task_id] = frame


def stream_end(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A stream that ran to its end closes on a terminal or interrupted state (one cut short is exempt)."""
    for stream in streams:
        if not stream.is_sse or not stream.complete:
            continue
        frames = [f for f in stream.frames if f.complete]
        if not frames:
            yield Problem(stream, None, "the stream ended without a single event")
            continue
        if all(f.c.kind == A2AKind.MESSAGE for f in frames):
            continue  # the agent answered with a Message: no task, no lifecycle
        # Its own task's states alone (its first event's task): another task's end, in an event
        # that named the wrong task, ends nothing of it.
        own = [f for f in frames if f.task_id == stream.task_id] or frames
        if any(f.c.kind in _STATEFUL and f.c.state in TERMINAL_STATES for f in own):
            continue  # it did end; what came after is after-terminal's to report
        last = own[-1]
        if last.c.kind in _STATEFUL and last.c.state in ENDS_A_STREAM:
            continue
        yield Problem(
            stream, last, f"the stream ended on {_describe(last)}, not on a terminal or interrupted state"
        )


@dataclass
class _Artifact:
    texts: list[str]  # its text so far, piece by piece: a Task snapshot's (when one seeded it), then deltas
    by: Stream  # the stream whose event last set or added to it
    closed: tuple[Stream, Frame] | None = None  # where its lastChunk came
    snapshot: tuple[Stream, Frame] | None = None  # the Task whose text it goes on from, if one

    @property
    def deltas(self) -> int:
        """How many deltas made its text (after the snapshot's, when one seeded it)."""
        return len(self.texts) - (self.snapshot is not None)


def _new_artifact_frames(streams: Sequence[Stream]) -> list[tuple[Stream, Frame]]:
    """The artifactUpdates of the streams, and the Tasks their streams carry, but those sent
    again: a task's stream that continues an earlier one (a request with Last-Event-ID, a
    subscribe to the task) with the id of an event that one sent repeats it (as the log's
    views read them); a subscribe's event without an id repeats an event without an id of
    the same content."""
    repeats: dict[str | None, Repeats] = {}
    found = []
    for stream in streams:
        again: set[int] = set()
        # (A plain response sends nothing again; its Task, a GetTask's, holds no place in
        # a stream's order: it would restate text a stream's later delta brings.)
        kinds = (A2AKind.ARTIFACT_UPDATE, A2AKind.TASK) if stream.is_sse else (A2AKind.ARTIFACT_UPDATE,)
        if stream.is_sse:
            task_repeats = repeats.setdefault(stream.task_id, Repeats())
            subscribe = stream.request.rpc_method in SUBSCRIBE_METHODS
            again = task_repeats.in_frames(stream.frames, stream.last_event_id, subscribe, stream.started_ns)
        found += [(stream, f) for i, f in enumerate(stream.frames) if f.c.kind in kinds and i not in again]
    return found


def _parts_text(parts: object) -> str:
    """The text of an artifact's parts, joined (as an artifactUpdate's text is read)."""
    if not isinstance(parts, list):
        return ""
    return "".join(t for p in parts if isinstance(p, dict) and isinstance(t := p.get("text"), str))


def _snapshot_texts(frame: Frame) -> dict[str, str]:
    """The text of each artifact a Task frame holds, by artifact id."""
    task = from_v03(frame.payload or {}).get("task")
    artifacts = task.get("artifacts") if isinstance(task, dict) else None
    if not isinstance(artifacts, list):
        return {}
    return {
        a["artifactId"]: _parts_text(a.get("parts"))
        for a in artifacts
        if isinstance(a, dict) and isinstance(a.get("artifactId"), str)
    }


def _seed(artifacts: dict[tuple[str | None, str | None], _Artifact], stream: Stream, frame: Frame) -> None:
    """Take a Task's artifacts as their text so far: a subscribe that picks a broken stream
    up again begins with the text the agent sent meanwhile, which no event of the log holds.
    A snapshot does not reopen an artifact its lastChunk closed, nor restate the text of
    one another stream that ran to its end is sending (arrival order across streams is not
    exact: its next delta may be in the snapshot already), nor go back on text already
    held."""
    for artifact_id, text in _snapshot_texts(frame).items():
        key = (frame.task_id, artifact_id)
        known = artifacts.get(key)
        if known is not None and (
            known.closed is not None
            or (known.by is not stream and known.by.complete)
            or "".join(known.texts).startswith(text)
        ):
            continue
        artifacts[key] = _Artifact([text], stream, snapshot=(stream, frame))


def _artifact_steps(streams: Sequence[Stream]) -> Iterator[tuple[Stream, Frame, _Artifact | None]]:
    """Each artifactUpdate, with what came before it for that artifact in its task: across
    the task's streams in time order (a task resumed on a new stream goes on with the
    artifacts an earlier one began, or a Task snapshot holds), else in the order of the
    exchanges."""
    steps = _new_artifact_frames(streams)
    if all(f.at_ns is not None for _, f in steps):
        steps.sort(key=lambda sf: sf[1].at_ns or 0)
    artifacts: dict[tuple[str | None, str | None], _Artifact] = {}
    for stream, frame in steps:
        if frame.c.kind == A2AKind.TASK:
            _seed(artifacts, stream, frame)
            continue
        c = frame.c
        key = (frame.task_id, c.artifact_id)
        before = artifacts.get(key)
        yield stream, frame, before
        text = c.text or ""
        if before is None or before.closed is not None or not c.append:
            artifacts[key] = _Artifact([text], stream)  # append false replaces what came before
        else:
            before.texts.append(text)
            before.by = stream
        if c.last_chunk:
            artifacts[key].closed = (stream, frame)


def artifact_order(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Per artifact: the first delta has append false, later ones append true, nothing after lastChunk."""
    for stream, frame, before in _artifact_steps(streams):
        c = frame.c
        if c.artifact_id is None:
            yield Problem(stream, frame, "an artifactUpdate without artifact.artifactId")
        elif before is not None and before.closed is not None:
            closer, last = before.closed
            where = f"event {last.seq}" if closer is stream else closer.label(last)
            yield Problem(stream, frame, f"artifact {c.artifact_id} goes on after its lastChunk ({where})")
        elif before is None and c.append:
            yield Problem(
                stream,
                frame,
                f"the first event of artifact {c.artifact_id} has append true: nothing to append to",
            )
        elif before is not None and not c.append and not c.last_chunk and before.deltas:
            # (Not one replacing a Task snapshot's text alone: another stream's first delta
            # may arrive after a snapshot that holds it.)
            yield Problem(
                stream,
                frame,
                f"a later delta of artifact {c.artifact_id} has append false, replacing the text so far",
            )


def last_chunk_text(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A lastChunk that replaces the deltas (append false) carries exactly their text, joined."""
    for stream, frame, before in _artifact_steps(streams):
        c = frame.c
        if not c.last_chunk or c.append or before is None or before.closed is not None:
            continue
        joined, text = "".join(before.texts), c.text or ""
        if joined != text:
            at = next((i for i, (a, b) in enumerate(zip(joined, text, strict=False)) if a != b), None)
            at = min(len(joined), len(text)) if at is None else at
            yield Problem(
                stream,
                frame,
                f"the lastChunk of artifact {c.artifact_id} is not {_pieces(stream, before)} joined: "
                f"they differ at character {at} ({joined[at : at + 20]!r} vs {text[at : at + 20]!r})",
            )


def _pieces(stream: Stream, artifact: _Artifact) -> str:
    """What an artifact's text so far was made of, for a lastChunk's stream: ``its 3 deltas``,
    or ``its text in the Task at event 0 and the 2 deltas after it``."""
    if artifact.snapshot is None:
        return f"its {artifact.deltas} deltas"
    by, task = artifact.snapshot
    where = f"event {task.seq}" if by is stream else by.label(task)
    return f"its text in the Task at {where} and the {artifact.deltas} deltas after it"


def completed_message(streams: Sequence[Stream]) -> Iterator[Problem]:
    """A v1.0 COMPLETED statusUpdate carries no message: the answer is the artifact before it."""
    for stream in streams:
        for frame in stream.frames:
            if frame.c.state != S.COMPLETED:
                continue
            update = (frame.payload or {}).get("statusUpdate")
            if not isinstance(update, dict):
                continue
            status = update.get("status")
            if isinstance(status, dict) and status.get("message") is not None:
                yield Problem(
                    stream, frame, "the COMPLETED statusUpdate carries status.message (v1.0 sends none)"
                )


def unique_ids(streams: Sequence[Stream]) -> Iterator[Problem]:
    """SSE event ids are unique within a stream."""
    for stream in streams:
        seen: dict[str, int | None] = {}
        for frame in stream.frames:
            if not frame.sse_id:  # (an empty id clears the last event id: it names no event)
                continue
            if frame.sse_id in seen:
                yield Problem(
                    stream, frame, f"event id {frame.sse_id!r} repeats that of event {seen[frame.sse_id]}"
                )
            else:
                seen[frame.sse_id] = frame.seq


def jsonrpc_id(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Each JSON-RPC response frame carries the id of the request it answers."""
    for stream in streams:
        if not stream.jsonrpc or stream.rpc_id is None:
            continue
        want = stream.rpc_id
        for frame in stream.frames:
            if frame.envelope is None and frame.payload is None:
                continue  # not JSON at all: the frame rule says so
            envelope = frame.envelope or {}
            if "id" not in envelope:
                yield Problem(stream, frame, f"a response without a JSON-RPC id (the request's is {want!r})")
            elif envelope["id"] != want or type(envelope["id"]) is not type(want):
                got = quoted(envelope["id"])
                yield Problem(stream, frame, f"JSON-RPC id {got} is not the request's {quoted(want)}")


def well_formed(streams: Sequence[Stream]) -> Iterator[Problem]:
    """Every event is a JSON A2A frame, and a stream that ran to its end does not stop mid-event."""
    for stream in streams:
        for f, problem in readable(stream):
            if problem is not None:
                yield problem
            elif f.c.kind == A2AKind.OTHER and stream.is_sse:
                yield Problem(
                    stream, f, "not an A2A frame: none of task, message, statusUpdate, artifactUpdate"
                )


RULES: dict[str, Rule] = {
    "transition": transition,
    "after-terminal": after_terminal,
    "stream-end": stream_end,
    "artifact-order": artifact_order,
    "last-chunk-text": last_chunk_text,
    "completed-message": completed_message,
    "unique-ids": unique_ids,
    "jsonrpc-id": jsonrpc_id,
    "frame": well_formed,
}
