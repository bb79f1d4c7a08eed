"""REINFORCE (Williams, 1992, "Simple statistical gradient-following algorithms for
connectionist reinforcement learning", Machine Learning 8:229–256): the root of the family.

Background. For a prompt x the policy samples a response y = (y_1 .. y_T) and a verifier
scores it, R(y). The gradient of the expected reward is the score-function identity

    ∇ E_y[R(y)] = E_y[ R(y) ∇ log π(y | x) ] = E_y[ R(y) Σ_t ∇ log π(y_t | x, y_<t) ]

so one sample gives an unbiased gradient estimate. Subtracting a baseline b that does not
depend on y keeps it unbiased (E[b ∇ log π(y)] = b ∇ Σ_y π(y) = 0) and can cut its
variance a lot:

    loss = − agg( (R − b) · log π(y_t | x, y_<t) )        the advantage is A = R − b

There is no importance ratio and no clip: the samples must come from the current policy,
so use one epoch and one minibatch (the defaults). Every other algorithm here is a patch
on this one: PPO adds a learned baseline, a ratio and a clip; GRPO a group baseline.

Baselines (`baseline`):
    "none"          b = 0, the plain estimator (high variance: all rewards ≥ 0 push every
                    sampled response up, the good ones just a little more).
    "running_mean"  b = an exponential moving average of past batches' mean reward, kept
                    as algorithm state (see `state_dict`).
    "group_mean"    b = the mean reward of the K samples of the same prompt. Including the
                    row's own reward makes b depend on y: a small bias, which RLOO removes.

Conventions: the sequence reward is copied onto every response token (outcome reward);
the default aggregation is "seq-mean-token-sum", the exact Σ_t of the estimator above
averaged over sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import (
    group_mean_std,
    importance_ratio,
    policy_gradient_loss,
    ratio_metrics,
)
from posttrain.algorithms.contract import Algorithm, check_field, check_loss_fields, require_advantages
from posttrain.types import PolicyOutputs, RolloutBatch


def ema_update(average: float, value: float, decay: float, count: int) -> float:
    """One step of an exponential moving average. The first value (count == 0) starts the
    average instead of being shrunk towards an arbitrary initial 0."""
    return value if count == 0 else decay * average + (1 - decay) * value


@dataclass
class REINFORCE(Algorithm):
    """REINFORCE with an optional baseline. Fields are the hyperparameters.

    State: with baseline="running_mean" the algorithm carries the moving average across
    steps, and `compute_advantages` advances it, so call it once per rollout batch. Save
    `state_dict()` (plain floats) with the checkpoint and restore it with
    `load_state_dict()`, or a resumed run restarts its baseline from nothing.
    """

    name: ClassVar[str] = "reinforce"
    zero_advantage_rows_are_inert: ClassVar[bool] = True  # every loss term is a multiple of A
    BASELINES: ClassVar[tuple[str, ...]] = ("none", "running_mean", "group_mean")
    accepts_turn_rows: ClassVar[bool] = True  # every baseline weighs rows by episode; −A · log π per token

    # The classic "reinforcement comparison" baseline: it needs no groups (works with one
    # sample per prompt) and no critic.
    baseline: str = "running_mean"
    # Each batch moves the average 10% of the way: it remembers ~10 batches, so it
    # tracks a policy that improves over tens of steps without chasing one batch's noise.
    ema_decay: float = 0.9
    # Σ_t log π(y_t) is log π(y): the estimator exactly as derived, one term per sequence.
    loss_agg: str = "seq-mean-token-sum"
    entropy_coef: float = 0.0  # the estimator has no entropy bonus
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    max_len: int | None = None  # divisor for loss_agg="seq-mean-token-sum-norm" only

    def __post_init__(self) -> None:
        check_field(self, "baseline", self.baseline in self.BASELINES, f"one of {list(self.BASELINES)}")
        check_field(self, "ema_decay", 0.0 <= self.ema_decay < 1.0, "0 <= value < 1")
        check_loss_fields(self)
        self._running_mean = 0.0  # algorithm state, not a hyperparameter: see state_dict
        self._num_batches = 0

    @property
    def needs_groups(self) -> bool:  # type: ignore[override]
        """Only group_mean's baseline is the prompt's own samples."""
        return self.baseline == "group_mean"

    def state_dict(self) -> dict[str, float]:
        """The running baseline, as plain floats for a checkpoint's JSON or torch.save."""
        return {"running_mean": float(self._running_mean), "num_batches": float(self._num_batches)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._running_mean = float(state["running_mean"])
        self._num_batches = int(state["num_batches"])

    def sequence_baseline(self, rewards: torch.Tensor, group_ids: torch.Tensor,
                          weights: torch.Tensor | None = None) -> torch.Tensor:
        """b for each row, (B,). Advances the running mean when that is the baseline.
        `weights`: a row's share of its episode (RolloutBatch.row_weights), so the means
        count episodes, not rows."""
        if self.baseline == "none":
            return torch.zeros_like(rewards)
        if self.baseline == "group_mean":
            return group_mean_std(rewards, group_ids, weights)[0]
        # running_mean: the average of *earlier* batches, so b does not depend on this
        # batch's samples and the estimate stays unbiased. The first batch has no history
        # and gets b = 0.
        b = torch.full_like(rewards, self._running_mean if self._num_batches > 0 else 0.0)
        batch_mean = rewards.mean() if weights is None else (weights * rewards).sum() / weights.sum()
        self._running_mean = ema_update(self._running_mean, batch_mean.item(), self.ema_decay, self._num_batches)
        self._num_batches += 1
        return b

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """A = R − b for each sequence, copied onto its response tokens; 0 elsewhere."""
        adv_seq = batch.rewards - self.sequence_baseline(batch.rewards, batch.group_ids, batch.row_weights)  # (B,)
        return {"advantages": adv_seq[:, None] * batch.response_mask}  # (B, T)

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """agg(−A · log π) − entropy_coef · agg(H) over response tokens."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        pg_loss = policy_gradient_loss(outputs.logp, adv, mask, self.loss_agg, self.max_len)
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        # No ratio enters the loss; it is logged because it shows when the samples have
        # gone stale (approx_kl > 0 means the update ran off-policy).
        log_ratio, ratio = importance_ratio(outputs.logp.detach(), batch.old_logp, mask)
        metrics = {
            "pg_loss": pg_loss.item(),
            **ratio_metrics(log_ratio, ratio, mask),
            **tail,
        }
        if self.baseline == "running_mean":
            metrics["baseline"] = self._running_mean
        return loss, metrics
