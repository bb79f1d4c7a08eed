"""Each monitor fires exactly when its condition starts to hold, on synthetic metric rows,
and stays quiet on a healthy run."""

import math

import pytest

from posttrain.runs.monitors import (
    MonitorConfig,
    check_all,
    chosen_likelihood_collapse,
    entropy_collapse,
    kl_explosion,
    length_blowup,
    no_learning_signal,
    proxy_gold_divergence,
)


def healthy_run(n=30):
    """Reward and dev pass@1 rise together, KL grows slowly, length and entropy drift a little."""
    rows = []
    for step in range(n):
        row = {"step": step, "reward_mean": 0.3 + 0.02 * step, "kl_ref": 0.002 * step,
               "response_length": 30 + 0.3 * step, "entropy": 0.8 - 0.01 * step,
               "zero_variance_groups": 1.0 if step % 4 == 0 else 0.75, "grad_norm": 0.1}  # fmt: skip
        if step % 5 == 0:
            row["dev_pass@1"] = 0.3 + 0.015 * step
        rows.append(row)
    return rows


def test_healthy_run_raises_nothing():
    assert check_all(healthy_run()) == []


# --- proxy reward up, gold down ------------------------------------------------------------


def goodhart_run():
    """Reward rises all run; dev pass@1 peaks at step 20 (0.60) then falls."""
    gold = {0: 0.30, 10: 0.50, 20: 0.60, 30: 0.55, 40: 0.48, 50: 0.40, 60: 0.35}
    rows = []
    for step in range(61):
        row = {"step": step, "reward_mean": 0.2 + 0.01 * step}
        if step in gold:
            row["dev_pass@1"] = gold[step]
        rows.append(row)
    return rows


def test_proxy_gold_divergence_fires_once_when_gold_has_fallen_enough():
    alerts = proxy_gold_divergence(goodhart_run(), min_gold_drop=0.1)
    # drop from 0.60: step 30 → 0.05 (noise), step 40 → 0.12 (fires), later steps continue it
    assert [a["step"] for a in alerts] == [40]
    assert alerts[0]["monitor"] == "proxy_gold_divergence"
    assert alerts[0]["value"] == 0.48 and alerts[0]["threshold"] == pytest.approx(0.5)
    assert "best 0.600 (step 20)" in alerts[0]["message"]


def test_proxy_gold_divergence_quiet_when_reward_fell_too():
    rows = goodhart_run()
    for row in rows:
        if row["step"] > 20:  # reward collapses along with gold: a collapse, not a hack
            row["reward_mean"] = 0.1
    assert proxy_gold_divergence(rows) == []


def test_proxy_gold_divergence_fires_again_after_recovery():
    gold = {0: 0.5, 10: 0.35, 20: 0.55, 30: 0.40}  # fall, recover to a new best, fall again
    rows = [{"step": s, "reward_mean": 0.01 * s, **({"dev_pass@1": gold[s]} if s in gold else {})} for s in range(31)]
    assert [a["step"] for a in proxy_gold_divergence(rows)] == [10, 30]


def test_proxy_gold_divergence_needs_both_metrics():
    rows = [{"step": s, "reward_mean": 0.1 * s} for s in range(10)]
    assert proxy_gold_divergence(rows) == []
    assert proxy_gold_divergence([{"step": 0, "dev_pass@1": 0.5}, {"step": 1, "dev_pass@1": 0.1}]) == []


# --- KL ---------------------------------------------------------------------------------------


def test_kl_fires_at_each_upward_crossing():
    kl = [0.1, 0.2, 0.6, 0.9, 0.7, 0.3, 0.2, 0.8, None, 0.4]
    rows = [{"step": s, **({"kl_ref": v} if v is not None else {})} for s, v in enumerate(kl)]
    alerts = kl_explosion(rows, kl_max=0.5)
    assert [(a["step"], a["value"]) for a in alerts] == [(2, 0.6), (7, 0.8)]


def test_kl_at_threshold_does_not_fire_and_nan_does():
    rows = [{"step": 0, "kl_ref": 0.5}, {"step": 1, "kl_ref": float("nan")}]
    alerts = kl_explosion(rows, kl_max=0.5)
    assert [a["step"] for a in alerts] == [1] and math.isnan(alerts[0]["value"])


def test_kl_per_sequence_threshold_is_a_config_choice():
    rows = [{"step": s, "kl_seq": 5.0 * s} for s in range(5)]  # 0, 5, 10, 15, 20
    config = MonitorConfig(kl_key="kl_seq", kl_max=15.0)
    assert [a["step"] for a in check_all(rows, config)] == [4]


# --- length -------------------------------------------------------------------------------------


