"""Held-out pass@1 of a policy: greedy decoding, the strict verifier, a bootstrap CI.

Greedy decoding makes pass@1 a property of the weights alone (no sampling noise), so the
only uncertainty left is which problems happened to be in the held-out set — exactly
what the bootstrap over problems measures.
"""

from __future__ import annotations

import dataclasses

from posttrain.eval.stats import bootstrap_ci
from posttrain.roles.environment import score_episodes
from posttrain.roles.rollout import RolloutEngine
from posttrain.types import Example


def evaluate_pass_at_1(engine: RolloutEngine, env, examples: list[Example], batch_size: int = 512) -> dict:
    """{"pass@1": mean, "ci": {"mean", "ci_low", "ci_high", "n"}, "episodes": [...]}"""
    greedy = dataclasses.replace(engine.params, temperature=0.0)
    episodes = []
    for start in range(0, len(examples), batch_size):
        episodes += engine.generate(examples[start : start + batch_size], 1, params=greedy)
    score_episodes(env.score, episodes)  # the verifier alone, never a shaped reward
    correct = [e.reward for e in episodes]
    ci = bootstrap_ci(correct)
    return {"pass@1": ci["mean"], "ci": ci, "episodes": episodes}
