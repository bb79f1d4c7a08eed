"""GRPO: Group Relative Policy Optimization (Shao et al., DeepSeekMath, arXiv:2402.03300).

Background. PPO needs a learned critic V(s) as its baseline. GRPO drops the critic: for
each prompt it samples a group of G responses, scores them, and uses the group itself as
the baseline. A response's advantage is how much better it scored than its siblings,

    A_i = (r_i − mean(r_1..r_G)) / std(r_1..r_G)                          (Sec. 4.1.2)

and every token of response i gets that same A_i (outcome supervision). The policy then
takes PPO's clipped step on those advantages, with an optional KL penalty to a frozen
reference policy added to the loss rather than folded into the reward (Eq. 3):

    J(θ) = E[ 1/G Σ_i 1/|o_i| Σ_t ( min(ρ_t A_i, clip(ρ_t, 1−ε, 1+ε) A_i) − β KL_t ) ]
    ρ_t  = π_θ(o_t | q, o_<t) / π_old(o_t | q, o_<t),   KL_t = k3 estimate (Eq. 4)

Pseudocode, one step (the controller and trainer do the plumbing):

    sample G responses per prompt from π_old; score them          -> batch.rewards
    advantages = compute_advantages(batch)                         # no gradients
    for each epoch / minibatch:
        loss = clipped surrogate + β · KL − entropy_coef · H       # compute_loss
        loss.backward(); optimizer.step()

Dr. GRPO (arXiv:2503.20783) is this file with two divisors deleted: `adv_norm="none"`
(no std) and `loss_agg="seq-mean-token-sum-norm"` (no 1/|o_i|).

Two settings outside the class reach every algorithm of the family: with a reward of several
terms and rl.reward.normalize per_term, each term is normalised within its group before the
weighted sum (GDPO, `per_term_advantages`); rl.entropy's token selection (Clip-Cov, KL-Cov, the
high-entropy tokens: algorithms/entropy_control.py) decides which tokens the loss trains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import (
    KL_ESTIMATORS,
    agg_loss,
    clipped_surrogate,
    group_mean_std,
    importance_ratio,
    kl_estimate,
    masked_mean,
)
from posttrain.algorithms.contract import Algorithm, check_field, check_loss_fields, require_advantages
from posttrain.types import PolicyOutputs, RolloutBatch

# What adv_norm subtracts and divides by, each named after both. Four of them centre on the
# group mean; "batch-mean-batch-std" has no group baseline, and "no-baseline" none at all.
ADV_NORMS = ("group", "group-mean-batch-std", "group-mean-pooled-std", "batch-mean-batch-std", "none", "no-baseline")
# Names that meant something else, or two things: refused with what each became. This
# project's old "batch" is Lite PPO's normalisation; its old "hybrid" (a pooled std) is
# NOT the seed's "hybrid" (local mean, global std), which is also Lite PPO's.
RENAMED_ADV_NORMS = {
    "batch": "'group-mean-batch-std' (what 'batch' meant here: group mean, std of all rewards, Lite PPO's); "
             "'batch-mean-batch-std' is the batch mean and std",
    "hybrid": "'group-mean-pooled-std' (what 'hybrid' meant here: std of r − group mean over the batch); the "
              "'hybrid' of the Tricks-or-Traps notes (group mean, batch std) is 'group-mean-batch-std'",
}


def check_adv_norm(algo: object) -> None:
    """`algo.adv_norm` is one of ADV_NORMS; a renamed one says what it became."""
    norm = getattr(algo, "adv_norm")
    renamed = f" ('{norm}' was renamed: use {RENAMED_ADV_NORMS[norm]})" if norm in RENAMED_ADV_NORMS else ""
    check_field(algo, "adv_norm", norm in ADV_NORMS, f"one of {list(ADV_NORMS)}{renamed}")


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, norm: str, eps: float,
                     weights: torch.Tensor | None = None) -> torch.Tensor:
    """One advantage per sequence: its reward minus a baseline, then scaled.

    Args:
        rewards:   (B,) float, one scalar reward per sequence.
        group_ids: (B,) long; the G samples of one prompt share an id.
        norm:      what to subtract and divide by, always as (r − mean) / (std + eps):
            "group"                 the group's mean and std: GRPO (arXiv:2402.03300,
                                    4.1.2). The seed's "local" normalisation.
            "group-mean-batch-std"  the group's mean, the std of all B rewards: Lite PPO
                                    (Liu et al., "Tricks or Traps? Part I",
                                    arXiv:2508.08221; TRL's scale_rewards="batch"), the
                                    seed's "hybrid". The batch std also counts the spread
                                    *between* prompts (easy vs hard), so one easy group
                                    with tiny variance is not blown up.
            "group-mean-pooled-std" the group's mean, the batch std of the centred rewards
                                    r − group mean: REINFORCE++ with a group baseline (Hu
                                    et al., arXiv:2501.03262). The *within*-group spread
                                    pooled over all prompts: one scale for the batch, which
                                    easy and hard prompts no longer inflate.
            "batch-mean-batch-std"  the mean and std of all B rewards, no group baseline:
                                    the seed's "global" normalisation (REINFORCE++ whitens
                                    this way). A group whose K rewards are equal keeps a
                                    non-zero advantage: all right on an easy prompt pushes
                                    those answers up further.
            "none"                  the group's mean, no division: Dr. GRPO
                                    (arXiv:2503.20783), which argues the group std
                                    up-weights prompts that are nearly always right or wrong.
            "no-baseline"           the reward itself, A = r: vanilla REINFORCE's
                                    advantage, the first row of the progressive build
                                    (`posttrain compare --rows progressive`). Unbiased, but
                                    every right answer is pushed up by the same amount
                                    whether its prompt is easy or hard: the variance a
                                    baseline removes.
        eps:       added to the std, so a zero-variance group gives 0 / eps = 0.
        weights:   (B,) or None: a row's share of its episode (RolloutBatch.row_weights), so
                   every statistic counts episodes, not rows (core.group_mean_std).

    All stds are unbiased (Bessel, N − 1). A group of size 1 has std 0 and (under a group
    mean) advantage 0: it is its own baseline. A group whose rewards are all equal also
    gets 0 everywhere, except under "batch-mean-batch-std".

    Returns (B,) advantages.
    """
    if norm == "no-baseline":
        return rewards.clone()  # (B,)
    if norm == "batch-mean-batch-std":
        everyone = torch.zeros_like(group_ids)  # the whole batch as one group
        mean, std, _ = group_mean_std(rewards, everyone, weights)  # (B,) each, all equal
        return (rewards - mean) / (std + eps)
    mean, group_std, _ = group_mean_std(rewards, group_ids, weights)  # (B,), (B,)
    centred = rewards - mean  # (B,)
    if norm == "group":
        std = group_std  # (B,)
    elif norm == "group-mean-batch-std":
        std = _batch_std(rewards, weights)  # scalar
    elif norm == "group-mean-pooled-std":
        std = _batch_std(centred, weights)  # scalar
    elif norm == "none":
        return centred
    else:
        raise ValueError(f"unknown advantage normalisation {norm!r}; choose one of {list(ADV_NORMS)}")
    return centred / (std + eps)  # (B,)


def _batch_std(x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased std of a (B,) tensor; 0 for a single element (torch.std would give NaN)."""
    if weights is not None:  # every row of the batch in one group: the weighted group std
        return group_mean_std(x, torch.zeros_like(x, dtype=torch.long), weights)[1][0]
    return x.std() if x.numel() > 1 else x.new_zeros(())


