"""SAPO: Soft Adaptive Policy Optimization (Gao et al., Qwen team, arXiv:2511.20347).

Background. PPO/GRPO's clip is a hard edge: inside [1 − ε, 1 + ε] a token gets the full
policy gradient, one step outside it gets none. Which tokens cross the edge changes from
minibatch to minibatch, so the update is a noisy on/off mix. SAPO replaces the clip with a
smooth gate on the ratio r_t = π_θ(y_t) / π_old(y_t),

    f(r; τ) = σ(τ · (r − 1)) · 4 / τ,          J = agg( f(r_t; τ_t) · A_t )

whose gradient with respect to log π is  4 σ(1 − σ) · r  (σ at τ(r − 1)): exactly 1 at
r = 1, where SAPO is the plain policy gradient, and fading smoothly as the ratio drifts,
faster for a larger temperature τ. Nothing is ever cut off, and nothing far from π_old
keeps its full weight.

The temperature depends on the sign of the advantage: τ_t = τ_pos where A_t > 0 and
τ_neg otherwise. A negative advantage pushes down a token's probability, which moves the
mass onto the rest of the vocabulary, many tokens at once; the paper reports that those
updates destabilise training more and damps them faster, τ_neg > τ_pos.

Diff from GRPO: the loss only. `min(r A, clip(r) A)` becomes `f(r; τ) · A`; GRPO's
group-normalised advantages are kept.

Conventions: "seq-mean-token-mean" aggregation (1/G Σ_i 1/|o_i| Σ_t, as verl forces and TRL
uses for sapo); the log-ratio is clamped to ±20 before exp, as in verl (TRL does not clamp;
the two agree wherever |log r| < 20); no KL term, as both references default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import agg_loss, importance_ratio, masked_mean, ratio_metrics
from posttrain.algorithms.contract import check_field, check_loss_fields, require_advantages
from posttrain.algorithms.grpo import GroupRelative, check_adv_norm
from posttrain.types import PolicyOutputs, RolloutBatch


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """f(r; τ) = σ(τ (r − 1)) · 4 / τ, elementwise. f(1) = 2 / τ and f'(1) = 1: at the
    old policy the gate is the ratio's own slope, so SAPO starts where the policy gradient is."""
    return torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)


def sapo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    agg: str = "seq-mean-token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """−agg( f(r_t; τ_t) · adv_t ), with τ_t = tau_pos where adv_t > 0 else tau_neg; and metrics.

    Args:
        logp, old_logp, adv, mask: (B, T) as in `core.clipped_surrogate`.
        tau_pos, tau_neg: the gate's temperatures for positive and non-positive advantages.

    Metrics: gate_slope_mean, the mean over response tokens of f'(r) = 4 σ(1 − σ), the share
    of the unclipped surrogate's gradient a token keeps (1 at r = 1, → 0 far from π_old; under
    PPO's clip it is 1 inside the band and 0 outside); approx_kl, ratio_mean, ratio_max.
    """
    log_ratio, ratio = importance_ratio(logp, old_logp, mask)  # (B, T), differentiable
    positive = (adv > 0).to(ratio.dtype)  # (B, T)
    tau = tau_neg + (tau_pos - tau_neg) * positive  # (B, T) τ_t, derived from adv so it lives on adv's device
    # the gradient reaching the gate is −adv · upstream, and upstream is 0 off the response:
    # zero adv there too, so an inf in padding cannot make 0 · inf = NaN
    adv = torch.where(mask != 0, adv, 0.0)  # (B, T)
    loss = agg_loss(-sapo_gate(ratio, tau) * adv, mask, agg, max_len)
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))  # (B, T)
        metrics = {"gate_slope_mean": masked_mean(4.0 * s * (1.0 - s), mask).item(),
                   **ratio_metrics(log_ratio, ratio, mask)}
    return loss, metrics


@dataclass
class SAPO(GroupRelative):
    """GRPO's advantages with SAPO's soft gate instead of the clip. Fields are the hyperparameters."""

    name: ClassVar[str] = "sapo"
    zero_advantage_rows_are_inert: ClassVar[bool] = True  # every loss term is a multiple of A
    needs_groups: ClassVar[bool] = True  # GRPO's group-relative advantages
    accepts_turn_rows: ClassVar[bool] = True  # GRPO's advantages, a per-token loss

    # the gate's temperature where A > 0 (larger: the gradient fades faster as r leaves 1); 1.0,
    # the paper's value for Qwen3-30B-A3B-Base and verl's and TRL's default
    tau_pos: float = 1.0
    # the temperature where A <= 0: 1.05, the paper's, verl's and TRL's, a little above tau_pos
    # because pushing a token down spreads its mass over the whole vocabulary, the less stable update
    tau_neg: float = 1.05
    adv_norm: str = "group"  # GRPO's group-normalised advantage, as in the paper
    adv_eps: float = 1e-6  # keeps zero-variance groups at advantage 0 instead of 0 / 0
    loss_agg: str = "seq-mean-token-mean"  # 1/G Σ_i 1/|o_i| Σ_t: what verl forces for sapo and TRL uses
    entropy_coef: float = 0.0  # the paper adds no entropy bonus
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    max_len: int | None = None  # divisor for loss_agg="seq-mean-token-sum-norm" only

    def __post_init__(self) -> None:
        check_field(self, "tau_pos", self.tau_pos > 0.0, "a number > 0 (the gate divides by it)")
        check_field(self, "tau_neg", self.tau_neg > 0.0, "a number > 0 (the gate divides by it)")
        check_adv_norm(self)
        check_field(self, "adv_eps", self.adv_eps > 0.0, "a number > 0")
        check_loss_fields(self)

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """sapo_loss − entropy_coef · agg(H)."""
        pg_loss, metrics = sapo_loss(
            outputs.logp, batch.old_logp, require_advantages(batch), batch.response_mask,
            self.tau_pos, self.tau_neg, self.loss_agg, self.max_len,
        )
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        return loss, {"pg_loss": pg_loss.item(), **metrics, **tail}
