"""Test-time search under one compute budget: tokens the policy generates, counted exactly.

Every search method here (search/methods.py: greedy, majority vote, best-of-N with a
verifier, an ORM or a PRM, PRM-guided beam search, MCTS) spends one currency, the tokens
the policy generates for a problem, and gets a `Budget` of them per problem. A method asks
for tokens only through `sample_completions` and `extend_steps`, which cap every row they
sample so that the row budgets of one call sum to at most what is left: a search can stop
short of its budget, never exceed it (tests/test_search.py counts every drawn id).

What the budget does not count, and the comparison reports beside it: the prompt and the
partial solution read again at every call (prefill: a KV cache could keep it; ours
re-reads), and the scorer's forward passes (a PRM reads every prefix it scores).

A `Partial` is a solution so far: the ids the policy drew (kept as drawn, never
re-tokenised), their text, and whether it has ended (end-of-sequence, or the generation cap
max_new_tokens). Steps are what the policy writes between two separators: `extend_steps`
stops each row at the first separator in its new text ("," or a newline for the arithmetic
chain, verifiers/steps.py), so one call adds one step to each partial.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from posttrain.config import SamplingParams
from posttrain.roles.engines import Engine
from posttrain.roles.engines.contract import STOP_TOKEN, example_prompt_ids
from posttrain.types import Example, Tokenizer


@dataclass
class Budget:
    """Generated tokens one problem may spend."""

    limit: int
    spent: int = 0

    @property
    def left(self) -> int:
        return self.limit - self.spent

    def charge(self, tokens: int) -> None:
        if tokens > self.left:  # the callers cap every row first: this is a bug, not a user error
            raise RuntimeError(f"a search drew {tokens} tokens with {self.left} of its {self.limit} left")
        self.spent += tokens


@dataclass
class Problem:
    """One problem being searched: its example, prompt ids and budget."""

    example: Example
    prompt_ids: list[int]
    budget: Budget

    @staticmethod
    def of(examples: list[Example], tokenizer: Tokenizer, budget: int) -> list[Problem]:
        return [Problem(e, example_prompt_ids(tokenizer, e), Budget(budget)) for e in examples]


@dataclass
class Partial:
    """A solution so far: the drawn ids, their text, and whether it has ended."""

    ids: list[int] = field(default_factory=list)
    text: str = ""
    done: bool = False
    logp: list[float] = field(default_factory=list)  # the sampler's log-prob of each id, as drawn

    def then(self, ids: list[int], logp: list[float], text: str, done: bool) -> Partial:
        return Partial(self.ids + ids, self.text + text, done, self.logp + logp)


def _row_caps(rows: list[tuple[Problem, Partial]], per_row: int, max_new_tokens: int) -> list[int]:
    """Each row's token cap: at most `per_row`, the room left under max_new_tokens, and its
    problem's budget left shared evenly among that problem's rows (so the caps of one
    problem sum to at most what it has left)."""
    rows_of = defaultdict(int)
    for problem, _ in rows:
        rows_of[id(problem)] += 1
    return [max(0, min(per_row, max_new_tokens - len(partial.ids), problem.budget.left // rows_of[id(problem)]))
            for problem, partial in rows]


def _draw(engine: Engine, rows: list[tuple[Problem, Partial]], caps: list[int],
          generator: torch.Generator | None, params: SamplingParams, stop_strings: tuple[str, ...],
          max_new_tokens: int) -> list[Partial | None]:
    """Continue every row with a cap >= 1 in one batched call, charge each problem what its
    rows drew, and return each row's extended partial (None for a row with no tokens left)."""
    live = [k for k, cap in enumerate(caps) if cap >= 1]
    out: list[Partial | None] = [None] * len(rows)
    if not live:
        return out
    contexts = [rows[k][0].prompt_ids + rows[k][1].ids for k in live]
    drawn = engine.continue_rows(contexts, [caps[k] for k in live], generator, params, stop_strings)
    for k, continuation in zip(live, drawn):
        problem, partial = rows[k]
        problem.budget.charge(len(continuation.token_ids))
        ended = continuation.stop == STOP_TOKEN or len(partial.ids) + len(continuation.token_ids) >= max_new_tokens
        out[k] = partial.then(continuation.token_ids, continuation.logp, continuation.text, ended)
    return out


def sample_completions(engine: Engine, problems: list[Problem], n: int, max_new_tokens: int,
                       generator: torch.Generator | None = None, params: SamplingParams | None = None
                       ) -> list[list[Partial]]:
    """Up to `n` whole completions of each problem, each capped at max_new_tokens and at
    an even share of the problem's budget, in one batched call. A completion the cap cut
    short is returned unfinished (done False when it hit a budget share below
    max_new_tokens): it counts, it just cannot be right."""
    rows = [(problem, Partial()) for problem in problems for _ in range(n)]
    extended = finish(engine, rows, max_new_tokens, generator, params)
    by_problem = defaultdict(list)
    for (problem, _), partial in zip(rows, extended):
        if partial is not None:
            by_problem[id(problem)].append(partial)
    return [by_problem[id(problem)] for problem in problems]


def finish(engine: Engine, rows: list[tuple[Problem, Partial]], max_new_tokens: int,
           generator: torch.Generator | None = None, params: SamplingParams | None = None) -> list[Partial | None]:
    """Each (problem, partial) row continued to its end (end-of-sequence or max_new_tokens),
    capped by its problem's budget shared among its rows in this call: MCTS's rollouts, and
    whole samples from an empty partial. None for a row that got no tokens."""
    params = params or engine.params
    return _draw(engine, rows, _row_caps(rows, max_new_tokens, max_new_tokens), generator, params, (), max_new_tokens)


def extend_steps(engine: Engine, rows: list[tuple[Problem, Partial]], separators: tuple[str, ...],
                 step_tokens: int, max_new_tokens: int, generator: torch.Generator | None = None,
                 params: SamplingParams | None = None) -> list[Partial | None]:
    """Each (problem, partial) row extended by one step: sampled until the first separator
    in its new text, end-of-sequence, or its cap (step_tokens, the room under
    max_new_tokens, the problem's budget shared among its rows in this call). None for a
    row that got no tokens: its problem's budget is spent."""
    params = params or engine.params
    return _draw(engine, rows, _row_caps(rows, step_tokens, max_new_tokens), generator, params, separators,
                 max_new_tokens)


def greedy_params(params: SamplingParams) -> SamplingParams:
    """Temperature 0: the policy's single most likely completion."""
    return dataclasses.replace(params, temperature=0.0)
