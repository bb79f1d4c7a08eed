"""The monitors of a preference stage's failures (runs/monitors.py runs them with the others),
and the one metric of them the stage computes itself.

    chosen_likelihood_collapse   the held-out chosen answers become unlikely: the loss wins
                                 pairs by pushing both sides down
    template_mimicry             the policy's samples collapse onto one opening, whatever the
                                 prompt: it copies the form its chosen responses share (a
                                 polite preamble, a fixed first line) instead of answering
    template_share(completions)  the metric template_mimicry reads: the share of samples that
                                 open with their most common opening

A length explosion and a KL spike, the other two signs of a preference loss being gamed,
are length_blowup and kl_explosion in runs/monitors.py: the preference stage logs
response_length and kl_ref on its dev samples under the names the RL stage uses.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from posttrain.runs.metric_series import Alert, make_alert, metric_series, onsets

# characters of a completion that make its opening: about three words of prose; for arithmetic's
# chain ("7+5=12,12+9=21,2") the first three terms, so prompts with different numbers open differently
TEMPLATE_PREFIX_CHARS = 16


def template_share(completions: Sequence[str], prefix_chars: int = TEMPLATE_PREFIX_CHARS) -> float:
    """The share of `completions` whose opening (first `prefix_chars` characters, lowercased,
    runs of whitespace as one space) is the most common opening among them; 0 for none.
    Distinct prompts answered on their own terms give ~1/len(completions); one template, 1."""
    if not completions:
        return 0.0
    openings = Counter(" ".join(c.lower().split())[:prefix_chars] for c in completions)
    return openings.most_common(1)[0][1] / len(completions)


def template_mimicry(rows: list[dict[str, Any]], key: str = "template_share", max_rise: float = 0.3) -> list[Alert]:
    """The share of dev samples opening alike more than `max_rise` above its first logged
    value (the first evaluation's: a task whose answers share a fixed form starts high and
    does not fire; a policy that learns one form for every prompt does)."""
    series = metric_series(rows, key)
    if not series:
        return []
    start = series[0][1]
    flags = [(step, not value - start <= max_rise, value) for step, value in series]
    return [
        make_alert(
            "template_mimicry", step,
            f"{key} = {value:.2f}: that share of the policy's dev samples open with the same "
            f"{TEMPLATE_PREFIX_CHARS} characters, more than {max_rise:g} above the first evaluation's {start:.2f}; "
            "the policy answers every prompt with one template (the form its chosen responses share) instead "
            "of answering it: read this step's samples, then raise beta, balance the pairs "
            "(rl.preference.balance_topics, balance_lengths), or add --dpo.nll_coef",
            value, start + max_rise,
        )  # fmt: skip
        for step, value in onsets(flags)
    ]


def chosen_likelihood_collapse(rows: list[dict[str, Any]], key: str = "dev_pref_logps_chosen_per_token",
                               max_drop: float = 0.5) -> list[Alert]:
    """The held-out chosen answers' log-likelihood per token more than `max_drop` nats below
    its first logged value (pipelines/preference_train.py, preference_health)."""
    series = metric_series(rows, key)
    if not series:
        return []
    start = series[0][1]
    flags = [(step, not start - value <= max_drop, value) for step, value in series]
    return [
        make_alert(
            "chosen_likelihood_collapse", step,
            f"{key} = {value:.3f} nats/token is more than {max_drop:g} below its first value {start:.3f}: "
            "the loss is winning pairs by making the chosen answers unlikely too (a held-out accuracy that "
            "rises while pass@1 falls is the same failure); raise beta, add --dpo.nll_coef, use IPO, or "
            "lower the learning rate",
            value, start - max_drop,
        )  # fmt: skip
        for step, value in onsets(flags)
    ]
