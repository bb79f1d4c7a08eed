"""Pairwise win-rate: the offline stand-in for AlpacaEval and MT-Bench's pairwise mode.

Two policies A and B answer the same N prompts, one answer each; a judge scores both
answers of a prompt and the one it scores higher wins that prompt:

    outcome_i = 1     if judge(a_i) > judge(b_i)          A wins prompt i
                0.5   if judge(a_i) = judge(b_i)          a tie counts half (AlpacaEval's rule)
                0     otherwise                           B wins
    win_rate  = (1/N) Σ_i outcome_i                       so win_rate(B vs A) = 1 − win_rate(A vs B)

Its 95% CI is the percentile bootstrap over prompts (eval/stats.py): the range the rate of
another draw of N prompts of the same kind would likely fall in.

Length. A judge that likes long answers makes a verbose policy look better (AlpacaEval's
known bias; Dubois et al. 2024, arXiv:2404.04475, fit a regression and report its win-rate
at zero length difference). `length_controlled` does the small version of that: a logistic
regression of the outcome on the length difference,

    P(A wins prompt i) = σ(θ0 + θ1 · x_i),    x_i = tanh((len(a_i) − len(b_i)) / s)

(s the standard deviation of the differences, tanh so that a few runaway answers cannot
steer the fit; ties are soft labels of ½; a small ridge on θ1 keeps the fit finite when
length separates the outcomes), and reports σ(θ0), the win-rate the judge would give two
answers of equal length, beside θ1, how much length moves the judge. With no length
difference at all, σ(θ0) is the raw win-rate exactly. Its CI is a bootstrap over prompts
too. It has no per-instruction terms (AlpacaEval's GLM has them), so it corrects only for
the length difference on average.

Trust. When the task has a verifier, `verifier_agreement` counts how often the judge picks
the side the verifier picks, on the prompts where the verifier picks one (one answer right,
the other wrong): a judge that agrees 60% of the time there says little about the 40% it
decides alone.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from posttrain.eval.stats import bootstrap_ci

TIE = 0.5  # a tie's share of a win (AlpacaEval and MT-Bench count a tie as half)
LENGTH_RIDGE = 1e-2  # on θ1 only: finite when length alone separates wins from losses, negligible otherwise
NEWTON_STEPS = 30  # Newton's method on a 2-parameter logistic fit converges in ~6; 30 leaves a margin
MAX_LOGIT = 30.0  # σ(30) = 1 − 1e-13: an all-wins sample stops there instead of running off to infinity


def pairwise_outcomes(score_a: Sequence[float], score_b: Sequence[float]) -> list[float]:
    """1 / ½ / 0 per prompt: A's answer scored above, equal to, or below B's."""
    if len(score_a) != len(score_b):
        raise ValueError(f"score_a has {len(score_a)} scores and score_b {len(score_b)}: a win-rate compares the "
                         "two answers to each prompt, so give one score per prompt on each side")
    return [1.0 if a > b else TIE if a == b else 0.0 for a, b in zip(score_a, score_b)]


def win_rate(outcomes: Sequence[float], confidence: float = 0.95, n_resamples: int = 10_000,
             seed: int = 0) -> dict[str, float]:
    """{"win_rate", "ci_low", "ci_high", "n", "wins", "ties", "losses"} of per-prompt
    outcomes (1, ½, 0); the CI a percentile bootstrap over prompts."""
    if any(o not in (0.0, TIE, 1.0) for o in outcomes):
        bad = next(o for o in outcomes if o not in (0.0, TIE, 1.0))
        raise ValueError(f"an outcome is 1 (A wins), 0.5 (tie) or 0 (B wins), got {bad!r}")
    ci = bootstrap_ci(outcomes, confidence, n_resamples, seed)
    return {"win_rate": ci["mean"], "ci_low": ci["ci_low"], "ci_high": ci["ci_high"], "n": ci["n"],
            "wins": sum(o == 1.0 for o in outcomes), "ties": sum(o == TIE for o in outcomes),
            "losses": sum(o == 0.0 for o in outcomes)}


def fit_length_logistic(y: torch.Tensor, x: torch.Tensor, weights: torch.Tensor,
                        ridge: float = LENGTH_RIDGE) -> torch.Tensor:
    """θ = (θ0, θ1) of P(y=1) = σ(θ0 + θ1·x), fitted by Newton's method on the weighted
    log-likelihood with soft labels y ∈ [0, 1] and a ridge on θ1; one fit per row of
    `weights` (R, N), all at once (a bootstrap resample is a row of item counts).
    y, x: (N,). Returns (R, 2)."""
    theta = torch.zeros(weights.shape[0], 2, dtype=torch.float64)  # (R, 2)
    for _ in range(NEWTON_STEPS):
        p = torch.sigmoid(theta[:, :1] + theta[:, 1:] * x)  # (R, N)
        residual = weights * (y - p)  # (R, N)
        curvature = weights * p * (1 - p)  # (R, N)
        g0 = residual.sum(1)  # (R,)
        g1 = (residual * x).sum(1) - ridge * theta[:, 1]  # (R,)
        h00 = curvature.sum(1) + 1e-12  # (R,): +ε keeps an all-wins sample's Hessian invertible
        h01 = (curvature * x).sum(1)  # (R,)
        h11 = (curvature * x * x).sum(1) + ridge  # (R,)
        det = h00 * h11 - h01 * h01  # (R,) > 0: h is positive definite with the ridge
        step = torch.stack([(h11 * g0 - h01 * g1) / det, (h00 * g1 - h01 * g0) / det], dim=1)  # (R, 2)
        theta = (theta + step).clamp(-MAX_LOGIT, MAX_LOGIT)
    return theta


def length_controlled(outcomes: Sequence[float], len_a: Sequence[float], len_b: Sequence[float],
                      confidence: float = 0.95, n_resamples: int = 2_000, seed: int = 0) -> dict[str, float]:
    """The win-rate at zero length difference (module docstring): {"lc_win_rate", "ci_low",
    "ci_high", "length_slope" (θ1), "scale" (s, in the lengths' unit)}. Fewer resamples than
    the raw rate's CI: each is a logistic fit."""
    if not len(outcomes) == len(len_a) == len(len_b):
        raise ValueError(f"{len(outcomes)} outcomes, {len(len_a)} lengths of A and {len(len_b)} of B: give one of "
                         "each per prompt")
    y = torch.tensor(outcomes, dtype=torch.float64)  # (N,)
    diff = torch.tensor(len_a, dtype=torch.float64) - torch.tensor(len_b, dtype=torch.float64)  # (N,)
    scale = float(diff.std(unbiased=False)) if len(outcomes) > 1 else 0.0
    x = torch.tanh(diff / scale) if scale > 0 else torch.zeros_like(diff)  # (N,)
    n = len(outcomes)
    point = fit_length_logistic(y, x, torch.ones(1, n, dtype=torch.float64))[0]
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n, (n_resamples, n), generator=generator)  # (R, N) item indices
    counts = torch.zeros(n_resamples, n, dtype=torch.float64).scatter_add_(
        1, draws, torch.ones(n_resamples, n, dtype=torch.float64))  # (R, N): how often each item was drawn
    rates = torch.sigmoid(fit_length_logistic(y, x, counts)[:, 0])  # (R,)
    tail = (1.0 - confidence) / 2
    low, high = torch.quantile(rates, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return {"lc_win_rate": float(torch.sigmoid(point[0])), "ci_low": float(low), "ci_high": float(high),
            "length_slope": float(point[1]), "scale": scale}


def verifier_agreement(outcomes: Sequence[float], reward_a: Sequence[float], reward_b: Sequence[float],
                       confidence: float = 0.95, seed: int = 0) -> dict[str, float]:
    """How often the judge sides with the verifier where the verifier takes a side:
    {"agreement" (1 per agreeing prompt, ½ per judge tie, 0 per disagreement, averaged over
    the decisive prompts), "ci_low", "ci_high", "decisive" (prompts where one answer scored
    higher), "verifier_ties" (both right or both wrong)}; agreement is NaN with no decisive
    prompt."""
    if not len(outcomes) == len(reward_a) == len(reward_b):
        raise ValueError(f"{len(outcomes)} outcomes, {len(reward_a)} verifier rewards of A and {len(reward_b)} of "
                         "B: give one of each per prompt")
    truth = pairwise_outcomes(reward_a, reward_b)
    agree = [1.0 - abs(judged - true) if judged != TIE else TIE
             for judged, true in zip(outcomes, truth) if true != TIE]
    ties = len(outcomes) - len(agree)
    if not agree:
        return {"agreement": math.nan, "ci_low": math.nan, "ci_high": math.nan, "decisive": 0, "verifier_ties": ties}
    ci = bootstrap_ci(agree, confidence, seed=seed)
    return {"agreement": ci["mean"], "ci_low": ci["ci_low"], "ci_high": ci["ci_high"], "decisive": len(agree),
            "verifier_ties": ties}
