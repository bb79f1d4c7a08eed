"""Your own problems: a JSONL file of {prompt, expected_answer, id?, meta?} lines, scored
by a `Final: <int>` spec.

Splits are assigned exactly like the arithmetic task's, from a sha256 of each prompt, so
the same file always splits the same way and a prompt can never be in two splits. SFT
needs demonstrations: put the reference completion in `meta.solution`, or skip SFT by
starting from a checkpoint that already follows the format (`--init`).

    {"prompt": "Q: 12*3\\n", "expected_answer": "36", "meta": {"solution": "Final: 36"}}
"""

from __future__ import annotations

import random
from typing import Any

from posttrain.envs.arithmetic import SPLIT_BUCKETS, SPLIT_RULE, load_examples_jsonl, split_of
from posttrain.verifiers.final_int import get_spec
from posttrain.types import Example


class JsonlEnv:
    def __init__(self, path: str = "", cot: bool = True, spec_version: str | None = None):
        if not path:
            raise ValueError("environment 'jsonl' needs a file: pass --env.path problems.jsonl")
        self.path = path
        self._spec = get_spec(spec_version or ("final_int/cot-v1" if cot else "final_int/strict-v1"))
        self.split_rule = SPLIT_RULE
        self.by_split: dict[str, list[Example]] = {split: [] for split in SPLIT_BUCKETS}
        for example in load_examples_jsonl(path):
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
        if "solution" not in example.meta:
            raise ValueError(f"{self.path}: problem {example.id or example.prompt!r} has no meta.solution; SFT needs "
                             "one per problem, or skip SFT with --init CHECKPOINT")
        return example.meta["solution"]

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        return self._spec(example, completion)
