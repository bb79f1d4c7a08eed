"""Your own problems: a file or directory of rows {prompt, expected_answer, id?, meta?}, or
TRL's conventions (prompt/completion, messages; envs/problem_rows.py), in any format
envs/dataset_files.py reads (JSONL, JSON, Parquet, a saved `datasets` directory), scored by
any registered verifier (posttrain/verifiers/__init__.py, `--env.spec_version`).

    name    default verifier          a row of the file
    jsonl   final_int/cot-v1          {"prompt": "Q: 12*3\\n", "expected_answer": 36,
            (strict-v1 with cot=false) "meta": {"solution": "12*3=36\\nFinal: 36"}}
    math    math/boxed-or-final-v2    {"prompt": "Half of 1?", "answer": "\\\\frac{1}{2}",
                                       "completion": "\\\\boxed{0.5}"}
    code    code/tests-v2             {"prompt": "Write add(a, b).", "expected_answer": "",
                                       "meta": {"tests": ["assert add(2, 3) == 5"],
                                                "solution": "def add(a, b):\\n    return a + b"}}

A problem the verifier could never score is refused when the file loads, naming the line
and what to fix: a final_int problem whose expected answer is not an integer, a math
problem with an empty one, a code problem whose `meta.tests` is missing or does not
compile. (The verifier itself stays total: it would score such a problem 0.0 with a
reason; refusing it at load keeps a run from training on rewards that can never be 1.)
Two more mistakes are refused the same way, because neither can ever train:
- a `meta.solution` that the verifier does not score 1: SFT would teach a wrong answer.
  Each solution is scored once per process and file (about 20 ms a problem under math's
  verifier, 40 ms under code's sandbox), so a run's repeated loads pay it once;
- the same prompt twice with different answers (expected_answer, or meta.tests): one of
  them is wrong, and no completion can earn the reward of both. Both lines are named.
Exact repeats (same prompt, same answer) are kept once, with a warning: the split of a
problem is its prompt's, so a copy would only count twice in every held-out pass@1.

Splits are assigned exactly like the arithmetic task's, from a sha256 of each prompt, so
the same file always splits the same way, with no seed to set, and a prompt can never be in
two splits (about 10% of the problems land in each of dev and heldout, so a file needs a few
dozen for both to be non-empty). A held-out set of your own replaces the hashed one: a
`heldout_path` file, a source's own "test" split (a DatasetDict, a JSON object of lists, a
test* file in a directory) or a `split` column; its rows are held out, and the training rows
the hash would have held out train instead (likewise a "validation" split for dev). A prompt
in both is kept in the held-out split only. SFT needs demonstrations: put the reference
completion in `completion` (or `meta.solution`), or skip SFT by starting from a checkpoint
that already follows the format (`--init`).
"""

from __future__ import annotations

import json
import os
import random
import warnings
from pathlib import Path
from typing import Any, Callable

from posttrain.config.checks import PosttrainWarning
from posttrain.envs.arithmetic import SPLIT_BUCKETS, SPLIT_RULE, split_of
from posttrain.envs.dataset_files import Row, parse_columns, read_rows
from posttrain.envs.problem_rows import assign_split, example_from_row
from posttrain.guards.sandbox import permit_weak_sandbox, weak_sandbox_refusal
from posttrain.types import Example
from posttrain.verifiers import get_verifier
from posttrain.verifiers.contract import shown

# (file, size, mtime, verifier) whose reference solutions all scored 1 in this process: the
# CLI's config check and the run itself load the same file, and scoring is the slow part
_SOLUTIONS_VERIFIED: set[tuple] = set()
SPLIT_ORDER = ("heldout", "dev", "train")  # a problem in two splits stays in the first of these


class JsonlEnv:
    """Problems from `path` (any format of envs/dataset_files.py), scored by `spec_version`
    (any registered verifier); by default final_int's cot-v1, or strict-v1 when `cot` is
    false. `columns` maps the source's column names to ours ("prompt=question,...");
    `heldout_path` is a held-out set of the user's own (every row of it held out)."""

    def __init__(self, path: str = "", cot: bool = True, spec_version: str | None = None, columns: str = "",
                 heldout_path: str = ""):
        self._load("jsonl", path, spec_version or ("final_int/cot-v1" if cot else "final_int/strict-v1"), columns,
                   heldout_path)

    def _load(self, env_name: str, path: str, spec_version: str, columns: str, heldout_path: str,
              row_as_ours: Callable[[Row], Row] | None = None) -> None:
        """Read the rows; `row_as_ours` rewrites a row of another schema (GSM8K's) into ours first."""
        if not path:
            raise ValueError(f"environment {env_name!r} needs a file: pass --env.path problems.jsonl")
        self.path = path
        self._spec = get_verifier(spec_version)
        self.by_split: dict[str, list[Example]] = {split: [] for split in SPLIT_BUCKETS}
        mapping = parse_columns(columns, "env.columns")
        rows = read_rows(path, mapping)
        if heldout_path:
            rows += [Row(row.where, row.record, "heldout") for row in read_rows(heldout_path, mapping)]
        if row_as_ours is not None:
            rows = [row_as_ours(row) for row in rows]
        checks = ProblemChecks([path, heldout_path], columns, self._spec)
        loaded = []
        for row in rows:
            example, declared = example_from_row(row)
            problem = checks(example, row.where)  # a prompt with two answers is refused there
            if problem:
                raise ValueError(f"{row.where}: {problem}; or remove the row")
            loaded.append((example, declared))
        declared_splits = {declared for _, declared in loaded if declared in ("dev", "heldout")}
        self.split_rule = SPLIT_RULE if not declared_splits else (
            f"{SPLIT_RULE}; except that the source's own {sorted(declared_splits)} rows are that split, and the "
            "rows the hash would put there train")
        placed: dict[str, tuple[Example, str]] = {}  # prompt -> (its first example, its split)
        for example, declared in loaded:
            split = assign_split(split_of(example.prompt), declared, declared_splits)
            first = placed.setdefault(example.prompt, (example, split))
            if SPLIT_ORDER.index(split) < SPLIT_ORDER.index(first[1]):
                placed[example.prompt] = (first[0], split)  # held out somewhere: never trained on
        for example, split in placed.values():
            self.by_split[split].append(example)
        if len(placed) < len(loaded):
            warnings.warn(f"{path}: {len(loaded) - len(placed)} row(s) repeat an earlier problem exactly (same "
                          "prompt and answer); each problem is kept once, in the most held-out split it is in",
                          PosttrainWarning, stacklevel=2)
        _SOLUTIONS_VERIFIED.add(checks.key)

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


