"""The lessons that draw (issue #42), part b: each lesson below ends a cell with `chart`, a
figure drawn with posttrain.teach.charts from the numbers the lesson computes. Run headless
at the widget's default and with one widget moved, the chart holds data both times, its axes
say what they measure, and the data drawn differ: the picture moves with the widget.

A lesson is run the way tests/test_lessons.py runs it (marimo's app.run(), the widget's
default text replaced in a copy of the notebook)."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.patches import Rectangle

from posttrain.teach.charts import SETTING, points
from tests.test_lessons import LESSONS, restore_threads, run_in_process, run_with_settings  # noqa: F401  (fixture)

# lesson file -> the widget defaults to replace, and with what: a second setting of its widget
MOVED = {
    "01_what_is_post_training_rl.py": {'value=0.0, label="baseline b"': 'value=1.5, label="baseline b"'},
    "02_rollout_and_pi_old.py": {'value=1.0, label="sampling': 'value=1.6, label="sampling'},
    "03_reward_and_reference.py": {'value=f"Final: {answer}"': 'value=f"Final: {answer}\\\\nFinal: {answer + 1}"'},
    "05_trainer.py": {"value=-4.0, label=": "value=-2.0, label="},
    "09_reinforce.py": {'step=0.5, value=0.0, label="reward offset': 'step=0.5, value=5.0, label="reward offset'},
    "14_dr_grpo.py": {"value=32, label": "value=48, label"},
    "16_dpo.py": {"step=0.25, value=-1.0, label=": "step=0.25, value=0.0, label="},
    "19_system_topology.py": {'value="split, async"': 'value="split, lockstep"'},
    "20_kv_cache.py": {"value=8192, label": "value=16384, label"},
    "21_scheduling_tricks.py": {"value=0.7, label": "value=0.3, label"},
    "22_memory_and_throughput.py": {'value=1280, label="context': 'value=0, label="context'},
    "22a_throughput_equation.py": {'value="colocated", label': 'value="async", label'},
    "25_kernels_for_rl.py": {"value=\"float32: the trainer's own kernels\"": 'value="int8 weights (models/int8.py)"'},
    "27_missing_concepts.py": {"step=0.25, value=1.0,": "step=0.25, value=3.0,"},
}


def drawn_data(fig) -> list:
    """Every data value a figure draws, in data coordinates: each line's points (the SETTING
    mark excluded: it moves with the widget by construction), each bar's rectangle, each
    scatter's offsets. Two figures drawn from the same numbers give equal lists."""
    data = []
    for ax in fig.axes:
        data += [np.round(np.asarray(line.get_xydata(), dtype=float), 9).tolist() for line in ax.get_lines()
                 if line.get_color() != SETTING]
        data += [[round(float(v), 9) for v in (p.get_x(), p.get_y(), p.get_width(), p.get_height())]
                 for p in ax.patches if isinstance(p, Rectangle)]
        data += [np.round(np.asarray(c.get_offsets(), dtype=float), 9).tolist() for c in ax.collections]
    return data


@pytest.mark.parametrize("name", sorted(MOVED))
def test_the_chart_holds_data_and_moves_with_the_widget(name, restore_threads, tmp_path):  # noqa: F811
    default = run_in_process(LESSONS / name)["chart"]
    moved = run_with_settings(LESSONS / name, MOVED[name], tmp_path)["chart"]
    for fig in (default, moved):
        assert points(fig) > 0, f"{name}: its chart draws no data"
        ax = fig.axes[0]
        assert ax.get_xlabel() and ax.get_ylabel(), f"{name}: its chart has an unlabelled axis"
    assert drawn_data(default) != drawn_data(moved), f"{name}: moving the widget ({MOVED[name]}) left the chart as it was"
