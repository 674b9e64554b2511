"""The LLM stream page's time axis (see axis.py).

One lane for the stream: the exchange as a bar (a triangle where the response headers
came), each text delta a tick (the model's thinking in its own colour), the other events
shorter grey ticks (past MAX_TICKS events, a mark per few pixels of time counts them, as on
the task page); the finish, the token counts and the end of the stream marked and labelled;
an error a red cross. The gaps between deltas well above the stream's typical gap are
measured under it.
"""

from __future__ import annotations

from collections import Counter

from markupsafe import Markup

from .axis import CHAR, TOP, LabelRows, Svg, fmt_ms
from .stream_page import StreamEvent, StreamPage
from .timeline import BIN_PX, MAX_TICKS
from .timeline import CATEGORY_COLOURS as TASK_COLOURS

LANE = 116
THINKING = "thinking"  # a text delta of the model's thinking, drawn apart from the answer's
CATEGORY_COLOURS = {
    "delta": "#00897b",
    THINKING: TASK_COLOURS["thinking"],
    "finish": "#2e7d32",
    "usage": "#6d4c41",
    "done": "#37474f",
    "error": "#d32f2f",
    "other": "#b0bec5",
}


def category(e: StreamEvent) -> str:
    """What a mark of the event shows: its category, a thinking delta told from the answer's."""
    return THINKING if e.category == "delta" and e.thinking else e.category


def _title(e: StreamEvent) -> str:
    what = e.event_type if e.event_type and e.event_type != "message" else e.kind
    said = [f"{e.state}" if e.state else None, e.tokens, None if e.complete else "cut off", e.parse_error]
    text = f": {e.text[:80]}" if e.text else ""
    extra = "".join(f", {s}" for s in said if s)
    return f"#{e.seq} at {e.at_ms:,.1f} ms, {what}{extra}{text}"


def _mark(e: StreamEvent) -> str | None:
    """The label of a mark: the finish, the end, the error, and the tokens counted (a
    delta has none: ruled out first, a long stream being nearly all deltas)."""
    kind = e.category
    if kind == "delta":
        return None
    name = e.event_type if e.event_type and e.event_type != "message" else e.kind
    main = {
        "finish": e.state or e.kind,
        "done": e.state or name,
        "error": e.text or "error",
    }.get(kind)
    said = [s for s in (main, e.tokens) if s]
    return " · ".join(said) if said else None


def _gap_labels(svg: Svg, page: StreamPage, mid: float) -> None:
    """Measure the longest gaps between deltas: those well above the typical one."""
    typical = page.gap_p50
    if typical is None:
        return
    for gap in page.longest_gaps:
        if gap.ms <= max(2 * typical, 0.03 * svg.span):
            continue
        x1, x2 = svg.x(gap.after.at_ms), svg.x(gap.before.at_ms)
        label = fmt_ms(gap.ms)
        y = mid + 30
        svg.add(
            "path",
            title=f"{gap.ms:,.1f} ms before delta {gap.number} (#{gap.before.seq})",
            d=f"M{x1} {y - 4} v4 H{x2} v-4",
            class_="tt-gap",
        )
        if x2 - x1 > len(label) * CHAR:
            svg.add(
                "text", x=(x1 + x2) / 2, y=y + 12, class_="tt-gap-label", text_anchor="middle", text=label
            )


def _ticks(svg: Svg, events: list[StreamEvent], mid: float) -> None:
    """A tick per event: shorter for an event without text, taller for one that is marked."""
    for e in events:
        kind = category(e)
        tall = {"delta": 10, THINKING: 10, "other": 5}.get(kind, 14)
        svg.tick(e.at_ms, mid, tall, _title(e), fill=CATEGORY_COLOURS[kind], class_=f"tt-ev tt-ev-{kind}")


def _binned_ticks(svg: Svg, events: list[StreamEvent], mid: float) -> None:
    """The events as marks per BIN_PX of time, as the task page draws a long lane: each as
    tall as its share of the busiest, coloured as most of its events are (an error's colour
    if any is one), its tooltip saying what it holds. The finish, the token counts, the end
    and errors keep their labelled marks above."""
    bins: dict[int, list[StreamEvent]] = {}
    for e in events:
        bins.setdefault(int(svg.x(e.at_ms) // BIN_PX), []).append(e)
    busiest = max(len(b) for b in bins.values())
    for at, group in bins.items():
        kinds = Counter(category(e) for e in group)
        fill = CATEGORY_COLOURS["error" if kinds["error"] else kinds.most_common(1)[0][0]]
        half = 4 + 10 * len(group) / busiest
        svg.add(
            "rect",
            title=_bin_title(group, kinds),
            x=at * BIN_PX,
            y=mid - half,
            width=BIN_PX,
            height=2 * half,
            fill=fill,
            class_="tt-bin",
        )


def _bin_title(group: list[StreamEvent], kinds: Counter[str]) -> str:
    first, last = group[0], group[-1]
    what = ", ".join(f"{n:,} {kind}" for kind, n in kinds.most_common())
    return (
        f"{len(group):,} events, #{first.seq} at {first.at_ms:,.1f} ms "
        f"to #{last.seq} at {last.at_ms:,.1f} ms: {what}"
    )


def stream_svg(page: StreamPage) -> Markup:
    """The stream's events on one time axis."""
    height = TOP + LANE + 6
    svg = Svg(page.end_ms)
    svg.grid(height)
    y = float(TOP)
    svg.rule(y)
    mid = y + 62  # mark labels above the axis, gap measures below
    detail = " · ".join(str(v) for v in (page.protocol, page.status, page.outcome) if v is not None)
    svg.lane_label(mid, f"#{page.exchange_id} {page.call or page.path}", detail)
    end = page.duration_ms if page.duration_ms is not None else page.end_ms
    title = f"#{page.exchange_id}: request at 0 ms, response ended at {end:,.1f} ms"
    svg.bar(0, end, mid - 2, 4, title, class_="tt-span")
    if page.ttfb_ms is not None:
        svg.headers_mark(page.ttfb_ms, mid)
    (_binned_ticks if len(page.events) > MAX_TICKS else _ticks)(svg, page.events, mid)
    labels = LabelRows(3)
    for e in page.events:
        label = _mark(e)
        if label is None:
            continue
        at = svg.x(e.at_ms)
        if e.category == "error":
            svg.add("path", d=f"M{at - 5} {mid - 24} l10 10 m0 -10 l-10 10", class_="tt-cut")
        else:
            svg.add("circle", title=_title(e), cx=at, cy=mid - 14, r=3.5, fill=CATEGORY_COLOURS[e.category])
        svg.mark_label(labels, at, mid - 21, label, CATEGORY_COLOURS[e.category])
    _gap_labels(svg, page, mid)
    return svg.markup(height, f"timeline of stream {page.exchange_id}")
