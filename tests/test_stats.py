"""Evaluation statistics, checked against numbers worked by hand and exact arithmetic."""

import math
import random
from fractions import Fraction

import pytest
import torch

from posttrain.eval.stats import (bootstrap_ci, bootstrap_means, noise_rule, noise_rule_line, paired_bootstrap_diff,
                                  pass_at_k)

# --- pass@k -----------------------------------------------------------------------------


def test_pass_at_k_worked_by_hand():
    # 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the plain success rate: 1 - C(7,1)/C(10,1) = 1 - 7/10 = 0.3
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # no correct sample: 1 - C(5,3)/C(5,3) = 0
    assert pass_at_k(5, 0, 3) == 0.0
    # n-c = 1 wrong sample < k = 2: every pair holds a correct one
    assert pass_at_k(5, 4, 2) == 1.0
    # all correct
    assert pass_at_k(4, 4, 4) == 1.0


def exact_pass_at_k(n, c, k):
    """Independent implementation: exact binomials in rational arithmetic."""
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_pass_at_k_matches_exact_binomials_everywhere_small():
    for n in range(1, 16):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = float(exact_pass_at_k(n, c, k))
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_is_stable_where_binomials_are_huge():
    # C(1000, 500) has 300 digits: float binomials would overflow to inf/inf = nan
    for n, c, k in [(200, 3, 10), (1000, 1, 500), (1000, 999, 1), (1000, 10, 100)]:
        assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), rel=1e-9)


@pytest.mark.parametrize(
    "args,message",
    [
        ((0, 0, 1), r"n \(samples per problem\) must be at least 1, got 0"),
        ((5, 6, 1), r"c \(correct samples\) must be between 0 and n=5, got 6"),
        ((5, -1, 1), r"c \(correct samples\) must be between 0 and n=5, got -1"),
        ((5, 2, 6), r"k must be between 1 and n=5: pass@6 needs at least 6 samples"),
        ((5, 2, 0), r"k must be between 1 and n=5"),
        ((5.0, 2, 1), r"n must be an int, got 5.0"),
        ((5, True, 1), r"c must be an int, got True"),
    ],
)
def test_pass_at_k_rejects_bad_inputs_with_the_value(args, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(*args)


# --- bootstrap CI ---------------------------------------------------------------------------


def test_constant_values_give_a_zero_width_interval():
    for constant in (0.0, 1.0, 0.5):
        ci = bootstrap_ci([constant] * 37)
        assert ci == {"mean": constant, "ci_low": constant, "ci_high": constant, "n": 37}


def test_two_items_worked_by_hand():
    # Resampling [0, 1] twice gives means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4.
    # 25% of the mass sits at each end, far more than the 2.5% tails: CI = [0, 1].
    ci = bootstrap_ci([0.0, 1.0])
    assert (ci["mean"], ci["ci_low"], ci["ci_high"]) == (0.5, 0.0, 1.0)


def test_bootstrap_spread_matches_the_standard_error_formula():
    # For 1..10: mean 5.5, population variance (ddof=0) = (10^2 - 1)/12 = 8.25.
    # The means of n=10 resampled items vary with variance 8.25/10 = 0.825 (std 0.908).
    values = torch.arange(1, 11, dtype=torch.float64)
    means = bootstrap_means(values, n_resamples=20_000, seed=0)
    assert means.mean().item() == pytest.approx(5.5, abs=0.02)
    assert means.std().item() == pytest.approx(math.sqrt(0.825), rel=0.03)


def test_ci_of_a_pass_rate_matches_the_normal_approximation():
    # 50 passes in 100: SE = sqrt(0.5 * 0.5 / 100) = 0.05, so 95% CI ~ 0.5 ± 1.96 * 0.05
    ci = bootstrap_ci([1.0] * 50 + [0.0] * 50)
    assert ci["mean"] == 0.5 and ci["n"] == 100
    assert ci["ci_low"] == pytest.approx(0.5 - 0.098, abs=0.015)
    assert ci["ci_high"] == pytest.approx(0.5 + 0.098, abs=0.015)


def test_ci_covers_the_true_mean_about_95_percent_of_the_time():
    rng = random.Random(0)
    covered = 0
    for trial in range(200):
        sample = [float(rng.random() < 0.7) for _ in range(100)]
        ci = bootstrap_ci(sample, n_resamples=1_000, seed=trial)
        assert ci["ci_low"] <= ci["mean"] <= ci["ci_high"]
        covered += ci["ci_low"] <= 0.7 <= ci["ci_high"]
    # 200 trials: binomial std of the rate is ~0.015; percentile CIs run slightly narrow
    assert 0.88 <= covered / 200 <= 0.99


def test_bootstrap_is_deterministic_given_the_seed():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)


