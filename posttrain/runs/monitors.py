"""Reward-hacking monitors: pure functions over a run's per-step metric rows.

A row is one line of metrics.jsonl, e.g.

    {"step": 40, "reward_mean": 0.81, "dev_pass@1": 0.55, "kl_ref": 0.07,
     "response_length": 31.0, "entropy": 0.42}

Any key may be missing from any row (the dev set is scored every few steps only, KL only
with a reference model); a monitor uses the rows that have its keys and ignores the
rest. A row without "step" is identified by its position in the list.

Each monitor returns a list of alerts, plain dicts ready for JSON:

    {"monitor": "kl_explosion", "step": 40, "message": "...", "value": 0.71, "threshold": 0.5}

An alert marks where a condition STARTS to hold: a KL that stays above its limit for 30
steps gives one alert, at the first of them, and another only if it drops back and
crosses again. A NaN counts as crossing the line (a metric that became NaN is broken).

The monitors, each the signature of a failure seen in RL post-training:

    proxy_gold_divergence  the reward (the sum, and each term of a stack: "reward/<term>")
                           keeps paying while a held-out metric falls: Goodhart's law
    kl_explosion           the policy has drifted far from the reference
    length_blowup          responses grew past 2x their starting length (padding,
                           repetition, or a length-correlated reward being farmed)
    entropy_collapse       the policy has become nearly deterministic: exploration stopped
    entropy_blowup         entropy ran far above where it started: the samples turn to noise
    truncation             samples are cut at the generation budget: unfinished text is scored
    no_learning_signal     step after step, every group scored alike or the gradient was 0:
                           the run spends its compute and learns nothing
    sampler_mismatch       the sampler's log-probs are far from the trained policy's (int8 or
                           bf16 sampling, stale batches: roles/mismatch.py), so the correction
                           biases the update, or masks so much that little is learnt
    chosen_likelihood_collapse
                           a preference loss is lowering the likelihood of the chosen answers
                           on held-out pairs: it wins pairs by making both sides unlikely
    template_mimicry       the policy's samples open alike, whatever the prompt: it copies a
                           template (the last two: runs/preference_monitors.py)

They detect; they do not diagnose. runs/diagnosis.py reads their alerts with the samples
and names the cause and the setting to change (`posttrain doctor RUN`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from posttrain.runs.metric_series import Alert, make_alert, metric_series, onsets
from posttrain.runs.preference_monitors import chosen_likelihood_collapse, template_mimicry

TRUNCATION_MAX = 0.25  # the share of samples cut above which the budget decides the rewards (MonitorConfig)


# ---------------------------------------------------------------------------------------
# The monitors
# ---------------------------------------------------------------------------------------


def proxy_gold_divergence(
    rows: list[dict[str, Any]],
    reward_key: str = "reward_mean",
    gold_key: str = "dev_pass@1",
    window: int = 5,
    min_gold_drop: float = 0.1,
) -> list[Alert]:
    """The proxy reward held or rose while the gold metric fell from its best.

    At each step t where the gold metric G is logged, let
        G*     = the best G at or before t, first reached at step t*,
        R(s)   = the mean reward over the last `window` rows at or before step s that
                 log it (one batch's reward is noisy; the window smooths it).
    The condition holds at t when
        G* − G(t) ≥ min_gold_drop    and    R(t) ≥ R(t*),
    i.e. the held-out metric lost at least `min_gold_drop` since its peak while the
    reward the optimiser sees is at least what it was at that peak. (A reward that fell
    together with the gold metric is a collapse, not hacking, and does not fire.)"""
    rewards = sorted(metric_series(rows, reward_key), key=lambda sv: sv[0])
    if not rewards:
        return []
    reward_steps = [step for step, _ in rewards]
    prefix = [0.0]  # prefix[i] = sum of the first i rewards: each window mean is O(log n)
    for _, value in rewards:
        prefix.append(prefix[-1] + value)

    def smoothed_reward(step: int) -> float | None:
        end = bisect.bisect_right(reward_steps, step)  # rewards logged at or before `step`
        start = max(0, end - window)
        return (prefix[end] - prefix[start]) / (end - start) if end > start else None

    flags = []
    best_gold, best_step = -math.inf, None
    for step, gold in metric_series(rows, gold_key):
        if gold > best_gold:
            best_gold, best_step = gold, step
        reward_now, reward_at_best = smoothed_reward(step), smoothed_reward(best_step)
        fired = (
            reward_now is not None
            and reward_at_best is not None
            and not best_gold - gold < min_gold_drop  # NaN gold counts as a drop
            and reward_now >= reward_at_best
        )
        flags.append((step, fired, (gold, best_gold, best_step, reward_now, reward_at_best)))
    return [
        make_alert(
            "proxy_gold_divergence", step,
            f"{gold_key} fell to {gold:.3f} from its best {best:.3f} (step {best_step}) while "
            f"{reward_key} (mean of last {window}) is {r_now:.3f}, not below its {r_best:.3f} "
            "at that best step: the reward is paying for something the held-out task does "
            "not; read this step's samples for an exploit",
            gold, best - min_gold_drop,
        )  # fmt: skip
        for step, (gold, best, best_step, r_now, r_best) in onsets(flags)
    ]


def kl_explosion(rows: list[dict[str, Any]], kl_key: str = "kl_ref", kl_max: float = 0.5) -> list[Alert]:
    """KL to the reference above `kl_max`. Fires where KL first exceeds it (see module)."""
    flags = [(step, not kl <= kl_max, kl) for step, kl in metric_series(rows, kl_key)]
    return [
        make_alert(
            "kl_explosion", step,
            f"{kl_key} = {kl:.3g} exceeds {kl_max:g}: the policy has drifted far from the "
            "reference; raise the KL coefficient, lower the learning rate, or check for an exploit",
            kl, kl_max,
        )  # fmt: skip
        for step, kl in onsets(flags)
    ]


def length_blowup(
    rows: list[dict[str, Any]], length_key: str = "response_length", baseline_steps: int = 5, factor: float = 2.0
) -> list[Alert]:
    """Mean response length above `factor` × the baseline, the mean of the first
    `baseline_steps` rows that log a length. Only rows after the baseline are checked."""
    lengths = metric_series(rows, length_key)
    if len(lengths) <= baseline_steps:
        return []
    baseline = sum(value for _, value in lengths[:baseline_steps]) / baseline_steps
    limit = factor * baseline
    flags = [(step, not length <= limit, length) for step, length in lengths[baseline_steps:]]
    return [
        make_alert(
            "length_blowup", step,
            f"{length_key} = {length:.1f} is more than {factor:g}x the baseline {baseline:.1f} "
            f"(mean of the first {baseline_steps} steps): look for padding, repetition, or a "
            "length-correlated reward being farmed",
            length, limit,
        )  # fmt: skip
        for step, length in onsets(flags)
    ]


def entropy_collapse(
    rows: list[dict[str, Any]], entropy_key: str = "entropy", entropy_floor: float = 0.05
) -> list[Alert]:
    """Mean token entropy below `entropy_floor` (nats/token)."""
    flags = [(step, not entropy >= entropy_floor, entropy) for step, entropy in metric_series(rows, entropy_key)]
    return [
        make_alert(
            "entropy_collapse", step,
            f"{entropy_key} = {entropy:.3g} nats/token is below {entropy_floor:g}: the policy is "
            "nearly deterministic, so the K samples of a prompt agree and GRPO gets no signal; "
            "consider clip-higher, an entropy bonus, or a higher sampling temperature",
            entropy, entropy_floor,
        )  # fmt: skip
        for step, entropy in onsets(flags)
    ]


def entropy_blowup(rows: list[dict[str, Any]], entropy_key: str = "entropy", baseline_steps: int = 5,
                   max_rise: float = 0.5) -> list[Alert]:
    """Mean token entropy more than `max_rise` nats/token above the baseline, the mean of the
    first `baseline_steps` rows that log it. A rise, not a ratio: an SFT policy starts near 0
    (make run: 0.017), where any ratio is noise."""
    series = metric_series(rows, entropy_key)
    if len(series) <= baseline_steps:
        return []
    baseline = sum(value for _, value in series[:baseline_steps]) / baseline_steps
    flags = [(step, not entropy <= baseline + max_rise, entropy) for step, entropy in series[baseline_steps:]]
    return [make_alert("entropy_blowup", step, f"{entropy_key} = {entropy:.3g} nats/token is more than {max_rise:g} "
                   f"above its baseline {baseline:.3g} (mean of the first {baseline_steps} steps): the policy spreads "
                   "its probability over more tokens at every position, the way a run diverges; lower "
                   "rl.optim.lr, or add a KL term (--<algo>.kl_coef)", entropy, baseline + max_rise)
            for step, entropy in onsets(flags)]


def truncation(rows: list[dict[str, Any]], key: str = "truncated_fraction", window: int = 5,
               max_fraction: float = TRUNCATION_MAX) -> list[Alert]:
    """The share of samples cut at the generation budget, averaged over the last `window`
    rows that log it (one small batch is noisy), above `max_fraction`."""
    series = metric_series(rows, key)
    means = [sum(v for _, v in series[i + 1 - window:i + 1]) / window for i in range(window - 1, len(series))]
    flags = [(step, not mean <= max_fraction, mean) for (step, _), mean in zip(series[window - 1:], means)]
    return [make_alert("truncation", step, f"{100 * mean:.0f}% of the samples of the last {window} steps were cut at "
                   f"the generation budget ({key}): the verifier scores unfinished text, so a right answer that did "
                   "not fit scores as wrong; raise rl.sampling.max_new_tokens (posttrain train ... --dry_run true "
                   "names the length the demonstrations need), or, if lengths grew during the run, see length_blowup",
                   mean, max_fraction)
            for step, mean in onsets(flags)]


def no_learning_signal(rows: list[dict[str, Any]], steps: int = 5) -> list[Alert]:
    """`steps` steps in a row without a learning signal: every group's samples got the same
    reward (zero_variance_groups = 1, so every group-relative advantage is 0), or the
    gradient was exactly 0. Fires at the last step of the first such stretch."""
    flags, quiet = [], 0
    for index, row in enumerate(rows):
        flat, grad_norm = row.get("zero_variance_groups"), row.get("grad_norm")
        if flat is None and grad_norm is None:
            continue
        quiet = quiet + 1 if flat == 1.0 or grad_norm == 0.0 else 0
        flags.append((row.get("step", index), quiet >= steps, row))
    alerts = []
    for step, row in onsets(flags):
        cut = row.get("truncated_fraction", 0.0)
        if row.get("zero_variance_groups") == 1.0 and cut > TRUNCATION_MAX:
            cause = (f"every group's samples got the same reward, and {100 * cut:.0f}% of them were cut at the "
                     "generation budget (truncated_fraction): a sample cut before its answer scores as wrong")
            fix = ("if the cut samples are answers on their way, raise rl.sampling.max_new_tokens, as easier prompts "
                   "would not help (posttrain doctor RUN reads the samples and says)")
        elif row.get("zero_variance_groups") == 1.0:
            reward = row.get("reward_mean", math.nan)
            cause = (f"in every group all samples got the same reward (reward mean {reward:.3g}: "
                     f"{'all wrong' if reward == 0 else 'all right' if reward == 1 else 'alike'}), so every "
                     "advantage is 0")
            fix = ("use prompts nearer what the policy can do (easier when it fails all, harder when it solves "
                   "all), sample more per prompt or at a higher temperature, give partial credit, or let DAPO's "
                   "dynamic sampling (--algo dapo) redraw prompts until a group disagrees")
        else:
            cause, fix = "the gradient was exactly 0", ("check that the loss reaches the trainable weights "
                                                        "(with LoRA: the adapter's) and that the rewards vary")
        alerts.append(make_alert(
            "no_learning_signal", step,
            f"{steps} steps in a row without a learning signal: {cause}. The run is learning nothing; {fix}",
            1.0, 1.0,
        ))  # fmt: skip
    return alerts


MISMATCH_KEYS = ("mismatch/logp_diff_mean", "int8/logp_mismatch")  # the int8 sampler's name, before roles/mismatch.py


def sampler_mismatch(rows: list[dict[str, Any]], mismatch_max: float | None = 0.05,
                     masked_max: float | None = 0.1) -> list[Alert]:
    """Mean |log π_sampler − log π_trainer| per token above `mismatch_max`, or more than
    `masked_max` of the trained tokens masked out of the gradient (roles/mismatch.py)."""
    lines = [(next((k for k in MISMATCH_KEYS if metric_series(rows, k)), MISMATCH_KEYS[0]), mismatch_max, "nats/token: the "
              "sampler is another policy than the one trained, and the weights correcting for it bias the update"),
             ("mismatch/masked_fraction", masked_max, "of the trained tokens: masked, they teach the update nothing")]
    return sorted((make_alert("sampler_mismatch", step, f"{name} = {value:.3g} exceeds {line:g} {why}; sample as the "
                          "trainer does (--rl.sampling.weights float32, --dtype float32, --dist.max_staleness 1) or "
                          "change rl.mismatch (its mode, cap, lower)", value, line)
                   for name, line, why in lines if line is not None
                   for step, value in onsets((s, not v <= line, v) for s, v in metric_series(rows, name))),
                  key=lambda alert: alert["step"])


# ---------------------------------------------------------------------------------------
# All at once
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MonitorConfig:
    """Which metric each monitor reads and where its line is. Set a threshold to None to
    switch that monitor off."""

    reward_key: str = "reward_mean"
    gold_key: str = "dev_pass@1"
    kl_key: str = "kl_ref"
    length_key: str = "response_length"
    entropy_key: str = "entropy"

    # 5 steps smooth the reward of one small batch without lagging far behind the trend.
    window: int = 5
    # Two standard errors of a pass@1 on 100 dev problems (s.e. <= 0.5/sqrt(100) = 0.05):
    # a smaller drop is within noise. With a larger dev set, lower it.
    min_gold_drop: float | None = 0.1
    # Per TOKEN, as the controller logs kl_ref (mean k3 over response tokens). k3 ≈ ½Δ²
    # for a log-ratio Δ, so 0.5 means log-probs ~1 nat away from the reference on the
    # average token: far beyond a healthy fine-tune. (The rule of thumb "KL > 15" is for
    # KL summed over a sequence; use it if your kl_key logs that.)
    kl_max: float | None = 0.5
    # The first steps' mean is the starting policy's habit, before RL has moved it much.
    baseline_steps: int = 5
    # Doubling is far outside the drift of a healthy run and the usual sign of padding
    # or repetition being paid for.
    length_factor: float | None = 2.0
    # 0.05 nats/token: about 99% of the mass on one token at every position.
    entropy_floor: float | None = 0.05
    # 0.5 nats/token above the first steps' mean: make run's entropy went from 0.017 to at most
    # 0.044 in 200 healthy steps (a rise of 0.027, runs of ARCHITECTURE.md's job); 0.5 is e^0.5 ≈
    # 1.6x as many equally likely tokens at every position, twenty times that drift
    entropy_rise_max: float | None = 0.5
    # a quarter of the samples cut, averaged over `window` steps: make run's highest step was 0.008;
    # a 16-character budget on reasoning-gym's gcd cut 99% (its answers need 18 to 21 characters)
    truncation_max: float | None = TRUNCATION_MAX
    # Five steps: one flat batch happens in a healthy run near its end; five in a row from
    # the start mean the run cannot learn as set up, and five steps are a small price to learn it.
    no_signal_steps: int | None = 5
    # 0.05 nats/token: a line between the two cases measured (BENCHMARKS.md): a trained
    # gpt_mini's int8 copy is 0.001 away (weights within 1.001 of 1 at p01–p99, the cap
    # almost never reached); SmolLM2-135M's is 0.8 away (weights from ~0 to 43)
    mismatch_max: float | None = 0.05
    # a tenth of the trained tokens masked (rl.mismatch.mode *_mask): 8x the int8 run's worst step's truncation (1.2%)
    mismatch_masked_max: float | None = 0.1
    # 0.5 nats/token: the chosen answers ~40% less likely per token than at the start, far
    # past the drift of a healthy preference run, and the first sign of the likelihood
    # collapse DPO shows on chains of thought (docs/algorithms/dpo.md)
    chosen_drop_max: float | None = 0.5
    # 0.3 of the dev samples more opening alike than at the first evaluation: on 64 samples a share's
    # standard error is at most 0.06, so 0.3 is five of them; arithmetic's openings carry the prompt's
    # numbers, so a healthy policy's share stays near 1/64
    template_rise_max: float | None = 0.3

    def __post_init__(self) -> None:
        if self.window < 1 or self.baseline_steps < 1:
            raise ValueError(f"window and baseline_steps must be >= 1, got {self.window} and {self.baseline_steps}")


def check_all(rows: list[dict[str, Any]], config: MonitorConfig | None = None) -> list[Alert]:
    """Every enabled monitor over `rows`, alerts sorted by step (then monitor name)."""
    c = config or MonitorConfig()
    alerts: list[Alert] = []
    if c.min_gold_drop is not None:
        for key in [c.reward_key] + term_keys(rows):  # the sum, then each term of a reward stack on its own
            alerts += proxy_gold_divergence(rows, key, c.gold_key, c.window, c.min_gold_drop)
    if c.kl_max is not None:
        alerts += kl_explosion(rows, c.kl_key, c.kl_max)
    if c.length_factor is not None:
        alerts += length_blowup(rows, c.length_key, c.baseline_steps, c.length_factor)
    if c.entropy_floor is not None:
        alerts += entropy_collapse(rows, c.entropy_key, c.entropy_floor)
    if c.entropy_rise_max is not None:
        alerts += entropy_blowup(rows, c.entropy_key, c.baseline_steps, c.entropy_rise_max)
    if c.truncation_max is not None:
        alerts += truncation(rows, window=c.window, max_fraction=c.truncation_max)
    if c.no_signal_steps is not None:
        alerts += no_learning_signal(rows, c.no_signal_steps)
    alerts += sampler_mismatch(rows, c.mismatch_max, c.mismatch_masked_max)  # each line None = off
    if c.chosen_drop_max is not None:
        alerts += chosen_likelihood_collapse(rows, max_drop=c.chosen_drop_max)
    if c.template_rise_max is not None:
        alerts += template_mimicry(rows, max_rise=c.template_rise_max)
    return sorted(alerts, key=lambda a: (a["step"], a["monitor"]))


TERM_PREFIX = "reward/"  # a reward stack's terms, each its mean weighted value per sample (rewards/stack.py)


def term_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The reward terms `rows` log on their own ("reward/accuracy", ...), in the order first seen."""
    return list(dict.fromkeys(key for row in rows for key in row if key.startswith(TERM_PREFIX)))


# Signs of a run going wrong that neither the live log nor the summary may hide (every monitor
# above) but one: the entropy floor is off, as on a task with one right answer a near-deterministic
# policy is the goal, not a collapse.
RUN_MONITORS = MonitorConfig(entropy_floor=None)
