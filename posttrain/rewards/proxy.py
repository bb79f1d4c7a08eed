"""A learned reward with the verifier watching: train on a reward model's score, keep the
verifier's verdict beside it as the gold reward.

`ProxyReward` has the scorer contract `score(example, completion) -> {reward, details}`, so
it plugs into the RL loop wherever a verifier does (`rl.rm.path`). Its reward is r_φ; its
details are the verifier's own (so `details["reason"]`, the RL stage's `pass_rate`, and
held-out pass@1 stay the verifier's) plus `gold_reward` and `proxy_reward`: the two curves
whose divergence is reward over-optimisation (Gao, Schulman & Hilton 2022). Several
reward-model directories make an ensemble (rewards/ensemble.py), each member's score kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from posttrain.models import load_tokenizer
from posttrain.rewards.ensemble import RewardEnsemble
from posttrain.rewards.equivalence_judge import CHECKER_NAME, EquivalenceChecker
from posttrain.rewards.reward_model import RewardModelScorer, load_reward_model, reward_model_info
from posttrain.types import Example
from posttrain.rewards.stack import Scored



class ProxyReward:
    """Train on a reward model's score; keep the verifier's verdict alongside as the gold.

        {"reward": r_φ(x, y),
         "details": {..the verifier's details (reason, parsed answer, ...)..,
                     "gold_reward": verifier reward, "proxy_reward": r_φ(x, y),
                     "reward_source": "reward_model", "truncated": bool}}
    """

    def __init__(self, scorer: RewardModelScorer | RewardEnsemble | EquivalenceChecker,
                 gold: Callable[[Example, str], Scored]) -> None:
        self.scorer = scorer
        self.gold = gold  # the environment's verifier

    @classmethod
    def load(cls, directory: str | Path, gold: Callable[[Example, str], Scored]) -> ProxyReward:
        """One saved reward model; an ensemble: ProxyReward(load_reward_scorer(paths, ...), gold)."""
        return cls(load_reward_scorer([directory]), gold)

    def __call__(self, example: Example, completion: str) -> Scored:
        gold = self.gold(example, completion)
        proxy = self.scorer.score(example, completion)
        details = {**gold["details"], "gold_reward": float(gold["reward"]), "proxy_reward": proxy["reward"],
                   "reward_source": "reward_model", "truncated": proxy["details"]["truncated"]}
        if "member_rewards" in proxy["details"]:  # an ensemble: each member's score and their spread
            details.update(member_rewards=proxy["details"]["member_rewards"], member_std=proxy["details"]["member_std"])
        return {"reward": proxy["reward"], "details": details}

    score = __call__


def load_reward_scorer(paths: Sequence[str | Path], ensemble: str = "mean",
                       disagreement_coef: float = 1.0) -> RewardModelScorer | RewardEnsemble | EquivalenceChecker:
    """A scorer from rl.rm.paths(): one reward-model directory, or several combined by
    `ensemble` (rewards/ensemble.py). One directory `posttrain equivalence` wrote is Kimi's
    two-stage answer check (rewards/equivalence_judge.py): the rule, and its judge where the
    rule cannot parse."""
    members = []
    if len(paths) == 1 and reward_model_info(paths[0]).get("checker") == CHECKER_NAME:
        return EquivalenceChecker.load(paths[0])  # it loads its judge itself: read the info, not the weights, first
    for directory in paths:
        model, _ = load_reward_model(directory)
        try:
            tokenizer = load_tokenizer(Path(directory))
        except FileNotFoundError:  # saved without its tokenizer: gpt_mini's characters
            tokenizer = None
        members.append(RewardModelScorer(model, tokenizer))
    return members[0] if len(members) == 1 else RewardEnsemble(members, ensemble, disagreement_coef)
