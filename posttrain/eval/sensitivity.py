"""How a policy's score depends on the sampling temperature, and on a shifted task: two of
the checks a preference loss needs beyond its pair accuracy (EVAL-25).

    temperature_table(engine_at, env, examples, temperatures, seed)
        one row per temperature: pass@1, mean reward and response length of one completion
        per problem, greedy at T = 0 and seeded samples above it

A preference loss changes how peaked the policy is as well as what it prefers: DPO pushes
probability off the rejected responses, and where it lands decides whether sampling at
T = 1 still finds the answer greedy decoding finds. A policy whose pass@1 falls fast as T
rises has its right answers only at the top of a flat distribution; one whose T = 1 pass@1
equals its greedy one has collapsed to a single answer (high pass@1, no diversity, which
the entropy the stage logs confirms). Comparing the table before and after training says
which way the loss moved it.
"""

from __future__ import annotations

import statistics
from typing import Callable

from posttrain.eval.evaluate import evaluate_pass_at_1, sampler, solved
from posttrain.roles.engines import Engine
from posttrain.roles.environment import score_episodes
from posttrain.seeds import generator_for
from posttrain.types import Environment, Episode, Example


def episode_scores(temperature: float, episodes: list[Episode]) -> dict[str, float]:
    """One row of the table: what one completion per problem scored at `temperature`."""
    return {"temperature": temperature,
            "pass@1": statistics.fmean(solved(e) for e in episodes) if episodes else 0.0,
            "reward_mean": statistics.fmean(e.reward for e in episodes) if episodes else 0.0,
            "response_length": statistics.fmean(len(e.response_ids) for e in episodes) if episodes else 0.0,
            "n": len(episodes)}


def temperature_table(engine_at: Callable[[float], Engine], env: Environment, examples: list[Example],
                      temperatures: list[float], seed: int) -> list[dict[str, float]]:
    """One row per temperature, in the order given: {"temperature", "pass@1", "reward_mean",
    "response_length", "n"} of one completion per example. `engine_at(T)` samples at T;
    T = 0 is greedy (evaluate_pass_at_1, the held-out evaluation's own decoding), any other
    T draws from generator_for(seed, "temperature-table", T), the same draws every call."""
    rows = []
    for temperature in temperatures:
        engine = engine_at(temperature)
        if temperature == 0:
            episodes = evaluate_pass_at_1(engine, env, examples)["episodes"]
        else:
            episodes = sampler(env)(engine, examples, 1, generator_for(seed, "temperature-table", temperature))
            score_episodes(env.score, episodes)  # the verifier alone, as pass@1 is scored
        rows.append(episode_scores(temperature, episodes))
    return rows
