"""Monte-Carlo step labels: how good is a step, for a task with no step checker?

Math-Shepherd (Wang et al. 2024, "Math-Shepherd: Verify and Reinforce LLMs Step-by-step
without Human Annotations") labels step k of a solution by asking the policy itself: from
the prefix that ends with step k, sample N continuations to the end and check each with
the task's outcome verifier. Then

    soft label  = (continuations that end correct) / N     an estimate of the chance the
                  policy can still solve the problem from here: the step's value
    hard label  = soft label > 0                            "some completion from here
                  is right", Math-Shepherd's hard estimation

A wrong step drives the value to ~0 (every continuation inherits the mistake); a right
one keeps it near the policy's own success rate from that point. The labels are noisy
(N samples) and policy-dependent (a weak policy makes a good step look bad), and they cost
tokens, which is why `tokens` is counted exactly: the search lead compares methods at one
token budget.

The last step ends the solution, so nothing is rolled out from it: its label is the
verifier's verdict on the whole completion (N copies of one deterministic check would say
the same), at no token cost.

All prefixes of all solutions go to the sampler at once (one `continue_rows` call, which
splits only past the engine's `max_rows`): rows of different prefixes share the decode
loop's forward passes instead of running one prefix at a time.

The text between steps is a task's choice: `newline_separators` (reasoning-gym style, one
step per line) by default; verifiers/steps.py::step_separators for the arithmetic chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from posttrain.config import SamplingParams
from posttrain.roles.engines.contract import Engine, example_prompt_ids
from posttrain.types import Example
from posttrain.verifiers.steps import newline_separators

ScoreFn = Callable[[Example, str], dict]  # the verifier contract: -> {"reward", "details"}


@dataclass(frozen=True)
class MonteCarloLabels:
    steps: list[str]
    soft: list[float]  # per step: the fraction of rollouts from its prefix that ended correct
    hard: list[bool]  # per step: soft > 0 (Math-Shepherd's hard estimation)
    tokens: int  # tokens sampled to label this solution (its rollouts' lengths, summed)


def prefix_texts(steps: Sequence[str], separators: Sequence[str]) -> list[str]:
    """The completion text up to and including each step and the separator after it: what
    the policy continues from. prefix_texts(s, sep)[-1] is the whole completion."""
    texts, text = [], ""
    for step, separator in zip(steps, separators):
        text += step + separator
        texts.append(text)
    return texts


def monte_carlo_step_labels(
    engine: Engine,
    examples: Sequence[Example],
    step_lists: Sequence[Sequence[str]],
    score: ScoreFn,
    n_rollouts: int = 8,
    max_new_tokens: int = 64,  # a whole completion's cap: the rollout gets what the prefix leaves
    separators: Callable[[Sequence[str]], list[str]] = newline_separators,
    generator: torch.Generator | None = None,
    params: SamplingParams | None = None,
) -> list[MonteCarloLabels]:
    """Label every step of `step_lists[i]` (a solution to `examples[i]`) by rolling out
    `n_rollouts` continuations from each step's prefix with `engine` (a
    roles/engines: its policy, tokenizer and sampler), and scoring prefix +
    continuation with `score`. `max_new_tokens` caps a whole completion, prefix included,
    as it capped the policy's own samples: a rollout gets what its prefix leaves (at least
    one token), so prefix + rollout is a completion the policy could have written. One
    labels object per solution."""
    if len(examples) != len(step_lists):
        raise ValueError(f"got {len(examples)} examples but {len(step_lists)} step lists: give one solution each")
    if isinstance(n_rollouts, bool) or not isinstance(n_rollouts, int) or n_rollouts < 1:
        raise ValueError(f"n_rollouts must be an int >= 1 (rollouts per step prefix), got {n_rollouts!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1 (a completion's cap), got {max_new_tokens!r}")
    tokenizer = engine.tokenizer
    # (solution, step) of every prefix that gets rollouts: all steps but each solution's last
    jobs: list[tuple[int, int]] = []
    contexts: list[list[int]] = []
    budgets: list[int] = []
    texts_of = []
    for i, (example, steps) in enumerate(zip(examples, step_lists)):
        texts = prefix_texts(steps, separators(steps))
        texts_of.append(texts)
        prompt_ids = example_prompt_ids(tokenizer, example)
        for k in range(len(steps) - 1):
            jobs.append((i, k))
            # the prefix is encoded on its own and appended to the prompt's ids, as the
            # sampler would have produced them one token at a time (a character tokenizer
            # gives the same ids either way)
            prefix = tokenizer.encode(texts[k])
            contexts += [prompt_ids + prefix] * n_rollouts
            budgets += [max(1, max_new_tokens - len(prefix))] * n_rollouts
    rows = engine.continue_rows(contexts, budgets, generator=generator, params=params) if contexts else []

    correct: dict[tuple[int, int], float] = {}
    tokens = [0] * len(examples)
    for j, (i, k) in enumerate(jobs):
        rollouts = rows[j * n_rollouts : (j + 1) * n_rollouts]
        tokens[i] += sum(len(row.token_ids) for row in rollouts)
        wins = sum(float(score(examples[i], texts_of[i][k] + row.text)["reward"]) == 1.0 for row in rollouts)
        correct[(i, k)] = wins / n_rollouts
    labels = []
    for i, (example, steps) in enumerate(zip(examples, step_lists)):
        soft = [correct[(i, k)] for k in range(len(steps) - 1)]
        if steps:  # the last step: the verdict on the whole completion, no rollouts
            soft.append(1.0 if float(score(example, texts_of[i][-1])["reward"]) == 1.0 else 0.0)
        labels.append(MonteCarloLabels(list(steps), soft, [value > 0 for value in soft], tokens[i]))
    return labels
