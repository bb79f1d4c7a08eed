"""Test-time search methods, each choosing one completion per problem within a token budget
(search/budget.py), all batched across problems:

    greedy           the most likely completion (temperature 0): the baseline
    majority vote    N samples, the most common final answer (self-consistency, Wang et al.
                     2023); needs no scorer at all
    best-of-N        N samples, the one a scorer ranks first: the verifier itself (an oracle:
                     its pass rate is pass@N), an ORM, or a PRM's step scores aggregated
                     (min / product / last, rewards/process_reward_model.py)
    PRM beam search  grow `width` partial solutions one step at a time: each sampled
                     `expansions` next steps, the PRM scores every new prefix, the best
                     `width` go on (Snell et al. 2024, "Scaling LLM Test-Time Compute")
    MCTS             search/mcts.py

Scorers are anything with `score_outcomes(prompts, completions) -> [p]` and, for the step
methods, `score_steps(prompts, steps) -> [[p, ...]]`: a trained ORM or PRM
(rewards/process_reward_model.py::StepRewardScorer), or `OracleStepScorer`, the arithmetic
step checker with the expected answer: what a perfect step verifier would buy, an upper
bound that no test-time method has. `OracleOutcomeScorer` is its outcome counterpart (the
task's verifier as a perfect ORM), and `NoisyScorer` makes either worse by a known amount,
so a lesson can turn one knob from "perfect reward model" to "coin flip".
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Callable, Protocol, Sequence

import torch

from posttrain.config import SamplingParams
from posttrain.rewards.process_reward_model import AGGREGATIONS, StepFormat
from posttrain.roles.engines import Engine
from posttrain.search.budget import Partial, Problem, extend_steps, greedy_params, sample_completions
from posttrain.types import Example
from posttrain.verifiers.steps import check_arithmetic_steps, split_steps


class Scorer(Protocol):
    def score_outcomes(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]: ...

    def score_steps(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]: ...


class OracleStepScorer:
    """The arithmetic step checker (verifiers/steps.py) as a PRM: 1.0 for a step whose label
    is True (it and every step before it right, a Final line with the expected answer), else
    0.0. It reads the expected answers, so it is an oracle: the ceiling of step-guided search."""

    def __init__(self, examples: Sequence[Example]):
        self.examples = {e.prompt: e for e in examples}

    def score_steps(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        return [[float(v.label) for v in check_arithmetic_steps(self.examples[p], s)] for p, s in zip(prompts, steps)]

    def score_outcomes(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        scores = self.score_steps(prompts, [split_steps(c) or [""] for c in completions])
        return [AGGREGATIONS["last"](s) for s in scores]


class OracleOutcomeScorer:
    """The task's verifier as an ORM: 1.0 for a completion it passes, else 0.0 (its own
    reward otherwise). It reads the expected answers, so it is an oracle: best-of-N by it is
    pass@N. Outcomes only: an outcome model has no opinion about steps."""

    def __init__(self, examples: Sequence[Example], score: Callable[[Example, str], dict]):
        self.examples = {e.prompt: e for e in examples}
        self.score = score

    def score_outcomes(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        return [float(self.score(self.examples[p], c)["reward"]) for p, c in zip(prompts, completions)]


class NoisyScorer:
    """`scorer` made worse by a known amount: every score s becomes (1 − noise)·s + noise·u,
    u uniform in [0, 1). noise 0 is `scorer` itself, noise 1 a random ranking.

    u is a hash of (seed, prompt, the text scored), not a random draw: the same prefix or
    completion always gets the same score, whichever batch it comes in, as it would from a
    reward model whose mistakes are its weights' and not the dice's. A step's u hashes the
    steps up to it, so a PRM's mistake about a prefix follows every search that reaches it."""

    def __init__(self, scorer, noise: float, seed: int = 0):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"noise must be in [0, 1] (0: the scorer itself, 1: a random score), got {noise!r}")
        self.scorer, self.noise, self.seed = scorer, noise, seed

    def _u(self, prompt: str, text: str) -> float:
        digest = hashlib.sha256(f"{self.seed}\0{prompt}\0{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def _blend(self, score: float, prompt: str, text: str) -> float:
        return (1.0 - self.noise) * score + self.noise * self._u(prompt, text)

    def score_outcomes(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        scores = self.scorer.score_outcomes(prompts, completions)
        return [self._blend(s, p, c) for s, p, c in zip(scores, prompts, completions)]

    def score_steps(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        scores = self.scorer.score_steps(prompts, steps)
        # "\x1f" (unit separator) between steps: two different step lists never hash alike
        return [[self._blend(s, p, "\x1f".join(chain[: k + 1])) for k, s in enumerate(row)]
                for row, p, chain in zip(scores, prompts, steps)]


def greedy(engine: Engine, problems: list[Problem], max_new_tokens: int) -> list[Partial | None]:
    """One completion per problem at temperature 0 (capped by the budget as any other)."""
    params = greedy_params(engine.params)
    return [partials[0] if partials else None
            for partials in sample_completions(engine, problems, 1, max_new_tokens, params=params)]


def majority_index(answers: Sequence[str | None]) -> int:
    """The index of the first answer among the most common ones; None (no answer: cut off,
    unparsed) never wins while a real answer exists; 0 when none does."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return 0
    top = max(votes.values())
    return next(k for k, a in enumerate(answers) if a is not None and votes[a] == top)


def majority_vote(candidates: list[Partial], answer_of: Callable[[str], str | None]) -> Partial | None:
    """The first-drawn candidate whose final answer is the most common among the finished
    ones (ties: the answer drawn first); `answer_of` None (no answer) casts no vote. No
    scorer: the answers vote."""
    if not candidates:
        return None
    return candidates[majority_index([answer_of(c.text) if c.done else None for c in candidates])]


def pick_highest(candidates: list[Partial], scores: list[float]) -> Partial | None:
    """The highest-scored candidate, an unfinished one only if none finished; ties: the
    first drawn (so a rerun picks the same one)."""
    if not candidates:
        return None
    ranked = sorted(range(len(candidates)), key=lambda k: (not candidates[k].done, -scores[k], k))
    return candidates[ranked[0]]


def prefix_values(scorer: Scorer, fmt: StepFormat, prompts: list[str], partials: list[Partial],
                  aggregation: str) -> list[float]:
    """The PRM's aggregated score of each partial solution's steps so far, one batched call
    (0 for a partial with no step yet)."""
    steps = [fmt.split(p.text) for p in partials]
    scored = [k for k, s in enumerate(steps) if s]
    values = [0.0] * len(partials)
    if scored:
        step_scores = scorer.score_steps([prompts[k] for k in scored], [steps[k] for k in scored])
        for k, scores in zip(scored, step_scores):
            values[k] = AGGREGATIONS[aggregation](scores)
    return values


def beam_search(engine: Engine, problems: list[Problem], scorer: Scorer, fmt: StepFormat,
                separators: tuple[str, ...], width: int, expansions: int, step_tokens: int, max_new_tokens: int,
                generator: torch.Generator | None = None, params: SamplingParams | None = None,
                aggregation: str = "min") -> list[Partial | None]:
    """PRM-guided beam search over steps, all problems in lockstep (module docstring). A
    problem stops when `width` solutions have finished or its budget is spent; its answer
    is the finished solution the PRM scores highest (an unfinished one if none finished)."""
    if width < 1 or expansions < 1:
        raise ValueError(f"beam search needs width >= 1 and expansions >= 1, got {width} and {expansions}")
    beams = {id(p): [Partial()] for p in problems}
    finished: dict[int, list[tuple[float, Partial]]] = {id(p): [] for p in problems}
    best_open: dict[int, tuple[float, Partial] | None] = {id(p): None for p in problems}
    while True:
        rows = [(p, beam) for p in problems if beams[id(p)] and len(finished[id(p)]) < width
                for beam in beams[id(p)] for _ in range(expansions)]
        if not rows:
            break
        children = extend_steps(engine, rows, separators, step_tokens, max_new_tokens, generator, params)
        grown = [(p, child) for (p, _), child in zip(rows, children) if child is not None]
        values = prefix_values(scorer, fmt, [p.example.prompt for p, _ in grown], [c for _, c in grown], aggregation)
        by_problem: dict[int, list[tuple[float, Partial]]] = {id(p): [] for p in problems}
        for (p, child), value in zip(grown, values):
            (finished[id(p)] if child.done else by_problem[id(p)]).append((value, child))
        for p in problems:
            if not any(prob is p for prob, _ in rows):
                continue
            ranked = sorted(by_problem[id(p)], key=lambda pair: -pair[0])  # stable: ties keep drawing order
            if ranked and (best_open[id(p)] is None or ranked[0][0] > best_open[id(p)][0]):
                best_open[id(p)] = ranked[0]
            beams[id(p)] = [child for _, child in ranked[: max(0, width - len(finished[id(p)]))]]
    answers = []
    for p in problems:
        done = sorted(finished[id(p)], key=lambda pair: -pair[0])
        answers.append(done[0][1] if done else (best_open[id(p)][1] if best_open[id(p)] else None))
    return answers
