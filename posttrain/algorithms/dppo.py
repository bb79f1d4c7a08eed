"""DPPO: Divergence Proximal Policy Optimization (arXiv:2602.04879), its Binary-TV and
Binary-KL variants.

Background. PPO's trust region is a band on the ratio r_t = π_θ(y_t) / π_old(y_t), and for
a vocabulary of 10^5 tokens the ratio is a poor measure of how far the policy moved. A rare
token going from 1e-5 to 1e-3 has ratio 100 and is clipped, though almost no probability
mass moved; a likely token falling from 0.99 to 0.80 has ratio 0.81, inside the band, though
a fifth of the mass moved. DPPO bounds a divergence between the old and new distributions
instead, approximated on the one token that was sampled by collapsing the vocabulary to two
outcomes, "this token" (probability p) and "anything else" (1 − p):

    Binary-TV   D = |p − p_old|
    Binary-KL   D = p_old log(p_old / p) + (1 − p_old) log((1 − p_old) / (1 − p))

A token leaves the trust region when it has moved more than δ *in the direction its
advantage pushes it* (p up for A > 0, down for A ≤ 0); such tokens are masked out of the
loss, like PPO's clipped ones. Every other token gets a REINFORCE term weighted by the
importance ratio, truncated at a large C and held constant (truncated IS, Sec. 5.4):

    J = agg( sg[min(r_t, C)] · A_t · log π_θ(y_t) · M_t ),   M_t = 1[t inside the trust region]

Diff from CISPO: that is CISPO's loss (sg[clip(r)] · A · log π) with the weight bounded only
above, at C = 1 + clip_eps_high, and the advantage multiplied by the mask M. So DPPO runs
CISPO's cispo_loss on the masked advantages; the Binary-KL variant is Binary-TV with the other
divergence and its own thresholds.

Conventions, as verl's dppo_tv / dppo_kl: p = exp(log π) of the sampled token; the mask
is a constant; KL's logs carry verl's 1e-8 guard; "token-mean" aggregation; no KL term.
verl's example script uses δ = 0.15 (TV) and 0.05 (KL) and Dr.GRPO's advantages and
aggregation (--dppo_tv.adv_norm none --dppo_tv.loss_agg seq-mean-token-sum-norm here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.cispo import CISPO, cispo_loss
from posttrain.algorithms.core import masked_mean
from posttrain.algorithms.contract import check_field, require_advantages
from posttrain.types import PolicyOutputs, RolloutBatch

# keeps log((1 − p_old) / (1 − p)) finite when p or p_old is 1 (verl's guard, the same value)
BINARY_KL_EPS = 1e-8


def binary_tv_trust_region(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                           delta_low: float, delta_high: float) -> torch.Tensor:
    """(B, T) bool, True where the sampled token stayed inside the Binary-TV trust region:
    p − p_old <= delta_high where adv > 0 (a push up may not raise p by more), and
    p − p_old >= −delta_low elsewhere (a push down may not lower it by more). Moving the
    other way, against the push, is always inside."""
    moved = torch.exp(logp) - torch.exp(old_logp)  # (B, T) p − p_old
    return torch.where(adv > 0, moved <= delta_high, moved >= -delta_low)


def binary_kl(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(p_old) ‖ Bernoulli(p)) per token, (B, T): the KL between the old and new
    policy once the vocabulary is collapsed to "the sampled token" and "any other"."""
    p, p_old = torch.exp(logp), torch.exp(old_logp)  # (B, T)
    return p_old * (old_logp - logp) + (1 - p_old) * torch.log((1 - p_old + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS))


def binary_kl_trust_region(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                           delta_low: float, delta_high: float) -> torch.Tensor:
    """(B, T) bool, True inside the Binary-KL trust region: where adv > 0, the binary KL is
    at most delta_high or p did not rise; elsewhere, at most delta_low or p did not fall.
    (KL has no sign, so the direction of the move is read from p against p_old.)"""
    kl = binary_kl(logp, old_logp)  # (B, T)
    p, p_old = torch.exp(logp), torch.exp(old_logp)  # (B, T)
    rose, fell = p >= p_old, p <= p_old  # (B, T)
    return torch.where(adv > 0, (kl <= delta_high) | fell, (kl <= delta_low) | rose)


@dataclass
class DPPOBinaryTV(CISPO):
    """CISPO's loss on the tokens inside a Binary-TV trust region. Fields are the hyperparameters."""

    name: ClassVar[str] = "dppo_tv"

    # how far p may fall under a negative advantage before the token leaves the loss: 0.15, verl's
    # DPPO example for dppo_tv
    delta_low: float = 0.15
    # how far p may rise under a positive advantage before the token leaves the loss: 0.15, verl's
    # DPPO example for dppo_tv
    delta_high: float = 0.15
    # the IS weight min(r, C) with C = 1 + 19 = 20: the fallback verl's dppo code uses for clip_ratio_c,
    # a large cap so that the truncation adds little bias (Sec. 5.4). verl's actor config sets
    # clip_ratio_c = 3 (for dual-clip PPO), its DPPO example 10000 (no truncation): clip_eps_high 2 or 9999
    clip_eps_high: float = 19.0
    clip_eps_low: float = 1.0  # no lower bound on the weight (1 − 1 = 0), as verl: only large ratios are truncated
    # GRPO's group-normalised advantage, verl's default; its DPPO example uses Dr.GRPO's "none" (no /std)
    adv_norm: str = "group"
    # every token of the batch weighs the same: verl's default for dppo; its DPPO example uses Dr.GRPO's
    # "seq-mean-token-sum-norm" (with adv_norm none)
    loss_agg: str = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field(self, "delta_low", self.delta_low >= 0.0, "a number >= 0 (how far p may fall under A <= 0)")
        check_field(self, "delta_high", self.delta_high >= 0.0, "a number >= 0 (how far p may rise under A > 0)")

    def trust_region(self, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: which tokens stay in the loss."""
        return binary_tv_trust_region(logp, old_logp, adv, self.delta_low, self.delta_high)

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """cispo_loss on the advantages masked to the trust region, − entropy_coef · agg(H).
        Metrics add trust_region_maskfrac, the response tokens masked out (verl's pg_clipfrac)."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        inside = self.trust_region(outputs.logp.detach(), batch.old_logp, adv).to(adv.dtype)  # (B, T) M, a constant
        pg_loss, metrics = cispo_loss(
            outputs.logp, batch.old_logp, adv * inside, mask,
            self.clip_eps_low, self.clip_eps_high, self.loss_agg, self.max_len,
        )
        metrics["trust_region_maskfrac"] = masked_mean(1.0 - inside, mask).item()
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        return loss, {"pg_loss": pg_loss.item(), **metrics, **tail}


@dataclass
class DPPOBinaryKL(DPPOBinaryTV):
    """DPPO-Binary-TV with the binary KL as the divergence. Fields are the hyperparameters."""

    name: ClassVar[str] = "dppo_kl"

    # the binary KL a fall of p under a negative advantage may reach: 0.05 nats, verl's DPPO example for dppo_kl
    delta_low: float = 0.05
    # the binary KL a rise of p under a positive advantage may reach: 0.05 nats, verl's DPPO example for dppo_kl
    delta_high: float = 0.05

    def trust_region(self, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
        return binary_kl_trust_region(logp, old_logp, adv, self.delta_low, self.delta_high)
