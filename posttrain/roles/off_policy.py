"""Off-policy bookkeeping for every rollout whose sampler is not the trainer's current policy:
how stale a batch is, and the truncated importance-sampling (TIS) correction applied when
episodes were sampled by older weights (the async topology) or by other weights (an int8
sampler). The rollout role calls it from `off_policy_correction` (roles/rollout.py,
distributed/).

Three policies meet in an async update:

    π_behaviour  the weights (version v_e) a worker sampled the episode with; its
                 log-probs are the `old_logp` captured at sampling time
    π_old        the trainer's weights right now, before this update (version v)
    π_θ          the weights being optimised

staleness = v − v_e, the number of updates between sampling and training. The
algorithm's clipped ratio π_θ / π_old keeps the update in its trust region around the
trainer's current weights, and the importance weight

    w = min(π_old / π_behaviour, C)         per token, C = dist.tis_cap

corrects for the episode having been drawn from π_behaviour instead of π_old. The cap
trades a little bias for bounded variance (Ionides 2008, "Truncated importance
sampling"); the same token-level truncated weight is what recent RL systems use for the
mismatch between a fast inference engine and the trainer (Yao et al. 2025, "Your
efficient RL framework secretly brings you off-policy RL training").

w multiplies the per-token advantage. For every loss here that is the same as weighting
each token's policy-gradient term, since w ≥ 0 is a constant with no gradient:
min(r·A, clip(r)·A)·w = min(r·(wA), clip(r)·(wA)). The KL and entropy terms regularise the
current policy and are left unweighted.

The same correction serves a sampler whose weights differ from the trainer's by design
(rl.sampling.weights int8): there π_behaviour is the int8 copy of the current weights,
staleness is 0, and `sampler_mismatch` also reports how far apart the two policies are.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.algorithms.core import masked_mean
from posttrain.models.policy import Policy
from posttrain.roles.trainer import Trainer
from posttrain.types import RolloutBatch


def staleness_stats(batch: RolloutBatch, version: int, max_staleness: int) -> dict[str, float]:
    """Staleness of every episode against the trainer's version; more than allowed is a bug."""
    staleness = [version - e.weight_version for e in batch.episodes]
    if max(staleness) > max_staleness or min(staleness) < 0:
        raise RuntimeError(f"a batch trained at weight version {version} holds episodes of versions "
                           f"{sorted({e.weight_version for e in batch.episodes})}: staleness must stay in "
                           f"[0, {max_staleness}]")
    return {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": max(staleness)}


def truncated_is_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """min(π_old / π_behaviour, cap) per token, (B, T); 0 off the response."""
    ratio = torch.exp(old_logp - behaviour_logp)  # (B, T)
    return ratio.clamp(max=cap) * mask


def trained_mask(batch: RolloutBatch) -> torch.Tensor:
    """(B, T): the response tokens of the rows the update trains (all rows when
    rows_with_gradient is None). Only these read π_old, so only these are corrected and
    measured."""
    if batch.rows_with_gradient is None:
        return batch.response_mask
    return batch.response_mask * batch.rows_with_gradient[:, None].to(batch.response_mask.dtype)


@torch.no_grad()
def current_logp(trainer: Trainer[Policy], batch: RolloutBatch) -> torch.Tensor:
    """log π_old of the batch's tokens under the trainer's weights right now, (B, T),
    computed by the trainer's own forward pass, so that the algorithm's ratio π_θ / π_old
    is exactly 1 before the first optimizer step.

    Only over the rows the update trains (`rows_with_gradient`): a row it leaves out has
    advantage 0 and no other term, so nothing reads its π_old, and it keeps the sampler's
    log-probs. Late in `make run` that is ~90% of the rows, and this forward pass was the
    int8 run's whole extra update time."""
    if batch.rows_with_gradient is None or bool(batch.rows_with_gradient.all()):
        return trainer.forward(batch).logp * batch.response_mask
    logp = batch.old_logp.clone()  # (B, T)
    rows = batch.rows_with_gradient.nonzero().squeeze(-1)  # (b,)
    if rows.numel():
        trained = batch.select(rows).without_trailing_padding()  # no column past its longest row
        logp[rows, : trained.tokens.shape[1]] = trainer.forward(trained).logp * trained.response_mask
    return logp


def apply_tis(batch: RolloutBatch, old_logp: torch.Tensor, cap: float) -> tuple[RolloutBatch, dict[str, float]]:
    """The batch the algorithm should see: old_logp = π_old (its ratio's denominator) and
    advantages weighted by the truncated importance weight. The metrics are over the rows
    the update trains (`trained_mask`)."""
    if batch.advantages is None:
        raise ValueError("apply_tis weights the batch's advantages, and it has none yet: compute them first "
                         "(algorithm.compute_advantages)")
    mask = batch.response_mask
    weights = truncated_is_weights(old_logp, batch.old_logp, mask, cap)  # (B, T)
    raw = torch.exp(old_logp - batch.old_logp)
    trained = trained_mask(batch)
    metrics = {
        "tis_weight_mean": masked_mean(weights, trained).item(),
        "tis_clipped_fraction": masked_mean((raw > cap).float(), trained).item(),
        # how far the trainer has moved from the sampling weights, per token (k1 estimate)
        "behaviour_kl": masked_mean(batch.old_logp - old_logp, trained).item(),
    }
    return dataclasses.replace(batch, old_logp=old_logp, advantages=batch.advantages * weights), metrics


def sampler_mismatch(batch: RolloutBatch, trainer: Trainer[Policy], cap: float,
                     prefix: str) -> tuple[RolloutBatch, dict[str, float]]:
    """TIS for a sampler that decodes with other weights than the trainer's (int8): π_old
    recomputed by the trainer's forward, `apply_tis`, and how far the two policies are
    apart, so a user sees when the correction is small enough to trust, over the response
    tokens of the rows the update trains:

        {prefix}/logp_mismatch      mean |log π_sampler − log π_trainer| per response token
        {prefix}/is_weight_pNN      quantiles of the untruncated weight π_trainer / π_sampler
        {prefix}/requantize_seconds  (added by the rollout) the cost of quantising again
    """
    old_logp = current_logp(trainer, batch)  # (B, T)
    mask = trained_mask(batch).bool()
    stats = {}
    if mask.any():  # else every row was left out: nothing trained, nothing to measure
        gap = (old_logp - batch.old_logp)[mask]  # (n tokens,)
        weights = gap.exp()
        quantiles = torch.quantile(weights.double(), torch.tensor([0.01, 0.1, 0.5, 0.9, 0.99], dtype=torch.double))
        stats = {f"{prefix}/logp_mismatch": gap.abs().mean().item(), f"{prefix}/is_weight_max": weights.max().item()}
        for name, q in zip(("p01", "p10", "p50", "p90", "p99"), quantiles.tolist()):
            stats[f"{prefix}/is_weight_{name}"] = q
    batch, tis = apply_tis(batch, old_logp, cap)
    return batch, {**tis, **stats}
