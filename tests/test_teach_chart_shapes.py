"""The chart helpers lessons added after the first five (grouped and lying bars, point
groups, a shaded span, a starred setting, the triangle of three shares): each holds the data
it was given, and what is only context (a span, an outline, the star) counts for nothing."""

from __future__ import annotations

import math

import pytest

from posttrain.teach.charts import (
    PALETTE,
    SETTING,
    figure,
    finish,
    grouped_bars,
    hbars,
    legend_right,
    mark_point,
    points,
    scatter,
    span,
    ternary,
    ternary_xy,
)


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return tuple(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))


def test_grouped_bars_one_bar_per_series_per_label_and_the_highlight_in_the_setting_colour():
    fig, ax = figure()
    grouped_bars(ax, ["row 0", "row 1"], {"grpo": [0.1, -0.1], "dapo": [0.2, float("nan")], "ablated": [0.3, 0.0]},
                 highlight="ablated")
    assert points(fig) == 6  # the zero line is context
    faces = [tuple(container.patches[0].get_facecolor()[:3]) for container in ax.containers]
    # the highlight in SETTING's red; the others skip the palette's vermilion, too near it
    assert faces == [pytest.approx(_rgb(PALETTE[0])), pytest.approx(_rgb(PALETTE[2])), pytest.approx(_rgb(SETTING))]
    centres = [p.get_x() + p.get_width() / 2 for p in ax.containers[0].patches]
    assert centres == [pytest.approx(-0.8 / 3), pytest.approx(1 - 0.8 / 3)]  # three bars of 0.8/3 around each label
    with pytest.raises(ValueError, match="series 'b' has 1 values for 2 labels"):
        grouped_bars(ax, ["x", "y"], {"b": [1.0]})


def test_hbars_reads_top_to_bottom():
    fig, ax = figure()
    hbars(ax, ["as it is", "async"], [18.2, 10.6])
    assert points(fig) == 2 and ax.yaxis_inverted()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["as it is", "async"]


def test_scatter_keeps_an_empty_groups_colour_slot_and_gives_it_no_legend_entry():
    fig, ax = figure()
    scatter(ax, {"R1-Zero": ([0, 1], [0, 0]), "R1": ([], []), "DPO": ([0.5], [0.8])})
    assert points(fig) == 3
    finish(fig, ax, "", "")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["R1-Zero", "DPO"]
    assert tuple(ax.collections[1].get_facecolor()[0][:3]) == pytest.approx(_rgb(PALETTE[2]))  # DPO keeps the third colour


def test_span_star_and_outline_are_not_data():
    fig, ax = figure()
    span(ax, 0.8, 1.2, "trust region")
    mark_point(ax, 0.5, 0.5, "you")
    ternary(ax, ["signal", "estimator", "cost"])
    assert points(fig) == 0
    legend_right(fig, ax)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["trust region", "you"]
    assert ax.get_lines()[0].get_color() == SETTING


def test_ternary_corners_and_centre():
    assert ternary_xy((1, 0, 0)) == (0, 0) and ternary_xy((0, 1, 0)) == (1, 0)
    assert ternary_xy((0, 0, 1)) == pytest.approx((0.5, math.sqrt(3) / 2))
    assert ternary_xy((1 / 3, 1 / 3, 1 / 3)) == pytest.approx((0.5, math.sqrt(3) / 6))  # the centroid
    with pytest.raises(ValueError, match=r"three shares >= 0 summing to 1; got \(0.5, 0.6, 0\)"):
        ternary_xy((0.5, 0.6, 0))
    _, ax = figure()
    with pytest.raises(ValueError, match="a triangle has three corners"):
        ternary(ax, ["a", "b"])
