"""The task page's time axis (see axis.py).

One lane per stream (a resubscribe gets its own), one for the task's other requests.
Each event is a tick coloured by what it carries (past MAX_TICKS in a lane, a mark per few
pixels of time counts them, as it counts the other requests past MAX_TICKS); state
changes are dots labelled with the state; the longest gaps in a lane are measured under
it. When a resuming recorder saw a side reconnect, a last lane marks each reconnect (a
ring for a client, a diamond for the agent's stream), coloured and labelled by how it went.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

from markupsafe import Markup

from tasktape.eventlog.resumes import ResumeOutcome

from .axis import CHAR, TOP, LabelRows, Svg, fmt_ms
from .display import STATE_COLOURS, UNKNOWN_STATE_COLOUR, short_state
from .task_page import Event, Exchange, Reconnect, TaskPage

LANE = 98
REQUEST_LANE = 44
RECONNECT_LANE = 56
CATEGORY_COLOURS = {
    "thinking": "#7e57c2",
    "answer": "#00897b",
    "message": "#455a64",
    "error": "#d32f2f",
    "other": "#9e9e9e",
}
MAX_GAP_LABELS = 3
# Green: nothing lost; blue: the agent answered instead; orange: rejoined, but something
# is missing; red: the reconnect failed; grey: there was nothing to rejoin.
RECONNECT_COLOURS = {
    ResumeOutcome.RESUMED: "#00897b",
    ResumeOutcome.ENDED: "#00897b",
    ResumeOutcome.REJOINED: "#00897b",
    ResumeOutcome.CAUGHT_UP: "#00897b",
    ResumeOutcome.FORWARDED: "#1e88e5",
    ResumeOutcome.GAP: "#ef6c00",
    ResumeOutcome.REFUSED: "#c62828",
    ResumeOutcome.GAVE_UP: "#c62828",
    ResumeOutcome.NOT_RESUMABLE: "#757575",
}
MAX_RECONNECT_LABEL = 48  # characters; the mark's tooltip and the table say the rest
# Past this many events a lane draws one mark per BIN_PX of time, its tooltip counting
# what fell there: a tick each would make the drawing megabytes and the page slow.
MAX_TICKS = 2000
BIN_PX = 3


def colour(event: Event) -> str:
    if event.category == "state":
        return STATE_COLOURS.get(event.state or "", UNKNOWN_STATE_COLOUR)
    return CATEGORY_COLOURS[event.category]


def reconnect_colour(r: Reconnect) -> str:
    return RECONNECT_COLOURS.get(r.outcome, CATEGORY_COLOURS["other"])  # an outcome from a newer writer


def reconnect_label(r: Reconnect) -> str:
    """A reconnect in a few words: who came back, and how it went."""
    after = r.last_event_id or "(no id)"
    tries = f" ({r.attempts} attempt{'s' if r.attempts != 1 else ''})" if r.attempts is not None else ""
    match r.outcome:
        case ResumeOutcome.RESUMED:
            label = f"client reconnected after {after}: {r.events_from_log or 0} from log"
        case ResumeOutcome.ENDED:
            label = f"client came back after the end ({after})"
        case ResumeOutcome.REFUSED:
            label = f"refused a client's {after}"
        case ResumeOutcome.FORWARDED:
            label = f"forwarded a client's {after} to the agent"
        case ResumeOutcome.REJOINED:
            label = f"upstream rejoined{tries}"
        case ResumeOutcome.CAUGHT_UP:
            label = "caught up from the ended task"
        case ResumeOutcome.GAP:
            label = "rejoined with a gap" + (f": {r.error}" if r.error else tries)
        case ResumeOutcome.GAVE_UP:
            label = "gave up" + (f": {r.error}" if r.error else tries)
        case ResumeOutcome.NOT_RESUMABLE:
            label = "not resumable" + (f": {r.error}" if r.error else "")
        case _:
            label = f"{r.side} {r.outcome}"
    return label if len(label) <= MAX_RECONNECT_LABEL else label[: MAX_RECONNECT_LABEL - 1] + "…"


def _reconnect_title(r: Reconnect) -> str:
    said = [
        f"after {r.last_event_id}" if r.last_event_id else None,
        f"{r.events_from_log} events from the log" if r.events_from_log is not None else None,
        f"on #{r.new_exchange_id}" if r.new_exchange_id is not None else None,
        f"{r.attempts} attempts" if r.attempts is not None else None,
        f"made up {', '.join(r.synthesized)}" if r.synthesized else None,
        r.error,
    ]
    extra = "".join(f", {s}" for s in said if s)
    return f"#{r.exchange_id}: {r.side} {r.outcome.replace('_', ' ')} at {r.at_ms:,.1f} ms{extra}"


def _event_title(e: Event) -> str:
    what = e.kind + (f" {short_state(e.state)}" if e.state else "")
    if e.kind == "artifactUpdate":
        what += " (thinking)" if e.artifact_type == "intermediate-thinking" else " (answer)"
        what += " lastChunk" if e.last_chunk else " append" if e.append else ""
    if not e.complete:
        what += ", cut off"
    text = f": {e.text[:80]}" if e.text else ""
    return f"#{e.exchange_id}.{e.seq} at {e.at_ms:,.1f} ms, {what}{text}"


def _stream_lane(svg: Svg, x: Exchange, events: list[Event], y: float) -> None:
    mid = y + 42  # the lane's axis: state labels above it, artifact and gap labels below
    detail = " · ".join(str(v) for v in (x.binding, x.status, x.outcome) if v is not None)
    svg.lane_label(mid, f"#{x.id} {x.label}", detail)
    end = x.end_ms if x.end_ms is not None else (events[-1].at_ms if events else x.start_ms)
    title = f"#{x.id}: request at {x.start_ms:,.1f} ms, response ended at {end:,.1f} ms"
    svg.bar(x.start_ms, end, mid - 2, 4, title, class_="tt-span")
    if x.ttfb_ms is not None:
        svg.headers_mark(x.start_ms + x.ttfb_ms, mid)
    _artifact_bands(svg, events, mid)
    marks = [e for e in events if e.category != "state"]
    binned = len(marks) > MAX_TICKS
    (_binned_ticks if binned else _ticks)(svg, marks, mid)
    labels = LabelRows(2)
    for e in _state_events(events, changes_only=binned):
        at = svg.x(e.at_ms)
        svg.add("circle", title=_event_title(e), cx=at, cy=mid, r=6, fill=colour(e), class_="tt-dot")
        label = short_state(e.state)
        placed = labels.place(at, label)
        if placed is None:
            continue  # no room: the dot's tooltip and the state list still name it
        row, anchor = placed
        svg.add(
            "text",
            x=at,
            y=mid - 17 - 13 * row,
            fill=colour(e),
            class_="tt-state",
            text_anchor=anchor,
            text=label,
        )
    _gap_labels(svg, events, mid)


def _ticks(svg: Svg, events: list[Event], mid: float) -> None:
    """A tick per event: a taller one for a lastChunk or a cut-off event."""
    for e in events:
        tall = 14 if e.last_chunk or not e.complete else 9
        svg.tick(e.at_ms, mid, tall, _event_title(e), fill=colour(e), opacity=0.5 if e.repeated else 1)
        if not e.complete:
            _cut_mark(svg, svg.x(e.at_ms), mid)


def _cut_mark(svg: Svg, at: float, mid: float) -> None:
    """A cross over a cut-off event."""
    svg.add("path", d=f"M{at - 5} {mid - 24} l10 10 m0 -10 l-10 10", class_="tt-cut")


def _state_events(events: list[Event], *, changes_only: bool) -> list[Event]:
    """The lane's events that carry a state; with ``changes_only``, those that change it."""
    states = [e for e in events if e.category == "state" and e.state is not None]
    if not changes_only:
        return states
    return states[:1] + [b for a, b in itertools.pairwise(states) if b.state != a.state]


