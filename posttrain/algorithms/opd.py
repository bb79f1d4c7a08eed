"""OPD: on-policy distillation. The student samples, a frozen teacher scores every token of
the student's own samples, and the student is pulled toward the teacher on its own text.

Background. SFT on a teacher's text (off-policy distillation) trains the student on prefixes
it would never write itself; RL on a verifier's 1/0 gives one bit per sample. On-policy
distillation takes the states from the student (its samples, as in RL) and the signal from
the teacher, dense: one number per token (Agarwal et al., GKD, arXiv:2306.13649; Lu and
Thinking Machines Lab, "On-Policy Distillation", 2025). Two forms of that number:

  reverse KL, per sampled token (divergence "k1" or "k3"). KL(π ‖ π_T) estimated on the
  token the student drew, with the estimators of a KL penalty (algorithms/core.py),

      k1_t = log π_old(y_t) − log π_T(y_t)              k3_t = r − log r − 1,  r = π_T / π_old

  and its negative used as the token's advantage, A_t = −k_t: a token the teacher finds
  likelier than the student did is pushed up, one it finds unlikely is pushed down, and no
  credit flows to earlier tokens (discount 0). The loss is GRPO's clipped surrogate on those
  advantages. Thinking Machines and prime-rl use k1 (prime-rl's ref_kl loss: the teacher's
  minus the trainer's log-prob as the per-token advantage); verl's distillation losses offer
  k1 and k3 (as a policy-gradient reward, or backpropagated directly).

  forward KL on the teacher's top k (divergence "topk"). At each position of the student's
  sample, the teacher's k likeliest next tokens S_t with their log-probs, and

      L_t = Σ_{v ∈ S_t} p_T(v) (log p_T(v) − log π_θ(v))

  minimised directly (supervised, verl's forward_kl_topk). Both log-probs are normalised over
  the whole vocabulary, so the k terms do not sum to a KL: L_t can go below 0 when the
  student puts more mass on S_t than the teacher does, and is then clamped to 0, as verl
  does. k log-probs per position instead of V: the teacher's memory is k × T per row.

Either form may add the task's reward: `reward_weight` × GRPO's group advantage on every
token (A_t = −k_t + w · Â_i), or, under "topk", w × GRPO's clipped surrogate on Â_i.

Pseudocode, one step (the controller, the teacher hook and the trainer do the plumbing):

    sample G responses per prompt from π_old; score them           -> batch.rewards
    teacher scores the same tokens (roles/teacher.py)              -> batch.teacher_logp (+ top k)
    advantages = −k(old_logp, teacher_logp) + w · group_adv         # compute_advantages
    loss = clipped surrogate (+ top-k forward KL) − entropy_coef · H # compute_loss

The teacher is any local model with the student's tokenizer (`teacher`: a checkpoint, a run
directory, or a model name), loaded once and frozen; pipelines/checks.py refuses one whose
tokenizer differs, since its log-probs would score other tokens than the student's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.core import agg_loss, clipped_surrogate, kl_estimate, masked_mean
from posttrain.algorithms.grpo import GRPO, group_advantages, without_truncated_rows
from posttrain.types import PolicyOutputs, RolloutBatch

DIVERGENCES = ("k1", "k3", "topk")
# The floor under both sides' top-k log-probs before the forward KL: a token the student gives
# e^-30 would otherwise weigh 30 nats × p_T in one term. verl's log_prob_min_clamp default.
TOPK_MIN_LOGP = -10.0


def reverse_kl_per_token(logp: torch.Tensor, teacher_logp: torch.Tensor, estimator: str,
                         clip: float) -> torch.Tensor:
    """KL(π ‖ π_teacher) estimated on each sampled token, (B, T): k1 = log π − log π_T, or k3
    (core.kl_k3, r = π_T / π). Clamped to [−clip, clip] when clip > 0: one token the teacher
    finds all but impossible must not outweigh the rest of the batch (verl's loss_max_clamp)."""
    kl = kl_estimate(logp, teacher_logp, estimator)  # (B, T)
    return kl.clamp(-clip, clip) if clip > 0 else kl


def topk_forward_kl(logp_at_topk: torch.Tensor, teacher_topk_logp: torch.Tensor, clip: float,
                    min_logp: float = TOPK_MIN_LOGP) -> torch.Tensor:
    """Σ over the teacher's top k of p_T (log p_T − log π), per position, (B, T).

    logp_at_topk (B, T, k): log π_θ of the teacher's top-k tokens; teacher_topk_logp (B, T, k):
    log π_T of the same tokens. Each is floored at `min_logp`; the sum is clamped at 0 below
    (a truncated sum is not a KL and goes negative when the student holds more of the top-k
    mass than the teacher) and at `clip` above when clip > 0."""
    student = logp_at_topk.clamp_min(min_logp)  # (B, T, k)
    teacher = teacher_topk_logp.clamp_min(min_logp)  # (B, T, k)
    kl = (teacher.exp() * (teacher - student)).sum(dim=-1).clamp_min(0.0)  # (B, T)
    return kl.clamp_max(clip) if clip > 0 else kl


def require_teacher_logp(batch: RolloutBatch) -> torch.Tensor:
    if batch.teacher_logp is None:
        raise ValueError("OPD needs batch.teacher_logp, the teacher's log-probs of the sampled tokens: the teacher "
                         "hook (roles/teacher.py::TeacherScores) fills it before compute_advantages")
    return batch.teacher_logp


@dataclass
class OPD(GRPO):
    """On-policy distillation: the teacher's per-token log-probs as the student's signal."""

    name: ClassVar[str] = "opd"
    # the teacher gives nearly every token an advantage of its own, so a row of zeros is rare (a
    # teacher equal to the student), and under "topk" the KL pulls on every row whatever its advantage
    zero_advantage_rows_are_inert: ClassVar[bool] = False
    # advantages run along the row, token by token, not one episode number copied onto each turn's row
    accepts_turn_rows: ClassVar[bool] = False

    # the teacher: a checkpoint directory (runs/<id>/checkpoints/<stage>/step_N), a run directory
    # (its last checkpoint) or a model name, with the student's tokenizer. Required: empty is
    # refused before the run (pipelines/checks.py), so a default instance can still be built
    teacher: str = ""
    # what pulls the student to the teacher: "k1" (Thinking Machines', prime-rl's: the per-token
    # log-ratio as the advantage), "k3" (its non-negative estimator, verl's default) or "topk"
    # (the forward KL on the teacher's top k, backpropagated; verl's forward_kl_topk)
    divergence: str = "k1"
    topk: int = 32  # the teacher's tokens per position under "topk": verl's Qwen3-0.6B example's 32
    kl_clip: float = 10.0  # |per-token divergence| ≤ kl_clip (verl's loss_max_clamp); 0 = no clamp
    # weight of the task's reward, as GRPO's group advantage, beside the teacher's signal. 0: pure
    # distillation (Thinking Machines', prime-rl's); the verifier's reward is still logged
    reward_weight: float = 0.0
    # every token's own advantage, averaged over the batch's tokens (verl's default aggregation):
    # a per-token signal needs no per-sequence normalisation
    loss_agg: str = "token-mean"

    @property
    def needs_groups(self) -> bool:  # type: ignore[override]
        """A group baseline only for the task reward's share of the advantage."""
        return self.reward_weight > 0 and super().needs_groups

    def __post_init__(self) -> None:
        super().__post_init__()
        check_field(self, "teacher", isinstance(self.teacher, str), "a checkpoint directory, run directory or model name")
        check_field(self, "divergence", self.divergence in DIVERGENCES, f"one of {list(DIVERGENCES)}")
        check_field(self, "topk", isinstance(self.topk, int) and self.topk >= 1, "an int >= 1")
        check_field(self, "kl_clip", self.kl_clip >= 0.0, "a number >= 0 (0 = no clamp)")
        check_field(self, "reward_weight", self.reward_weight >= 0.0, "a number >= 0")

    def teacher_settings(self) -> dict | None:
        """The teacher the pipeline loads beside the policy: roles/teacher.py::make_teacher's
        `topk` (0: the sampled tokens' log-probs only) and the directory or name it reads."""
        return {"teacher": self.teacher, "topk": self.topk if self.divergence == "topk" else 0}

    @torch.no_grad()
    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """A_t = −k(old_logp, teacher_logp)_t (0 under "topk", whose signal is in the loss)
        + reward_weight · GRPO's group advantage; 0 off the response (and, with
        overlong_filter, on the truncated rows, whose mask is returned too)."""
        teacher_logp = require_teacher_logp(batch)  # (B, T)
        mask = (without_truncated_rows(batch.response_mask, batch.truncated) if self.overlong_filter
                else batch.response_mask)  # (B, T)
        adv = torch.zeros_like(batch.old_logp)  # (B, T)
        if self.divergence != "topk":
            adv = -reverse_kl_per_token(batch.old_logp, teacher_logp, self.divergence, self.kl_clip)  # (B, T)
        if self.reward_weight > 0:
            adv_seq = group_advantages(batch.rewards, batch.group_ids, self.adv_norm, self.adv_eps,
                                       batch.row_weights)  # (B,)
            adv = adv + self.reward_weight * adv_seq[:, None]
        out = {"advantages": adv * mask}
        return {**out, "response_mask": mask} if self.overlong_filter else out

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO's loss on the advantages (the clipped surrogate, a KL term to the reference
        if kl_coef > 0, the entropy bonus), plus under "topk" agg(top-k forward KL)."""
        # under "topk" without the task reward every advantage is 0, and so is the surrogate (exactly)
        loss, metrics = super().compute_loss(outputs, batch)
        if self.divergence == "topk":
            loss, metrics = self.add_topk_kl(loss, metrics, outputs, batch)
        return loss, metrics

    def add_topk_kl(self, loss: torch.Tensor, metrics: dict[str, float], outputs: PolicyOutputs,
                    batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if outputs.teacher_topk_logp is None or batch.teacher_topk_logp is None:
            raise ValueError("OPD's divergence='topk' needs the teacher's top-k log-probs on the batch "
                             "(batch.teacher_topk_logp, teacher_topk_ids: roles/teacher.py::TeacherScores with topk "
                             "> 0) and the student's at the same tokens (PolicyOutputs.teacher_topk_logp: the "
                             "trainer's forward computes them when the batch carries teacher_topk_ids)")
        mask = batch.response_mask  # (B, T)
        kl_mat = topk_forward_kl(outputs.teacher_topk_logp, batch.teacher_topk_logp, self.kl_clip)  # (B, T)
        topk_kl = agg_loss(kl_mat, mask, self.loss_agg, self.max_len)
        # the mass the teacher's top k hold under each side: how much of the distribution the k terms see
        student_mass = masked_mean(outputs.teacher_topk_logp.detach().exp().sum(-1), mask).item()
        teacher_mass = masked_mean(batch.teacher_topk_logp.exp().sum(-1), mask).item()
        return loss + topk_kl, {**metrics, "topk_kl": masked_mean(kl_mat.detach(), mask).item(),
                                "topk_student_mass": student_mass, "topk_teacher_mass": teacher_mass}
