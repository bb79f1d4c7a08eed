"""Long-tail rollouts: a batch decodes until its longest sample ends.

Reasoning models' response lengths are close to log-normal: most answers are short, a few
run on for many times the mean. A synchronous step waits for all K·B of them, so the
number of decode steps is the *maximum* of K·B draws, not their mean:

    E[max of n draws] = ∫ exp(μ + σz) · n·Φ(z)^(n−1)·φ(z) dz     (the max's density)
    straggler tax     = E[max] / E[mean]

For cv = 1.3 (σ = 1) and n = 256 that is ~11× the mean; for cv = 0.5, ~3.5×. What a decode of ragged rows costs, when
finished rows leave the batch (our sampler drops them, roles/rollout.py):

    seconds = a·max(L) + b·Σ L

a = the cost of a step whatever its rows (reading every weight once; Python overhead on a
CPU), b = the cost per row-token (FLOPs, the row's KV cache). The a·max(L) term is the tax.

Three patches, in the order they compose (each acts on what the one before leaves):

    1. packing        finished rows give their slot to new work (continuous batching in the
                      engine, packed rows in the update): the b-term pays Σ L, not n·max L
    2. length cap     truncate at a cap C with a shaped penalty before it (DAPO's soft
                      overlong punishment), so the policy learns to stop: max L ≤ C
    3. dynamic K      launch n/keep rows, end the step when n have finished, drop the rest:
                      the step waits for the n-th order statistic of n/keep, not the max
                      (this biases the batch toward short answers; correct for it or accept it)

Low-precision rollout (int8/fp8 weights) shrinks a: decode reads fewer weight bytes. The
price is a sampler that is not the trained policy: `logprob_mismatch` measures how far.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

_NORMAL = statistics.NormalDist()


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(μ, σ) of the log-normal with this mean and coefficient of variation (std / mean)."""
    if mean <= 0 or cv < 0:
        raise ValueError(f"mean={mean}, cv={cv}: a log-normal needs mean > 0 and cv >= 0")
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def order_statistic_z(i: int, n: int) -> float:
    """Blom's approximation of the standard normal's i-th smallest of n draws (1-based)."""
    if not 1 <= i <= n:
        raise ValueError(f"order statistic {i} of {n}: need 1 <= i <= n")
    return _NORMAL.inv_cdf((i - 0.375) / (n + 0.25))


def expected_order_statistic(i: int, n: int, mean: float, cv: float, points: int = 4000) -> float:
    """E[i-th shortest of n log-normal lengths], by quadrature over the normal's order
    statistic density n!/((i−1)!(n−i)!)·Φ(z)^(i−1)·(1−Φ(z))^(n−i)·φ(z) times exp(μ + σz).
    (exp(μ + σ·E[z_(i:n)]) would be lower: the exponential of a mean is below the mean of
    the exponential, by ~10% for the max of 256 at σ = 1.)"""
    mu, sigma = lognormal_params(mean, cv)
    if not 1 <= i <= n:
        raise ValueError(f"order statistic {i} of {n}: need 1 <= i <= n")
    log_c = math.lgamma(n + 1) - math.lgamma(i) - math.lgamma(n - i + 1)
    lo, hi = -10.0, 10.0
    dz = (hi - lo) / points
    total = 0.0
    for k in range(points + 1):
        z = lo + k * dz
        below, above = 0.5 * math.erfc(-z / math.sqrt(2)), 0.5 * math.erfc(z / math.sqrt(2))  # Φ(z), 1 − Φ(z)
        if below <= 0 or above <= 0:
            continue
        log_density = log_c + (i - 1) * math.log(below) + (n - i) * math.log(above) - z * z / 2 - 0.5 * math.log(2 * math.pi)
        total += math.exp(log_density + mu + sigma * z) * (0.5 if k in (0, points) else 1.0)
    return total * dz


def expected_max(n: int, mean: float, cv: float) -> float:
    """E[the longest of n log-normal lengths]: the decode steps a synchronous batch takes."""
    return expected_order_statistic(n, n, mean, cv)


def straggler_tax(n: int, cv: float) -> float:
    """E[max] / mean for n draws: how many times the mean length the batch waits for."""
    return expected_max(n, 1.0, cv)


def expected_lengths(n: int, mean: float, cv: float) -> list[float]:
    """A typical batch of n lengths, shortest first: the log-normal's quantiles at Blom's
    plotting positions (i − 0.375)/(n + 0.25), no sampling noise. Its longest is the
    median-like max, somewhat below E[max]; feed it to decode_seconds or the rooflines."""
    mu, sigma = lognormal_params(mean, cv)
    return [math.exp(mu + sigma * order_statistic_z(i, n)) for i in range(1, n + 1)]


def simulated_max(n: int, mean: float, cv: float, trials: int = 2000, seed: int = 0) -> float:
    """Monte Carlo E[max of n]: the check on Blom's approximation."""
    mu, sigma = lognormal_params(mean, cv)
    rng = random.Random(seed)
    return statistics.fmean(max(rng.lognormvariate(mu, sigma) for _ in range(n)) for _ in range(trials))


