"""GMPO: Geometric-Mean Policy Optimization (Zhao et al., arXiv:2507.20673).

Background. GRPO's objective is an arithmetic mean over a response's tokens of ρ_t · A;
one token whose ratio ρ_t = π_θ(y_t) / π_old(y_t) has shot up dominates that mean, and the
clip that would stop it is narrow (ε = 0.2) and hard. GMPO maximises the geometric mean of
the token terms instead. With one advantage A_i per response, the geometric mean of the
ρ_t · A_i (taken on |A_i|, the sign put back) is

    A_i · (Π_t ρ_t)^(1/|o_i|) = A_i · exp( 1/|o_i| Σ_t log ρ_t )

a mean of log-ratios, in which an outlier token moves the result by its log divided by the
length, not by its ratio. The clip moves inside, to each token and into log space, and is
PPO's pessimistic one: for A_i > 0 a log-ratio above ε_high is held at ε_high, for A_i < 0
one below −ε_low is held at −ε_low, and those tokens get no gradient. Because the geometric
mean is already damped, the paper widens the range to (e^−0.4, e^0.4) ≈ (0.67, 1.49).

    c_t = min(log ρ_t, ε_high)  if A_i > 0,   max(log ρ_t, −ε_low)  otherwise
    J   = 1/G Σ_i A_i · exp( 1/|o_i| Σ_t c_t )

Diff from GSPO, its nearest relative: GSPO's sequence ratio s_i is the same geometric mean
of the token ratios, clipped once as a whole in ratio space; GMPO clips each token's log-ratio
before the mean, so a clipped token drops out of the gradient while the others keep theirs.
Its gradient, A_i · exp(mean_t c_t) · 1/|o_i| Σ_t 1[t not clipped] ∇ log π_θ(y_t), shows it.

Conventions: GRPO's group-normalised advantages; the per-response term is copied onto the
response's tokens and aggregated with loss_agg, so "seq-mean-token-mean" (the default) is
the paper's 1/G Σ_i; ε in log space as TRL's GMPOConfig and verl's geo_mean read theirs;
clipfrac counts the tokens whose clip is active (TRL's clip_ratio/region_mean); no KL term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import MAX_LOG_RATIO, agg_loss, importance_ratio, masked_mean, ratio_metrics
from posttrain.algorithms.contract import check_field, check_loss_fields, require_advantages
from posttrain.algorithms.grpo import GroupRelative, check_adv_norm
from posttrain.types import PolicyOutputs, RolloutBatch


def gmpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    log_clip_low: float,
    log_clip_high: float,
    agg: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−agg( A_i · exp(mean_t c_t) ) with c_t the sign-aware clipped log-ratio; and metrics.

    Args:
        logp, old_logp, adv, mask: (B, T) as in `core.clipped_surrogate`; adv is one value
            per row (GRPO's), read as its mean over the row's response tokens.
        log_clip_low, log_clip_high: the log-ratio is held inside [−log_clip_low, log_clip_high]
            on the side where moving further would pay (PPO's pessimism).

    Metrics: clipfrac (response tokens whose clip is active), geo_ratio_mean (the rows'
    exp(mean_t c_t)), approx_kl, ratio_mean, ratio_max (per token).
    """
    log_ratio, ratio = importance_ratio(logp, old_logp, mask)  # (B, T), 0 off the response
    adv_seq = masked_mean(torch.where(mask != 0, adv, 0.0), mask, dim=-1)  # (B,) A_i
    up = (adv_seq > 0)[:, None]  # (B, 1) which side the clip guards
    held = torch.clamp(log_ratio, -log_clip_low, log_clip_high)  # (B, T)
    # min for A > 0: a rise past ε_high is held there (no gradient); a fall stays free, and max for A ≤ 0
    clipped = torch.where(up, torch.minimum(log_ratio, held), torch.maximum(log_ratio, held))  # (B, T) c_t
    # one-sided clipping leaves the other side free: bound the mean so exp cannot overflow
    log_geo_ratio = masked_mean(clipped, mask, dim=-1).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B,)
    geo_ratio = torch.exp(log_geo_ratio)  # (B,) the geometric mean of the clipped token ratios
    per_row = -adv_seq * geo_ratio  # (B,)
    loss = agg_loss(per_row[:, None].expand_as(mask), mask, agg, max_len)
    with torch.no_grad():
        active = torch.where(up, log_ratio > log_clip_high, log_ratio < -log_clip_low)  # (B, T)
        has_tokens = (mask.sum(-1) > 0).float()  # (B,)
        metrics = {"clipfrac": masked_mean(active.float(), mask).item(),
                   "geo_ratio_mean": masked_mean(geo_ratio, has_tokens).item(),
                   **ratio_metrics(log_ratio, ratio, mask)}
    return loss, metrics


@dataclass
class GMPO(GroupRelative):
    """GRPO's advantages with GMPO's geometric-mean objective. Fields are the hyperparameters."""

    name: ClassVar[str] = "gmpo"
    zero_advantage_rows_are_inert: ClassVar[bool] = True  # every row's term is A_i times its ratio
    needs_groups: ClassVar[bool] = True  # GRPO's group-relative advantages
    accepts_turn_rows: ClassVar[bool] = False  # its ratio is the whole row's: a turn row would be a turn's

    # log-space clip range (e^−0.4, e^0.4) ≈ (0.67, 1.49): the paper's, TRL's GMPOConfig default and
    # verl's GMPO example; wider than GRPO's 0.2 because the geometric mean already damps outliers
    log_clip_low: float = 0.4
    log_clip_high: float = 0.4
    adv_norm: str = "group"  # GRPO's group-normalised advantage, as in the paper
    adv_eps: float = 1e-6  # keeps zero-variance groups at advantage 0 instead of 0 / 0
    loss_agg: str = "seq-mean-token-mean"  # one term per response, 1/G Σ_i: the paper's, verl's and TRL's mean
    entropy_coef: float = 0.0  # the paper adds no entropy bonus
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    max_len: int | None = None  # divisor for loss_agg="seq-mean-token-sum-norm" only

    def __post_init__(self) -> None:
        check_field(self, "log_clip_low", self.log_clip_low >= 0.0, "a number >= 0 (a log-ratio; 0.4 is e^-0.4)")
        check_field(self, "log_clip_high", self.log_clip_high >= 0.0, "a number >= 0 (a log-ratio; 0.4 is e^0.4)")
        check_adv_norm(self)
        check_field(self, "adv_eps", self.adv_eps > 0.0, "a number > 0")
        check_loss_fields(self)

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """gmpo_loss − entropy_coef · agg(H)."""
        pg_loss, metrics = gmpo_loss(
            outputs.logp, batch.old_logp, require_advantages(batch), batch.response_mask,
            self.log_clip_low, self.log_clip_high, self.loss_agg, self.max_len,
        )
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        return loss, {"pg_loss": pg_loss.item(), **metrics, **tail}
