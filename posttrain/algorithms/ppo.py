"""PPO: Proximal Policy Optimization (Schulman et al., arXiv:1707.06347) with GAE
(Schulman et al., arXiv:1506.02438), as used for language models since Ziegler et al.
(arXiv:1909.08593) and InstructGPT (Ouyang et al., arXiv:2203.02155).

Background. PPO patches REINFORCE three ways:
1. A learned baseline: a critic V(s_t) predicts the return from each prefix, so each token
   gets its own advantage instead of the sequence's.
2. Sample reuse: the surrogate weighs each token by ρ_t = π_θ / π_old (importance
   sampling), so one rollout batch can feed several epochs of minibatch steps.
3. A pessimistic clip on ρ_t, so those steps cannot move the policy far (Eq. 7).

Each response token is a time step; the episode ends at the last response token.
Token-level reward (Ziegler et al.; InstructGPT Eq. 2): the sequence reward on the last response
token, optionally minus β·KL_t on every response token,

    r_t = −β (log π_old(y_t) − log π_ref(y_t)) + [t is the last response token] · R

Generalised advantage estimation, a λ-weighted average of n-step advantages (Sec. 3 of
arXiv:1506.02438), computed backwards over the response:

    δ_t = r_t + γ V(s_next(t)) − V(s_t)        A_t = δ_t + γλ A_next(t)        R_t = A_t + V(s_t)

next(t) is the next *response* position in the row, so tokens with response_mask 0 in
the middle of a response (a tool's output inserted between two model turns) are not time
steps: the recursion passes its running A and V through them unchanged, and they get no
advantage. After the last response token V = 0 and A = 0 (terminal). A truncated response
is treated as terminal too: its reward was given at its last token.

Loss (minimised): clipped surrogate + vf_coef · value loss − entropy_coef · entropy, with
the value loss clipped around the sampling-time values like the ratio is (PPO2 / CleanRL):

    L_V = ½ max( (V_φ − R)², (V_old + clip(V_φ − V_old, −c, c) − R)² )

Conventions: `batch.values` are V at sampling time (B, T), `outputs.values` the current
critic's (B, T), both aligned with tokens: values[b, t] = V(prefix up to and including
token t − 1), the state in which token t was chosen. Advantages are whitened over all
response tokens of the rollout batch (mean 0, unbiased std 1); returns are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import (
    agg_loss,
    clipped_surrogate,
    kl_k1,
    masked_mean,
    masked_var,
    masked_whiten,
)
from posttrain.algorithms.contract import Algorithm, check_field, check_loss_fields
from posttrain.types import PolicyOutputs, RolloutBatch


def last_token_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """1.0 at the last response token of each row, 0 elsewhere, (B, T). A row without
    response tokens has none."""
    on = response_mask != 0
    tokens_from_here = on.flip(-1).cumsum(-1).flip(-1)  # (B, T) response tokens at positions >= t
    return (on & (tokens_from_here == 1)).to(response_mask.dtype)


def token_level_rewards(
    rewards: torch.Tensor, response_mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """Per-token rewards (B, T): the sequence reward `rewards` (B,) on the last response
    token, minus kl_coef · kl on every response token (kl (B, T), a per-token KL estimate
    between the sampling policy and the reference). 0 off the response."""
    token_rewards = rewards[:, None] * last_token_mask(response_mask)  # (B, T)
    if kl is not None and kl_coef != 0:
        token_rewards = token_rewards - kl_coef * kl  # (B, T)
    return torch.where(response_mask != 0, token_rewards, 0.0)


@torch.no_grad()
def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens of each row.

    Args:
        token_rewards: (B, T) r_t, read only where response_mask is 1.
        values:        (B, T) V(s_t) at sampling time, read only where response_mask is 1.
        response_mask: (B, T) 1 on the tokens that are time steps.
        gamma, lam:    discount γ and GAE's λ, both in [0, 1].

    Returns (advantages, returns), each (B, T) and 0 off the response; returns = A + V.
    Positions with mask 0 are skipped: the running advantage and next value pass through
    them unchanged, so what they hold cannot reach any result.
    """
    B, T = token_rewards.shape
    on = response_mask != 0
    advantages = token_rewards.new_zeros(B, T)
    next_value = token_rewards.new_zeros(B)  # V after the last response token: terminal, 0
    next_adv = token_rewards.new_zeros(B)  # A after it: 0
    for t in reversed(range(T)):  # a loop over T, vectorised over B
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]  # (B,) TD error δ_t
        adv_t = delta + gamma * lam * next_adv  # (B,)
        # torch.where, not a blend with the mask: inf or NaN in a skipped position must not leak
        next_adv = torch.where(on[:, t], adv_t, next_adv)
        next_value = torch.where(on[:, t], values[:, t], next_value)
        advantages[:, t] = torch.where(on[:, t], adv_t, 0.0)
    returns = torch.where(on, advantages + values, 0.0)  # (B, T) the critic's targets
    return advantages, returns


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None,
    agg: str = "token-mean",
    max_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """½ agg( max((V − R)², (V_clipped − R)²) ) with V_clipped = V_old + clip(V − V_old, ±c).

    Args:
        values:     (B, T) the current critic V_φ, differentiable.
        old_values: (B, T) V at sampling time; returns (B, T) the targets R. Constants.
        value_clip: c, or None for the plain squared error.

    Returns (loss, vf_clipfrac): the fraction of response tokens where the clipped error is
    the larger one (there the gradient is zero: the critic may not move further this batch).
    """
    on = mask != 0
    # zero padding first: 0 · inf in the backward pass would be NaN
    values = torch.where(on, values, 0.0)
    old_values = torch.where(on, old_values, 0.0)
    returns = torch.where(on, returns, 0.0)
    vf_loss1 = (values - returns) ** 2  # (B, T)
    if value_clip is None:
        return 0.5 * agg_loss(vf_loss1, mask, agg, max_len), 0.0
    values_clipped = old_values + torch.clamp(values - old_values, -value_clip, value_clip)  # (B, T)
    vf_loss2 = (values_clipped - returns) ** 2  # (B, T)
    loss = 0.5 * agg_loss(torch.maximum(vf_loss1, vf_loss2), mask, agg, max_len)
    clipfrac = masked_mean((vf_loss2 > vf_loss1).float(), mask).item()
    return loss, clipfrac