class ProblemChecks:
    """The check of each problem of a source, in order: the verifier can score it
    (`check_example`), its prompt has no other answer earlier in the source, and its
    reference solution, if any, scores 1. Returns what is wrong, or None."""

    def __init__(self, paths: list[str], columns: str, spec) -> None:
        self.spec = spec
        self.key = (tuple(source_stamp(path) for path in paths if path), columns, spec.version)
        self.answers: dict[str, tuple] = {}  # prompt -> (the answer of its first row, that row)

    def __call__(self, example: Example, where: str) -> str | None:
        problem = self.spec.check_example(example)
        if problem:
            return problem
        answer = (example.expected_answer.strip(), json.dumps(example.meta.get("tests")))
        first, first_where = self.answers.setdefault(example.prompt, (answer, where))
        if first != answer:
            what = "expected_answer" if first[0] != answer[0] else "meta.tests"
            theirs, ours = (first[0], answer[0]) if what == "expected_answer" else (first[1], answer[1])
            source, _, place = first_where.rpartition(", ")
            same_source = where.startswith(source + ", ")
            return (f"prompt {shown(example.prompt)} is also on {place if same_source else first_where} with "
                    f"{what} {shown(theirs)}, here {shown(ours)}: a prompt has one answer (no completion can be "
                    "rewarded under two), so one of them is wrong or the same answer written twice: keep one")
        return self.check_solution(example)

    def check_solution(self, example: Example) -> str | None:
        solution = example.meta.get("solution")
        if solution is None or self.key in _SOLUTIONS_VERIFIED:
            return None
        if not isinstance(solution, str):
            return f"meta.solution must be a str (the reference completion SFT trains on), got {shown(solution)}"
        result = self.spec(example, solution)
        if result["reward"] == 1.0:
            return None
        details = result["details"]
        why = ", ".join(f"{key} {shown(details[key])}" for key in ("reason", "parsed", "error") if details.get(key))
        return (f"meta.solution {shown(solution, 80)} scores {result['reward']:g}, not 1, under {self.spec.version} "
                f"({why}), so SFT would teach a wrong answer: fix the solution or the expected answer")


def source_stamp(path: str) -> tuple:
    """(real path, total size, newest mtime) of a file, or of the files in a directory: a
    source whose solutions were verified is not verified again until one of them changes."""
    root = Path(path)
    files = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else [root] if root.is_file() else []
    stats = [p.stat() for p in files]
    return (os.path.realpath(path), sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0))


# A named environment is the jsonl one with another default verifier: no `cot` setting,
# because their answers span lines (a boxed derivation, a function) and must not be cut
# at the first newline.


class MathEnv(JsonlEnv):
    """Math problems from `path`, scored by math/boxed-or-final-v2 (a `\\boxed{}` or
    `Final:` answer, compared by math-verify) unless `spec_version` names another."""

    def __init__(self, path: str = "", spec_version: str | None = None, columns: str = "", heldout_path: str = ""):
        self._load("math", path, spec_version or "math/boxed-or-final-v2", columns, heldout_path)


class CodeEnv(JsonlEnv):
    """Programming problems from `path`, each with its tests in `meta.tests`, scored by
    code/tests-v2 (every test passes, each verdict reached where the solution cannot touch it)
    unless `spec_version` names another (code/tests-partial-v2: the fraction that passes).

    Where the namespace sandbox cannot be built (posttrain/guards/sandbox.py), construction fails
    with what is missing, unless `allow_weak_sandbox` accepts the prelude-only sandbox for
    the rest of the process (every scorer in it, so evaluation agrees with training)."""

    def __init__(self, path: str = "", spec_version: str | None = None, allow_weak_sandbox: bool = False,
                 columns: str = "", heldout_path: str = ""):
        if allow_weak_sandbox:
            permit_weak_sandbox()
        elif refusal := weak_sandbox_refusal():
            raise ValueError(f"environment 'code': {refusal}")
        self._load("code", path, spec_version or "code/tests-v2", columns, heldout_path)
