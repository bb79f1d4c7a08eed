"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv:2506.13585, Sec. 3.1).

Background. PPO/GRPO's clip does more than bound the step: where the clipped branch is
active, the token's gradient is exactly zero. In long chain-of-thought RL the tokens that
get clipped first are rare ones whose probability is rising fast ("However", "Wait",
"Recheck"), the forks in a reasoning path, and after the first minibatch step they stop
learning. CISPO keeps every token's gradient and clips only the importance weight that
multiplies it, treating that weight as a constant:

    PPO    J = agg( min(r_t A_t, clip(r_t, 1 − ε, 1 + ε) A_t) )          ∇ = 0 where clipped
    CISPO  J = agg( sg[ clip(r_t, 1 − ε_low, 1 + ε_high) ] · A_t · log π_θ(y_t) )

with r_t = π_θ(y_t) / π_old(y_t) and sg the stop-gradient. That is REINFORCE's loss with
each token weighted by a bounded importance weight: an off-policy correction whose
variance is capped, and never a dropped token. The paper sets no lower bound (ε_low large;
here 1.0, i.e. a bound at 0, which a ratio can never cross) and tunes only ε_high.

Conventions: advantages are GRPO's group-normalised ones (group mean, unbiased group std);
"token-mean" aggregation, the paper's 1 / Σ_i |o_i| over all tokens of the batch; no KL term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import (
    importance_ratio,
    masked_mean,
    policy_gradient_loss,
    ratio_metrics,
)
from posttrain.algorithms.contract import check_field, check_loss_fields, require_advantages
from posttrain.algorithms.grpo import GroupRelative, check_adv_norm
from posttrain.types import PolicyOutputs, RolloutBatch


def cispo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    agg: str = "token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−agg( sg[clip(r, 1 − eps_low, 1 + eps_high)] · adv · logp ), and metrics.

    Args:
        logp, old_logp, adv, mask: (B, T) as in `core.clipped_surrogate`.
        eps_low, eps_high: the IS weight is clipped to [1 − eps_low, 1 + eps_high].

    The gradient at each token is −w_t · adv_t · ∇ log π (scaled by the aggregation): never
    zero unless adv is. Metrics: is_clipfrac (tokens whose weight was clipped), approx_kl,
    ratio_mean, ratio_max.
    """
    log_ratio, ratio = importance_ratio(logp.detach(), old_logp, mask)  # (B, T), no gradient
    is_weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # (B, T) sg[clip(r)]
    loss = policy_gradient_loss(logp, is_weight * adv, mask, agg, max_len)
    metrics = {
        "is_clipfrac": masked_mean((is_weight != ratio).float(), mask).item(),
        **ratio_metrics(log_ratio, ratio, mask),
    }
    return loss, metrics


@dataclass
class CISPO(GroupRelative):
    """GRPO's advantages with CISPO's loss. Fields are the hyperparameters."""

    name: ClassVar[str] = "cispo"
    zero_advantage_rows_are_inert: ClassVar[bool] = True  # every loss term is a multiple of A
    needs_groups: ClassVar[bool] = True  # GRPO's group-relative advantages
    accepts_turn_rows: ClassVar[bool] = True  # GRPO's advantages, a per-token loss

    clip_eps_low: float = 1.0  # lower bound 1 − 1 = 0: none, as in the paper (ε_low "large")
    # The paper tunes only ε_high and we found no value stated for it: 0.2 is PPO's ε, and
    # the value verl's CISPO example uses.
    clip_eps_high: float = 0.2
    adv_norm: str = "group"  # GRPO's group-normalised advantage (arXiv:2506.13585, Sec. 3.1)
    adv_eps: float = 1e-6  # keeps zero-variance groups at advantage 0 instead of 0 / 0
    loss_agg: str = "token-mean"  # the paper's 1 / Σ_i |o_i|: every token of the batch weighs the same
    entropy_coef: float = 0.0  # the paper adds no entropy bonus
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    max_len: int | None = None  # divisor for loss_agg="seq-mean-token-sum-norm" only

    def __post_init__(self) -> None:
        check_field(self, "clip_eps_low", self.clip_eps_low >= 0.0, "a number >= 0 (>= 1 means no lower bound)")
        check_field(self, "clip_eps_high", self.clip_eps_high >= 0.0, "a number >= 0")
        check_adv_norm(self)
        check_field(self, "adv_eps", self.adv_eps > 0.0, "a number > 0")
        check_loss_fields(self)

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """cispo_loss − entropy_coef · agg(H)."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        pg_loss, metrics = cispo_loss(
            outputs.logp, batch.old_logp, adv, mask,
            self.clip_eps_low, self.clip_eps_high, self.loss_agg, self.max_len,
        )
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        return loss, {"pg_loss": pg_loss.item(), **metrics, **tail}
