"""The course's chart helper: a chart holds the data it was given, marks are not data, and a
curve of the wrong length is refused with the label that has it."""

from __future__ import annotations

import io

import pytest

from posttrain.teach.charts import SETTING, band, bars, curves, figure, finish, mark, points


def test_points_counts_curves_and_bars_not_the_setting_mark():
    fig, ax = figure()
    curves(ax, [0.5, 1.0, 1.5], {"unclipped": [0.5, 1.0, 1.5], "clipped": [0.8, 1.0, 1.2]})
    mark(ax, 1.2, "1 + ε")
    assert points(fig) == 6
    fig2, ax2 = figure()
    bars(ax2, ["greedy", "best-of-4"], [0.4, 0.55], errors=[0.05, 0.06], highlight=["best-of-4"])
    assert points(fig2) == 2
    assert [p.get_facecolor()[:3] for p in ax2.patches][1] == pytest.approx((0xC0 / 255, 0x39 / 255, 0x2B / 255))


def test_finish_labels_axes_and_legend_and_renders_png():
    fig, ax = figure()
    curves(ax, [1, 2], {"a": [1, 2]})
    band(ax, [1, 2], [0.5, 1.5], [1.5, 2.5], label="95% CI")
    mark(ax, 1.5, "now")
    finish(fig, ax, "steps", "pass@1 (fraction)")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("steps", "pass@1 (fraction)")
    assert ax.get_legend() is not None and [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "95% CI", "now"]
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    assert buffer.getvalue()[:4] == b"\x89PNG"
    assert SETTING in {line.get_color() for line in ax.get_lines()}


def test_a_curve_of_the_wrong_length_names_itself():
    _, ax = figure()
    with pytest.raises(ValueError, match="curve 'b' has 1 values for 2 x positions"):
        curves(ax, [1, 2], {"a": [1, 2], "b": [3]})
