"""Verifiers: `score(example, completion) -> {"reward", "details"}`, one versioned spec each.

    contract.py      the contract they all keep, and the input checks they share
    final_int.py     `Final: <int>` answers, strict and chain-of-thought, and hackable variants
    gsm8k.py         GSM8K's `#### <int>` answers, and its `<<48/2=24>>` calculator annotations as steps
    math_answer.py   `\\boxed{}` or `Final:` answers compared by math-verify, with a hard deadline
    math_worker.py   the child process that runs math-verify, killed when the deadline passes
    code.py          the example's tests run against the completion's code in the sandbox,
                     the verdict computed by this process, never by the untrusted one
    code_probes.py   each test split into what only the sandbox can compute and the comparison
    code_replay.py   a test that cannot be split, replayed in a sandbox without the solution
    code_values.py   the plain data that crosses the sandbox's wall, both ways
    code_harness.py  the three programs that run inside the sandbox
    reasoning_gym_answer.py   a reasoning-gym task's own grader behind the contract, made total
    humaneval_program.py      a HumanEval problem's header + the completion, judged by code/tests-v2

Every spec of every module, by name (its `version`, also `details["spec_version"]`):

    VERIFIERS["math/boxed-or-final-v2"](example, completion)
    get_verifier(name)   the same, with an error listing the valid names

A spec that changes what pays gets a new version and the old one stays registered, so a
run scored under it can still be compared: math/boxed-or-final-v1 credits relations and
percentages it cannot judge ('5 = 4' for 4), v2 (the default) refuses them. code/tests-v1
(and humaneval/tests-v1 on it) ran a test it could not split beside the solution, which
could forge its verdict (an always-equal object paid 1.0 on 6 HumanEval problems), and let
a solution's own `abs` compute `abs(f(x) - y)`; code/tests-v2 (the default) replays such
a test without the solution or withholds its verdict, and reads a builtin's name as the
builtin unless it is meta["entry_point"].
"""

from __future__ import annotations

from posttrain.verifiers import code, final_int, gsm8k, humaneval_program, math_answer, reasoning_gym_answer
from posttrain.verifiers.contract import Verifier

VERIFIERS: dict[str, Verifier] = {**final_int.SPECS, **math_answer.SPECS, **code.SPECS,
                                  **reasoning_gym_answer.SPECS, **humaneval_program.SPECS, **gsm8k.SPECS}


def get_verifier(name: str) -> Verifier:
    """The scorer registered as `name`, e.g. get_verifier("code/tests-v1")."""
    if name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; valid names: {', '.join(VERIFIERS)}")
    return VERIFIERS[name]
