"""The code exercise of Part IV (lesson 23), in the shape `posttrain check` runs it
(teach/exercises.py builds an `Exercise` from each entry of `PART_IV`): the library's own
function adapted to the stub's signature, the cases, and the hint a failure prints.

    23  kl_alert_steps  the steps where the KL monitor fires: onsets, not every step above the line

Every case is deterministic and runs in milliseconds.
"""

from __future__ import annotations

import math

from posttrain.runs.monitors import kl_explosion


def _ref_alert_steps(rows, kl_max):
    return [alert["step"] for alert in kl_explosion(rows, kl_max=kl_max)]


def _same_steps(got, want) -> str | None:
    if not isinstance(got, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in got):
        return f"expected a list of int steps, got {got!r}"
    return None if got == want else f"alert steps {got}, expected {want}"


def _kl_rows(values, start=0):
    return [{"step": start + i, "kl_ref": v} for i, v in enumerate(values)]


def _alert_cases():
    rising = _kl_rows([0.01, 0.05, 0.2, 0.4, 0.6, 0.8, 0.9, 1.1])
    twice = _kl_rows([0.1, 0.7, 0.8, 0.3, 0.2, 0.9, 0.4], start=10)
    gaps = [{"step": 0, "kl_ref": 0.1}, {"step": 1, "dev_pass@1": 0.4}, {"step": 2, "kl_ref": None},
            {"step": 3, "kl_ref": 0.9}, {"step": 4, "reward_mean": 0.5}, {"step": 5, "kl_ref": 0.95}]
    return [
        ("a KL that rises through the line and stays above (one alert, at the first step above)", (rising, 0.5)),
        ("a KL that drops back below the line and crosses again (two alerts)", (twice, 0.5)),
        ("rows that do not log the KL, or log None (skip them)", (gaps, 0.5)),
        ("a NaN KL counts as above the line", (_kl_rows([0.1, math.nan, 0.2, 0.3]), 0.5)),
        ("rows without a 'step' (their position in the list is the step)",
         ([{"kl_ref": 0.1}, {"kl_ref": 0.2}, {"kl_ref": 0.7}], 0.5)),
        ("a KL exactly at the line is not above it", (_kl_rows([0.5, 0.5, 0.50001]), 0.5)),
        ("above the line from the first row", (_kl_rows([0.9, 0.1]), 0.5)),
    ]


PART_IV: dict[str, dict] = {
    "23": dict(function="kl_alert_steps", lesson="23", reference=_ref_alert_steps, cases=_alert_cases,
               compare=_same_steps,
               hint="Walk the rows that have a number under 'kl_ref' (None is missing); a row is above when "
                    "NOT (kl <= kl_max), so NaN is above. Report a step only where 'above' turns on (the "
                    "first row, or the row before it was not above); a row's step is row['step'], else its "
                    "index in the list."),
}
