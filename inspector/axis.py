"""The time axis the inspector's pages draw as inline SVG on the server: a scale from
milliseconds to x, round ticks with their grid, and an element builder that escapes what
it is given. Drawn without script, a page shows the same offline, in a screenshot, and
saved to disk."""

from __future__ import annotations

import math

from markupsafe import Markup, escape

WIDTH = 1120
LEFT = 214  # room for lane labels
RIGHT = 28
TOP = 30  # room for the axis labels
CHAR = 6.3  # average width of a character at the labels' size, for spacing them


def nice_step(span: float, ticks: int = 8) -> float:
    """A round tick step (1, 2 or 5 times a power of ten) giving about ``ticks`` ticks."""
    raw = max(span, 1e-3) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def fmt_ms(ms: float) -> str:
    """A time on the axis: ``12 s``, ``250 ms``, ``2.5 ms``."""
    return f"{ms / 1000:g} s" if ms >= 10_000 else f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.3g} ms"


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
        self.step = nice_step(duration or 1.0)
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
        """A lane's name and the line under it, left of the axis."""
        self.add("text", x=12, y=mid - 4, class_="tt-lane-title", text=title)
        self.add("text", x=12, y=mid + 11, class_="tt-lane-detail", text=detail)

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
        for i in range(ticks + 1):
            at = self.x(i * self.step)
            self.add("line", x1=at, x2=at, y1=TOP - 6, y2=height - 4, class_="tt-grid")
            anchor = "end" if i == ticks else "middle" if i else "start"
            self.add(
                "text", x=at, y=TOP - 12, class_="tt-axis", text_anchor=anchor, text=fmt_ms(i * self.step)
            )

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
