"""Self-rewarding (Yuan et al. 2024, "Self-Rewarding Language Models", arXiv:2401.10020): the
policy judges its own samples, and its verdicts alone rank them into preference pairs.

The paper's loop, per iteration t: the model M_t samples N responses to new prompts, scores
each one itself with an LLM-as-a-judge prompt (its own "AI feedback", Sec. 2.2), and the
highest- against the lowest-scored response of a prompt becomes a DPO pair (ties dropped);
M_{t+1} is M_t trained by DPO on those pairs. The model is taught to judge beforehand by
"evaluation fine-tuning" (EFT) data, judgements mixed into its SFT (Sec. 2.1).

Here the judge is `rewards/judge.py`'s `Judge` wrapped around the policy itself (the same
module object, so it judges with the weights being trained), reading its verdict as a soft
label from the next-token distribution, and the scorer has the contract every ranker has,
`score(example, completion) -> {reward, details}`, so the preference stage ranks with it
exactly as it ranks with a reward model (`ProxyReward`, rl.rm.path). The verifier still
scores every sample, but only into details["gold_reward"]: it never chooses a pair, and is
kept to measure how often the judge agrees with it (eval/ranker_agreement.py).

On gpt_mini the judge reads the compact prompt (judge.py: COMPACT_JUDGE_PROMPT, "Q: ...\\n"
+ the sample + "\\nCorrect? ") and answers Y or N (CORRECT_YN), which SFT's judge
demonstrations teach it (data/judge_demos.py). Every judge reads that prompt, so that what
the judge demonstrations train is what the stage asks.
"""

from __future__ import annotations

from typing import Callable

from posttrain.models.policy import Policy
from posttrain.rewards.judge import COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, Judge
from posttrain.types import Example, Tokenizer
from posttrain.rewards.stack import Scored


# the criterion the compact prompt stands for (it does not print it; a longer prompt would)
SELF_JUDGE_CRITERION = ("Correctness", "Is every step of the answer right, its final answer included?")


def self_judge(policy: Policy, tokenizer: Tokenizer, min_label_mass: float = 0.25) -> Judge:
    """The policy as its own judge: the compact prompt, a Y/N verdict (its probability of Y
    is the score), the same module object, so later rounds judge with the trained weights."""
    return Judge(policy, tokenizer, CORRECT_YN, min_label_mass=min_label_mass, source="policy",
                 prompt=COMPACT_JUDGE_PROMPT_VERSION)


class SelfJudgeReward:
    """Rank by the judge's verdict; keep the verifier's alongside, as the gold, to measure it.

        {"reward": the judge's score in [0, 1] (P(Y) renormalised over Y and N),
         "details": {..the verifier's details..,
                     "gold_reward": verifier reward, "judge_reward": the same score,
                     "judge_label_mass": the judge's probability on Y and N together,
                     "judge_reason": its soft label or why it failed, "reward_source": "self_judge"}}

    A judgement that failed (too long for the model, too little mass on the labels) scores 0,
    as in every Judge, and says so in judge_reason."""

    def __init__(self, judge: Judge, gold: Callable[[Example, str], Scored]) -> None:
        self.judge = judge  # the policy (or any model) as a Judge
        self.gold = gold  # the environment's verifier: recorded, never ranks

    def __call__(self, example: Example, completion: str) -> Scored:
        gold = self.gold(example, completion)
        (judgement,) = self.judge.rate(*SELF_JUDGE_CRITERION, [example], [completion])
        details = {**gold["details"], "gold_reward": float(gold["reward"]), "judge_reward": judgement.score,
                   "judge_label_mass": judgement.label_mass, "judge_reason": judgement.reason,
                   "reward_source": "self_judge"}
        return {"reward": judgement.score, "details": details}

    score = __call__
