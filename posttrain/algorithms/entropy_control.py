"""Entropy control: keeping a policy's entropy from collapsing (or exploding) during RL.

An LLM policy trained with a policy gradient loses entropy fast: it grows more certain of the
tokens it already favours, explores less, and its reward plateaus early. Four controls, each
a setting of `rl.entropy` that any algorithm declaring `accepts_token_selection` (the GRPO
family) or, for the coefficient, any RL algorithm takes:

1. An adaptive entropy coefficient (Skywork-OR1, arXiv:2505.22312;
   TRL's use_adaptive_entropy). The bonus −c · H is paid only while the policy's entropy is at
   or below a target, and c itself walks by a fixed step toward whatever keeps it there:

       c_{k+1} = min(c_k + Δ, c_max)   if H_k <= target        applied: c_{k+1}
               = max(c_k − Δ, 0)       if H_k >  target        applied: 0

2. Clip-Cov and 3. KL-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for
   Reasoning Language Models", arXiv:2505.22617). The paper shows the change of
   entropy over a step is driven by the covariance, over tokens, between a token's log-prob and
   its advantage: a confident token (high log π) with a high advantage lowers entropy when it
   is pushed up. Each token's contribution to that covariance is

       cov_t = (A_t − mean A) · (log π_t − mean log π)          (means over the response tokens)

   Clip-Cov takes a random `cov_ratio` share of the tokens whose cov_t lies in (low, high), not
   already clipped by PPO, and detaches their gradient. KL-Cov takes the top `cov_ratio` share
   by cov_t and adds kl_coef · |log π_θ − log π_old| to their loss, with no PPO clip at all.

4. High-entropy token training (Wang et al., "Beyond the 80/20 Rule", arXiv:2506.01939; TRL's
   top_entropy_quantile). Only the tokens in the top `top_quantile` of entropy ("forking"
   tokens, where the reasoning path branches) carry policy gradient; the paper keeps 20%.

Conventions. All selection happens where the loss is computed, on each micro-batch the trainer
hands the loss, as verl and TRL do: with rl.update.micro_batch_size set, the quantile, the
means and the top-k are each micro-batch's. A selection multiplies the advantage by a 0/1
factor: for PPO's clipped loss max(−A r, −A clip(r)) · k = max(−kA r, −kA clip(r)) for k ≥ 0,
so zeroing a token's advantage is exactly verl's and TRL's zeroing of its loss, value and
gradient; the entropy bonus and the KL term still read every token.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.algorithms.core import importance_ratio, masked_mean

COV_METHODS = ("none", "clip_cov", "kl_cov")


# --------------------------------------------------------------------------------------
# Token selections: pure functions of one micro-batch's tensors
# --------------------------------------------------------------------------------------


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """(B, T) bool: True on the response tokens whose entropy is at or above the
    (1 − top_quantile) quantile of the response tokens' entropies (linear interpolation, as
    torch.quantile). top_quantile = 0.2 keeps the top 20%; 1.0 keeps every token; 0.0 only the
    highest. False off the response and everywhere when there is no response token."""
    on = mask != 0
    valid = entropy.detach()[on].float()  # (N,)
    if valid.numel() == 0:
        return torch.zeros_like(on)
    threshold = torch.quantile(valid, 1.0 - top_quantile)
    return (entropy.detach() >= threshold) & on


def token_covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """cov_t = (A_t − mean A) · (log π_t − mean log π), (B, T), means over the response tokens
    (arXiv:2505.22617: each token's share of the covariance); 0 off the response. No gradient."""
    logp, adv = logp.detach(), adv.detach()
    centred = (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))  # (B, T)
    return torch.where(mask != 0, centred, 0.0)


def ppo_clipped(ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, eps_low: float,
                eps_high: float) -> torch.Tensor:
    """(B, T) bool: the response tokens whose clipped branch is PPO's active one (the loss
    −A · clip(r) above −A · r), the tokens core.clipped_surrogate counts in clipfrac."""
    return (-adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) > -adv * ratio) & (mask != 0)


