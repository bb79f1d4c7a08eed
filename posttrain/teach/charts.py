"""The course's charts: one look for every lesson that draws a curve.

    fig, ax = figure()                     a matplotlib figure in the course's size and style
    curves(ax, xs, {"GRPO": ys, ...})      several things compared on one set of axes
    mark(ax, x, "ε = 0.2")                 where the widget's current setting is
    finish(fig, ax, "ratio ρ", "objective")  labelled axes (units in the label), legend, layout
    points(fig)                            how many data points it holds (tests assert > 0)

and for charts that are not curves over x: bars / grouped_bars / hbars (one value per label,
several things per label, labels too long to sit under a bar), scatter (groups of points),
span (a shaded stretch of x: context, not data), mark_point (a setting that is a point in the
plane), ternary + ternary_xy (a triangle of three shares), legend_right (the legend beside
the plot when the curves fill it).

A lesson's chart cell is then the computation it already shows as numbers, drawn:

    @app.cell
    def _(eps, ratios, clipped):
        from posttrain.teach.charts import curves, figure, finish, mark

        fig, ax = figure()
        curves(ax, ratios, {"clipped": clipped})
        mark(ax, 1 + eps, f"1 + ε = {1 + eps:g}")
        finish(fig, ax, "ratio ρ = π_θ / π_old", "surrogate objective")

marimo shows the figure the cell ends with and redraws it when the widget moves. Every chart
is drawn from the library's numbers: the cell computes nothing the chart alone needs.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import matplotlib
import numpy as np

matplotlib.use("Agg")  # no window: marimo, the static renderings and the tests all draw to images

from matplotlib.axes import Axes  # noqa: E402  (the backend is chosen before any figure module loads)
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

WIDTH, HEIGHT = 7.5, 2.8  # inches: the width of a lesson's text column, short enough to sit beside its prose
# One colour per compared thing, in order, then a grey for "the reference line": colour-blind
# safe (Okabe–Ito), so two curves stay two curves for every reader.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
REFERENCE = "#7f7f7f"
SETTING = "#C0392B"  # the widget's current value: one colour across the course
DECORATION = "decoration"  # the gid of what a helper draws that is not data (an outline, a shaded region)


def figure(width: float = WIDTH, height: float = HEIGHT) -> tuple[Figure, Axes]:
    """A new figure with one set of axes in the course's style. It is made outside pyplot's
    registry, which keeps every figure until it is closed: a slider moved a hundred times
    leaves no hundred open figures behind."""
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    ax.grid(True, color="#e5e5e5", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def curves(ax: Axes, xs: Sequence[float], series: Mapping[str, Sequence[float]], *,
           styles: Mapping[str, str] | None = None, markers: bool = False) -> None:
    """One line per entry of `series`, all over the same `xs`, coloured in PALETTE order.
    `styles` gives a line style per label ("--" for a reference, ":" for a bound)."""
    for index, (label, ys) in enumerate(series.items()):
        if len(ys) != len(xs):
            raise ValueError(f"curve {label!r} has {len(ys)} values for {len(xs)} x positions")
        ax.plot(list(xs), list(ys), label=label, color=PALETTE[index % len(PALETTE)],
                linestyle=(styles or {}).get(label, "-"), marker="o" if markers else None, markersize=3)


def band(ax: Axes, xs: Sequence[float], low: Sequence[float], high: Sequence[float], label: str | None = None,
         index: int = 0) -> None:
    """A shaded interval (a confidence interval, a spread over seeds) in the colour of curve `index`."""
    ax.fill_between(list(xs), list(low), list(high), color=PALETTE[index % len(PALETTE)], alpha=0.18,
                    linewidth=0, label=label)


def bars(ax: Axes, labels: Sequence[str], values: Sequence[float], *, errors: Sequence[float] | None = None,
         highlight: Iterable[str] = ()) -> None:
    """One bar per label; those in `highlight` (the current choice) in SETTING's colour."""
    chosen = set(highlight)
    colours = [SETTING if label in chosen else PALETTE[0] for label in labels]
    ax.bar(range(len(values)), list(values), color=colours, yerr=None if errors is None else list(errors),
           capsize=3)
    ax.set_xticks(range(len(labels)), list(labels), fontsize=8)


def mark(ax: Axes, x: float, label: str, *, vertical: bool = True) -> None:
    """The widget's current setting: a vertical line at x (or a horizontal one at y = x)."""
    line = ax.axvline if vertical else ax.axhline
    line(x, color=SETTING, linestyle="--", linewidth=1.2, label=label)


def finish(fig: Figure, ax: Axes, xlabel: str, ylabel: str, title: str | None = None,
           legend: bool = True) -> Figure:
    """Label both axes (say the unit in the label: "tokens", "nats", "s"), add the legend when
    there is something to tell apart, lay out, and return the figure for the cell to end with."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if legend and ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def grouped_bars(ax: Axes, labels: Sequence[str], series: Mapping[str, Sequence[float]], *,
                 highlight: str | None = None) -> None:
    """Several things compared at each label, side by side: one bar per entry of `series` in
    each group, coloured in PALETTE order, the entry named `highlight` (the current choice) in
    SETTING's colour. A NaN value (a row that was dropped) leaves its slot empty."""
    width = 0.8 / max(1, len(series))
    # with a highlighted entry, the others skip the palette's vermilion, too near SETTING's red
    colours = [c for c in PALETTE if highlight is None or c != PALETTE[1]]
    for index, (name, values) in enumerate(series.items()):
        if len(values) != len(labels):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(labels)} labels")
        offset = (index - (len(series) - 1) / 2) * width
        colour = SETTING if name == highlight else colours[index % len(colours)]
        ax.bar([i + offset for i in range(len(labels))], list(values), width=width, color=colour, label=name)
    ax.set_xticks(range(len(labels)), list(labels), fontsize=7)
    ax.axhline(0, color=REFERENCE, linewidth=0.8).set_gid(DECORATION)


