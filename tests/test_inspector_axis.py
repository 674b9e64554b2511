"""The time axis the inspector's pages draw (inspector/axis.py), read off the SVG it makes:
one unit per axis, chosen by its span, ticks at round steps in it; lane labels cut to the
room left of the plot, their tooltips saying the whole."""

from __future__ import annotations

import math
import re

import pytest

from tasktape.inspector.axis import ELLIPSIS, Svg, fmt_ms

MIN = 60_000
H = 60 * MIN
NUMBER = re.compile(r"\d{1,3}(,\d{3})*(\.\d+)?")  # thousands separated, decimals if any


def tick_labels(duration_ms: float) -> list[str]:
    svg = Svg(duration_ms)
    svg.grid(100)
    return re.findall(r'class="tt-axis"[^>]*>([^<]*)<', svg.markup(100, "axis"))


def lane_labels(title: str, detail: str) -> list[tuple[str, str, str]]:
    """The lane's title and detail as drawn: class, tooltip (empty if none), text."""
    svg = Svg(1000)
    svg.lane_label(50, title, detail)
    found = re.findall(
        r'<text x="12" y="[\d.]+" class="(tt-lane-\w+)">(?:<title>([^<]*)</title>)?([^<]*)</text>',
        svg.markup(100, "lane"),
    )
    assert [c for c, _, _ in found] == ["tt-lane-title", "tt-lane-detail"]
    return found


def test_a_15_second_stream_is_counted_in_seconds() -> None:
    assert tick_labels(15_000) == [f"{s} s" for s in range(0, 18, 2)]  # not "8,000 ms", "10 s"


def test_a_task_resumed_after_three_hours_is_counted_in_hours() -> None:
    assert tick_labels(3 * H + 17 * MIN) == ["0 h", "0.5 h", "1 h", "1.5 h", "2 h", "2.5 h", "3 h", "3.5 h"]


def test_ticks_past_a_thousand_are_separated() -> None:
    assert tick_labels(1_900) == ["0 ms", "500 ms", "1,000 ms", "1,500 ms", "2,000 ms"]
    assert tick_labels(1_008 * H)[-2:] == ["1,000 h", "1,200 h"]


@pytest.mark.parametrize(
    ("duration_ms", "unit"),
    [
        (0, "ms"),
        (0.004, "ms"),
        (350, "ms"),
        (1_999, "ms"),
        (2_000, "s"),
        (50_000, "s"),
        (9 * MIN, "s"),
        (25 * MIN, "min"),
        (2.9 * H, "min"),
        (3 * H, "h"),
        (90 * 24 * H, "h"),
    ],
)
def test_an_axis_counts_in_one_unit_at_round_steps(duration_ms: float, unit: str) -> None:
    labels = tick_labels(duration_ms)
    counts = [label.removesuffix(f" {unit}") for label in labels]
    assert all(NUMBER.fullmatch(count) for count in counts), labels
    values = [float(count.replace(",", "")) for count in counts]
    step = values[1]
    assert step / 10 ** math.floor(math.log10(step)) in (1, 2, 5), labels
    assert values == pytest.approx([i * step for i in range(len(values))]), labels
    assert (
        4 <= len(values) <= 12 and values[-1] * {"ms": 1, "s": 1e3, "min": MIN, "h": H}[unit] >= duration_ms
    )


@pytest.mark.parametrize(
    ("ms", "label"),
    [
        (2.5, "2.5 ms"),
        (400, "400 ms"),
        (4_000, "4 s"),
        (45 * MIN, "45 min"),
        (3 * H + 17 * MIN, "3.28 h"),
        (1_500 * H, "1,500 h"),
    ],
)
def test_a_gap_is_measured_in_the_unit_its_length_calls_for(ms: float, label: str) -> None:
    assert fmt_ms(ms) == label


@pytest.mark.parametrize(
    ("title", "detail"),
    [
        (
            "#2 search_the_entire_knowledge_base_for_documents_matching",
            "openai · 200 · upstream_disconnected",
        ),
        ("#12 " + "W" * 40, "M" * 60),
        ("#7 " + "日本語" * 20, "👩\u200d👩\u200d👧" * 30),
    ],
)
def test_a_long_lane_label_is_cut_and_its_tooltip_says_the_whole(title: str, detail: str) -> None:
    for (_, tooltip, shown), whole in zip(lane_labels(title, detail), (title, detail), strict=True):
        assert tooltip == whole and shown.endswith(ELLIPSIS)
        assert whole.startswith(shown.removesuffix(ELLIPSIS))
        assert len(shown) > 8  # cut to the room, not to a stub


def test_the_widest_lane_labels_are_cut_shortest() -> None:
    wide = lane_labels("#1 " + "W" * 60, "M" * 60)
    narrow = lane_labels("#1 " + "i" * 60, "l" * 60)
    for (_, _, w), (_, _, n) in zip(wide, narrow, strict=True):
        assert len(w) < len(n)


def test_a_lane_label_that_fits_is_left_whole() -> None:
    assert lane_labels("#3 add", "id 2 · 1 ms") == [
        ("tt-lane-title", "", "#3 add"),
        ("tt-lane-detail", "", "id 2 · 1 ms"),
    ]