# The adv_norms a reward term can be normalised under on its own (GDPO): those that divide each
# term's residual from its group mean by a spread. Centring alone ("none") is linear, so per-term
# centring then summing is the sum centred: nothing decoupled. The others have no group baseline.
PER_TERM_NORMS = ("group", "group-mean-batch-std", "group-mean-pooled-std")


def per_term_advantages(terms: torch.Tensor, term_weights: torch.Tensor, group_ids: torch.Tensor, norm: str,
                        eps: float, weights: torch.Tensor | None = None) -> torch.Tensor:
    """GDPO: Group reward-Decoupled normalisation Policy Optimization (NVIDIA,
    arXiv:2601.05242). One advantage per sequence from K reward terms:

        A_i = batch_whiten( Σ_k w_k · (r_ik − mean_g r_k) / (std_g r_k + eps) )

    Summing first and normalising the sum (GRPO) lets a dense term drown a sparse one: a format
    reward that varies in every group sets the group's std, and a right answer in a group whose
    format scores are already spread gets a smaller advantage. Normalising each term within its
    group first gives every term that varies in a group the same unit there, then the weights
    w_k say how much each counts. The final whitening over the batch keeps the scale from
    growing with K (TRL's multi_objective_aggregation="normalize_then_sum").

    Args:
        terms:        (B, K) float, each term's raw value (before its weight).
        term_weights: (B, K) float, each term's weight (the same on every row of a step).
        group_ids:    (B,) long; norm, eps, weights: as `group_advantages`, applied to each term
                      (norm one of PER_TERM_NORMS; "group" is the paper's).

    Returns (B,) advantages, whitened over the batch (mean 0, unbiased std 1 up to eps)."""
    if norm not in PER_TERM_NORMS:
        raise ValueError(f"per-term normalisation (GDPO) needs adv_norm in {list(PER_TERM_NORMS)}, got {norm!r}: "
                         "centring alone is linear, so each term centred and then summed is the sum centred")
    per_term = torch.stack([group_advantages(terms[:, k], group_ids, norm, eps, weights)
                            for k in range(terms.shape[1])], dim=1)  # (B, K)
    combined = (per_term * term_weights).sum(dim=1)  # (B,)
    return group_advantages(combined, group_ids, "batch-mean-batch-std", eps, weights)  # (B,)


