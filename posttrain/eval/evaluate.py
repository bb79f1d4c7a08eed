"""Held-out pass@1 of a policy: greedy decoding, the strict verifier, a bootstrap CI.

Greedy decoding makes pass@1 a property of the weights alone (no sampling noise), so the
only uncertainty left is which problems happened to be in the held-out set — exactly
what the bootstrap over problems measures.
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.eval.stats import bootstrap_ci, pass_at_k
from posttrain.roles.agent import AgentLoop
from posttrain.roles.environment import is_multi_turn, score_episodes
from posttrain.roles.engines import Engine
from posttrain.types import Environment, Episode, Example
from posttrain.verifiers.contract import is_solved


def solved(episode: Episode) -> float:
    """1.0 when the verifier counts the episode as solved, else 0.0: its own word when it
    gives one (`details["correct"]`, as partial-credit graders report it), else a full
    reward of at least 1. Pass@1 is the fraction solved, never the mean reward: under
    partial credit (code/tests-partial-v1, a grader paying 0.5 for a near miss) the mean
    would count two half-right answers as one pass."""
    return float(is_solved(episode.reward, episode.details))


def one_completion_each(engine: Engine, examples: list[Example], k: int,
                        generator: torch.Generator | None = None, params=None) -> list[Episode]:
    """K completions of each example: sampled from `generator`, or with `params` (greedy, for pass@1)."""
    if params is None:
        return engine.generate(examples, k, generator)
    return engine.generate(examples, k, params=params)  # greedy: no generator to draw from


def sampler(env: Environment):
    """How `env`'s episodes are drawn: one completion each, or a multi-turn environment's
    agent loop (roles/agent.py), whose episodes come back scored by the environment."""
    return AgentLoop(env) if is_multi_turn(env) else one_completion_each


def evaluate_pass_at_1(engine: Engine, env: Environment, examples: list[Example], batch_size: int = 512) -> dict:
    """{"pass@1": fraction solved, "ci": {"mean", "ci_low", "ci_high", "n", "mean_reward"},
    "episodes": [...]}: the CI is pass@1's; mean_reward sits beside it, equal to it for a
    verifier that pays only 0 or 1."""
    # float32 weights whatever the rollout samples with: pass@1 measures the policy being trained
    greedy = dataclasses.replace(engine.params, temperature=0.0, weights="float32")
    sample, episodes = sampler(env), []
    for start in range(0, len(examples), batch_size):
        episodes += sample(engine, examples[start : start + batch_size], 1, params=greedy)
    score_episodes(env.score, episodes)  # the verifier alone, never a shaped reward
    ci = bootstrap_ci([solved(e) for e in episodes])
    ci["mean_reward"] = sum(e.reward for e in episodes) / max(1, len(episodes))
    if episodes and any(e.turns is not None for e in episodes):
        # a multi-turn environment: how often it was used (a tool environment: episodes with a call)
        ci["observed_episodes"] = bootstrap_ci([float(e.observed) for e in episodes])
    return {"pass@1": ci["mean"], "ci": ci, "episodes": episodes}


def evaluate_pass_at_k(engine: Engine, env: Environment, examples: list[Example], n: int, ks: list[int],
                       generator: torch.Generator | None = None) -> dict:
    """{"pass@k": {k: unbiased estimate}, "ci": {k: bootstrap CI over problems}, "n_correct": [...],
    "episodes": [...]}: n samples per problem at the engine's own temperature (greedy would
    make them identical), each solved or not (`solved`), then Chen et al.'s estimator per
    problem (stats.pass_at_k), averaged. Needs n >= max(ks); n well above k lowers its variance."""
    if not ks or any(not 1 <= k <= n for k in ks):
        raise ValueError(f"every k must be between 1 and n={n} (samples per problem), got ks={ks}")
    if engine.params.temperature <= 0:
        raise ValueError("pass@k needs sampling (temperature > 0): greedy decoding gives n identical samples")
    sample, episodes = sampler(env), []
    for example in examples:  # one problem at a time: its n samples are one group
        episodes += sample(engine, [example], n, generator)
    score_episodes(env.score, episodes)
    n_correct = [int(sum(solved(e) for e in episodes[i * n : (i + 1) * n])) for i in range(len(examples))]
    cis = {k: bootstrap_ci([pass_at_k(n, c, k) for c in n_correct]) for k in ks}
    return {"pass@k": {k: ci["mean"] for k, ci in cis.items()}, "ci": cis, "n_correct": n_correct,
            "episodes": episodes}