def test_large_inputs_are_chunked_without_changing_the_answer_much():
    values = [float(i % 3 == 0) for i in range(5_000)]  # 10,000 x 5,000 indices: 4 chunks
    ci = bootstrap_ci(values)
    se = math.sqrt(ci["mean"] * (1 - ci["mean"]) / 5_000)
    assert ci["ci_high"] - ci["ci_low"] == pytest.approx(2 * 1.96 * se, rel=0.1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"values": []}, r"values is empty"),
        ({"values": [1.0, float("nan")]}, r"non-finite value \(nan\)"),
        ({"values": [1.0], "confidence": 95}, r"confidence must be between 0 and 1 .* got 95"),
        ({"values": [1.0], "n_resamples": 0}, r"n_resamples must be a positive int .* got 0"),
    ],
)
def test_bootstrap_rejects_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_ci(**kwargs)


# --- paired difference ------------------------------------------------------------------------


def test_identical_runs_are_within_noise():
    a = [1.0, 0.0, 1.0, 1.0] * 25
    result = paired_bootstrap_diff(a, a)
    assert (result["mean_diff"], result["ci_low"], result["ci_high"]) == (0.0, 0.0, 0.0)
    assert result["verdict"] == "within noise"


def test_paired_difference_worked_by_hand():
    # per-item differences repeat (0, 1, 0, 0): mean 0.25 over n = 200,
    # SE = sqrt(0.25 * 0.75 / 200) = 0.0306, CI ~ 0.25 ± 0.06 = [0.19, 0.31]
    result = paired_bootstrap_diff([1.0, 1.0, 1.0, 0.0] * 50, [1.0, 0.0, 1.0, 0.0] * 50)
    assert result["mean_diff"] == 0.25 and result["n"] == 200
    assert (result["mean_a"], result["mean_b"]) == (0.75, 0.5)
    assert result["ci_low"] == pytest.approx(0.19, abs=0.015)
    assert result["ci_high"] == pytest.approx(0.31, abs=0.015)
    assert result["verdict"] == "real"


def test_pairing_detects_a_gain_that_separate_intervals_would_miss():
    # b passes half of 200 items; a passes the same ones plus 10 more.
    b = [1.0] * 100 + [0.0] * 100
    a = [1.0] * 110 + [0.0] * 90
    # Separately each CI is ~ ±1.96 * sqrt(0.25 / 200) = ±0.069, so they overlap...
    assert bootstrap_ci(a)["ci_low"] < bootstrap_ci(b)["ci_high"]
    # ...but the differences are ten 1s and 190 0s: mean 0.05, SE = sqrt(0.05 * 0.95 / 200)
    # = 0.0154, CI ~ [0.02, 0.08], which excludes 0.
    assert paired_bootstrap_diff(a, b)["verdict"] == "real"


def test_paired_difference_of_a_small_mixed_change_is_within_noise():
    # a gains 3 items and loses 2: differences have mean 1/100, CI clearly spans 0
    b = [1.0] * 50 + [0.0] * 50
    a = [0.0, 0.0] + [1.0] * 48 + [1.0, 1.0, 1.0] + [0.0] * 47
    result = paired_bootstrap_diff(a, b)
    assert result["mean_diff"] == pytest.approx(0.01)
    assert result["verdict"] == "within noise"


def test_paired_difference_needs_the_same_items():
    with pytest.raises(ValueError, match="a has 3 values and b has 2"):
        paired_bootstrap_diff([1.0, 0.0, 1.0], [1.0, 0.0])


# --- the noise rule ---------------------------------------------------------------------


@pytest.mark.parametrize("diff, n, verdict", [
    (0.03, 60, "likely noise"),  # the seed's example: 2-3 points on a small set
    (-0.04, 50, "likely noise"),  # a drop is judged by its size too
    (0.55 - 0.50, 99, "likely noise"),  # exactly 5 points (0.05000000000000004 in floats): not > 5
    (0.0, 10, "likely noise"),
    (0.06, 99, "over 5 points"),
    (-0.25, 40, "over 5 points"),
    (0.01, 100, "not applicable"),  # the rule is for N < 100
    (0.30, 500, "not applicable"),
])
def test_noise_rule_on_hand_made_cases(diff, n, verdict):
    assert noise_rule(diff, n)["verdict"] == verdict


def test_noise_rule_line_says_why():
    assert noise_rule_line(0.03, 60) == "noise rule: likely noise (N = 60 < 100 and |difference| = 3.0 <= 5 points)"
    assert noise_rule_line(0.1, 500) == ("noise rule: not applicable (N = 500 >= 100: the noise rule is for small "
                                         "sets; read the CI)")


@pytest.mark.parametrize("diff, n, problem", [(0.1, 0, "positive int"), (0.1, True, "positive int"),
                                               (0.1, 2.0, "positive int"), (float("nan"), 10, "finite")])
def test_noise_rule_refuses_what_is_not_a_difference_on_items(diff, n, problem):
    with pytest.raises(ValueError, match=problem):
        noise_rule(diff, n)
