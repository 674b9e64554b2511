"""The MCP session page's time axis (see axis.py).

One lane per tool call: its POST as a bar, each progress notification a tick labelled
with its progress, each request the server sent while it waited a taller tick (its
tooltip says what it asks and when the client answered), the result or error a dot. A
GET that resumed the call (its messages came on it) is drawn in the call's lane as the
call's continuation, dashed, linked to the POST it continues. One lane below for the
session's other requests, each a bar named on it, in as many rows as keep them apart (up
to MAX_REQUEST_ROWS). A session of more than MAX_CALL_LANES calls has its first ones
drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from .axis import CHAR, TOP, WIDTH, LabelRows, Svg
from .session_page import ServerRequest, SessionExchange, SessionPage

LANE = 74
ROW = 19  # one row of the other requests' lane
# A session of thousands of calls would be a drawing hundreds of thousands of pixels tall:
# it draws its first MAX_CALL_LANES calls and MAX_REQUEST_ROWS rows of other requests (the
# page lists every call, and says how many are not drawn).
MAX_CALL_LANES = 50
MAX_REQUEST_ROWS = 8
MAX_REQUEST_LABEL = 40  # characters; the label's tooltip says the rest
MARK_COLOURS = {"progress": "#1e88e5", "request": "#8e24aa", "result": "#2e7d32", "error": "#c62828"}


def _call_lane(svg: Svg, x: SessionExchange, resumed: list[SessionExchange], y: float) -> None:
    mid = y + 40
    took = f"{x.duration_ms:,.0f} ms" if x.duration_ms is not None else None
    via = f"resumed on #{', #'.join(map(str, x.resumed_on))}" if x.resumed_on else None
    detail = " · ".join(v for v in (f"id {x.rpc_id}", took, via) if v)
    svg.lane_label(mid, f"#{x.id} {x.tool or x.label}", detail)
    end = x.end_ms if x.end_ms is not None else x.start_ms
    title = f"#{x.id} POST {x.tool or ''}: {x.start_ms:,.1f} to {end:,.1f} ms ({x.outcome or 'open'})"
    svg.bar(x.start_ms, end, mid - 2, 4, title, class_="tt-span")
    for get in resumed:
        until = get.end_ms if get.end_ms is not None else get.start_ms
        if x.answer is not None and x.answer.exchange_id == get.id:
            until = x.answer.at_ms
        svg.add(
            "path",
            title=f"#{get.id} GET resumed it after Last-Event-ID {get.last_event_id or '(none)'}",
            d=f"M{svg.x(end)} {mid} H{svg.x(get.start_ms)}",
            class_="tt-resume-link",
        )
        title = f"#{get.id} GET, resuming #{x.id}: {get.start_ms:,.1f} to {until:,.1f} ms"
        svg.bar(get.start_ms, until, mid - 3, 6, title, class_="tt-resumed")
        svg.add(
            "text", x=svg.x(get.start_ms), y=mid + 22, class_="tt-resume-label", text=f"#{get.id} GET resumed"
        )
    labels = LabelRows(2)
    for p in x.progress:
        at = svg.x(p.at_ms)
        where = f"#{p.exchange_id}.{p.seq}" if p.seq is not None else f"#{p.exchange_id}"
        title = f"progress {p.label} at {p.at_ms:,.1f} ms ({where}){': ' + p.message if p.message else ''}"
        svg.tick(p.at_ms, mid, 10, title, fill=MARK_COLOURS["progress"], class_="tt-progress")
        svg.mark_label(labels, at, mid - 14, p.label, MARK_COLOURS["progress"])
    for asked in x.asked:
        svg.tick(asked.at_ms, mid, 16, _asked_title(asked), fill=MARK_COLOURS["request"], class_="tt-asked")
    if x.answer is not None:
        a = x.answer
        name = "error" if a.error else "result"
        at = svg.x(a.at_ms)
        svg.add(
            "circle",
            title=f"{name} at {a.at_ms:,.1f} ms (#{a.exchange_id}){': ' + a.text if a.text else ''}",
            cx=at,
            cy=mid,
            r=6,
            fill=MARK_COLOURS[name],
            class_="tt-dot",
        )
        label = f"{name}: {a.text}" if a.text and len(a.text) <= 28 else name
        anchor = "end" if at + 10 + len(label) * CHAR > WIDTH - 4 else "start"
        svg.add(
            "text",
            x=at + 10 if anchor == "start" else at - 10,
            y=mid + 4,
            fill=MARK_COLOURS[name],
            class_="tt-mark-label",
            text_anchor=anchor,
            text=label,
        )


def _asked_title(asked: ServerRequest) -> str:
    where = f"#{asked.exchange_id}.{asked.seq}" if asked.seq is not None else f"#{asked.exchange_id}"
    said = f"{asked.text} at {asked.at_ms:,.1f} ms ({where}, {asked.tie})"
    reply = asked.reply
    return said + (f"; answered by #{reply.exchange_id} at {reply.at_ms:,.1f} ms" if reply else "; no answer")


@dataclass(frozen=True)
class _Placed:
    """An other request in its row, its label starting at ``label_x``."""

    exchange: SessionExchange
    row: int
    label_x: float


def _pack(svg: Svg, others: list[SessionExchange]) -> list[_Placed]:
    """The other requests, each in the first row where it (and its name) has room; its
    name ends at the drawing's right edge at the latest. Those with no room in the first
    MAX_REQUEST_ROWS rows are left out."""
    rows: list[float] = []  # where each row is taken up to
    placed = []
    for x in others:
        left = svg.x(x.start_ms)
        width = len(_label(x)) * CHAR
        label_x = min(left + 3, WIDTH - 4 - width)
        right = max(svg.x(x.end_ms if x.end_ms is not None else x.start_ms), label_x + width + 5)
        start = min(left, label_x)
        row = next((i for i, taken in enumerate(rows) if start >= taken + 4), len(rows))
        if row == MAX_REQUEST_ROWS:
            continue
        if row == len(rows):
            rows.append(right)
        rows[row] = right
        placed.append(_Placed(x, row, label_x))
    return placed


def _request_lane(svg: Svg, placed: list[_Placed], others: int, y: float) -> None:
    left_out = f" ({others - len(placed)} not drawn)" if others > len(placed) else ""
    svg.lane_label(y + 24, "other requests", f"{others} exchanges{left_out}")
    for p in placed:
        x = p.exchange
        top = y + 12 + ROW * p.row
        end = x.end_ms if x.end_ms is not None else x.start_ms
        title = f"#{x.id} {x.label} {x.status or ''}: {x.start_ms:,.1f} to {end:,.1f} ms" + (
            f" · {x.detail}" if x.detail else ""
        )
        failed = " tt-failed" if x.answer is not None and x.answer.error else ""
        svg.bar(x.start_ms, end, top, ROW - 5, title, min_width=2, class_="tt-request-bar" + failed)
        name = _name(x)
        label = _label(x)
        svg.add(
            "text",
            title=name if label != name else None,
            x=p.label_x,
            y=top + ROW - 9,
            class_="tt-request-label",
            text=label,
        )


def _name(x: SessionExchange) -> str:
    return f"#{x.id} {x.label}" + (" (resumed)" if x.last_event_id else "")


def _label(x: SessionExchange) -> str:
    """The name drawn on a request's bar: cut, past MAX_REQUEST_LABEL characters."""
    name = _name(x)
    return name if len(name) <= MAX_REQUEST_LABEL else name[: MAX_REQUEST_LABEL - 1] + "…"


def drawn_calls(page: SessionPage) -> list[SessionExchange]:
    """The tool calls the timeline has a lane for."""
    return page.calls[:MAX_CALL_LANES]


def session_svg(page: SessionPage) -> Markup:
    """The session on one time axis."""
    by_id = page.by_id
    calls = drawn_calls(page)
    # A resumed GET is drawn in its call's lane (if that is drawn at all).
    resumed = {i for c in page.calls for i in c.resumed_on}
    svg = Svg(page.duration_ms)
    others = [x for x in page.others if x.id not in resumed]
    placed = _pack(svg, others)
    rows = max((p.row for p in placed), default=-1) + 1
    height = TOP + LANE * len(calls) + (22 + ROW * rows if placed else 0) + 6
    svg.grid(height)
    y = float(TOP)
    for x in calls:
        svg.rule(y)
        _call_lane(svg, x, [by_id[i] for i in x.resumed_on], y)
        y += LANE
    if placed:
        svg.rule(y)
        _request_lane(svg, placed, len(others), y)
    return svg.markup(height, f"timeline of MCP session {page.session_id}")