def sequence_advantages(batch: RolloutBatch, norm: str, eps: float) -> torch.Tensor:
    """(B,) the group-relative advantage of each row: `group_advantages` of the summed reward,
    or GDPO's `per_term_advantages` when the batch carries its reward terms (rl.reward.normalize
    per_term). Those terms must add up, with their weights, to batch.rewards: a reward changed
    after the stack (DAPO's overlong penalty) would otherwise be silently left out."""
    if batch.reward_terms is None or batch.reward_term_weights is None:
        return group_advantages(batch.rewards, batch.group_ids, norm, eps, batch.row_weights)  # (B,)
    summed = (batch.reward_terms * batch.reward_term_weights).sum(dim=1)  # (B,)
    if not torch.allclose(summed, batch.rewards, rtol=1e-4, atol=1e-4):
        worst = int((summed - batch.rewards).abs().argmax())
        raise ValueError(f"row {worst}: its reward terms sum to {summed[worst].item():.6g} with their weights, but its "
                         f"reward is {batch.rewards[worst].item():.6g}; something changed the reward after the stack "
                         "scored it, and per-term normalisation would leave that out. Use rl.reward.normalize sum")
    return per_term_advantages(batch.reward_terms, batch.reward_term_weights, batch.group_ids, norm, eps,
                               batch.row_weights)  # (B,)


def without_truncated_rows(response_mask: torch.Tensor, truncated: torch.Tensor | None) -> torch.Tensor:
    """The response mask with every truncated row zeroed: overlong filtering. (B, T).

    A row cut off by the generation budget (`truncated`, (B,) bool) is an unfinished
    answer; its verifier reward (usually 0) says "too long", not "wrong". Filtering drops
    such rows from the loss entirely (DAPO, arXiv:2503.14476, Sec. 3.4, tried it first;
    "Tricks or Traps", arXiv:2508.08221, measures it as one of its four techniques), instead
    of training on them as failures
    (truncation, the default). Their rewards still count in the group's baseline: they are
    what π_old did."""
    if truncated is None:
        raise ValueError("overlong_filter needs batch.truncated ((B,) bool, which rows the generation budget cut "
                         "off): RolloutBatch.collate fills it from each Episode.finished")
    return response_mask * (~truncated).to(response_mask.dtype)[:, None]  # (B, T)


