"""The pieces every monitor is made of (runs/monitors.py, runs/preference_monitors.py): a
metric's series out of the rows, the steps where a condition starts to hold, an alert."""

from __future__ import annotations

from typing import Any, Iterable

Alert = dict[str, Any]  # {"monitor", "step", "message", "value", "threshold"}


def metric_series(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) for every row that has `key` with a number (None counts as missing)."""
    out = []
    for index, row in enumerate(rows):
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((row.get("step", index), float(value)))
    return out


def onsets(flags: Iterable[tuple[int, bool, Any]]) -> list[tuple[int, Any]]:
    """The (step, payload) of each False -> True transition (a True first flag counts)."""
    found, previous = [], False
    for step, flag, payload in flags:
        if flag and not previous:
            found.append((step, payload))
        previous = flag
    return found


def make_alert(monitor: str, step: int, message: str, value: float, threshold: float) -> Alert:
    return {"monitor": monitor, "step": step, "message": message, "value": value, "threshold": threshold}