def _binned_ticks(svg: Svg, events: list[Event], mid: float) -> None:
    """The events as marks per BIN_PX of time: each as tall as its share of the busiest,
    coloured as most of its events are (an error's colour if any is one), its tooltip
    saying what it holds."""
    bins: dict[int, list[Event]] = {}
    for e in events:
        bins.setdefault(int(svg.x(e.at_ms) // BIN_PX), []).append(e)
    busiest = max(len(b) for b in bins.values())
    for at, group in bins.items():
        kinds = Counter(e.category for e in group)
        fill = CATEGORY_COLOURS["error" if kinds["error"] else kinds.most_common(1)[0][0]]
        half = 4 + 10 * len(group) / busiest
        x = at * BIN_PX
        svg.add(
            "rect",
            title=_bin_title(group, kinds),
            x=x,
            y=mid - half,
            width=BIN_PX,
            height=2 * half,
            fill=fill,
            class_="tt-bin",
        )
        if any(not e.complete for e in group):
            _cut_mark(svg, x + BIN_PX / 2, mid)


def _bin_title(group: list[Event], kinds: Counter[str]) -> str:
    first, last = group[0], group[-1]
    what = ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common())
    closes = sum(1 for e in group if e.last_chunk)
    closing = f", {closes:,} lastChunk" if closes else ""
    return (
        f"{len(group):,} events, #{first.exchange_id}.{first.seq} at {first.at_ms:,.1f} ms "
        f"to #{last.exchange_id}.{last.seq} at {last.at_ms:,.1f} ms: {what}{closing}"
    )


def _artifact_bands(svg: Svg, events: list[Event], mid: float) -> None:
    """A faint band under each artifact's deltas, from its first to its last, named below."""
    spans: dict[str, list[Event]] = {}
    for e in events:
        if e.kind == "artifactUpdate" and e.artifact_id is not None:
            spans.setdefault(e.artifact_id, []).append(e)
    taken = -1e9
    for deltas in spans.values():
        first, last = deltas[0], deltas[-1]
        fill = CATEGORY_COLOURS[first.category] if first.category in CATEGORY_COLOURS else colour(first)
        x1, x2 = svg.x(first.at_ms), svg.x(last.at_ms)
        name = "thinking" if first.artifact_type == "intermediate-thinking" else "answer"
        when = f"{first.at_ms:,.1f} to {last.at_ms:,.1f} ms"
        svg.add(
            "rect",
            title=f"{name} {first.artifact_id}: {len(deltas)} events, {when}",
            x=x1 - 3,
            y=mid - 12,
            width=x2 - x1 + 6,
            height=24,
            rx=3,
            fill=fill,
            class_="tt-band",
        )
        label = f"{name} · {len(deltas)}"
        if x1 >= taken + 6:
            svg.add("text", x=x1 - 3, y=mid + 26, fill=fill, class_="tt-band-label", text=label)
            taken = x1 + len(label) * CHAR


def _gap_labels(svg: Svg, events: list[Event], mid: float) -> None:
    """Measure the longest gaps of a lane under it: those well above its typical gap."""
    pairs = list(itertools.pairwise(events))
    if not pairs:
        return
    gaps = [b.at_ms - a.at_ms for a, b in pairs]
    typical = statistics.median(gaps)
    wide = sorted(
        (p for p, g in zip(pairs, gaps, strict=True) if g > max(3 * typical, 0.04 * svg.span)),
        key=lambda p: p[0].at_ms - p[1].at_ms,
    )[:MAX_GAP_LABELS]
    for a, b in wide:
        x1, x2 = svg.x(a.at_ms), svg.x(b.at_ms)
        label = fmt_ms(b.at_ms - a.at_ms)
        y = mid + 36
        svg.add("path", d=f"M{x1} {y - 4} v4 H{x2} v-4", class_="tt-gap")
        if x2 - x1 > len(label) * CHAR:
            middle = (x1 + x2) / 2
            svg.add("text", x=middle, y=y + 12, class_="tt-gap-label", text_anchor="middle", text=label)


def _request_lane(svg: Svg, others: list[Exchange], y: float) -> None:
    mid = y + REQUEST_LANE / 2
    counts: dict[str, int] = {}
    for x in others:
        counts[x.label] = counts.get(x.label, 0) + 1
    names = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in counts.items())
    svg.lane_label(mid + 2, "other requests", names)
    if len(others) > MAX_TICKS:
        _binned_requests(svg, others, mid)
        return
    for x in others:
        end = x.end_ms if x.end_ms is not None else x.start_ms
        title = f"#{x.id} {x.label} {x.status or ''}: {x.start_ms:,.1f} to {end:,.1f} ms"
        svg.bar(x.start_ms, end, mid - 6, 12, title, min_width=2, class_="tt-request")


