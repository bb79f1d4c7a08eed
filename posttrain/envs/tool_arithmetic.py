"""Tool arithmetic: multiplications too long for a small model to do in its head, with a
calculator it can call. The task of issue #20 item 7, where calling the tool should win.

    prompt:         "Q: 347*829\\n"
    model turn 1:   "<tool_call>calculator: 347*829</tool_call>"      (compact call format)
    observation:    "<tool_result>287663</tool_result>\\n"             (the environment's turn)
    model turn 2:   "Final: 287663"                                    (scored: final_int/strict-v1)

Operands have `digits` digits each (3 by default: 100..999, 810,000 problems). A
character-level gpt_mini learns 5-term single-digit sums from a few hundred
demonstrations; a 6-digit product needs a long chain of carries, which it is not expected
to learn that way, so the task is built for the call to be the path to reward. Measured
(docs/guides/agents.md): after SFT on 1,000 demonstrations, half of them calling the tool, gpt_mini
guessed on 929 of 1,500 held-out problems over three seeds and got none right, and got 564 of
its 571 calls right; GRPO took the call rate and held-out pass@1 to 100%. The answer is
checked by the same strict verifier as the arithmetic task: the final turn, outside <think>
blocks, must be exactly `Final: <int>`.

Splits follow the arithmetic task's rule (envs/arithmetic.py): a hash of the canonical
expression "347*829" puts each problem in train, dev or heldout, so no problem is in two.
"347*829" and "829*347" are different problems and may land in different splits.

For SFT, `demonstration(example)` gives the two model turns with the calculator's real
output between them; that output must be masked out of the SFT loss exactly as tool
output is out of the RL loss (ToolEnvironment.demonstration explains why).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from posttrain.envs.arithmetic import SPLIT_RULE, check_split_request, split_of
from posttrain.envs.tool_calls import render_call
from posttrain.envs.tool_env import ToolEnvironment
from posttrain.envs.tools import ToolCall, calculator_tool
from posttrain.rewards.agentic import AgenticReward
from posttrain.types import Example
from posttrain.verifiers.final_int import get_spec

SPEC_VERSION = "final_int/strict-v1"  # the answer turn is one line: the work happened in the tool


class ToolArithmeticEnv(ToolEnvironment):
    """a*b with `digits`-digit operands and a calculator tool.

    digits        operand length, 2..6 (3: 100..999, products of up to 6 digits).
    seed          seeds the environment's own stream for `sample(..., seed=None)`.
    call_format   "compact" (`<tool_call>calculator: 347*829</tool_call>`, for character
                  models) or "json" (the Hermes/Qwen format chat templates teach).
    max_turns     model turns per episode: 3 leaves room for one retry after a bad call.
    on_malformed  "continue" (the model reads a <tool_error> and may retry) or "end"
                  (reward 0 at the first malformed call).
    step_cost, malformed_penalty
                  subtracted from the answer's score per tool call and per malformed
                  call (rewards/agentic.py); 0 = the answer's score alone.
    tool_demos    the share of SFT demonstrations that call the calculator; the others
                  state the product at once, as if computed in the head. Below 1, SFT leaves
                  a policy that mostly guesses, and RL has to find that the call pays.
    """

    def __init__(self, digits: int = 3, seed: int = 0, call_format: str = "compact", max_turns: int = 3,
                 max_total_tokens: int = 96, on_malformed: str = "continue", tool_demos: float = 1.0,
                 step_cost: float = 0.0, malformed_penalty: float = 0.0, thinking: str = "keep_all"):
        if isinstance(digits, bool) or digits not in range(2, 7):
            raise ValueError(f"digits must be an int from 2 to 6, got {digits!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if isinstance(tool_demos, bool) or not isinstance(tool_demos, (int, float)) or not 0 <= tool_demos <= 1:
            raise ValueError(f"tool_demos must be a share in [0, 1], got {tool_demos!r}")
        # 96 tokens: two compact turns and a result are ~50 characters; room for one retry
        super().__init__([calculator_tool()], call_format=call_format, max_turns=max_turns,
                         max_total_tokens=max_total_tokens, on_malformed=on_malformed,
                         agentic_reward=AgenticReward(step_cost, malformed_penalty), thinking=thinking)
        self.digits, self.seed, self.tool_demos = digits, seed, float(tool_demos)
        self._rng = random.Random(seed)
        self._spec = get_spec(SPEC_VERSION)

    @property
    def name(self) -> str:
        return f"tool_arithmetic-D{self.digits}-{self.call_format}"

    @property
    def spec_version(self) -> str:
        return SPEC_VERSION

    @property
    def split_rule(self) -> str:
        return SPLIT_RULE

    @property
    def honest(self) -> bool:
        return True

    # --- problems ------------------------------------------------------------------------------

    def _draw(self, rng: random.Random) -> tuple[int, int]:
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        return rng.randint(low, high), rng.randint(low, high)

    def _example(self, a: int, b: int) -> Example:
        expression = f"{a}*{b}"
        return Example(prompt=f"Q: {expression}\n", expected_answer=str(a * b),
                       id=f"toolarith-D{self.digits}-{expression}",
                       meta={"digits": self.digits, "a": a, "b": b, "split": split_of(expression)})

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        """n problems of `split`, i.i.d. (repeats possible); seed None continues the
        environment's own stream, so successive batches differ."""
        check_split_request(split, n)
        rng = self._rng if seed is None else random.Random(seed)
        examples: list[Example] = []
        while len(examples) < n:
            a, b = self._draw(rng)
            if split_of(f"{a}*{b}") == split:
                examples.append(self._example(a, b))
        return examples

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """n DISTINCT problems of `split`, the same every call (a smaller n: a prefix)."""
        check_split_request(split, n)
        n_problems = (9 * 10 ** (self.digits - 1)) ** 2
        if n > n_problems // 20:  # dev and heldout each hold ~10%: stay well inside that
            raise ValueError(f"n={n} is too many distinct problems for digits={self.digits} (each of dev and "
                             f"heldout holds ~{n_problems // 10}); ask for at most {n_problems // 20}")
        rng = random.Random(seed)
        chosen: dict[tuple[int, int], None] = {}  # an ordered set: the first n distinct draws
        while len(chosen) < n:
            a, b = self._draw(rng)
            if split_of(f"{a}*{b}") == split:
                chosen.setdefault((a, b), None)
        return [self._example(a, b) for a, b in chosen]

    # --- the task's answers ----------------------------------------------------------------------

    def demonstration_turns(self, example: Example) -> list[str]:
        """Call the calculator on the prompt's expression, then state its result; or, for
        the 1 - tool_demos share of problems (chosen by a hash of the problem, so the same
        ones every run), state the product at once."""
        a, b = _operands(example.prompt)
        if stable_fraction(f"demo:{a}*{b}") >= self.tool_demos:
            return [f"Final: {a * b}"]
        call = ToolCall("calculator", {"expression": f"{a}*{b}"})
        return [render_call(call, self.call_format), f"Final: {a * b}"]

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        """The final answer turn (thinking removed) under final_int/strict-v1."""
        return self._spec(example, completion)

    def __repr__(self) -> str:
        return (f"ToolArithmeticEnv(digits={self.digits}, seed={self.seed}, call_format={self.call_format!r}, "
                f"max_turns={self.max_turns})")


def stable_fraction(key: str) -> float:
    """A number in [0, 1) fixed by `key` (the same on every machine and run)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def _operands(prompt: str) -> tuple[int, int]:
    body = prompt[len("Q: "):-1] if prompt.startswith("Q: ") and prompt.endswith("\n") else ""
    a, star, b = body.partition("*")
    if not (star and a.isascii() and a.isdigit() and b.isascii() and b.isdigit()):
        raise ValueError(f"not a tool-arithmetic prompt (want 'Q: <a>*<b>\\n'): {prompt!r}")
    return int(a), int(b)