def clip_cov_selection(cov: torch.Tensor, clipped: torch.Tensor, mask: torch.Tensor, ratio: float,
                       low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """(B, T) bool: Clip-Cov's detached tokens (arXiv:2505.22617; verl's clip_cov). The candidates are
    the response tokens not already clipped by PPO whose cov_t lies strictly inside (low, high);
    max(1, ⌊ratio · response tokens⌋) of them are drawn uniformly without replacement with
    `generator` (all of them when there are fewer)."""
    candidates = ((cov > low) & (cov < high) & (mask != 0) & ~clipped).flatten().nonzero().squeeze(-1)  # (C,)
    count = max(int(ratio * mask.sum().item()), 1)
    chosen = candidates[torch.randperm(candidates.numel(), generator=generator)[:count].to(candidates.device)]
    picked = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    picked[chosen] = True
    return picked.view_as(cov)


def kl_cov_selection(cov: torch.Tensor, mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """(B, T) bool: KL-Cov's penalised tokens (arXiv:2505.22617; verl's kl_cov), the
    max(1, ⌊ratio · response tokens⌋) response tokens of largest cov_t; none without a
    response token."""
    on = (mask != 0).flatten()
    picked = torch.zeros(cov.numel(), dtype=torch.bool, device=cov.device)
    valid = on.nonzero().squeeze(-1)  # (N,) flat positions of the response tokens
    if valid.numel() > 0:
        count = max(int(ratio * valid.numel()), 1)
        picked[valid[torch.topk(cov.flatten()[valid], count).indices]] = True
    return picked.view_as(cov)


def draw_generator(tokens: torch.Tensor) -> torch.Generator:
    """A generator seeded from the micro-batch's tokens: Clip-Cov's draw is random over tokens
    but the same for the same batch, so a resumed run redraws exactly what it drew (the
    algorithm sees no step number; the tokens are what identifies a batch)."""
    return torch.Generator().manual_seed(zlib.crc32(tokens.detach().cpu().numpy().tobytes()))


# --------------------------------------------------------------------------------------
# The selection an algorithm's loss applies (rl.entropy's token settings)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selected:
    """What a TokenSelection gives the loss: `keep` (B, T), a 0/1 factor on each token's
    advantage; `penalty` (B, T), a per-token loss to add (KL-Cov's, differentiable), or None;
    `unclipped`, True when the policy loss must drop PPO's clip (KL-Cov replaces it); and the
    metrics of the selection."""

    keep: torch.Tensor
    penalty: torch.Tensor | None = None
    unclipped: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenSelection:
    """Which tokens carry policy gradient, from rl.entropy (pipelines/build.py hands it to the
    algorithm; the default selects every token). The cov defaults are verl's configured ones
    (verl/trainer/config/actor/actor.yaml, 0.8.0.dev): Clip-Cov detaches 2e-4 of the tokens,
    drawn from those with cov in (1, 5); KL-Cov penalises the top 2e-4 with coefficient 0.1."""

    top_quantile: float = 1.0  # keep the tokens in this top share of entropy; 1 = all (80/20: 0.2)
    cov: str = "none"  # "clip_cov", "kl_cov" or "none"
    cov_ratio: float = 2e-4  # the share of response tokens Clip-Cov detaches, or KL-Cov penalises
    clip_cov_low: float = 1.0  # Clip-Cov's candidates: cov_t strictly between low and high
    clip_cov_high: float = 5.0
    kl_cov_coef: float = 0.1  # KL-Cov's weight on |log π_θ − log π_old| of the penalised tokens

    def __post_init__(self) -> None:
        if not 0.0 <= self.top_quantile <= 1.0:
            raise ValueError(f"top_quantile={self.top_quantile!r} must be in [0, 1] (1 = every token)")
        if self.cov not in COV_METHODS:
            raise ValueError(f"cov={self.cov!r} must be one of {list(COV_METHODS)}")
        if not 0.0 < self.cov_ratio <= 1.0:
            raise ValueError(f"cov_ratio={self.cov_ratio!r} must be in (0, 1]")

    @property
    def active(self) -> bool:
        """False when every token keeps its gradient and nothing is added: the loss is untouched."""
        return self.top_quantile < 1.0 or self.cov != "none"

    def select(self, logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, entropy: torch.Tensor,
               mask: torch.Tensor, eps_low: float, eps_high: float, tokens: torch.Tensor) -> Selected:
        """The selection on one micro-batch, every tensor (B, T): logp differentiable (KL-Cov's
        penalty carries its gradient), the rest constants. eps_low, eps_high: the algorithm's
        PPO clip, which Clip-Cov leaves alone. tokens: the batch's, to seed Clip-Cov's draw."""
        keep = torch.ones_like(adv)  # (B, T)
        metrics: dict[str, Any] = {}
        if self.top_quantile < 1.0:
            high = high_entropy_mask(entropy, mask, self.top_quantile)  # (B, T)
            keep = keep * high.to(keep.dtype)
            metrics["entropy_kept_frac"] = masked_mean(high.float(), mask).item()
        if self.cov == "none":
            return Selected(keep, metrics=metrics)
        cov = token_covariance(logp, adv, mask)  # (B, T)
        log_ratio, ratio = importance_ratio(logp.detach(), old_logp, mask)  # (B, T) each
        if self.cov == "clip_cov":
            detached = clip_cov_selection(cov, ppo_clipped(ratio, adv, mask, eps_low, eps_high), mask,
                                          self.cov_ratio, self.clip_cov_low, self.clip_cov_high,
                                          draw_generator(tokens))  # (B, T)
            metrics["clip_cov_frac"] = masked_mean(detached.float(), mask).item()
            return Selected(keep * (~detached).to(keep.dtype), metrics=metrics)
        penalised = kl_cov_selection(cov, mask, self.cov_ratio)  # (B, T)
        # |log π_θ − log π_old| with its gradient: the same log-ratio as the surrogate's, 0 off the response
        penalty = self.kl_cov_coef * importance_ratio(logp, old_logp, mask)[0].abs() * penalised  # (B, T)
        metrics["kl_cov_frac"] = masked_mean(penalised.float(), mask).item()
        metrics["kl_cov_abs_log_ratio"] = masked_mean(log_ratio.abs(), penalised.float()).item()
        return Selected(keep, penalty=penalty, unclipped=True, metrics=metrics)


# --------------------------------------------------------------------------------------
# The adaptive entropy coefficient (rl.entropy.target)
# --------------------------------------------------------------------------------------


class AdaptiveEntropyController:
    """Skywork-OR1's adaptive entropy control (arXiv:2505.22312), as TRL runs it.

    Holds c, the coefficient in waiting, and the last entropy measured. After each step that
    measured mean per-token entropy H: c rises by `delta` (up to `coef_max`) when H <= target and
    falls by `delta` (down to 0) otherwise; the coefficient the next step applies is c when
    H <= target, else 0 (no bonus while entropy is above target). Before any measurement the
    applied coefficient is 0, as TRL's (its last entropy starts at +inf).

    Unlike the adaptive KL controller (rewards/kl_control.py) the step is additive, so c may
    start at 0 (TRL's default entropy_coef) and come back from 0 once entropy falls below the target.

    Args:
        init_coef: c_0 (the algorithm's entropy_coef).
        target:    the entropy to hold, in nats per response token (what the "entropy" metric reads).
        delta:     Δ, c's step per RL step (TRL's default: 0.005).
        coef_max:  the ceiling on c (TRL's entropy_coef_max: 1).
    """

    def __init__(self, init_coef: float, target: float, delta: float, coef_max: float) -> None:
        if not init_coef >= 0:
            raise ValueError(f"init_coef must be >= 0, got {init_coef!r}")
        if not (target > 0 and delta > 0 and coef_max > 0):
            raise ValueError(f"target, delta and coef_max must be > 0, got {target!r}, {delta!r}, {coef_max!r}")
        self.value = min(float(init_coef), coef_max)
        self.target, self.delta, self.coef_max = float(target), float(delta), float(coef_max)
        self.last_entropy: float | None = None  # None: nothing measured yet, no bonus

    def applied(self) -> float:
        """The coefficient the next step's loss uses."""
        below = self.last_entropy is not None and self.last_entropy <= self.target
        return self.value if below else 0.0

    def update(self, entropy: float) -> float:
        """One control step from the entropy the step measured; returns the next step's coefficient."""
        if entropy <= self.target:
            self.value = min(self.value + self.delta, self.coef_max)
        else:
            self.value = max(self.value - self.delta, 0.0)
        self.last_entropy = float(entropy)
        return self.applied()

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])
        self.last_entropy = None if state["last_entropy"] is None else float(state["last_entropy"])
