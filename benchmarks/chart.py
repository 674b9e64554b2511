"""The report's chart: throughput of each capture path by concurrency and by stream length."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from . import scaling

MISSING = 'matplotlib is not installed (python -m pip install -e ".[bench]" brings it)'


def can_draw() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def draw(path: Path) -> str | None:
    """Draw what the scaling suite measured into a PNG; the report's markdown that shows it,
    or says why it could not be drawn; None when there is nothing to draw."""
    if not scaling.RESULTS:
        return None
    if not can_draw():
        return f"*No chart: {MISSING}.*"
    _plot(path)
    return f"![Throughput by concurrency and by stream length]({path.name})"


def _plot(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: a file
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4), constrained_layout=True)
    panels = (
        (axes[0], scaling.SHAPES["concurrency"], 0, "streams at once (the same events among them)"),
        (axes[1], scaling.SHAPES["length"], 1, f"events per stream ({scaling.STREAMS} streams at once)"),
    )
    for ax, shapes, axis, xlabel in panels:
        for name, rates in scaling.RESULTS.items():
            points = sorted((shape[axis], rates[shape]) for shape in shapes)
            style = "-" if name.startswith("tasktape") else "--"
            ax.plot(
                *zip(*points, strict=True),
                style,
                marker="o",
                label=name,
                linewidth=2 if style == "-" else 1.2,
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = ticker.FuncFormatter(lambda value, _: f"{value:,.0f}")  # 10,000 reads better than 10^4
        ax.set_xticks([shape[axis] for shape in shapes], [f"{shape[axis]:,}" for shape in shapes])
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("events/s received")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("Throughput by concurrency")
    axes[1].set_title("Throughput by stream length")
    # Below both panels, where it hides no line.
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
