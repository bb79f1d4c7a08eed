"""Verifiers: `score(example, completion) -> {"reward", "details"}`, one versioned spec each.

    final_int.py     `Final: <int>` answers, strict and chain-of-thought, and hackable variants
    math_answer.py   `\\boxed{}` or `Final:` answers compared by math-verify, with a hard deadline
    code.py          the example's tests run against the completion's code in the sandbox
"""
