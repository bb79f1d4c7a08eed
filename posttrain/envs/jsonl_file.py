"""Your own problems: a JSONL file of {prompt, expected_answer, id?, meta?} lines, scored
by any registered verifier (posttrain/verifiers/__init__.py, `--env.spec_version`).

    name    default verifier          a line of the file
    jsonl   final_int/cot-v1          {"prompt": "Q: 12*3\\n", "expected_answer": 36,
            (strict-v1 with cot=false) "meta": {"solution": "12*3=36\\nFinal: 36"}}
    math    math/boxed-or-final-v1    {"prompt": "Half of 1?", "expected_answer": "\\\\frac{1}{2}",
                                       "meta": {"solution": "\\\\boxed{0.5}"}}
    code    code/tests-v1             {"prompt": "Write add(a, b).", "expected_answer": "",
                                       "meta": {"tests": ["assert add(2, 3) == 5"],
                                                "solution": "def add(a, b):\\n    return a + b"}}

A problem the verifier could never score is refused when the file loads, naming the line
and what to fix: a final_int problem whose expected answer is not an integer, a math
problem with an empty one, a code problem whose `meta.tests` is missing or does not
compile. (The verifier itself stays total: it would score such a problem 0.0 with a
reason; refusing it at load keeps a run from training on rewards that can never be 1.)

Splits are assigned exactly like the arithmetic task's, from a sha256 of each prompt, so
the same file always splits the same way and a prompt can never be in two splits (about
10% of the problems land in each of dev and heldout, so a file needs a few dozen for both
to be non-empty). SFT needs demonstrations: put the reference completion in
`meta.solution`, or skip SFT by starting from a checkpoint that already follows the format
(`--init`).
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.envs.arithmetic import SPLIT_BUCKETS, SPLIT_RULE, load_examples_jsonl, split_of
from posttrain.types import Example
from posttrain.verifiers import get_verifier


class JsonlEnv:
    """Problems from `path`, scored by `spec_version` (any registered verifier); by
    default final_int's cot-v1, or strict-v1 when `cot` is false."""

    def __init__(self, path: str = "", cot: bool = True, spec_version: str | None = None):
        self._load("jsonl", path, spec_version or ("final_int/cot-v1" if cot else "final_int/strict-v1"))

    def _load(self, env_name: str, path: str, spec_version: str) -> None:
        if not path:
            raise ValueError(f"environment {env_name!r} needs a file: pass --env.path problems.jsonl")
        self.path = path
        self._spec = get_verifier(spec_version)
        self.split_rule = SPLIT_RULE
        self.by_split: dict[str, list[Example]] = {split: [] for split in SPLIT_BUCKETS}
        for example in load_examples_jsonl(path, check=self._spec.check_example):
            self.by_split[split_of(example.prompt)].append(example)

    @property
    def spec_version(self) -> str:
        return self._spec.version

    def _split(self, split: str, n: int) -> list[Example]:
        if split not in self.by_split:
            raise ValueError(f"split must be one of {list(self.by_split)}, got {split!r}")
        if not self.by_split[split] and n > 0:
            sizes = {name: len(rows) for name, rows in self.by_split.items()}
            raise ValueError(f"{self.path}: no problems fall in split {split!r} (split sizes {sizes}); "
                             "add more problems (about 10% land in each of dev and heldout)")
        return self.by_split[split]

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        pool = self._split(split, n)
        rng = random.Random(seed)
        return [rng.choice(pool) for _ in range(n)]

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """Up to n distinct problems of `split` (all of them when the file has fewer)."""
        pool = list(self._split(split, n))
        random.Random(seed).shuffle(pool)
        return pool[:n]

    def solution(self, example: Example) -> str:
        if not isinstance(example.meta.get("solution"), str):
            raise ValueError(f"{self.path}: problem {example.id or example.prompt!r} has no meta.solution "
                             "(a str); SFT needs one per problem, or skip SFT with --init CHECKPOINT")
        return example.meta["solution"]

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        return self._spec(example, completion)


# A named environment is the jsonl one with another default verifier: no `cot` setting,
# because their answers span lines (a boxed derivation, a function) and must not be cut
# at the first newline.


class MathEnv(JsonlEnv):
    """Math problems from `path`, scored by math/boxed-or-final-v1 (a `\\boxed{}` or
    `Final:` answer, compared by math-verify) unless `spec_version` names another."""

    def __init__(self, path: str = "", spec_version: str | None = None):
        self._load("math", path, spec_version or "math/boxed-or-final-v1")


class CodeEnv(JsonlEnv):
    """Programming problems from `path`, each with its tests in `meta.tests`, scored by
    code/tests-v1 (every test passes in the sandbox) unless `spec_version` names another
    (code/tests-partial-v1: the fraction that passes)."""

    def __init__(self, path: str = "", spec_version: str | None = None):
        self._load("code", path, spec_version or "code/tests-v1")