def test_length_fires_above_twice_the_first_steps_mean():
    lengths = [20, 22, 18, 20, 20] + [30, 39, 41, 45, 35, 50]  # baseline 20, limit 40
    rows = [{"step": s, "response_length": v} for s, v in enumerate(lengths)]
    alerts = length_blowup(rows, baseline_steps=5, factor=2.0)
    assert [a["step"] for a in alerts] == [7, 10]
    assert alerts[0]["threshold"] == 40.0


def test_length_needs_a_baseline_first():
    rows = [{"step": s, "response_length": 100.0 * (s + 1)} for s in range(5)]
    assert length_blowup(rows, baseline_steps=5) == []


def test_rows_missing_the_length_key_are_skipped_not_counted():
    rows = [{"step": 0, "response_length": 10}, {"step": 1}, {"step": 2, "response_length": 10},
            {"step": 3, "response_length": 25}]  # fmt: skip
    assert [a["step"] for a in length_blowup(rows, baseline_steps=2)] == [3]


# --- entropy ------------------------------------------------------------------------------------


def test_entropy_collapse():
    entropy = [0.9, 0.5, 0.2, 0.06, 0.04, 0.03, 0.05]  # 0.05 is at the floor: not below it
    rows = [{"step": 10 * s, "entropy": v} for s, v in enumerate(entropy)]
    assert [a["step"] for a in entropy_collapse(rows, entropy_floor=0.05)] == [40]


# --- check_all ----------------------------------------------------------------------------------


def test_check_all_sorts_by_step_and_respects_disabled_monitors():
    rows = healthy_run()
    rows[12]["kl_ref"] = 3.0
    rows[25]["entropy"] = 0.001
    alerts = check_all(rows)
    assert [(a["step"], a["monitor"]) for a in alerts] == [(12, "kl_explosion"), (25, "entropy_collapse")]
    assert all(set(a) == {"monitor", "step", "message", "value", "threshold"} for a in alerts)
    assert check_all(rows, MonitorConfig(kl_max=None, entropy_floor=None)) == []


def test_rows_without_step_use_their_position():
    rows = [{"kl_ref": 0.1}, {"kl_ref": 0.9}]
    assert kl_explosion(rows)[0]["step"] == 1


def test_config_rejects_a_zero_window():
    with pytest.raises(ValueError, match="window"):
        MonitorConfig(window=0)


# --- no learning signal ------------------------------------------------------------------------


def flat_rows(flags, reward=0.0):
    """One row per flag: True = every group scored alike."""
    return [{"step": step, "zero_variance_groups": 1.0 if flat else 0.5, "reward_mean": reward,
             "grad_norm": 0.0 if flat else 0.3} for step, flat in enumerate(flags)]


def test_no_learning_signal_fires_at_the_fifth_flat_step_in_a_row_and_says_what_to_change():
    alerts = no_learning_signal(flat_rows([True] * 12))
    assert [a["step"] for a in alerts] == [4]
    assert "all wrong" in alerts[0]["message"] and "--algo dapo" in alerts[0]["message"]
    assert "all right" in no_learning_signal(flat_rows([True] * 5, reward=1.0))[0]["message"]


def test_no_learning_signal_needs_the_steps_in_a_row():
    assert no_learning_signal(flat_rows([True, True, True, True, False] * 4)) == []
    assert [a["step"] for a in no_learning_signal(flat_rows([True] * 5 + [False] + [True] * 5))] == [4, 10]


def test_a_zero_gradient_with_varied_rewards_is_named_as_such():
    rows = [{"step": s, "zero_variance_groups": 0.5, "grad_norm": 0.0} for s in range(6)]
    (alert,) = no_learning_signal(rows)
    assert alert["step"] == 4 and "gradient was exactly 0" in alert["message"] and "LoRA" in alert["message"]
    assert check_all(rows, MonitorConfig(no_signal_steps=None)) == []


# --- a preference loss making the chosen answers unlikely ------------------------------------


def test_chosen_likelihood_collapse_fires_past_the_drop_and_again_after_recovery():
    values = [-0.5, -0.7, -1.2, -0.8, -1.3, -1.0]  # drops from the first value: 0.2, 0.7, 0.3, 0.8, 0.5
    rows = [{"step": s, "dev_pref_logps_chosen_per_token": v} for s, v in enumerate(values)]
    alerts = chosen_likelihood_collapse(rows)
    assert [a["step"] for a in alerts] == [2, 4]  # 0.5 exactly (step 5) is not past the line
    assert alerts[0]["threshold"] == pytest.approx(-1.0) and "raise beta" in alerts[0]["message"]
    assert [a["step"] for a in check_all(rows) if a["monitor"] == "chosen_likelihood_collapse"] == [2, 4]
    assert check_all(rows, MonitorConfig(chosen_drop_max=None)) == []
