"""Shared math for every RL algorithm (the contract they follow is in contract.py).

Every function here is pure: tensors and scalars in, tensors (or floats) out, no config
objects. Conventions used throughout:

    B   rows (episodes) in the batch        T   token positions per row (padded)
    V   vocabulary size                     G   number of groups (prompts)

Per-token tensors are (B, T) and aligned with `batch.tokens`: position t of `logp`,
`old_logp`, `ref_logp` holds log π(tokens[t] | tokens[<t]). Masks are float 1.0 / 0.0;
`response_mask` is 1 exactly on the tokens the policy generated (EOS included). Nothing
at a masked-out position may reach a result or a gradient: the functions below use
`torch.where` rather than `x * mask` wherever a padded value could be inf or NaN,
because inf * 0 is NaN.
"""

from __future__ import annotations


from typing import Callable

import torch
import torch.utils.checkpoint


# exp() overflows float32 above ~88. Log-ratios are clamped to ±20 before exponentiating:
# a ratio of e^20 ≈ 5e8 is already far outside any trust region, so the clamp only ever
# touches tokens that are broken anyway, and it keeps one such token from turning the
# whole batch's loss into inf or NaN.
MAX_LOG_RATIO = 20.0


# --------------------------------------------------------------------------------------
# Masked reductions
# --------------------------------------------------------------------------------------


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x · mask over `dim` (all elements when None). Positions where mask == 0
    contribute exactly 0 even if x is inf or NaN there."""
    x = torch.where(mask != 0, x * mask, 0.0)  # not x * mask alone: inf * 0 = NaN
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ x · mask / Σ mask over `dim`. Where the mask is all zero the result is 0, not
    NaN (and so is its gradient)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    # Divide by 1 where there is nothing to average: the numerator is 0 there, so the
    # result is 0. (torch.where on the quotient would still back-propagate 0/0 = NaN.)
    safe_count = torch.where(count > 0, count, torch.ones_like(count))
    return masked_sum(x, mask, dim) / safe_count


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, unbiased: bool = True
) -> torch.Tensor:
    """Variance of the masked entries of x over `dim`. `unbiased` divides the sum of
    squared deviations by n − 1 (Bessel) instead of n. Returns 0 where there are too
    few entries (n ≤ 1 when unbiased, n = 0 otherwise)."""
    mean = masked_mean(x, mask, dim)
    if dim is not None:
        mean = mean.unsqueeze(dim)
    sq_dev = masked_sum((x - mean) ** 2, mask, dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    denom = count - 1 if unbiased else count
    safe_denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.where(denom > 0, sq_dev / safe_denom, torch.zeros_like(sq_dev))


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) with mean and unbiased variance over all masked
    entries. With `shift_mean=False` only the scale changes (the mean is added back).
    Masked-out positions come back as 0."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask != 0, whitened, 0.0)


# --------------------------------------------------------------------------------------
# Loss aggregation: how a (B, T) matrix of per-token losses becomes one number
# --------------------------------------------------------------------------------------

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def agg_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None
) -> torch.Tensor:
    """Reduce per-token losses (B, T) over the response tokens to a scalar.

    Let L[b] = Σ_t loss[b, t] · mask[b, t] and n[b] = Σ_t mask[b, t].

        token-mean               Σ_b L[b] / Σ_b n[b]: every token in the batch weighs the
                                 same, so long responses weigh more (DAPO, arXiv:2503.14476, Sec. 3.3).
        seq-mean-token-mean      (1/B) Σ_b L[b] / n[b]: each sequence weighs the same, its
                                 tokens share that weight (GRPO's 1/G Σ_i 1/|o_i| Σ_t).
        seq-mean-token-sum       (1/B) Σ_b L[b]: no length division at all.
        seq-mean-token-sum-norm  (1/B) Σ_b L[b] / max_len: a constant divisor (the
                                 generation budget) instead of |o_i|, which removes GRPO's
                                 length bias (Dr. GRPO, arXiv:2503.20783).

    B counts every row. A row (or batch) with no response tokens contributes 0; none of
    the modes returns NaN.
    """
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, mask, dim=-1).mean()
    if mode == "seq-mean-token-sum-norm":
        if max_len is None or max_len <= 0:
            raise ValueError(
                f"loss aggregation 'seq-mean-token-sum-norm' needs a positive constant max_len "
                f"(the generation budget, e.g. max_new_tokens), got max_len={max_len!r}"
            )
        return (masked_sum(loss_mat, mask, dim=-1) / max_len).mean()
    raise ValueError(f"unknown loss aggregation mode {mode!r}; choose one of {list(LOSS_AGG_MODES)}")


def micro_batch_share(mode: str, micro_mask: torch.Tensor, batch_mask: torch.Tensor) -> float:
    """The weight of one micro-batch's loss within its whole batch's, for gradient
    accumulation: Σ over micro-batches of share · agg_loss(micro) = agg_loss(whole batch),
    exactly, for every mode.

    token-mean averages over the batch's response tokens, so a micro-batch's token mean
    counts by its share of those tokens (verl and TRL normalise by the global token count
    for the same reason); the seq-mean modes average over rows, so it counts by its share
    of the rows. micro_mask (b, T') and batch_mask (B, T) are the response masks."""
    if mode == "token-mean":
        tokens = batch_mask.sum()
        return (micro_mask.sum() / tokens).item() if tokens > 0 else 0.0
    return micro_mask.shape[0] / batch_mask.shape[0]


# --------------------------------------------------------------------------------------
# KL estimators between the current policy π and the reference π_ref, per token
# --------------------------------------------------------------------------------------
# The tokens were sampled from π (on-policy), so each is a single-sample Monte Carlo
# estimate of KL(π ‖ π_ref) = E_π[log π − log π_ref] at that position.
# See J. Schulman, "Approximating KL Divergence" (2020), http://joschu.net/blog/kl-approx.html


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = log π − log π_ref, (B, T). Unbiased but high variance, and negative on some
    tokens, so a per-token penalty with it can reward moving away from π_ref."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π − log π_ref)², (B, T). Always ≥ 0, low variance, biased (its
    expectation is an f-divergence that matches KL only to second order)."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = r − log r − 1 with r = π_ref / π, (B, T). Unbiased for KL(π ‖ π_ref) since
    E_π[r] = 1, always ≥ 0 since log r ≤ r − 1, and low variance. This is the estimator in
    the GRPO paper (arXiv:2402.03300, Eq. 4). The log-ratio is clamped to ±MAX_LOG_RATIO
    so exp cannot overflow to inf when π puts almost no mass on a token π_ref likes."""
    log_r = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    return torch.exp(log_r) - log_r - 1


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimate (B, T) with the estimator named `kind`."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; choose one of {list(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[kind](logp, ref_logp)


# --------------------------------------------------------------------------------------
# PPO's clipped surrogate objective
# --------------------------------------------------------------------------------------


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's pessimistic policy loss (arXiv:1707.06347, Eq. 7), negated to be minimised.

    Args:
        logp:      (B, T) log π_θ(token | prefix), differentiable.
        old_logp:  (B, T) log π_old(token | prefix) from sampling time, a constant.
        adv:       (B, T) advantage of each token, a constant.
        mask:      (B, T) response mask.
        eps_low, eps_high: the trust region is ratio ∈ [1 − eps_low, 1 + eps_high]
                   (equal in PPO; DAPO's clip-higher raises eps_high, arXiv:2503.14476).
        dual_clip: constant c > 1, or None. For negative advantages the loss is capped at
                   −adv · c, so a token whose ratio has exploded cannot dominate the
                   update (dual-clip PPO, Ye et al., AAAI 2020, arXiv:1912.09729).
        agg, max_len: how per-token losses become a scalar, see `agg_loss`.

    Returns (loss, metrics) where metrics are python floats over response tokens:
        clipfrac    fraction of tokens where the clipped branch is the active one
                    (the gradient through those tokens is zero)
        approx_kl   k3 estimate of KL(π_old ‖ π_θ): the tokens were sampled from π_old
        ratio_mean, ratio_max
        dual_clipfrac (only with dual_clip) fraction of tokens capped by the dual clip
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be a constant > 1 (3 is common) or None, got {dual_clip!r}")
    # Off the response the log-ratio is set to 0 (ratio 1) whatever padding holds, even
    # -inf log-probs or inf advantages: the backward pass multiplies by those values, and
    # 0 · inf is NaN. agg_loss then drops the padded losses themselves.
    on = mask != 0
    log_ratio = torch.where(on, logp - old_logp, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    ratio = torch.exp(log_ratio)  # (B, T) π_θ / π_old

    pg_loss1 = -adv * ratio  # (B, T) the unclipped surrogate
    pg_loss2 = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # (B, T)
    pg_loss_clip = torch.maximum(pg_loss1, pg_loss2)  # (B, T) PPO's min over objectives = max over losses
    pg_loss_mat = pg_loss_clip
    if dual_clip is not None:
        pg_loss3 = -adv * dual_clip  # (B, T) the dual-clip cap, only meaningful for adv < 0
        pg_loss_mat = torch.where(adv < 0, torch.minimum(pg_loss_clip, pg_loss3), pg_loss_clip)  # (B, T)
    loss = agg_loss(pg_loss_mat, mask, agg, max_len)

    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean((pg_loss2 > pg_loss1).float(), mask).item(),
            # k3 with r = π_θ / π_old, samples from π_old: E[(r − 1) − log r] = KL(old ‖ θ)
            "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
            "ratio_max": ratio.masked_fill(~on, 0.0).max().item() if on.any() else 0.0,
        }
        if dual_clip is not None:
            metrics["dual_clipfrac"] = masked_mean((pg_loss_mat < pg_loss_clip).float(), mask).item()
    return loss, metrics


# --------------------------------------------------------------------------------------
# Group statistics (the K samples of one prompt share a group id)
# --------------------------------------------------------------------------------------


def group_mean_std(
    values: torch.Tensor, group_ids: torch.Tensor, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group, without a loop over groups.

    Args:
        values: (B,) float, e.g. rewards.
        group_ids: (B,) long, any integers; rows with equal ids form a group.
        weights: (B,) float or None (all 1): how much of one sample a row is. An episode
            cut into n rows (one per model turn, RolloutBatch.row_weights) gives each 1/n,
            so the group's statistics are its episodes', as if each were one row.

    Returns (mean, std, count), each (B,) and broadcast back to rows; count is the weighted
    size (the number of episodes). std uses Bessel's N − 1; a group of one has std 0
    (there is no spread to estimate).
    """
    weights = torch.ones_like(values) if weights is None else weights
    _, idx = torch.unique(group_ids, return_inverse=True)  # (B,) ids relabelled 0..G-1
    G = int(idx.max()) + 1
    count = values.new_zeros(G).index_add_(0, idx, weights)  # (G,)
    mean = values.new_zeros(G).index_add_(0, idx, weights * values) / count  # (G,)
    sq_dev = weights * (values - mean[idx]) ** 2  # (B,) two-pass variance: stable when values are large
    ss = values.new_zeros(G).index_add_(0, idx, sq_dev)  # (G,)
    # > 1.5, not > 1: a weighted count is a float sum, exact only up to rounding
    var = torch.where(count > 1.5, ss / (count - 1).clamp(min=1), torch.zeros_like(ss))  # (G,)
    return mean[idx], var.sqrt()[idx], count[idx]


def zero_variance_group_fraction(rewards: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups whose rewards are all equal. Such a group has advantage 0 on
    every sample under any group baseline, so it contributes no policy gradient (what
    DAPO's dynamic sampling filters out, arXiv:2503.14476 Sec. 3.2)."""
    _, idx = torch.unique(group_ids, return_inverse=True)  # (B,)
    G = int(idx.max()) + 1
    # all equal <=> max == min within the group
    gmax = rewards.new_full((G,), -torch.inf).scatter_reduce(0, idx, rewards, "amax")
    gmin = rewards.new_full((G,), torch.inf).scatter_reduce(0, idx, rewards, "amin")
    return (gmax == gmin).float().mean().item()


# --------------------------------------------------------------------------------------
# Pieces shared by the algorithms beyond GRPO (REINFORCE, RLOO, CISPO, PPO, ...)
# --------------------------------------------------------------------------------------


def policy_gradient_loss(
    logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean", max_len: int | None = None
) -> torch.Tensor:
    """REINFORCE's loss, agg(−adv · logp) (Williams 1992, "Simple statistical
    gradient-following algorithms"). `adv` is a constant, so the gradient is
    −agg(adv · ∇ log π): the score-function estimator, with no ratio and no clip.

    Args:
        logp: (B, T) log π_θ(token | prefix), differentiable.
        adv:  (B, T) the weight on each token's log-prob (advantage, or advantage times a
              constant importance weight as in CISPO).
        mask, agg, max_len: response mask and aggregation, see `agg_loss`.

    At θ = θ_old its gradient equals that of `clipped_surrogate` (∇ ratio = ∇ log π there).
    """
    # The gradient reaching logp is −adv · (upstream), and upstream is 0 off the response:
    # zero adv there too, or an inf advantage in padding would make 0 · inf = NaN. (A −inf
    # log-prob in padding is harmless: agg_loss drops the NaN product and its gradient.)
    adv = torch.where(mask != 0, adv, 0.0)  # (B, T)
    return agg_loss(-adv * logp, mask, agg, max_len)


def importance_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log_ratio, ratio) of π_θ / π_old per token, (B, T) each. Off the response the
    log-ratio is 0 (ratio 1) whatever padding holds; it is clamped to ±MAX_LOG_RATIO so
    exp cannot overflow. Differentiable in `logp`, the same computation as inside
    `clipped_surrogate`."""
    log_ratio = torch.where(mask != 0, logp - old_logp, 0.0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    return log_ratio, torch.exp(log_ratio)


@torch.no_grad()
def ratio_metrics(log_ratio: torch.Tensor, ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """approx_kl (k3 of the ratio, samples from π_old: an estimate of KL(π_old ‖ π_θ)),
    ratio_mean and ratio_max over response tokens, named as `clipped_surrogate` names them."""
    on = mask != 0
    return {
        "approx_kl": masked_mean((ratio - 1) - log_ratio, mask).item(),
        "ratio_mean": masked_mean(ratio, mask).item(),
        "ratio_max": ratio.masked_fill(~on, 0.0).max().item() if on.any() else 0.0,
    }


@torch.no_grad()
def advantage_metrics(adv: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """adv_mean and adv_std (unbiased) over response tokens."""
    return {"adv_mean": masked_mean(adv, mask).item(), "adv_std": masked_var(adv, mask).sqrt().item()}
