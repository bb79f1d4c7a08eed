"""Teacher: a frozen model that scores the student's own samples (on-policy distillation,
algorithms/opd.py).

It is the reference role pointed at other weights: a `Reference` (a frozen copy, its log-probs
of the batch's response tokens by `Reference.logp`) holding the teacher's checkpoint instead
of the student's starting one. It runs as a step hook before the advantages, as PRIME's
process rewards do, and writes on the batch

    teacher_logp       (B, T)     log π_T of each sampled token (Reference.logp)
    teacher_topk_logp  (B, T, k)  with topk > 0: the teacher's k likeliest next tokens at each
    teacher_topk_ids   (B, T, k)  response position and their log-probs (one forward for all three)

and logs the KL from the sampler to the teacher on the sampled tokens, `teacher_kl` (k3:
unbiased and never negative) and `teacher_kl_k1` (the plain log-ratio's mean): the number
on-policy distillation drives toward 0.

The teacher may be larger than the student (another gpt_mini shape, another model), but it
must read the same token ids: `check_same_tokenizer` refuses one that does not, before the run.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.algorithms.core import kl_k3, masked_mean
from posttrain.config import ConfigError
from posttrain.models import load_checkpoint_model
from posttrain.models.device import model_device, place
from posttrain.models.logprobs import response_topk
from posttrain.models.policy import Policy
from posttrain.roles.hooks import StepHook
from posttrain.roles.reference import Reference
from posttrain.types import RolloutBatch, Tokenizer


class TeacherScores(StepHook):
    """The teacher's scores of every sampled token, on the batch before its advantages."""

    # a frozen model's forward over the batch, as the reference's is: counted in time/reference, where
    # the step's time equation (systems/throughput.py) reads the frozen passes
    timing = "reference"

    def __init__(self, teacher: Reference, topk: int = 0):
        self.teacher = teacher
        self.topk = topk  # 0: the sampled tokens only (k1, k3); k: also the teacher's k likeliest (top-k KL)

    def before_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        if self.topk:
            batch.teacher_logp, batch.teacher_topk_logp, batch.teacher_topk_ids = response_topk(
                self.teacher.model, batch, self.topk, self.teacher.share_prompt)
        else:
            batch.teacher_logp = self.teacher.logp(batch)  # (B, T)
        mask = batch.response_mask  # (B, T)
        return {"teacher_kl": masked_mean(kl_k3(batch.old_logp, batch.teacher_logp), mask).item(),
                "teacher_kl_k1": masked_mean(batch.old_logp - batch.teacher_logp, mask).item()}


def make_teacher(policy: Policy, directory: Path, topk: int = 0, share_prompt: bool = True) -> TeacherScores:
    """The teacher at `directory` (a checkpoint, loaded in its own shape: it may be larger than
    the student), frozen, placed where the policy is and in its precision. `topk` is capped at
    the teacher's vocabulary."""
    model = load_checkpoint_model(directory)  # on the CPU in float32, then moved beside the policy
    vocabulary = model.lm_head.weight.shape[0]
    return TeacherScores(Reference(place(model, model_device(policy), policy.compute_dtype), share_prompt),
                         min(topk, vocabulary))


def token_table(tokenizer: Tokenizer) -> tuple:
    """What two tokenizers must share for one model's log-probs to score the other's tokens:
    the special ids and the text of every id, in order."""
    return (tokenizer.bos_id, tokenizer.eos_id,
            tuple(tokenizer.decode([i], skip_special_tokens=False) for i in range(len(tokenizer))))


def check_same_tokenizer(student: Tokenizer, teacher: Tokenizer, setting: str, value: str) -> None:
    """ConfigError naming `setting`=`value` unless the teacher's tokenizer is the student's:
    the teacher scores the student's token ids, and under another vocabulary an id is another
    piece of text, so its log-probs would be those of a different sample."""
    if token_table(student) == token_table(teacher):
        return
    differing = next((i for i in range(min(len(student), len(teacher)))
                      if student.decode([i], skip_special_tokens=False) != teacher.decode([i], skip_special_tokens=False)),
                     None)
    first = ("" if differing is None else
             f"; token {differing} is {student.decode([differing], skip_special_tokens=False)!r} to the student and "
             f"{teacher.decode([differing], skip_special_tokens=False)!r} to the teacher")
    raise ConfigError(f"{setting}={value!r} is not allowed: the teacher's tokenizer is not the student's (vocabulary "
                      f"{len(teacher)} against {len(student)}, eos id {teacher.eos_id} against {student.eos_id}"
                      f"{first}). On-policy distillation scores the student's token ids under the teacher, so both "
                      "must share one tokenizer: pick a teacher of the student's model family (for gpt_mini, a "
                      "gpt_mini checkpoint)")