def hbars(ax: Axes, labels: Sequence[str], values: Sequence[float], *, highlight: Iterable[str] = ()) -> None:
    """bars() lying down, first label on top: for labels too long to sit under a bar (a
    lever's name, a design's), read top to bottom like the table they replace."""
    chosen = set(highlight)
    ax.barh(range(len(values)), list(values), color=[SETTING if label in chosen else PALETTE[0] for label in labels])
    ax.set_yticks(range(len(labels)), list(labels), fontsize=8)
    ax.invert_yaxis()


def scatter(ax: Axes, groups: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, size: float = 18) -> None:
    """Points in groups, one colour per group in PALETTE order: {label: (xs, ys)}. An empty
    group keeps its colour slot and gets no legend entry, so a group's colour stays the same
    while the widget moves others in and out."""
    for index, (label, (xs, ys)) in enumerate(groups.items()):
        if len(xs) != len(ys):
            raise ValueError(f"group {label!r} has {len(xs)} x values for {len(ys)} y values")
        if not xs:
            continue
        ax.scatter(list(xs), list(ys), s=size, color=PALETTE[index % len(PALETTE)], label=label, linewidths=0)


def mark_point(ax: Axes, x: float, y: float, label: str) -> None:
    """The widget's current setting as one point (a star), for a chart whose setting is a
    position in the plane rather than a value on the x axis. Like mark(), it is not data."""
    ax.plot([x], [y], marker="*", markersize=14, color=SETTING, markeredgecolor="white", linestyle="none",
            label=label)


_HEIGHT = 3 ** 0.5 / 2  # an equilateral triangle of side 1


def ternary_xy(shares: Sequence[float]) -> tuple[float, float]:
    """Where three shares summing to 1 sit in the triangle ternary() draws: the first at the
    bottom-left corner, the second bottom-right, the third at the top."""
    if len(shares) != 3 or min(shares) < 0 or abs(sum(shares) - 1) > 1e-6:
        raise ValueError(f"a point of the triangle is three shares >= 0 summing to 1; got {tuple(shares)}")
    return shares[1] + shares[2] / 2, shares[2] * _HEIGHT


def ternary(ax: Axes, corners: Sequence[str]) -> None:
    """Turn `ax` into a triangle of three shares (corners named bottom-left, bottom-right,
    top): no x or y axis, the outline in grey, each corner labelled with its force."""
    if len(corners) != 3:
        raise ValueError(f"a triangle has three corners; got {list(corners)}")
    ax.plot([0, 1, 0.5, 0], [0, 0, _HEIGHT, 0], color=REFERENCE, linewidth=0.8)
    ax.lines[-1].set_gid(DECORATION)  # drawn as a line, yet no data: points() skips it
    for (x, y), text, where in zip([(0, 0), (1, 0), (0.5, _HEIGHT)], corners, ("right", "left", "center")):
        ax.annotate(text, (x, y), xytext=(0, -14 if y == 0 else 6), textcoords="offset points", ha=where,
                    fontsize=9)
    ax.set_aspect("equal")
    ax.set_xlim(-0.25, 1.25)
    ax.set_ylim(-0.12, _HEIGHT + 0.08)
    ax.axis("off")


def span(ax: Axes, low: float, high: float, label: str | None = None) -> None:
    """A shaded stretch of the x axis (a trust region, a band of pass rates): context, not data."""
    ax.axvspan(low, high, color=REFERENCE, alpha=0.12, linewidth=0, label=label).set_gid(DECORATION)


def legend_right(fig: Figure, ax: Axes) -> Figure:
    """Move the legend out of the plot to its right, for a chart whose curves fill the axes
    (call it after finish()). Returns the figure for the cell to end with."""
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        ax.legend(handles, labels, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def points(fig: Figure) -> int:
    """Data points drawn on the figure's axes (lines, bars, scatter and shaded bands), so a
    test can assert a chart is not empty. A mark() line and error bars count for nothing."""
    total = 0
    for ax in fig.axes:
        decorations: set[int] = set()  # an error bar's caps and whiskers belong to the bar they sit on
        for container in ax.containers:
            if isinstance(container, ErrorbarContainer):
                decorations.update(id(artist) for artist in container.get_children())
        total += sum(int(np.size(line.get_xdata())) for line in ax.get_lines()
                     if line.get_color() != SETTING and id(line) not in decorations and line.get_gid() != DECORATION)
        total += sum(1 for patch in ax.patches if patch.get_gid() != DECORATION)
        total += sum(int(np.size(collection.get_offsets())) // 2 for collection in ax.collections if id(collection) not in decorations)
    return total


__all__ = ["DECORATION", "PALETTE", "REFERENCE", "SETTING", "band", "bars", "curves", "figure", "finish",
           "grouped_bars", "hbars", "legend_right", "mark", "mark_point", "points", "scatter", "span", "ternary",
           "ternary_xy"]
