"""Judge demonstrations: SFT rows that teach a model to judge answers to its task, made from
the task itself (the self-rewarding paper's "evaluation fine-tuning" data, Yuan et al. 2024,
arXiv:2401.10020, Sec. 2.1, whose EFT set was judgements kept where they matched human
rankings; here the task's own solutions give the labels).

For each problem, two rows in the judge's exact layout (rewards/judge.py::judge_prompt_ids,
the compact prompt and the Y/N scale of rewards/self_judge.py):

    prompt   <bos>Q: 7+5+9\n7+5=12,12+9=21\nFinal: 21\nCorrect?␣       response  Y<eos>
    prompt   <bos>Q: 7+5+9\n7+5=13,13+9=22\nFinal: 22\nCorrect?␣       response  N<eos>

The right answer is the environment's solution. The wrong one is the error a policy makes:
on arithmetic (any task whose problems verifiers/steps.py can read), one step's sum off by a
small amount and every later step carried on from it, so the chain is consistent with itself
and only checking the arithmetic catches it (a digit changed at random would instead leave a
copying mismatch that a judge can spot without adding anything); on other tasks, one digit of
the solution changed. Only the label token (and EOS) is trained, as in any SFT row: the
model learns to answer the question, not to write the wrong chain.
"""

from __future__ import annotations

import random
import re

from posttrain.rewards.judge import COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, judge_prompt_ids
from posttrain.rewards.self_judge import SELF_JUDGE_CRITERION
from posttrain.types import Environment, Episode, Example, Tokenizer
from posttrain.verifiers.steps import problem_of

# how far a wrong step's sum is off: the slips a running-sum chain shows (a carry, a neighbour)
STEP_ERRORS = (-10, -2, -1, 1, 2, 10)


def carried_step_error(terms: list[int], ops: list[str], rng: random.Random, cot: bool = True) -> str:
    """A wrong arithmetic solution in the environment's format ("a+b=s,s+c=t\\nFinal: t"): one
    step's sum off by one of STEP_ERRORS, every later step continued from it, the final answer
    the last (wrong) sum. Without a chain of thought (cot False), only the wrong final line."""
    sums = [terms[0]]
    wrong_step = rng.randrange(len(ops))  # the step whose result is wrong
    for i, (op, term) in enumerate(zip(ops, terms[1:])):
        sums.append(sums[-1] + term if op == "+" else sums[-1] - term)
        if i == wrong_step:
            sums[-1] += rng.choice(STEP_ERRORS)
    final = f"Final: {sums[-1]}"
    if not cot:
        return final
    steps = ",".join(f"{sums[i]}{op}{term}={sums[i + 1]}" for i, (op, term) in enumerate(zip(ops, terms[1:])))
    return f"{steps}\n{final}"


def corrupt_one_digit(text: str, rng: random.Random) -> str:
    """`text` with one of its digits (chosen uniformly) replaced by another digit; ValueError
    when it has none (no wrong twin can be made this way)."""
    positions = [m.start() for m in re.finditer(r"[0-9]", text)]
    if not positions:
        raise ValueError(f"the solution {text[:60]!r} has no digit to corrupt; judge demonstrations need a task "
                         "whose solutions hold numbers")
    i = rng.choice(positions)
    return text[:i] + rng.choice([d for d in "0123456789" if d != text[i]]) + text[i + 1 :]


def wrong_solution(env: Environment, example: Example, rng: random.Random) -> str:
    """A wrong answer to `example` in the form of its solution (module docstring)."""
    solution = env.solution(example)
    problem = problem_of(example)
    if problem is not None and len(problem[1]) >= 1:
        return carried_step_error(*problem, rng, cot="\n" in solution)
    return corrupt_one_digit(solution, rng)


def judge_demonstrations(env: Environment, tokenizer: Tokenizer, examples: list[Example], seed: int) -> list[Episode]:
    """Two rows per example, its solution judged Y and a wrong twin judged N (module
    docstring), laid out as the self-judge reads them. Deterministic in `seed`."""
    rng = random.Random(seed)
    yes, no = CORRECT_YN.labels
    rows = []
    for i, example in enumerate(examples):
        for completion, label in ((env.solution(example), yes), (wrong_solution(env, example, rng), no)):
            prompt_ids = judge_prompt_ids(tokenizer, CORRECT_YN, *SELF_JUDGE_CRITERION, example, completion,
                                          COMPACT_JUDGE_PROMPT_VERSION)
            response = tokenizer.encode(label) + [tokenizer.eos_id]
            rows.append(Episode(example=example, group_id=i, prompt_ids=prompt_ids, response_ids=response,
                                response_logp=[0.0] * len(response), completion=label))
    return rows
