"""PRIME's implicit process reward model (Cui et al., arXiv:2502.01456; the implicit PRM
itself: Yuan et al., "Free Process Rewards without Process Labels", arXiv:2412.01981).

An implicit PRM is a causal LM π_φ, here a trainable copy of the starting (SFT) policy,
read against the frozen reference π_ref (the same starting policy):

    r_t       = β log π_φ(y_t | y_<t) / π_ref(y_t | y_<t)          the process reward of token t
    logit(y)  = Σ_t r_t = β log π_φ(y) / π_ref(y)                  the outcome score
    loss      = BCE( σ(logit(y)), outcome label ∈ [0, 1] )          what π_φ is trained on

Only outcome labels are needed: the cross-entropy on the sequence-level sum decides how
the evidence spreads over the tokens, and each token's share is its process reward. At the
start π_φ = π_ref, so every r_t is exactly 0 and the outcome score is σ(0) = ½.

The PRM is updated online, one optimizer step per rollout batch on that batch's verifier
labels, so it keeps up with the policy that produced them (an offline PRM is soon gamed).
The reference's log-probs are not recomputed: the reference role has already put them in
`batch.ref_logp`.

    implicit_process_rewards(prm_logp, ref_logp, mask, beta)   r_t, (B, T)
    implicit_outcome_logits(prm_logp, ref_logp, mask, beta)    Σ_t r_t, (B,)
    implicit_prm_loss(prm_logp, ref_logp, mask, labels, beta)  the BCE above
    ImplicitPRMLoss                                             that loss on a rollout batch, for the one Trainer
    ImplicitPRM                                                 the model and its Trainer, one step per batch
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from posttrain.algorithms.core import masked_mean
from posttrain.models.logprobs import response_logp
from posttrain.models.policy import Policy
from posttrain.roles.trainer import Trainer
from posttrain.types import RolloutBatch


def implicit_process_rewards(prm_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                             beta: float) -> torch.Tensor:
    """r_t = β (log π_φ(y_t | y_<t) − log π_ref(y_t | y_<t)) on response tokens, 0 elsewhere, (B, T).

    Args:
        prm_logp: (B, T) log π_φ of each token; ref_logp (B, T) log π_ref; mask (B, T) response mask.
    """
    return torch.where(mask != 0, beta * (prm_logp - ref_logp), 0.0)  # where: padding's values cannot leak


def implicit_outcome_logits(prm_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor,
                            beta: float) -> torch.Tensor:
    """β log π_φ(y) / π_ref(y) = Σ_t r_t of each row, (B,): the logit of p(correct | y)."""
    return implicit_process_rewards(prm_logp, ref_logp, mask, beta).sum(dim=1)


def implicit_prm_loss(prm_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
                      beta: float) -> torch.Tensor:
    """Mean over rows of −[ l log σ(z) + (1 − l) log(1 − σ(z)) ], z = Σ_t r_t: the PRM's
    cross-entropy on outcome labels l ∈ [0, 1] (B,). Computed from the logit z, never from
    σ(z), so a confident PRM gives a finite loss and gradient."""
    logits = implicit_outcome_logits(prm_logp, ref_logp, mask, beta)  # (B,)
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def outcome_labels(rewards: torch.Tensor) -> torch.Tensor:
    """The batch's rewards as the PRM's labels, (B,); ValueError unless each is in [0, 1]."""
    bad = ~((rewards >= 0) & (rewards <= 1))  # written so that NaN is bad too
    if bad.any():
        raise ValueError(f"the implicit PRM learns p(correct) from outcome labels in [0, 1], but the rewards include "
                         f"{rewards[bad][:4].tolist()}: train PRIME on the verifier's 0/1 (--rl.reward.terms accuracy, "
                         "no --rl.reward.length_penalty)")
    return rewards


class ImplicitPRMLoss:
    """implicit_prm_loss on a rollout batch's rows, as the one Trainer minimises it
    (roles/trainer.py::step; algorithms/contract.py::ModelLoss): a mean over rows, so a
    micro-batch weighs by its share of the rows. Built for one batch, whose labels it checks
    first. It keeps what its forward passes computed, `logp` (B, T), log π_φ before the
    update: the PRM's held-out verdict on the batch, and its scores under update="after",
    with no second forward pass."""

    def __init__(self, batch: RolloutBatch, beta: float, share_prompt: bool):
        if batch.ref_logp is None:
            raise ValueError("the implicit PRM reads batch.ref_logp (π_ref's log-probs): run the reference role first")
        self.ref_logp = batch.ref_logp  # (B, T) log π_ref, the reference's
        self.labels = outcome_labels(batch.rewards)  # (B,)
        self.logp = torch.zeros_like(batch.old_logp)  # (B, T), filled micro-batch by micro-batch
        self.beta, self.share_prompt = beta, share_prompt

    def share(self, batch: RolloutBatch, rows: torch.Tensor) -> float:
        return len(rows) / batch.batch_size

    def compute_loss(self, model: Policy, batch: RolloutBatch,
                     rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        micro = batch.select(rows)
        rows = rows.to(self.logp.device)
        prm_logp = response_logp(model, micro, self.share_prompt)  # (b, T)
        loss = implicit_prm_loss(prm_logp, self.ref_logp[rows], micro.response_mask, self.labels[rows], self.beta)
        self.logp[rows] = prm_logp.detach()
        return loss, {"loss": loss.item()}


class ImplicitPRM:
    """π_φ, a trainable copy of the starting policy, stepped once per rollout batch by the
    one Trainer (roles/trainer.py) on ImplicitPRMLoss. Called by the controller on each
    batch (after the reference has filled `batch.ref_logp`): returns the batch's process
    rewards (B, T) and metrics.

    update: "before" updates on the batch, then scores it with the updated weights (the
    paper's default; two forward passes and one backward); "after" scores with the
    weights before the update, reusing the update's forward pass.
    """

    def __init__(self, policy: Policy, beta: float, lr: float, update: str = "before",
                 grad_clip: float = 1.0, micro_batch_size: int = 0, share_prompt: bool = True):
        if update not in ("before", "after"):
            raise ValueError(f"ImplicitPRM update={update!r} is invalid; allowed: 'before' or 'after'")
        self.model = copy.deepcopy(policy).train()
        if not any(p.requires_grad for p in self.model.parameters()):
            raise ValueError("the implicit PRM is a copy of the policy, and the policy has no trainable parameters: "
                             "build the PRM from the policy the trainer trains, not the rollout engine's frozen copy")
        # AdamW with the policy trainer's β2 0.95 and no weight decay, at a constant learning rate
        # (verl's PRIME recipe: weight_decay 0, grad_clip 1.0, constant lr); a constant rate has no
        # schedule length, so total_steps is any number
        self.trainer = Trainer(self.model, lr, total_steps=1, final_lr_fraction=1.0, adam_beta2=0.95,
                               weight_decay=0.0, grad_clip=grad_clip, micro_batch_size=micro_batch_size)
        self.beta, self.update, self.share_prompt = beta, update, share_prompt

    def logp(self, batch: RolloutBatch) -> torch.Tensor:
        """log π_φ of the batch's response tokens, (B, T), differentiable unless under no_grad."""
        return response_logp(self.model, batch, self.share_prompt)

    def micro_batches(self, batch: RolloutBatch) -> list[torch.Tensor]:
        rows = torch.arange(batch.batch_size, device=batch.tokens.device)
        return list(rows.split(self.trainer.micro_batch_size or batch.batch_size))

    def __call__(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """One online step of the PRM on `batch`: (process rewards (B, T), metrics)."""
        loss = ImplicitPRMLoss(batch, self.beta, self.share_prompt)  # ValueError without batch.ref_logp
        stepped = self.trainer.step(batch, loss)
        mask = batch.response_mask  # (B, T)

        # the PRM's verdict on rollouts it has not trained on yet: a held-out accuracy, step by step
        logits_before = implicit_outcome_logits(loss.logp, loss.ref_logp, mask, self.beta)  # (B,)
        accuracy = ((logits_before > 0) == (loss.labels > 0.5)).float().mean().item()
        if self.update == "before":
            with torch.no_grad():
                self.model.eval()
                prm_logp = torch.cat([self.logp(batch.select(rows)) for rows in self.micro_batches(batch)])
        else:
            prm_logp = loss.logp
        process_rewards = implicit_process_rewards(prm_logp, loss.ref_logp, mask, self.beta)  # (B, T)
        return process_rewards, {
            "prm/loss": stepped["loss"],
            "prm/accuracy": accuracy,
            "prm/grad_norm": stepped["grad_norm"],
            "prm/process_reward_mean": masked_mean(process_rewards, mask).item(),  # per response token
            "prm/outcome_score_mean": process_rewards.sum(dim=1).mean().item(),  # Σ_t r_t per response
        }

    def state_dict(self) -> dict:
        """The PRM's weights and its optimizer's moments: with them a resumed run scores and
        steps exactly as an uninterrupted one. Its learning rate is constant, so the trainer's
        schedule holds nothing a resume needs, and the keys stay those of checkpoints written
        when the PRM had its own AdamW loop: they load as they are."""
        return {"model": self.model.state_dict(), "optimizer": self.trainer.state_dict()["optimizer"]}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.trainer.load_state_dict({**self.trainer.state_dict(), "optimizer": state["optimizer"]})
