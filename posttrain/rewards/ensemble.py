"""Several reward models as one: the ensemble mitigation of reward hacking, and the learned
layer of the reward stack.

A single learned reward r_φ has errors the policy can find and farm. Models trained on
the same pairs from different seeds make different errors, so an exploit of one is
usually not an exploit of all of them (Coste et al. 2023, "Reward Model Ensembles Help
Mitigate Overoptimization", arXiv:2310.02743; Eisenstein et al. 2023, "Helping or
Herding?", arXiv:2312.09244). Three ways to combine M scores r_1 … r_M of one completion:

    mean              (1/M) Σ_m r_m                 averages the errors out
    min               min_m r_m                      worst case: pays only what every model agrees on
    mean-minus-std    mean − λ · std_m(r_m)          uncertainty-weighted: charges disagreement,
                                                     which is largest off the training distribution

(std is the population standard deviation over the M scores; λ is `disagreement_coef`.)
Coste et al. found worst-case and uncertainty-weighted optimisation hold the gold reward
up longer than a single model or the mean; Eisenstein et al. found that ensembles
pretrained alike share errors, so they reduce hacking without removing it.

`RewardEnsemble` has the scorer contract (`score(example, completion) -> {reward,
details}`) like each member, so it plugs in where one reward model does (rl.rm.path with
several directories). `LearnedReward` makes any such scorer a term of the reward stack
(rl.reward.terms "accuracy + 0.5*rm"): the verifiable reward stays, and the learned one is one
weighted layer on top of it, as in seed 000's production stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from posttrain.types import Example
from posttrain.rewards.stack import Scored

COMBINES = ("mean", "min", "mean-minus-std")


def mean_and_std(scores: list[float]) -> tuple[float, float]:
    """The mean of the members' scores and their population standard deviation."""
    mean = sum(scores) / len(scores)
    return mean, math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))


def combine_scores(scores: list[float], how: str = "mean", disagreement_coef: float = 1.0) -> float:
    """One reward from M members' scores of the same completion (module docstring)."""
    if not scores:
        raise ValueError("an ensemble needs at least one member's score")
    mean, std = mean_and_std(scores)
    if how == "mean":
        return mean
    if how == "min":
        return min(scores)
    if how == "mean-minus-std":
        return mean - disagreement_coef * std
    raise ValueError(f"how={how!r}: expected one of {', '.join(COMBINES)}")


class RewardEnsemble:
    """M scorers (reward models) combined by `how`; details keep every member's score."""

    def __init__(self, members: Sequence[Callable[[Example, str], Scored]], how: str = "mean",
                 disagreement_coef: float = 1.0) -> None:
        if not members:
            raise ValueError("a RewardEnsemble needs at least one member")
        if how not in COMBINES:
            raise ValueError(f"how={how!r}: expected one of {', '.join(COMBINES)}")
        if not (disagreement_coef >= 0 and math.isfinite(disagreement_coef)):
            raise ValueError(f"disagreement_coef={disagreement_coef!r}: expected a finite number >= 0")
        self.members, self.how, self.disagreement_coef = members, how, disagreement_coef
        self.spec_version = f"reward_ensemble/{how}-x{len(members)}"

    def score(self, example: Example, completion: str) -> Scored:
        results = [member(example, completion) for member in self.members]
        scores = [float(r["reward"]) for r in results]
        details = {"source": "reward_model", "spec_version": self.spec_version, "member_rewards": scores,
                   "member_std": mean_and_std(scores)[1],
                   "truncated": any(r["details"].get("truncated", False) for r in results)}
        return {"reward": combine_scores(scores, self.how, self.disagreement_coef), "details": details}

    __call__ = score


@dataclass(frozen=True)
class LearnedReward:
    """A learned scorer (a reward model or a RewardEnsemble) as a term of the reward stack:
    its score of the completion, with its details kept in details["term_details"]["rm"]."""

    scorer: Callable[[Example, str], Scored]
    name: str = "rm"

    @property
    def spec(self) -> str:
        return f"{self.name}({getattr(self.scorer, 'spec_version', 'reward_model')})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> Scored:
        return self.scorer(example, completion)
