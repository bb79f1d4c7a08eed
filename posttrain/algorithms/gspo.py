"""GSPO: Group Sequence Policy Optimization (Zheng et al., Qwen team, arXiv:2507.18071).

Background. The reward is given to a whole sequence, yet GRPO corrects for off-policy
samples token by token: each ρ_t = π_θ(y_t)/π_old(y_t) is a one-sample importance weight,
which the paper argues is mostly noise that accumulates over long responses. GSPO puts
the importance ratio, the clip and the optimisation at the level the reward lives on, the
sequence (Sec. 4.1):

    s_i(θ) = (π_θ(y_i | x) / π_old(y_i | x)) ^ (1/|y_i|)
           = exp( 1/|y_i| Σ_t log(π_θ(y_i,t | x, y_i,<t) / π_old(y_i,t | x, y_i,<t)) )

    J(θ) = 1/G Σ_i min( s_i Â_i, clip(s_i, 1 − ε_low, 1 + ε_high) Â_i )

with Â_i GRPO's group-normalised advantage. The 1/|y_i| (a geometric mean of the token
ratios) keeps s_i on one scale whatever the length. Since s_i stays very near 1, the clip
range is tiny: the paper uses ε_low = 3e-4 and ε_high = 4e-4 (Sec. 5.1), against GRPO's
0.2; it clips far more tokens than GRPO and still learns faster.

Diff from GRPO: only the ratio. The code swaps it in with the paper's GSPO-token form
(Sec. 4.3): s_i,t = sg[s_i] · π_θ(y_i,t) / sg[π_θ(y_i,t)] has the value s_i at every token,
and, averaged over the sequence's tokens, exactly GSPO's gradient s_i Â_i ∇ (1/|y_i|) Σ_t
log π_θ(y_i,t). So GRPO's loss runs unchanged on a batch whose old_logp is replaced by
logp − log s_i (both stop-gradient'ed): that makes its per-token ratio equal s_i.

Conventions: loss_agg must be "seq-mean-token-mean" (each sequence is one term of 1/G Σ_i);
ratio_mean / ratio_max / clipfrac are then of s_i (clipfrac weighted by tokens,
seq_clipfrac by sequences); approx_kl is still the per-token k3 estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import MAX_LOG_RATIO, importance_ratio, masked_mean, ratio_metrics
from posttrain.algorithms.contract import check_field, require_advantages
from posttrain.algorithms.grpo import GRPO
from posttrain.types import PolicyOutputs, RolloutBatch


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log s_i = mean over the response tokens of (log π_θ − log π_old), (B,). 0 for a row
    with no response tokens."""
    return masked_mean(torch.where(mask != 0, logp - old_logp, 0.0), mask, dim=-1)  # (B,)


@dataclass
class GSPO(GRPO):
    """GRPO with one importance ratio per sequence, clipped at the sequence level."""

    name: ClassVar[str] = "gspo"
    accepts_turn_rows: ClassVar[bool] = False  # its ratio is the whole row's: a turn row would be a turn's

    clip_eps_low: float = 3e-4  # Sec. 5.1: s_i is a geometric mean, so it barely moves from 1
    clip_eps_high: float = 4e-4  # Sec. 5.1: slightly wider above 1, like DAPO's clip-higher
    loss_agg: str = "seq-mean-token-mean"  # Eq. 5's 1/G Σ_i: one term per sequence

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field(self, "loss_agg", self.loss_agg == "seq-mean-token-mean",
                    "'seq-mean-token-mean' (GSPO's objective averages over sequences)")

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO's loss with every token's ratio replaced by its sequence's s_i."""
        mask = batch.response_mask  # (B, T)
        logp = outputs.logp.detach()  # (B, T) sg[π_θ]
        log_s = sequence_log_ratio(logp, batch.old_logp, mask)  # (B,) sg[log s_i]
        # exp(logp − seq_old_logp) = s_i in value, with gradient s_i ∇ logp: GSPO-token.
        # (Padding may hold anything: the clipped surrogate ignores positions off the mask.)
        seq_old_logp = logp - log_s[:, None]  # (B, T)
        loss, metrics = super().compute_loss(outputs, dataclasses.replace(batch, old_logp=seq_old_logp))

        with torch.no_grad():
            s = torch.exp(log_s.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # (B,)
            adv = masked_mean(require_advantages(batch), mask, dim=-1)  # (B,) Â_i
            clipped = torch.clamp(s, 1 - self.clip_eps_low, 1 + self.clip_eps_high)  # (B,)
            has_tokens = (mask.sum(-1) > 0).float()  # (B,)
            metrics["seq_clipfrac"] = masked_mean((-adv * clipped > -adv * s).float(), has_tokens).item()
            # the per-token KL(π_old ‖ π_θ) estimate, as every other algorithm logs it
            metrics["approx_kl"] = ratio_metrics(*importance_ratio(logp, batch.old_logp, mask), mask)["approx_kl"]
        return loss, metrics
