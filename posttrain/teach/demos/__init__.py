"""Small demos that make one idea visible, each calling the library's real code.

    bandit        one REINFORCE step in slow motion; baseline on/off variance ablation
    two_step_mdp  delayed reward: the first action's credit arrives through the return
    kl_tradeoff   E_π[r] − β·KL(π ‖ π_ref): closed form vs gradient ascent, swept over β
    tokens        how a tokenizer splits near-miss answers, beside the strict scorer's verdict
    gridworld_ppo PPO from scratch on FrozenLake, through the LLM path's GAE and clipped surrogate
    sentiment_steering PPO + value head steers gpt_mini toward VADER-positive text; the alignment tax per β

Every demo is `main(argv) -> int`, takes `--out-dir` and `--seed`, and writes a run
directory (runs/<timestamp>-<name>/) with a log, a CSV and a PNG; the plumbing they
share is in common.py.

    from posttrain.teach.demos import run_demo
    run_demo("bandit", ["--fast", "--steps", "50"])
"""

from __future__ import annotations

from typing import Callable

from posttrain.teach.demos import bandit, gridworld_ppo, kl_tradeoff, sentiment_steering, tokens, two_step_mdp

DEMOS: dict[str, Callable[[list[str]], int]] = {
    "bandit": bandit.main,
    "two_step_mdp": two_step_mdp.main,
    "kl_tradeoff": kl_tradeoff.main,
    "tokens": tokens.main,
    "gridworld_ppo": gridworld_ppo.main,
    "sentiment_steering": sentiment_steering.main,
}


def run_demo(name: str, argv: list[str]) -> int:
    """Run the demo registered as `name` with its command-line arguments; its exit code."""
    if name not in DEMOS:
        raise ValueError(f"unknown demo {name!r}; valid demos: {', '.join(DEMOS)}")
    return DEMOS[name](argv)
