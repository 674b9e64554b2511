"""The time axis the inspector's pages draw as inline SVG on the server: a scale from
milliseconds to x, round ticks with their grid, and an element builder that escapes what
it is given. Drawn without script, a page shows the same offline, in a screenshot, and
saved to disk."""

from __future__ import annotations

import bisect
import itertools
import math
import string
import unicodedata
from enum import Enum

from markupsafe import Markup, escape

WIDTH = 1120
LEFT = 214  # room for lane labels
RIGHT = 28
TOP = 30  # room for the axis labels
CHAR = 6.3  # average width of a character at the labels' size, for spacing them
LANE_LABEL_X = 12
LANE_LABEL_ROOM = LEFT - LANE_LABEL_X - 8  # pixels a lane's title or detail may take
TITLE_PX, DETAIL_PX = 12, 11  # font sizes of .tt-lane-title (bold) and .tt-lane-detail
# Widths of characters in em, on the wide side of the usual sans-serif fonts (DejaVu Sans
# the widest of them): a label cut to fit by these fits. Bold is BOLD times as wide.
_NARROW_EM, _NARROW = 0.45, set(" !'(),-./:;IJ[\\]`fijlrt|\u00b7")
_WIDE_EM, _WIDE = 1.0, set("%@MWmw\u2026")
_UPPER_EM, _UPPER = 0.85, set(string.ascii_uppercase + "#$&+<=>^~{}")
_ASCII_EM, _OTHER_EM = 0.66, 1.25  # any other ASCII; any other character (a CJK one: 1 em)
BOLD = 1.15
ELLIPSIS = "\u2026"


