"""The self-critique reward term: the production rubric (Accuracy, Relevance, Completeness,
Clarity, Helpfulness) scored by a judge model, as one term of the reward stack.

Kimi K2 (arXiv:2507.20534, Sec. 3.2) trains verifiable and open-ended tasks in one RL run: a
checker pays where one exists, and the model critiques its own answers against a rubric where
none does. Here that is

    --rl.reward.terms "accuracy + 0.2*self_critique"          (rl.reward.judge: who critiques)

    reward = 1.0 · verifier + 0.2 · Σ_c w_c · judge_c(answer) / Σ_c w_c        (w_c = 1 each)

where judge_c is `rewards/judge.py`'s soft label for criterion c. The term is the rubric
`self_critique_rubric(judge)` builds; this module only chooses the judge and the judge's
question for the model at hand, and holds the term's place in a stack before the policy exists.

Which judge (rl.reward.judge):
    "policy"      the weights being trained, judging their own samples (Kimi's self-critique).
                  The same module object: every step judges with the step's weights.
    a directory   a frozen judge: a gpt_mini checkpoint, a transformers directory, "smollm2-135m".

Which question, by the judge's tokenizer:
    a character-level tokenizer (gpt_mini)   the compact prompt with the Y/N verdict
        (judge.py's COMPACT_JUDGE_PROMPT, CORRECT_YN): "Y" and "N" are one character, so one token,
        and that prompt is the one judge demonstrations (--sft.judge_demos) teach. The full
        prompt is 232 characters before the answer on "Q: 9+8+3+2+7" and gpt_mini holds 96
        positions, so every judgement would be refused as too long. The compact prompt does not print the criterion: on gpt_mini the
        five criteria ask one question ("Correct?") and score alike.
    any other tokenizer                       the full prompt, one per criterion, with the
        1..5 digit scale (FIVE_POINT): each digit is one token of a BPE tokenizer.
A judge whose tokenizer cannot write its scale's labels as single tokens is refused when the
term is built, with the judge to pass instead.
"""

from __future__ import annotations

from typing import Any

from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.models.policy import Policy
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.judge import (COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, FIVE_POINT, JUDGE_PROMPT_VERSION,
                                     PRODUCTION_CRITERIA, Judge, LabelScale, judge_prompt_ids, self_critique_rubric)
from posttrain.rewards.rubric import Rubric
from posttrain.rewards.stack import Scored
from posttrain.types import Example, Tokenizer

POLICY_JUDGE = "policy"  # rl.reward.judge's value for the policy judging itself


def critique_question(tokenizer: Tokenizer) -> tuple[LabelScale, str]:
    """The scale and the JUDGE_PROMPTS key a judge with `tokenizer` is asked (the module's rule)."""
    if isinstance(tokenizer, CharTokenizer):
        return CORRECT_YN, COMPACT_JUDGE_PROMPT_VERSION
    return FIVE_POINT, JUDGE_PROMPT_VERSION


def critique_judge(model: Policy, tokenizer: Tokenizer, source: str, min_label_mass: float = 0.25) -> Judge:
    """A Judge for `model` with the question its tokenizer can read; ValueError naming the
    judge to pass when the scale's labels are not single tokens."""
    scale, prompt = critique_question(tokenizer)
    try:
        return Judge(model, tokenizer, scale, min_label_mass=min_label_mass, source=source, prompt=prompt)
    except ValueError as error:
        raise ValueError(f"the judge {source!r} cannot give the self_critique verdict: {error}. Pass a judge whose "
                         "tokenizer writes each digit 1-5 as one token (a transformers model such as smollm2-135m: "
                         "--rl.reward.judge smollm2-135m) or a gpt_mini checkpoint (Y/N)") from None


def longest_critique(tokenizer: Tokenizer, example: Example, response_tokens: int) -> int:
    """Tokens the judge reads to critique a response of `response_tokens` tokens to `example`:
    the longest of the five criteria's prompts (the response stood in by an empty one, its
    tokens added), + 1 for the verdict. More than the judge's positions, and every such
    judgement scores 0 as too long."""
    scale, prompt = critique_question(tokenizer)
    return max(len(judge_prompt_ids(tokenizer, scale, name, question, example, "", prompt))
               for name, question in PRODUCTION_CRITERIA.items()) + response_tokens + 1


class SelfCritique:
    """The RewardTerm "self_critique": the production rubric scored by a judge. With the
    policy as judge the term is made before the policy exists (a run's settings are checked
    first) and given the policy by `judged_by`; an unjudged term refuses to score."""

    name = "self_critique"

    def __init__(self, source: str, rubric: Rubric | None = None) -> None:
        """`source`: rl.reward.judge ("policy" or the judge's name); `rubric`: the production
        rubric the judge scores, None until the policy is given."""
        self.source, self.rubric = source, rubric

    @classmethod
    def from_setting(cls, judge: str, min_label_mass: float = 0.25) -> SelfCritique:
        """rl.reward.judge's term: a judge model loaded now (a bad directory or scale fails
        before training), or the policy's place kept for `judged_by`."""
        if judge == POLICY_JUDGE:
            return cls(judge)
        try:
            directory = resolve_model_dir(judge)
            model, tokenizer = load_checkpoint_model(directory), load_tokenizer(directory)
        except (OSError, ValueError) as error:
            raise ValueError(f"the self_critique judge {judge!r} (rl.reward.judge) is not a model: {error}; give "
                             "'policy', a checkpoint directory, a transformers directory or 'smollm2-135m'") from None
        model.eval()  # a frozen judge: no dropout, and it never trains
        return cls(judge, self_critique_rubric(critique_judge(model, tokenizer, judge, min_label_mass)))

    def judged_by(self, policy: Policy, tokenizer: Tokenizer, min_label_mass: float = 0.25) -> SelfCritique:
        """This term with the policy as its judge; a term with its own judge model is returned as it is."""
        if self.source != POLICY_JUDGE:
            return self
        return SelfCritique(self.source, self_critique_rubric(critique_judge(policy, tokenizer, "policy",
                                                                             min_label_mass)))

    @property
    def spec(self) -> str:
        """The criteria and who judges: the same before and after the policy is given, so the
        reward_spec the checks print is the run's. The judge's prompt and scale are in each
        sample's details (term_details.self_critique.rubric_spec)."""
        return f"{self.name}(" + ",".join(f"{name}:1" for name in PRODUCTION_CRITERIA) + f") by {self.source}"

    def __call__(self, example: Example, completion: str, scored: Scored) -> Scored:
        if self.rubric is None:
            raise RuntimeError("the self_critique term has no judge yet: with rl.reward.judge 'policy' the RL stage "
                               "gives it the policy (pipelines/build.py::reward_stack(rl, policy, tokenizer))")
        return self.rubric.score(example, completion)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with a multi-turn agent loop to rollout workers: a frozen judge travels with
        it; the policy does not, as a worker's copy would judge with stale weights."""
        if self.source == POLICY_JUDGE and self.rubric is not None:
            raise ValueError("the self_critique term with the policy as judge cannot go to a rollout worker: the "
                             "worker's copy of the policy would judge with stale weights; use --dist.topology "
                             "colocated, or a frozen judge (--rl.reward.judge DIRECTORY)")
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"<SelfCritique {self.spec}>"
