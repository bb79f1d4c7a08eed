"""Environment: the task's prompts and its verifier.

An environment (see posttrain/envs/) offers `sample(split, n, seed)` for prompts and
`score(example, completion) -> {"reward", "details"}` for rewards. This role applies the
verifier to freshly sampled episodes. The verifier sees only text: it cannot be
backpropagated through, which is why RL needs a policy-gradient estimator at all.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from posttrain.types import Episode, Example


class Environment(Protocol):
    spec_version: str

    def sample(self, split: str, n: int, seed: int) -> list[Example]: ...

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]: ...

    def solution(self, example: Example) -> str: ...

    def score(self, example: Example, completion: str) -> dict[str, Any]: ...


def score_episodes(score: Callable[[Example, str], dict[str, Any]], episodes: list[Episode]) -> list[Episode]:
    """Fill in `reward` and `details` of each episode, in place. `score` is the
    environment's verifier (`env.score`) or a reward built on it (posttrain/rewards/stack.py)."""
    for episode in episodes:
        result = score(episode.example, episode.completion)
        episode.reward = float(result["reward"])
        episode.details = result["details"]
    return episodes