class TimeUnit(Enum):
    """A unit an axis counts in: its symbol, its length in ms, and the span from which an
    axis is counted in it (from ten minutes on in minutes, not "1,200 s"; from three hours
    on in hours, not "600 min")."""

    MS = ("ms", 1, 0)
    S = ("s", 1_000, 2_000)
    MIN = ("min", 60_000, 10 * 60_000)
    H = ("h", 3_600_000, 3 * 3_600_000)

    def __init__(self, symbol: str, ms: int, from_ms: int) -> None:
        self.symbol = symbol
        self.ms = ms
        self.from_ms = from_ms

    @classmethod
    def for_span(cls, ms: float) -> TimeUnit:
        """The unit to count ``ms`` in: the largest one it reaches."""
        return [unit for unit in cls if ms >= unit.from_ms][-1]

    def tick(self, count: float, decimals: int) -> str:
        """``count`` of this unit with ``decimals`` places at most: ``1,500 ms``, ``2.5 s``."""
        text = f"{count:,.{decimals}f}"
        return f"{text.rstrip('0').rstrip('.') if decimals else text} {self.symbol}"


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks."""
    raw = max(span, 1e-3) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def fmt_ms(ms: float) -> str:
    """A length of time in the unit its size calls for: ``250 ms``, ``2.5 ms``, ``12 s``,
    ``3.28 h``."""
    unit = TimeUnit.for_span(ms)
    count = ms / unit.ms
    return f"{count:,.0f} {unit.symbol}" if count >= 10 else f"{count:.3g} {unit.symbol}"


def _decimals(step: float) -> int:
    """The decimal places the multiples of a step of 1, 2 or 5 times a power of ten need."""
    return max(0, -math.floor(math.log10(step) + 1e-9))


def _em(char: str) -> float:
    if char in _NARROW:
        return _NARROW_EM
    if char in _WIDE:
        return _WIDE_EM
    if char in _UPPER:
        return _UPPER_EM
    if unicodedata.category(char) in ("Mn", "Me", "Cf"):  # a combining mark, a joiner: no width
        return 0
    return _ASCII_EM if char.isascii() else _OTHER_EM


def fit(text: str, px: float, *, bold: bool = False, room: float = LANE_LABEL_ROOM) -> str:
    """``text`` as it fits in ``room`` pixels at a font size of ``px``: whole, or cut with an
    ellipsis."""
    scale = px * (BOLD if bold else 1)
    ends = list(itertools.accumulate(_em(char) * scale for char in text))  # where each ends
    if not ends or ends[-1] <= room:
        return text
    keep = bisect.bisect_right(ends, room - _em(ELLIPSIS) * scale)
    return text[:keep].rstrip() + ELLIPSIS


def _num(value: object) -> object:
    return round(value, 1) if isinstance(value, float) else value


class LabelRows:
    """Rows of labels along a lane: each goes in the first row where it has room, starting
    at its mark (ending there, near the right edge), or is left out."""

    def __init__(self, rows: int) -> None:
        self.ends = [-1e9] * rows  # where the labels on each row end

    def place(self, at: float, label: str) -> tuple[int, str] | None:
        """The row and text-anchor of a label for the mark at ``at``; None: no room."""
        width = len(label) * CHAR
        anchor = "end" if at + width > WIDTH - 4 else "start"
        left = at if anchor == "start" else at - width
        row = next((i for i, end in enumerate(self.ends) if left >= end + 6), None)
        if row is None:
            return None
        self.ends[row] = left + width
        return row, anchor


class Svg:
    """An SVG drawing whose x axis runs from 0 to a little past ``duration`` ms."""

    def __init__(self, duration: float) -> None:
        self.parts: list[str] = []
        # One unit for the whole axis, its ticks round in it: not "8,000 ms" next to "10 s".
        self.unit = TimeUnit.for_span(duration or 1.0)
        self.unit_step = nice_step((duration or 1.0) / self.unit.ms)
        self.step = self.unit_step * self.unit.ms
        self.span = self.step * math.ceil((duration or 1.0) / self.step * 1.001)

    def x(self, ms: float) -> float:
        return round(LEFT + ms / self.span * (WIDTH - LEFT - RIGHT), 1)

    def add(self, tag: str, title: str | None = None, text: str | None = None, **attrs: object) -> None:
        """One element; ``class_`` is ``class``, ``text_anchor`` is ``text-anchor``; numbers
        to a tenth of a pixel."""
        attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{escape(_num(v))}"' for k, v in attrs.items())
        inner = (Markup("<title>{}</title>").format(title) if title else Markup()) + (text or "")
        self.parts.append(f"<{tag}{attr}>{inner}</{tag}>" if inner else f"<{tag}{attr}/>")

    def bar(
        self,
        start_ms: float,
        end_ms: float,
        y: float,
        height: float,
        title: str,
        *,
        min_width: float = 1,
        **attrs: object,
    ) -> None:
        """A span of time: a rounded bar from ``start_ms`` to ``end_ms``, at least ``min_width`` wide."""
        x = self.x(start_ms)
        width = max(self.x(end_ms) - x, min_width)
        self.add("rect", title=title, x=x, y=y, width=width, height=height, rx=2, **attrs)

    def tick(self, at_ms: float, mid: float, half: float, title: str, **attrs: object) -> None:
        """A moment: a thin mark ``2 * half`` tall, centred on the lane's axis ``mid``."""
        self.add("rect", title=title, x=self.x(at_ms) - 1, y=mid - half, width=2, height=2 * half, **attrs)

    def mark_label(self, labels: LabelRows, at: float, base: float, text: str, fill: str) -> None:
        """A mark's label above it, in the first of ``labels``' rows with room (``base``: the
        lowest row's baseline); left out when none has."""
        placed = labels.place(at, text)
        if placed is not None:
            row, anchor = placed
            self.add(
                "text",
                x=at,
                y=base - 12 * row,
                fill=fill,
                class_="tt-mark-label",
                text_anchor=anchor,
                text=text,
            )

    def lane_label(self, mid: float, title: str, detail: str) -> None:
        """A lane's name and the line under it, left of the axis: each cut to the room
        there, its tooltip saying the whole."""
        for text, y, px, bold, class_ in (
            (title, mid - 4, TITLE_PX, True, "tt-lane-title"),
            (detail, mid + 11, DETAIL_PX, False, "tt-lane-detail"),
        ):
            shown = fit(text, px, bold=bold)
            self.add(
                "text", title=text if shown != text else None, x=LANE_LABEL_X, y=y, class_=class_, text=shown
            )

    def headers_mark(self, at_ms: float, mid: float) -> None:
        """When the response's headers came: a small triangle under the lane's axis."""
        at = self.x(at_ms)
        self.add(
            "path",
            title=f"response headers at {at_ms:,.1f} ms",
            d=f"M{at} {mid + 4} l-4 7 h8 z",
            class_="tt-ttfb",
        )

    def grid(self, height: float) -> None:
        """The ticks along the top, each with its line down the drawing."""
        ticks = round(self.span / self.step)
        decimals = _decimals(self.unit_step)
        for i in range(ticks + 1):
            at = self.x(i * self.step)
            self.add("line", x1=at, x2=at, y1=TOP - 6, y2=height - 4, class_="tt-grid")
            anchor = "end" if i == ticks else "middle" if i else "start"
            label = self.unit.tick(i * self.unit_step, decimals)
            self.add("text", x=at, y=TOP - 12, class_="tt-axis", text_anchor=anchor, text=label)

    def rule(self, y: float) -> None:
        """The line between two lanes."""
        self.add("line", x1=0, x2=WIDTH, y1=y, y2=y, class_="tt-lane-rule")

    def markup(self, height: float, label: str) -> Markup:
        """The drawing, ``label`` naming it for screen readers."""
        return Markup(
            f'<svg class="tt-timeline" viewBox="0 0 {WIDTH} {height}" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(self.parts)
            + "</svg>"
        )
