"""REINFORCE++ (Hu et al., arXiv:2501.03262): PPO's machinery without the critic.

Background. PPO's critic is a second model as large as the policy. REINFORCE++ keeps the
rest of PPO and drops the critic (V ≡ 0), using instead the statistics of the whole batch:

1. The KL to the reference goes into the per-token reward, as in PPO-RLHF, not into the
   loss as in GRPO: r_t = −β KL_t + [t is the last response token] · R, with
   KL_t = log π_old(y_t) − log π_ref(y_t) (k1), or its square / 2 (k2, always ≥ 0).
2. Each token's advantage is its reward-to-go (γ = 1): A_t = Σ_{s ≥ t} r_s
   = R − β Σ_{s ≥ t} KL_s. This is exactly PPO's GAE with V ≡ 0 and γ = λ = 1, so the
   code calls `ppo.gae` with zero values.
3. No critic and no group baseline: the advantages are whitened over every response token
   of the global batch, (A − mean) / std. The batch mean plays the baseline.
4. PPO's clipped surrogate, so a batch can be reused for several minibatch steps.

Diff from PPO: values = 0, λ = 1, no value loss. Diff from GRPO: the baseline and the
scale come from the whole batch instead of each prompt's group, and the KL moved from the
loss into the reward.

Conventions: the KL uses π_old (the sampling policy; this runs before the update, without
gradients); mean and unbiased std over all response tokens (`core.masked_whiten`);
loss_agg "token-mean", since each token has its own advantage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import (
    clipped_surrogate,
    kl_estimate,
    masked_mean,
    masked_whiten,
)
from posttrain.algorithms.contract import Algorithm, check_field, check_loss_fields, require_advantages
from posttrain.algorithms.ppo import gae, token_level_rewards
from posttrain.types import PolicyOutputs, RolloutBatch

REWARD_KL_ESTIMATORS = ("k1", "k2")


@dataclass
class ReinforcePP(Algorithm):
    """REINFORCE++: KL-shaped token rewards, reward-to-go, global whitening, PPO clip."""

    name: ClassVar[str] = "reinforce_pp"

    clip_eps_low: float = 0.2  # PPO's ε = 0.2: REINFORCE++ keeps PPO's clipped surrogate (arXiv:2501.03262)
    clip_eps_high: float = 0.2  # symmetric, as in PPO
    # β: small enough that the KL summed over a response (~48 tokens × KL ~0.1 each gives
    # 0.05 at β = 0.01) stays well below a correct answer's reward of 1.
    kl_coef: float = 0.01
    kl_estimator: str = "k1"  # the paper's log(π_old / π_ref); k2 = ½ (log ratio)² is never negative
    adv_eps: float = 1e-8  # inside the sqrt of the whitening, for an all-equal batch
    loss_agg: str = "token-mean"  # every token carries its own advantage
    entropy_coef: float = 0.0  # the paper adds no entropy bonus
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    max_len: int | None = None  # divisor for loss_agg="seq-mean-token-sum-norm" only

    def __post_init__(self) -> None:
        check_field(self, "clip_eps_low", 0.0 <= self.clip_eps_low < 1.0, "0 <= value < 1")
        check_field(self, "clip_eps_high", self.clip_eps_high >= 0.0, "a number >= 0")
        check_field(self, "kl_coef", self.kl_coef >= 0.0, "a number >= 0")
        check_field(self, "kl_estimator", self.kl_estimator in REWARD_KL_ESTIMATORS, f"one of {list(REWARD_KL_ESTIMATORS)}")
        check_field(self, "adv_eps", self.adv_eps > 0.0, "a number > 0")
        check_loss_fields(self)

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Whitened reward-to-go of the KL-shaped token rewards; also the unwhitened
        reward-to-go as "returns" (for logging)."""
        mask = batch.response_mask  # (B, T)
        kl = None
        if self.kl_coef > 0:
            if batch.ref_logp is None:
                raise ValueError("REINFORCE++ with kl_coef > 0 needs batch.ref_logp; run the reference role first")
            kl = kl_estimate(batch.old_logp, batch.ref_logp, self.kl_estimator)  # (B, T)
        token_rewards = token_level_rewards(batch.rewards, mask, kl, self.kl_coef)  # (B, T)
        # no critic: GAE with V ≡ 0 and γ = λ = 1 is the reward-to-go Σ_{s ≥ t} r_s
        reward_to_go, _ = gae(token_rewards, torch.zeros_like(token_rewards), mask, gamma=1.0, lam=1.0)
        advantages = masked_whiten(reward_to_go, mask, eps=self.adv_eps)  # (B, T) over the whole batch
        return {"advantages": advantages, "returns": reward_to_go}

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """clipped surrogate − entropy_coef · agg(H); the KL is already in the advantages."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        pg_loss, metrics = clipped_surrogate(
            outputs.logp, batch.old_logp, adv, mask,
            eps_low=self.clip_eps_low, eps_high=self.clip_eps_high, agg=self.loss_agg, max_len=self.max_len,
        )
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        metrics = {"pg_loss": pg_loss.item(), **metrics, **tail}
        if batch.ref_logp is not None:
            kl = kl_estimate(batch.old_logp, batch.ref_logp, self.kl_estimator)  # (B, T)
            metrics["kl"] = masked_mean(kl, mask).item()
        return loss, metrics