def _binned_requests(svg: Svg, others: list[Exchange], mid: float) -> None:
    """The requests as marks per BIN_PX of time (a task polled thousands of times), each
    as tall as its share of the busiest, its tooltip counting what started there."""
    bins: dict[int, list[Exchange]] = {}
    for x in others:
        bins.setdefault(int(svg.x(x.start_ms) // BIN_PX), []).append(x)
    busiest = max(len(b) for b in bins.values())
    for at, group in bins.items():
        half = 2 + 4 * len(group) / busiest
        svg.add(
            "rect",
            title=_requests_title(group),
            x=at * BIN_PX,
            y=mid - half,
            width=BIN_PX,
            height=2 * half,
            class_="tt-request tt-bin",
        )


def _requests_title(group: list[Exchange]) -> str:
    first, last = group[0], group[-1]
    what = ", ".join(f"{n:,} {label}" for label, n in Counter(x.label for x in group).most_common())
    return (
        f"{len(group):,} requests, #{first.id} at {first.start_ms:,.1f} ms "
        f"to #{last.id} at {last.start_ms:,.1f} ms: {what}"
    )


def _reconnect_lane(svg: Svg, reconnects: list[Reconnect], y: float) -> None:
    """Each reconnect a mark at its moment, labelled, with a faint line up through the
    lanes above: which streams it falls across."""
    mid = y + 40  # labels above the marks
    clients = sum(1 for r in reconnects if r.client)
    svg.lane_label(mid, "reconnects", f"{clients} client, {len(reconnects) - clients} upstream")
    labels = LabelRows(2)
    for r in reconnects:
        at, fill, title = svg.x(r.at_ms), reconnect_colour(r), _reconnect_title(r)
        classes = f"tt-reconnect {r.css_class}"
        svg.add("line", x1=at, x2=at, y1=TOP, y2=y, stroke=fill, class_="tt-reconnect-rule")
        if r.client:  # a ring
            svg.add("circle", title=title, cx=at, cy=mid, r=5, fill="#fff", stroke=fill, class_=classes)
        else:  # a diamond
            d = f"M{at} {mid - 6} l6 6 l-6 6 l-6 -6 z"
            svg.add("path", title=title, d=d, fill=fill, class_=classes)
        svg.mark_label(labels, at, mid - 10, reconnect_label(r), fill)


def timeline_svg(page: TaskPage) -> Markup:
    """The task's run on one time axis."""
    streams = [x for x in page.exchanges if x.is_sse]
    others = [x for x in page.exchanges if not x.is_sse]
    height = TOP + LANE * len(streams) + (REQUEST_LANE if others else 0) + 6
    height += RECONNECT_LANE if page.reconnects else 0
    svg = Svg(page.duration_ms)
    svg.grid(height)
    y = float(TOP)
    for x in streams:
        svg.rule(y)
        _stream_lane(svg, x, [e for e in page.events if e.exchange_id == x.id], y)
        y += LANE
    if others:
        svg.rule(y)
        _request_lane(svg, others, y)
        y += REQUEST_LANE
    if page.reconnects:
        svg.rule(y)
        _reconnect_lane(svg, page.reconnects, y)
    return svg.markup(height, f"timeline of task {page.task_id}")
