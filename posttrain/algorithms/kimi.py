"""Kimi k1.5's policy loss: online policy mirror descent with a mean-reward baseline
(Kimi Team, "Kimi k1.5: Scaling Reinforcement Learning with LLMs", arXiv:2501.12599, Sec. 2.3.2).

Background. Each iteration i keeps the policy close to the one that sampled the batch,
π_i = π_old, by a KL penalty of weight τ:

    max_θ  E_{y ~ π_θ}[ r(x, y) ] − τ · KL(π_θ(· | x) ‖ π_i(· | x))

whose solution is π*(y | x) = π_i(y | x) · exp(r(x, y) / τ) / Z. Taking logs, for ANY
response y (sampled by any policy, so off-policy data is allowed):

    r(x, y) − τ log Z = τ · log( π*(y | x) / π_i(y | x) )

Kimi makes this equality a squared loss on the samples of π_i, with τ log Z replaced by
the mean reward r̄ of the k samples of x (the report finds it works in practice; it is the
limit of τ log Z as τ → ∞):

    L(θ) = E[ ( r − r̄ − τ · ℓ )² ],    ℓ = log π_θ(y | x) − log π_i(y | x) = Σ_t (log π_θ − log π_old)

Its gradient (the report's Eq. 3, negated to be minimised), with A = r − r̄:

    ∇ [ 1/(2τ) (A − τ ℓ)² ] = −A ∇ℓ + τ ℓ ∇ℓ = −A ∇ log π_θ(y) + ∇ (τ/2 · ℓ²)

so the loss used here is the same function less its constant A²/(2τ):

    loss_i = −A_i · ℓ_i + τ/2 · ℓ_i²

The first term is REINFORCE's −A · log π(y) with the group-mean baseline (∇ℓ = ∇ log π_θ,
and ℓ = 0 at θ = θ_old); the second is an ℓ2 penalty on how far the sequence's log-prob
has moved since sampling. This file is exactly that diff on REINFORCE: the baseline fixed
to the group mean, and + τ/2 · ℓ² per sequence. No ratio, no clip, no critic; the mean
baseline with no division by a std (unlike GRPO).

When the squared term acts. At the first gradient of a batch, π_θ = π_old and ℓ = 0: the
update is REINFORCE's exactly. From the second minibatch or epoch on (rl.update.minibatches,
rl.update.epochs), or when the sampler is not the trained policy (int8 sampling, async rollouts),
ℓ ≠ 0 and it pulls each sequence back towards π_old with force τ ℓ, whatever its
advantage. So a row whose advantage is 0 is NOT inert here.

Conventions: ℓ is the whole sequence's log-ratio (the report's log π(y, z | x) is of the
whole chain of thought and answer), so the loss is one term per sequence, averaged over
sequences (loss_agg "seq-mean-token-sum"). The report does not state τ; the default 0.01
is OpenKimi's PMD-mean setting (Xu et al., arXiv:2602.05933) for 0/1 rewards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.contract import check_field, require_advantages
from posttrain.algorithms.core import importance_ratio, masked_mean, masked_sum, ratio_metrics
from posttrain.algorithms.reinforce import REINFORCE
from posttrain.types import PolicyOutputs, RolloutBatch


def kimi_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              tau: float) -> tuple[torch.Tensor, dict[str, float]]:
    """mean_i( −A_i ℓ_i + τ/2 ℓ_i² ), ℓ_i = Σ_t mask · (logp − old_logp): Kimi k1.5's squared
    loss 1/(2τ) (A_i − τ ℓ_i)² less its constant A_i²/(2τ) (same gradient, 0 at θ = θ_old).

    Args:
        logp:     (B, T) log π_θ(token | prefix), differentiable.
        old_logp: (B, T) log π_old(token | prefix) at sampling time, a constant.
        adv:      (B, T) the sequence's advantage r − r̄ on each of its response tokens.
        mask:     (B, T) response mask. A row with no response tokens has ℓ = A = 0 and adds 0.
        tau:      τ > 0, the weight of the KL to π_old the loss came from.

    Returns (loss, metrics): pg_loss (the −A ℓ term's mean), sq_loss (the τ/2 ℓ² term's),
    seq_log_ratio (mean ℓ) and seq_log_ratio_abs (mean |ℓ|) of the sequences."""
    log_ratio, _ = importance_ratio(logp, old_logp, mask)  # (B, T), 0 off the response, clamped
    ell = masked_sum(log_ratio, mask, dim=-1)  # (B,) log π_θ(y) − log π_old(y)
    adv_seq = masked_mean(adv, mask, dim=-1)  # (B,) the advantage every response token carries
    pg = -adv_seq * ell  # (B,)
    sq = 0.5 * tau * ell**2  # (B,)
    loss = (pg + sq).mean()
    with torch.no_grad():
        metrics = {"pg_loss": pg.mean().item(), "sq_loss": sq.mean().item(),
                   "seq_log_ratio": ell.mean().item(), "seq_log_ratio_abs": ell.abs().mean().item()}
    return loss, metrics


@dataclass
class Kimi(REINFORCE):
    """REINFORCE with the group-mean baseline plus τ/2 · (log π_θ(y) − log π_old(y))² per sequence."""

    name: ClassVar[str] = "kimi"
    # τ/2 · ℓ² pulls on every row once π_θ has moved from π_old, advantage 0 or not
    zero_advantage_rows_are_inert: ClassVar[bool] = False
    needs_groups: ClassVar[bool] = True  # r̄ is the mean of the prompt's own k samples
    # ℓ is the whole row's log-ratio: a row cut from one turn of an episode would be a turn's
    accepts_turn_rows: ClassVar[bool] = False
    BASELINES: ClassVar[tuple[str, ...]] = ("group_mean",)

    baseline: str = "group_mean"  # r̄ = mean(r_1..r_k) in place of τ log Z (Sec. 2.3.2)
    # the report states no τ; OpenKimi's PMD-mean recipe uses 0.01 with 0/1 rewards. Smaller
    # lets a sequence's log-prob move further from π_old (its optimum is ℓ = A / τ)
    tau: float = 0.01
    loss_agg: str = "seq-mean-token-sum"  # one term per sequence, on log π(y) = Σ_t log π(y_t)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field(self, "tau", self.tau > 0, "a number > 0 (the KL weight τ; 0 would divide the loss by 0)")
        check_field(self, "loss_agg", self.loss_agg == "seq-mean-token-sum",
                    "'seq-mean-token-sum': the loss is one square per sequence, of log π(y) = Σ_t log π(y_t)")

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """mean_i( −A_i ℓ_i + τ/2 ℓ_i² ) − entropy_coef · agg(H)."""
        adv = require_advantages(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        loss, metrics = kimi_loss(outputs.logp, batch.old_logp, adv, mask, self.tau)
        loss, tail = self.loss_tail(loss, outputs, batch)  # entropy bonus, entropy and advantage metrics
        log_ratio, ratio = importance_ratio(outputs.logp.detach(), batch.old_logp, mask)
        return loss, {**metrics, **ratio_metrics(log_ratio, ratio, mask), **tail}
