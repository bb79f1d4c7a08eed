"""Off-policy bookkeeping for every rollout whose sampler is not the trainer's current policy:
how stale a batch is, the trainer's own log-probs of it (π_old), and the textbook truncated
importance weight. The correction itself, one for every such sampler, is roles/mismatch.py.

Three policies meet in an async update:

    π_behaviour  the weights (version v_e) a worker sampled the episode with; its
                 log-probs are the `old_logp` captured at sampling time
    π_old        the trainer's weights right now, before this update (version v)
    π_θ          the weights being optimised

staleness = v − v_e, the number of updates between sampling and training. The
algorithm's clipped ratio π_θ / π_old keeps the update in its trust region around the
trainer's current weights, and the importance weight

    w = min(π_old / π_behaviour, C)         per token, C = rl.mismatch.cap

corrects for the episode having been drawn from π_behaviour instead of π_old. The cap
trades a little bias for bounded variance (Ionides 2008, "Truncated importance
sampling"). That is `truncated_is_weights` below and rl.mismatch's default mode,
token_truncate; roles/mismatch.py has the others (sequence-level, masked, two-sided).

The same correction serves a sampler whose weights differ from the trainer's by design
(rl.sampling.weights int8, --dtype bfloat16, another engine): there π_behaviour is the
sampler's copy of the current weights and staleness is 0.
"""

from __future__ import annotations

import torch

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
