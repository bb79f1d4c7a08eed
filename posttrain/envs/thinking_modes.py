"""Thinking-mode fusion (Qwen3, Yang et al. 2025, §4.3): one model, two modes, chosen by a
switch in the prompt.

    prompt  "Q: 7+5+9+3+1 /think\\n"       completion "<think>7+5=12,12+9=21,21+3=24,24+1=25</think>\\nFinal: 25"
    prompt  "Q: 7+5+9+3+1 /no_think\\n"    completion "Final: 25"

The arithmetic task's running sum is the natural thinking: in /think mode the model
writes it inside `<think>…</think>` and then the answer line; in /no_think mode it answers
at once. Both are scored by final_int/think-v1, which reads the answer after the thinking
(an unclosed block or a number written only while thinking scores 0).

Where the switch lives: in the prompt text, as Qwen3 puts `/think` and `/no_think` in the
user's message, so the model, the sampler and the trainer see nothing new: SFT on the
fused demonstrations (`think_mode="fused"`) teaches both modes and the switch between them,
and a held-out set in one mode (`think_mode="think"` or `"no_think"`) measures each. The
same problems in both modes share the arithmetic task's `id` (the mode is a suffix), so the
two measurements pair problem by problem.

Which fused problem gets which switch is a pure function of the problem, through sha256
(as the splits are, envs/arithmetic.py), so SFT's demonstrations are half of each mode,
the same half on every run. The thinking budget (tokens allowed inside <think> before an
answer is forced) is the sampler's, roles/think_budget.py.

Lengths: a /think completion is the chain of thought plus 16 characters of tags and
newline, ~56 tokens on level 3 with gpt_mini's characters: raise rl.sampling.max_new_tokens
from its default 48 (docs/guides/search.md, "Thinking-mode fusion").
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from posttrain.envs.arithmetic import ArithmeticEnv, _check_choice
from posttrain.types import Example
from posttrain.verifiers.final_int import get_spec
from posttrain.verifiers.think_tags import THINK_CLOSE, THINK_OPEN, forced_text

THINK_MODES = ("fused", "think", "no_think")
SWITCHES = {"think": " /think", "no_think": " /no_think"}  # appended to the question, before its newline
THINK_SPEC = "final_int/think-v1"


def fused_mode(expression: str) -> str:
    """The switch a fused problem gets: think or no_think, half each, from a hash of the
    problem (salted, so it does not follow the split's hash)."""
    return ("think", "no_think")[hashlib.sha256(f"think-mode:{expression}".encode()).digest()[0] % 2]


def budget_cut(expression: str, share: float, steps: int) -> int | None:
    """Where a /think demonstration is cut, as a thinking budget would cut it: None for most
    problems; for a `share` of them (by a hash of the problem), a number of characters
    0..steps of its thinking, uniform, from the same hash."""
    digest = hashlib.sha256(f"budget-cut:{expression}".encode()).digest()
    if int.from_bytes(digest[:8], "big") / 2**64 >= share:
        return None
    return int.from_bytes(digest[8:16], "big") % (steps + 1)


def mode_of(example: Example) -> str:
    """The switch a prompt carries; ValueError for a prompt without one."""
    for mode, switch in SWITCHES.items():
        if example.prompt.endswith(switch + "\n"):
            return mode
    raise ValueError(f"not a thinking-mode prompt (want 'Q: <expr> /think\\n' or '... /no_think\\n'): "
                     f"{example.prompt!r}")


class ThinkingModesEnv:
    """The arithmetic task with a /think or /no_think switch in every prompt.

    level        difficulty 1..5, as the arithmetic task's.
    seed         seeds the environment's own stream for `sample(..., seed=None)`.
    think_mode   "fused": each problem carries the switch fused_mode gives it (the SFT
                 mix); "think" or "no_think": every problem carries that switch (to
                 measure one mode on the same problems as the other).
    budget_demos the share of /think demonstrations cut after a random number of thinking
                 characters and ended as the budget sampler ends a row (the early-stop
                 text, </think>, then the answer). 0 is Qwen3's recipe, where the model
                 never sees the text; gpt_mini needs some (docs/guides/search.md, "Thinking-mode fusion").
    """

    spec_version = THINK_SPEC
    honest = True

    def __init__(self, level: int = 3, seed: int = 0, think_mode: str = "fused", budget_demos: float = 0.0):
        _check_choice("think_mode", think_mode, list(THINK_MODES))
        if isinstance(budget_demos, bool) or not isinstance(budget_demos, (int, float)) or not 0 <= budget_demos <= 1:
            raise ValueError(f"budget_demos must be a share between 0 and 1, got {budget_demos!r}")
        self.base = ArithmeticEnv(level=level, cot=True, seed=seed)  # its solution holds the steps to think with
        self.level, self.seed, self.think_mode, self.budget_demos = level, seed, think_mode, budget_demos
        self._spec = get_spec(THINK_SPEC)

    @property
    def name(self) -> str:
        return f"arithmetic-think-L{self.level}-{self.think_mode}"

    @property
    def split_rule(self) -> str:
        return self.base.split_rule

    def with_switch(self, example: Example) -> Example:
        """An arithmetic problem with its switch: in its prompt, its id and its meta."""
        expression = example.prompt[len("Q: "):-1]
        mode = fused_mode(expression) if self.think_mode == "fused" else self.think_mode
        return dataclasses.replace(example, prompt=example.prompt[:-1] + SWITCHES[mode] + "\n",
                                   id=f"{example.id}/{mode}", meta={**example.meta, "think_mode": mode})

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        return [self.with_switch(e) for e in self.base.sample(split, n, seed)]

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """The arithmetic task's fixed set (the same problems in every mode), with switches."""
        return [self.with_switch(e) for e in self.base.fixed_set(split, n, seed)]

    def solution(self, example: Example) -> str:
        """The demonstration of the prompt's mode: the running sum inside <think>…</think>
        then the answer line (for a budget_demos share, the sum cut short and closed by the
        budget's text), or the answer line alone."""
        mode = mode_of(example)
        question = example.prompt[: -len(SWITCHES[mode]) - 1] + "\n"
        steps, final = self.base.solution(dataclasses.replace(example, prompt=question)).rsplit("\n", 1)
        if mode == "no_think":
            return final
        cut = budget_cut(question[len("Q: "):-1], self.budget_demos, len(steps))
        if cut is None:
            return f"{THINK_OPEN}{steps}{THINK_CLOSE}\n{final}"
        return f"{THINK_OPEN}{steps[:cut]}{forced_text()}{final}"

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        return self._spec(example, completion)

    def __repr__(self) -> str:
        return (f"ThinkingModesEnv(level={self.level}, seed={self.seed}, think_mode={self.think_mode!r}, "
                f"budget_demos={self.budget_demos})")
