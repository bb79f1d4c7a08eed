"""How far a learned ranker (a reward model, or the policy judging itself) agrees with the
verifier on the samples it ranked into preference pairs.

When something other than the verifier builds the pairs (rl.rm.path, rl.preference.self_reward), every
sample still carries the verifier's verdict in details["gold_reward"] and the ranker's score
in `reward`. Two numbers per round, each with a bootstrap CI:

    ranker_auroc            P(a random verifier-correct sample outscores a random incorrect
                            one), ties half (eval/calibration.py::auroc), over all the round's
                            samples; 0.5 is chance. CI: resampling whole prompts, since a
                            prompt's samples share its difficulty
    ranker_pair_agreement   of the ranker's pairs the verifier also ranks (one sample right,
                            the other wrong), the share it ranks the same way; 1 = every such
                            pair points where the verifier's would. CI: resampling those pairs

and `ranker_pair_gold_ties`, the share of the ranker's pairs the verifier calls a tie (both
right or both wrong): a pair the truth cannot confirm, which trains on the ranker's taste
alone. A statistic with nothing to measure (a round whose samples are all right, no pair the
verifier ranks) is left out rather than written as NaN.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from posttrain.eval.calibration import auroc, grouped_bootstrap_ci
from posttrain.eval.stats import bootstrap_ci
from posttrain.types import Episode, PreferencePair


def ranker_agreement(groups: Mapping[str, list[Episode]], pairs: Sequence[PreferencePair],
                     seed: int = 0) -> dict[str, float]:
    """The module docstring's numbers for one round: `groups` maps each prompt to its scored
    samples (reward = the ranker's score, details["gold_reward"] = the verifier's), `pairs`
    are the pairs the ranker built from them."""
    stats: dict[str, float] = {}
    by_prompt = [([e.reward for e in g], [e.details["gold_reward"] for e in g]) for g in groups.values() if g]
    scores = [s for g in by_prompt for s in g[0]]
    gold = [y for g in by_prompt for y in g[1]]
    if scores and 0 < sum(y > 0.5 for y in gold) < len(gold):
        ci = grouped_bootstrap_ci(by_prompt, auroc, seed=seed)
        stats.update(ranker_auroc=auroc(scores, gold), ranker_auroc_ci_low=ci["ci_low"],
                     ranker_auroc_ci_high=ci["ci_high"])
    verdict = {(prompt, e.completion): e.details["gold_reward"] for prompt, g in groups.items() for e in g}
    agree = []  # 1 where the verifier ranks the pair the ranker's way, 0 the other way; ties left out
    for pair in pairs:
        chosen, rejected = verdict[(pair.prompt, pair.chosen)], verdict[(pair.prompt, pair.rejected)]
        if chosen != rejected:
            agree.append(float(chosen > rejected))
    if pairs:
        stats["ranker_pair_gold_ties"] = 1 - len(agree) / len(pairs)
    if agree:
        ci = bootstrap_ci(agree, seed=seed)
        stats.update(ranker_pair_agreement=ci["mean"], ranker_pair_agreement_ci_low=ci["ci_low"],
                     ranker_pair_agreement_ci_high=ci["ci_high"])
    return stats