class GroupRelative(Algorithm):
    """GRPO's group-relative advantage, for GRPO and for the algorithms that keep it under a loss
    of their own (CISPO, SAPO, GMPO): each sequence's `sequence_advantages` on all its tokens, and
    GDPO's per-term normalisation wherever `adv_norm` scales each term. A subclass declares
    `adv_norm` and `adv_eps` as fields."""

    adv_norm: str
    adv_eps: float

    @property
    def accepts_reward_terms(self) -> bool:  # type: ignore[override]
        """Each reward term normalised within its group (GDPO) under an adv_norm that scales."""
        return self.adv_norm in PER_TERM_NORMS

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """The group-relative advantage on every response token."""
        adv_seq = sequence_advantages(batch, self.adv_norm, self.adv_eps)  # (B,) GDPO's with reward terms
        return {"advantages": adv_seq[:, None] * batch.response_mask}  # (B, T)


@dataclass
class GRPO(GroupRelative):
    """Group Relative Policy Optimization. Fields are the hyperparameters."""

    name: ClassVar[str] = "grpo"
    zero_advantage_rows_are_inert: ClassVar[bool] = True  # every loss term is a multiple of A
    accepts_turn_rows: ClassVar[bool] = True  # the group baseline, weighted by episode; per-token loss
    accepts_token_selection: ClassVar[bool] = True  # compute_loss applies token_selection

    clip_eps_low: float = 0.2  # PPO's ε = 0.2 (arXiv:1707.06347); DeepSeekMath does not state its ε
    clip_eps_high: float = 0.2  # symmetric as in PPO; DAPO's clip-higher raises it to 0.28
    # GRPO uses β = 0.04 (Sec. 4.2). We default to 0: many recent recipes (DAPO, Dr. GRPO)
    # drop the KL term for verifiable rewards, and with β = 0 the reference forward pass
    # is skipped entirely.
    kl_coef: float = 0.0
    kl_estimator: str = "k3"  # the paper's unbiased, non-negative estimator (Eq. 4)
    # weight the per-token KL estimate by π_θ/π_old: tokens drawn from π_old estimate
    # KL(π_θ ‖ π_ref) unbiased only so (DeepSeek-V3.2). Off as in GRPO; on in TRL 1.16
    kl_importance_weight: bool = False
    adv_norm: str = "group"  # divide by the group std, as in the paper (Sec. 4.1.2)
    adv_eps: float = 1e-6  # keeps zero-variance groups at advantage 0 instead of 0 / 0
    loss_agg: str = "seq-mean-token-mean"  # the paper's 1/G Σ_i 1/|o_i| Σ_t (Eq. 3)
    entropy_coef: float = 0.0  # the paper has no entropy bonus
    entropy_agg: str = "loss_agg"  # the entropy bonus aggregated as the loss is; "token-mean" is TRL's per-token mean
    # The constant divisor of loss_agg="seq-mean-token-sum-norm" (unused otherwise): Dr. GRPO
    # divides by the generation budget, so set it to max_new_tokens.
    max_len: int | None = None
    # overlong filtering: leave the rows the generation budget cut off out of the loss
    # (without_truncated_rows). Off, as in the paper: a truncated answer is scored as it
    # stands (reward 0) and trained on like any wrong one
    overlong_filter: bool = False

    @property
    def needs_groups(self) -> bool:  # type: ignore[override]
        """The baseline is the prompt's group under every adv_norm but batch-mean-batch-std
        and no-baseline."""
        return self.adv_norm not in ("batch-mean-batch-std", "no-baseline")

    def __post_init__(self) -> None:
        check_field(self, "clip_eps_low", 0.0 <= self.clip_eps_low < 1.0, "0 <= value < 1")
        check_field(self, "clip_eps_high", self.clip_eps_high >= 0.0, "a number >= 0")
        check_field(self, "kl_coef", self.kl_coef >= 0.0, "a number >= 0")
        check_field(self, "kl_estimator", self.kl_estimator in KL_ESTIMATORS, f"one of {list(KL_ESTIMATORS)}")
        check_field(self, "kl_importance_weight", isinstance(self.kl_importance_weight, bool), "true or false")
        check_adv_norm(self)
        check_field(self, "adv_eps", self.adv_eps > 0.0, "a number > 0")
        check_field(self, "overlong_filter", isinstance(self.overlong_filter, bool), "true or false")
        check_loss_fields(self)

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Group-relative advantage of each sequence, copied onto each of its response
        tokens (outcome supervision, arXiv:2402.03300 Sec. 4.1.2); 0 off the response.
        With overlong_filter, also the response mask without the truncated rows, which is
        then the mask the loss reads: their advantages are 0 and so is their every loss term."""
        adv_seq = sequence_advantages(batch, self.adv_norm, self.adv_eps)  # (B,)
        if not self.overlong_filter:
            return {"advantages": adv_seq[:, None] * batch.response_mask}  # (B, T)
        mask = without_truncated_rows(batch.response_mask, batch.truncated)  # (B, T)
        return {"advantages": adv_seq[:, None] * mask, "response_mask": mask}

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """clipped surrogate + kl_coef · agg(KL(π_θ ‖ π_ref)) − entropy_coef · agg(H), all
        aggregated over response tokens with `loss_agg`. The surrogate trains the tokens
        `token_selection` keeps (all by default), with KL-Cov's penalty added and its clip off."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        picked = self.token_selection.select(outputs.logp, batch.old_logp, adv, outputs.entropy, mask,
                                             self.clip_eps_low, self.clip_eps_high, batch.tokens)
        # KL-Cov replaces PPO's clip with its penalty (arXiv:2505.22617, verl's kl_cov): [1 − 1, ∞) clips nothing
        eps_low, eps_high = (1.0, math.inf) if picked.unclipped else (self.clip_eps_low, self.clip_eps_high)
        pg_loss, metrics = clipped_surrogate(
            outputs.logp,
            batch.old_logp,
            adv * picked.keep,  # (B, T) a dropped token's loss and gradient are 0 (entropy_control.py)
            mask,
            eps_low=eps_low,
            eps_high=eps_high,
            agg=self.loss_agg,
            max_len=self.max_len,
        )
        if picked.penalty is not None:  # KL-Cov's kl_coef · |log ratio| on the top-covariance tokens
            pg_loss = pg_loss + agg_loss(picked.penalty, mask, self.loss_agg, self.max_len)
        loss = pg_loss
        metrics = {"pg_loss": pg_loss.item(), **metrics, **picked.metrics}

        # The loss term uses `loss_agg`; the logged kl is a plain per-token mean, so it reads
        # the same whatever the aggregation.
        if self.kl_coef > 0:
            if batch.ref_logp is None:
                raise ValueError("GRPO with kl_coef > 0 needs batch.ref_logp; run the reference role first")
            kl_mat = kl_estimate(outputs.logp, batch.ref_logp, self.kl_estimator)  # (B, T)
            if self.kl_importance_weight:  # × π_θ/π_old, with its gradient (where its value is 1 too)
                kl_mat = kl_mat * importance_ratio(outputs.logp, batch.old_logp, mask)[1]  # (B, T)
            kl = agg_loss(kl_mat, mask, self.loss_agg, self.max_len)
            loss = loss + self.kl_coef * kl  # the + β·KL term of Eq. 3, a loss, not a reward penalty
            metrics["kl"] = masked_mean(kl_mat.detach(), mask).item()
        loss, tail = self.loss_tail(loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        return loss, {**metrics, **tail}