def decode_seconds(lengths: list[float], seconds_per_step: float, seconds_per_row_token: float) -> float:
    """A decode whose rows leave when they finish: Σ over steps t of (a + b·rows alive at t)
    = a·max(L) + b·Σ L, since a row of length L is alive for L steps."""
    if not lengths:
        return 0.0
    return seconds_per_step * max(lengths) + seconds_per_row_token * sum(lengths)


def static_batch_seconds(lengths: list[float], seconds_per_step: float, seconds_per_row_token: float) -> float:
    """A decode that keeps every row to the end (no dropping, no refill): (a + b·n)·max(L)."""
    if not lengths:
        return 0.0
    return (seconds_per_step + seconds_per_row_token * len(lengths)) * max(lengths)


def overlong_penalty(length: float, cap: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, https://arxiv.org/abs/2503.14476):
    0 up to cap − buffer, falling linearly to −1 at the cap, −1 beyond. Added to the reward,
    it teaches the policy to finish before the cap instead of being cut off there."""
    if not 0 < buffer <= cap:
        raise ValueError(f"buffer={buffer}, cap={cap}: need 0 < buffer <= cap")
    if length <= cap - buffer:
        return 0.0
    return max(-1.0, (cap - buffer - length) / buffer)


@dataclass(frozen=True)
class PatchStep:
    """The decode time of a batch after one more patch, cumulatively."""

    patch: str
    decode_steps: float  # the steps the batch waits for
    seconds: float

    def speedup_over(self, before: PatchStep) -> float:
        return before.seconds / self.seconds


def straggler_patches(n: int, mean: float, cv: float, seconds_per_step: float, seconds_per_row_token: float,
                      cap: float | None = None, keep_fraction: float = 1.0) -> list[PatchStep]:
    """A batch of n log-normal lengths (mean, cv) before and after each patch, in compose
    order: none (every row kept to the end), packing (rows leave or are refilled), a
    length cap at `cap`, dynamic K (launch n / keep_fraction rows, wait for n of them).

    The cap is modelled as truncation (min(L, cap)); a policy trained under the shaped
    penalty ends earlier than that, so this is the patch's least effect."""
    if not 0 < keep_fraction <= 1:
        raise ValueError(f"keep_fraction={keep_fraction}: a fraction in (0, 1] of the launched rows to wait for")
    lengths = expected_lengths(n, mean, cv)
    steps = [PatchStep("none", max(lengths), static_batch_seconds(lengths, seconds_per_step, seconds_per_row_token)),
             PatchStep("packing", max(lengths), decode_seconds(lengths, seconds_per_step, seconds_per_row_token))]
    if cap is not None:
        lengths = [min(L, cap) for L in lengths]
        steps.append(PatchStep(f"length cap {cap:g}", max(lengths),
                               decode_seconds(lengths, seconds_per_step, seconds_per_row_token)))
    if keep_fraction < 1:
        launched = math.ceil(n / keep_fraction)
        drawn = expected_lengths(launched, mean, cv)
        drawn = [min(L, cap) for L in drawn] if cap is not None else drawn
        stop = drawn[n - 1]  # the n-th to finish ends the step; the others are cut there
        steps.append(PatchStep(f"dynamic K (wait for {n} of {launched})", stop,
                               decode_seconds([min(L, stop) for L in drawn], seconds_per_step, seconds_per_row_token)))
    return steps


@dataclass(frozen=True)
class Mismatch:
    """How far a low-precision sampler's log-probs are from the trained policy's."""

    mean_abs_logp_diff: float  # nats per token
    kl_k3: float  # KL(sampler ‖ policy) per token, k3 estimator on the sampled tokens
    clipped_fraction: float  # tokens whose importance weight π / π_sampler exceeds the cap
    effective_sample_fraction: float  # (Σw)² / (n·Σw²): 1 = no loss; the share of tokens the weights keep


def logprob_mismatch(sampler_logp: list[float], policy_logp: list[float], cap: float = 2.0) -> Mismatch:
    """Compare per-token log-probs of the sampled tokens under the sampler (int8, fp8) and
    the policy the update trains: the importance weight w = π / π_sampler corrects the
    update, truncated at `cap` (TIS, roles/off_policy.py)."""
    if len(sampler_logp) != len(policy_logp) or not sampler_logp:
        raise ValueError(f"{len(sampler_logp)} sampler and {len(policy_logp)} policy log-probs: give one each, "
                         "for the same tokens")
    diffs = [p - s for s, p in zip(sampler_logp, policy_logp)]  # log w
    weights = [math.exp(d) for d in diffs]
    # k3 with r = π / π_sampler on tokens drawn from the sampler: E[r − 1 − log r] = KL(sampler ‖ π)
    kl = statistics.fmean(w - 1 - d for w, d in zip(weights, diffs))
    ess = sum(weights) ** 2 / (len(weights) * sum(w * w for w in weights))
    return Mismatch(statistics.fmean(abs(d) for d in diffs), kl, sum(w > cap for w in weights) / len(weights), ess)