@torch.no_grad()
def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V) / Var(R) over response tokens: 1 = the critic predicts the returns
    perfectly, 0 = no better than their mean, < 0 = worse. NaN when Var(R) = 0."""
    var_returns = masked_var(returns, mask)
    if var_returns.item() == 0:
        return float("nan")
    return (1 - masked_var(returns - values, mask) / var_returns).item()


@dataclass
class PPO(Algorithm):
    """PPO with a critic and GAE. Fields are the hyperparameters."""

    name: ClassVar[str] = "ppo"

    clip_eps_low: float = 0.2  # ε = 0.2, the paper's best setting (arXiv:1707.06347, Table 1)
    clip_eps_high: float = 0.2  # symmetric, as in PPO
    gamma: float = 1.0  # no discount within a response: the only reward comes at its end
    lam: float = 0.95  # GAE λ of Ziegler et al. / InstructGPT: some bias for much less variance
    # β of the per-token KL penalty in the reward (InstructGPT uses 0.02). 0 skips the
    # reference model entirely; verifiable rewards rarely need it.
    kl_coef: float = 0.0
    vf_coef: float = 0.5  # CleanRL's default weight of the value loss (PPO's c1)
    value_clip: float | None = 0.2  # PPO2 clips the value change like the ratio; None turns it off
    whiten_advantages: bool = True  # mean 0, std 1 per batch: the step size no longer tracks reward scale
    loss_agg: str = "token-mean"  # each token is a time step with its own advantage
    entropy_coef: float = 0.0  # LLM policies start with plenty of entropy
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    max_len: int | None = None  # divisor for loss_agg="seq-mean-token-sum-norm" only

    def __post_init__(self) -> None:
        check_field(self, "clip_eps_low", 0.0 <= self.clip_eps_low < 1.0, "0 <= value < 1")
        check_field(self, "clip_eps_high", self.clip_eps_high >= 0.0, "a number >= 0")
        check_field(self, "gamma", 0.0 <= self.gamma <= 1.0, "a number in [0, 1]")
        check_field(self, "lam", 0.0 <= self.lam <= 1.0, "a number in [0, 1]")
        check_field(self, "kl_coef", self.kl_coef >= 0.0, "a number >= 0")
        check_field(self, "vf_coef", self.vf_coef > 0.0, "a number > 0 (the critic must be trained)")
        check_field(self, "value_clip", self.value_clip is None or self.value_clip > 0.0, "a number > 0, or None")
        check_loss_fields(self)

    @property
    def uses_critic(self) -> bool:
        return True

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """GAE advantages (whitened) and returns from token-level rewards and batch.values."""
        if batch.values is None:
            raise ValueError("PPO needs batch.values, V at sampling time (B, T): run the critic on the batch first")
        kl = None
        if self.kl_coef > 0:
            if batch.ref_logp is None:
                raise ValueError("PPO with kl_coef > 0 needs batch.ref_logp; run the reference role first")
            kl = kl_k1(batch.old_logp, batch.ref_logp)  # (B, T) of the policy that sampled
        mask = batch.response_mask
        token_rewards = token_level_rewards(batch.rewards, mask, kl, self.kl_coef)  # (B, T)
        advantages, returns = gae(token_rewards, batch.values, mask, self.gamma, self.lam)  # (B, T) each
        if self.whiten_advantages:
            advantages = masked_whiten(advantages, mask)  # (B, T)
        return {"advantages": advantages, "returns": returns}

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """clipped surrogate + vf_coef · clipped value loss − entropy_coef · agg(H)."""
        if batch.advantages is None or batch.returns is None:
            raise ValueError("batch.advantages/returns are None: run compute_advantages on the batch first")
        if outputs.values is None or batch.values is None:
            raise ValueError("PPO needs outputs.values (the critic now) and batch.values (at sampling time)")
        mask = batch.response_mask  # (B, T)
        pg_loss, metrics = clipped_surrogate(
            outputs.logp, batch.old_logp, batch.advantages, mask,
            eps_low=self.clip_eps_low, eps_high=self.clip_eps_high, agg=self.loss_agg, max_len=self.max_len,
        )
        value_loss, vf_clipfrac = clipped_value_loss(
            outputs.values, batch.values, batch.returns, mask, self.value_clip, self.loss_agg, self.max_len
        )
        loss, tail = self.loss_tail(pg_loss + self.vf_coef * value_loss, outputs, batch)  # + entropy bonus
        metrics = {
            "pg_loss": pg_loss.item(),
            "value_loss": value_loss.item(),
            "vf_clipfrac": vf_clipfrac,
            "explained_variance": explained_variance(batch.returns, outputs.values.detach(), mask),
            **metrics,
            **tail,
            "returns_mean": masked_mean(batch.returns, mask).item(),
            "values_mean": masked_mean(outputs.values.detach(), mask).item(),
        }
        if batch.ref_logp is not None:
            metrics["kl"] = masked_mean(kl_k1(batch.old_logp, batch.ref_logp), mask).item()
        return loss, metrics
