"""Length terms of a reward: what an answer's length costs, or (Kimi k1.5) earns.

Each is a term of `RewardStack` (rewards/stack.py). The per-sample ones (linear, quadratic,
ratio) price one completion's length on its own; `KimiLength` is a group term, pricing a
sample against the other samples of its prompt, so it runs once the whole group is scored
(`RewardStack.score_groups`).

A length penalty pays for brevity: on its own it favours short wrong answers over long
right ones unless accuracy dominates. Kimi k1.5 switched its length reward on only after a
warm-up for this reason, and charges wrong answers without ever paying them for brevity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from posttrain.rewards.stack import Scored
from posttrain.types import Example


@dataclass(frozen=True)
class LinearLength:
    """penalty = −c · max(0, L − L0).

    Free up to L0, then a constant price c per unit of length. L is `length(completion)`:
    characters by default; pass `length=lambda s: len(tokenizer.encode(s))` for tokens."""

    L0: int
    c: float
    length: Callable[[str], int] = len
    name: str = "length_linear"

    @property
    def spec(self) -> str:
        return f"{self.name}(L0={self.L0},c={self.c:g})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        return -self.c * max(0, self.length(completion) - self.L0)


@dataclass(frozen=True)
class QuadraticLength:
    """penalty = −c · max(0, L − L0)².

    Gentle just past L0, steep far past it: a few extra tokens cost almost nothing, a
    runaway generation costs a lot. Unbounded, so pick c so that the longest length you
    allow costs about one accuracy reward: c ≈ 1 / (L_max − L0)²."""

    L0: int
    c: float
    length: Callable[[str], int] = len
    name: str = "length_quadratic"

    @property
    def spec(self) -> str:
        return f"{self.name}(L0={self.L0},c={self.c:g})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        return -self.c * max(0, self.length(completion) - self.L0) ** 2


@dataclass(frozen=True)
class RatioLength:
    """penalty = −clip(L / L_ref − 1, 0, max_penalty).

    Relative to a reference length L_ref (e.g. the mean length of the starting policy's
    answers): 50% longer than the reference costs 0.5. Scale-free, so one setting works
    for short and long tasks, and bounded by `max_penalty` (default 1.0: never more than
    one accuracy reward, so a right answer always beats a wrong one of any length).
    Answers shorter than L_ref earn no bonus (the lower clip at 0): paying for brevity
    would reward the empty answer."""

    L_ref: float
    max_penalty: float = 1.0
    length: Callable[[str], int] = len
    name: str = "length_ratio"

    def __post_init__(self) -> None:
        if not self.L_ref > 0:
            raise ValueError(f"L_ref must be > 0 (a typical answer length), got {self.L_ref!r}")

    @property
    def spec(self) -> str:
        return f"{self.name}(L_ref={self.L_ref:g},max={self.max_penalty:g})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        excess = self.length(completion) / self.L_ref - 1.0
        return -min(max(excess, 0.0), self.max_penalty)


def kimi_length_reward(lengths: list[int], solved: list[bool]) -> list[float]:
    """Kimi k1.5's length reward for one group (arXiv:2501.12599, Sec. 2.3.3):

        λ_i = 0.5 − (len_i − min_len) / (max_len − min_len)     min, max over the group
        len_reward_i = λ_i             if sample i is right
                     = min(0, λ_i)     if it is wrong

    λ runs from +0.5 (the group's shortest) to −0.5 (its longest). A right answer is paid
    for being short and charged for being long; a wrong one is only ever charged, so a
    short wrong answer earns nothing for its brevity. All 0 when every length is equal."""
    if len(lengths) != len(solved):
        raise ValueError(f"{len(lengths)} lengths but {len(solved)} verdicts: give one of each per sample")
    shortest, longest = min(lengths), max(lengths)
    if longest == shortest:
        return [0.0] * len(lengths)
    lams = [0.5 - (length - shortest) / (longest - shortest) for length in lengths]
    return [lam if right else min(0.0, lam) for lam, right in zip(lams, solved)]


@dataclass(frozen=True)
class KimiLength:
    """`kimi_length_reward`, paid from RL step `start_step` on (0 before). Kimi k1.5 ran
    without it first: switched on from the start it slowed early training, and a policy
    that cannot yet solve a prompt is paid most for stopping early (Sec. 2.3.3)."""

    start_step: int = 0
    name: str = "length_kimi"

    def __post_init__(self) -> None:
        if isinstance(self.start_step, bool) or not isinstance(self.start_step, int) or self.start_step < 0:
            raise ValueError(f"start_step must be an int >= 0 (the RL step the length reward starts), "
                             f"got {self.start_step!r}")

    @property
    def spec(self) -> str:
        return f"{self.name}(from_step={self.start_step})"

    def __call__(self, lengths: list[int], solved: list[bool], step: int) -> list[float]:
        if step < self.start_step:
            return [0.0] * len(lengths)
        return kimi_length_reward(lengths, solved)

