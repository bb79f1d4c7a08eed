"""PRIME: Process Reinforcement through IMplicit rEwards (Cui et al., arXiv:2502.01456).

Background. An outcome reward says only whether the whole response was right. A process
reward model (PRM) would say which tokens helped, but needs step labels and, trained
offline, is soon gamed by a policy that drifts away from its data. PRIME gets per-token
rewards from outcome labels alone. An *implicit PRM* π_φ is a causal LM (a copy of the
SFT policy) trained as an outcome classifier whose logit is a log-ratio to the frozen
reference π_ref (the SFT policy too):

    p(correct | y) = σ( β Σ_t log π_φ(y_t | y_<t) / π_ref(y_t | y_<t) )

Trained that way, each term of the sum is a token's share of the evidence, its process
reward r_t = β log π_φ(y_t | y_<t) / π_ref(y_t | y_<t) (Yuan et al., arXiv:2412.01981).
PRIME updates π_φ online on every rollout batch (cross-entropy against the verifier's
0/1), so it follows the policy. The PRM itself lives in rewards/implicit_prm.py; it fills
`batch.process_rewards` (B, T) before this file's `compute_advantages` runs.

Advantages (Sec. 3.3 of the paper, γ = 1): outcome and process rewards get leave-one-out
baselines separately, then are added. For response i of a group of K,

    outcome   A_out_i    = r_o(y_i) − 1/(K−1) Σ_{j≠i} r_o(y_j)                   (RLOO)
    process   b_i        = 1/(K−1) Σ_{j≠i} mean_t r_t(y_j)   (the others' mean token reward)
              A_proc_i,t = Σ_{s ≥ t} ( r_s(y_i) − b_i )          (Monte-Carlo return)
    A_i,t = outcome_coef · A_out_i + process_coef · A_proc_i,t

then whitened over the batch's response tokens (mean 0, std 1), as verl's PRIME recipe
does. The policy takes PPO's clipped step on A (arXiv:1707.06347, Eq. 7).

The diff from RLOO (its parent here): the process term in the advantage, whitening, and
PPO's ratio and clip instead of REINFORCE's plain −A · log π.

Conventions: a group of one sample has no "others": its advantage is 0 (as RLOO's).
Where the PRM's forward passes fit in a step (`prm_update`): "before" (the paper's
default, verl's "double forward") updates π_φ on the batch, then scores it with the
updated weights; "after" scores it with π_φ as it was before this batch, reusing the
update's forward pass (one forward fewer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.contract import check_field, check_loss_fields, require_advantages
from posttrain.algorithms.core import clipped_surrogate, group_mean_std, masked_whiten
from posttrain.algorithms.rloo import RLOO, leave_one_out_baseline
from posttrain.types import PolicyOutputs, RolloutBatch

PRM_UPDATE_ORDERS = ("before", "after")


def leave_one_out_process_returns(
    process_rewards: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """PRIME's process advantage: the return Σ_{s≥t} (r_s − b_i) of each response token,
    with b_i the mean per-token reward of the *other* responses of the same prompt.

    Args:
        process_rewards: (B, T) r_t, read only where response_mask is 1.
        response_mask:   (B, T) 1 on the response tokens (the time steps).
        group_ids:       (B,) long; the K samples of one prompt share an id.

    Returns (B, T), 0 off the response and 0 on every row of a group of one.
    Why a per-token baseline: responses differ in length, and subtracting b_i from every
    token makes the return at t compare "the rest of this response" with "as many tokens
    of an average sibling", not with a sibling's whole (longer or shorter) sum.
    """
    on = response_mask != 0
    rewards = torch.where(on, process_rewards, 0.0)  # (B, T) padding cannot leak, even NaN
    lengths = response_mask.sum(dim=1).clamp(min=1)  # (B,)
    mean_token_reward = rewards.sum(dim=1) / lengths  # (B,) mean_t r_t(y_i)
    baseline = leave_one_out_baseline(mean_token_reward, group_ids)  # (B,) b_i
    centred = torch.where(on, rewards - baseline[:, None], 0.0)  # (B, T)
    returns = centred.flip(-1).cumsum(-1).flip(-1)  # (B, T) Σ_{s ≥ t}, skipping masked positions (they add 0)
    _, _, count = group_mean_std(mean_token_reward, group_ids)  # (B,) K of the row's group
    return torch.where(on & (count[:, None] > 1), returns, 0.0)


def prime_advantages(
    rewards: torch.Tensor,
    process_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    outcome_coef: float,
    process_coef: float,
) -> torch.Tensor:
    """outcome_coef · RLOO(outcome) on every response token + process_coef · the process
    return (`leave_one_out_process_returns`), (B, T), before any whitening.

    Args:
        rewards:         (B,) the verifier's outcome reward r_o(y_i).
        process_rewards: (B, T) the implicit PRM's r_t.
        response_mask:   (B, T); group_ids (B,).
    """
    outcome = rewards - leave_one_out_baseline(rewards, group_ids)  # (B,) A_out, 0 for a group of one
    process = leave_one_out_process_returns(process_rewards, response_mask, group_ids)  # (B, T)
    return outcome_coef * outcome[:, None] * response_mask + process_coef * process  # (B, T)


@dataclass
class PRIME(RLOO):
    """RLOO's outcome advantages plus the implicit PRM's process returns, under PPO's clip."""

    name: ClassVar[str] = "prime"
    # whitening shifts every row's advantages, so a row of a flat group is not 0 and not inert
    zero_advantage_rows_are_inert: ClassVar[bool] = False

    # β of r_t = β log π_φ/π_ref, in the PRM's loss and in its rewards alike: the paper's 0.05
    # (verl recipe beta_train=0.05). Larger β saturates σ(β Σ log-ratio) after smaller moves of π_φ
    beta: float = 0.05
    # weights of the two leave-one-out terms: the paper adds them with equal weight (verl's recipe
    # has 5 and 5, the same after whitening)
    outcome_coef: float = 1.0
    process_coef: float = 1.0
    # mean 0, std 1 over the batch's response tokens, as verl's PRIME recipe: the process
    # returns grow with length and with β, and whitening keeps the step size independent of both
    whiten_advantages: bool = True
    clip_eps_low: float = 0.2  # PPO's ε = 0.2 (arXiv:1707.06347); the paper uses PPO's clip
    clip_eps_high: float = 0.2  # symmetric, as in PPO
    loss_agg: str = "token-mean"  # every token has its own advantage, as in PPO (verl's default)
    # the implicit PRM's learning rate. The paper trains π_φ at 1e-6 with the policy at 5e-7
    # (2x); gpt_mini's policy trains at rl.optim.lr 1e-4, so 2e-4 keeps that ratio
    prm_lr: float = 2e-4
    # "before": update π_φ on the batch, then score it with the updated PRM (the paper's and
    # verl's default, two PRM forward passes); "after": score first, then update (one forward)
    prm_update: str = "before"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field(self, "beta", self.beta > 0.0, "a number > 0 (the scale of the implicit reward)")
        check_field(self, "outcome_coef", self.outcome_coef >= 0.0, "a number >= 0")
        check_field(self, "process_coef", self.process_coef >= 0.0, "a number >= 0")
        check_field(self, "clip_eps_low", 0.0 <= self.clip_eps_low < 1.0, "0 <= value < 1")
        check_field(self, "clip_eps_high", self.clip_eps_high >= 0.0, "a number >= 0")
        check_field(self, "prm_lr", self.prm_lr > 0.0, "a number > 0")
        check_field(self, "prm_update", self.prm_update in PRM_UPDATE_ORDERS, f"one of {list(PRM_UPDATE_ORDERS)}")
        check_loss_fields(self)

    @property
    def uses_reference(self) -> bool:
        return True  # the implicit reward is a log-ratio to π_ref

    def implicit_prm_settings(self) -> dict | None:
        """The PRM's settings; None with process_coef 0, when nothing reads its rewards (the
        ablation: RLOO, whitened, under PPO's clip) and building and training it would be waste."""
        if self.process_coef == 0:
            return None
        return {"beta": self.beta, "lr": self.prm_lr, "update": self.prm_update}

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """outcome RLOO + process return per token (`prime_advantages`), whitened; 0 off the response."""
        process_rewards = batch.process_rewards
        if process_rewards is None and self.process_coef == 0:
            process_rewards = torch.zeros_like(batch.old_logp)  # (B, T) the ablation: no PRM, no process term
        if process_rewards is None:
            raise ValueError("PRIME needs batch.process_rewards (B, T), the implicit PRM's per-token rewards: "
                             "the controller fills them with its process_reward role (rewards/implicit_prm.py)")
        mask = batch.response_mask
        advantages = prime_advantages(batch.rewards, process_rewards, mask, batch.group_ids,
                                      self.outcome_coef, self.process_coef)  # (B, T)
        if self.whiten_advantages:
            advantages = masked_whiten(advantages, mask)  # (B, T)
        _, _, count = group_mean_std(batch.rewards, batch.group_ids)
        return {"advantages": torch.where(count[:, None] > 1, advantages, 0.0)}  # no siblings, no signal

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """PPO's clipped surrogate on A − entropy_coef · agg(H)."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        pg_loss, metrics = clipped_surrogate(outputs.logp, batch.old_logp, adv, mask,
                                             eps_low=self.clip_eps_low, eps_high=self.clip_eps_high,
                                             agg=self.loss_agg, max_len=self.max_len)
        loss, tail = self.loss_tail(pg_loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        return loss, {"pg_loss": pg_loss.item(), **metrics, **tail}
