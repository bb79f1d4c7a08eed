"""Steps: a completion cut into checkable pieces, and a label for each piece.

A process reward model (rewards/process_reward_model.py) scores every step of a chain of
thought instead of only its end. It needs two things from a task: where the steps are,
and which of them are right. This module gives both for the arithmetic task, and a
Monte-Carlo label for tasks that have only an outcome verifier (monte_carlo.py).

Where the steps are (`split_steps`, the arithmetic chain format of envs/arithmetic.py):

    "7+5=12,12+9=21,21+3=24\\nFinal: 24"  ->  ["7+5=12", "12+9=21", "21+3=24", "Final: 24"]

The rule, total on every string (it never raises): strip surrounding ASCII whitespace; if
the last line starts with "Final:", it is the last step and the text before it is the
body; otherwise the whole text is the body. The body is cut at every ',' and newline,
each piece stripped, empty pieces dropped. So malformed text still yields steps ("hello"
-> ["hello"], "" -> []), which the checker then marks wrong; nothing is lost silently
except empty pieces and whitespace.

`join_steps` writes steps back in the same format (',' between chain steps, a newline
before the Final line): `join_steps(split_steps(c)) == c` for every well-formed chain.

Which steps are right (`check_arithmetic_steps`): three verdicts per step, so a caller can
see exactly why a step fails.

    arithmetic_holds   "a op b = c" parses and a op b == c. The issue's definition of a
                       correct step; on its own it lets "1+1=2" pass anywhere. For the
                       Final line: the number equals the result of the last chain step
    follows_problem    the step does the problem's next operation: its left operand is the
                       previous step's result as written (the first term for step 1) and
                       its operator and right operand are the problem's next ones. For the
                       Final line: the chain covered every term before it
    label              the label PRMs are trained on: this step and every step before it
                       both hold and follow, so every result so far is the true running
                       sum, and for the Final line its number is the expected answer.
                       This is the "first error" convention of PRM800K (Lightman et al.
                       2023) and the hard label of Math-Shepherd (Wang et al. 2024): a step
                       is good iff the solution can still reach the right answer without
                       undoing anything, so every step after the first mistake is bad, even
                       one whose own arithmetic is right ("12+9=20,20+3=23": the second step
                       holds and follows, but starts from a wrong sum)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from posttrain.types import Example

FINAL_PREFIX = "Final:"
WHITESPACE = " \t\n\r\f\v"  # ASCII only, as final_int.py strips
# one chain step and the Final line, matched whole:
# integers (negative after a '-' problem), an operator, a term, '=', an integer. ASCII digits
# only (str.isdigit() would let '٣' through), at most 40 of them: int() refuses strings
# past 4,300 digits, and no answer here is near 40
_STEP = re.compile(r"(-?[0-9]{1,40})([+-])([0-9]{1,40})=(-?[0-9]{1,40})")
_FINAL = re.compile(r"Final: (-?[0-9]{1,40})")


def split_steps(completion: str) -> list[str]:
    """The steps of an arithmetic chain of thought (the rule is in the module docstring).
    Total on strings: returns [] for empty text, never raises."""
    text = completion.strip(WHITESPACE)
    if not text:
        return []
    body, _, last_line = text.rpartition("\n")
    final = []
    if last_line.startswith(FINAL_PREFIX):
        final = [last_line.strip(WHITESPACE)]
    else:
        body = text
    pieces = (piece.strip(WHITESPACE) for line in body.split("\n") for piece in line.split(","))
    return [piece for piece in pieces if piece] + final


def join_steps(steps: Sequence[str]) -> str:
    """Steps back into one completion: ',' between chain steps, a newline before a step
    that starts with 'Final:'. The inverse of split_steps on well-formed chains."""
    text = ""
    for i, step in enumerate(steps):
        if i:
            text += "\n" if step.startswith(FINAL_PREFIX) else ","
        text += step
    return text


def step_separators(steps: Sequence[str]) -> list[str]:
    """The text that follows each step in `join_steps(steps)`: ',' or a newline before
    the next step, '' after the last. A process reward model reads each step's score at the
    token after the step, where the step is known to be over."""
    return [("\n" if nxt.startswith(FINAL_PREFIX) else ",") for nxt in steps[1:]] + [""] if steps else []


def newline_separators(steps: Sequence[str]) -> list[str]:
    """One step per line (reasoning-gym style, TRL's default step separator): a newline
    after every step but the last."""
    return ["\n"] * (len(steps) - 1) + [""] if steps else []


@dataclass(frozen=True)
class StepVerdict:
    step: str
    arithmetic_holds: bool  # a op b == c (Final line: equals the last chain result)
    follows_problem: bool  # the problem's next operation, from the previous result as written
    label: bool  # holds, follows, and every earlier step was labelled True (the PRM's target)


def problem_of(example: Example) -> tuple[list[int], list[str]] | None:
    """(terms, ops) of an arithmetic example: from its meta when the environment put them
    there, else parsed from a 'Q: <expr>\\n' prompt; None when it is neither."""
    meta = example.meta or {}
    terms, ops = meta.get("terms"), meta.get("ops")
    if isinstance(terms, list) and isinstance(ops, list) and len(ops) == len(terms) - 1 and terms:
        return [int(t) for t in terms], [str(o) for o in ops]
    prompt = example.prompt.strip(WHITESPACE)
    match = re.fullmatch(r"Q: ([0-9]{1,40}(?:[+-][0-9]{1,40})*)", prompt)
    if match is None:
        return None
    expression = match.group(1)
    return [int(t) for t in re.findall(r"[0-9]+", expression)], re.findall(r"[+-]", expression)


def check_arithmetic_steps(example: Example, steps: Sequence[str]) -> list[StepVerdict]:
    """One StepVerdict per step (module docstring). Total: a step that does not parse is
    wrong on all three counts; an example that is not an arithmetic problem raises
    ValueError, since no step of it can be checked."""
    problem = problem_of(example)
    if problem is None:
        raise ValueError(f"not an arithmetic example (want meta terms/ops or a 'Q: <expr>\\n' prompt): "
                         f"{example.prompt!r}; label steps of other tasks with monte_carlo_step_labels")
    terms, ops = problem
    expected = str(example.expected_answer).strip(WHITESPACE)
    verdicts: list[StepVerdict] = []
    previous = terms[0]  # the left operand step 1 must start from
    on_path = True  # every step so far held and followed
    done = 0  # chain steps that followed the problem so far (the next term is terms[done + 1])
    for step in steps:
        final = _FINAL.fullmatch(step)
        if final is not None:
            answer = int(final.group(1))
            holds = answer == previous  # the running value so far: the last result, or the first term
            follows = done == len(ops)
            on_path = on_path and holds and follows and final.group(1) == expected
            verdicts.append(StepVerdict(step, holds, follows, on_path))
            continue
        match = _STEP.fullmatch(step)
        if match is None:
            verdicts.append(StepVerdict(step, False, False, False))
            on_path = False
            continue
        a, op, b, c = int(match.group(1)), match.group(2), int(match.group(3)), int(match.group(4))
        holds = c == (a + b if op == "+" else a - b)
        follows = done < len(ops) and a == previous and op == ops[done] and b == terms[done + 1]
        on_path = on_path and holds and follows
        verdicts.append(StepVerdict(step, holds, follows, on_path))
        # the next step should start from this one's result as written, right or wrong
        previous, done = c, done + 1
    return verdicts


def arithmetic_step_labels(example: Example, completion: str) -> tuple[list[str], list[bool]]:
    """(steps, labels) of one completion: split_steps, then each verdict's `label`."""
    steps = split_steps(completion)
    return steps, [verdict.label for verdict in check_arithmetic_steps(example, steps)]


def stepwise_record(example: Example, completion: str, outcome: float) -> dict[str, Any]:
    """One row of TRL's stepwise-supervision format (`prompt`, `completions`: the steps,
    `labels`: one bool per step), plus our `outcome` (the verifier's reward for the whole
    completion, which an outcome reward model trains on) and the expected answer."""
    steps, labels = arithmetic_step_labels(example, completion)
    return {"prompt": example.prompt, "completions": steps, "labels": labels, "outcome": float(outcome),
            "expected_answer": example.expected_answer}
