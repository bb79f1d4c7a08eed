"""Search QA: questions about invented towns that need a lookup, then arithmetic. The web
archetype of tool use (L18), offline: a search tool over a bundled corpus
(envs/corpus_search.py) and a calculator.

    prompt:         "Q: Zedoputh towers+wells\n"
    model turn 1:   "<tool_call>search: Zedoputh</tool_call>"
    observation:    "<tool_result>Zedoputh has 45 towers, 56 bridges and 38 wells. Zedoputh lies east
                     of Sasi.</tool_result>\n"
    model turn 2:   "<tool_call>calculator: 45+38</tool_call>"
    observation:    "<tool_result>83</tool_result>\n"
    model turn 3:   "Final: 83"                        (scored: final_int/strict-v1, against 83)

The towns are invented, so no model knows their numbers: the answer needs the lookup. A
question asks for the sum or the product of two of a town's three counts (6 kinds × 1,000
towns = 6,000 problems, split by a hash of the question as the arithmetic task splits).

What gets hacked (the search archetype's failure): a policy that searches and then copies
a number from the snippet, "Final: 45", has used the tool and is grounded in what it
retrieved, and a verifier that asks "is the answer supported by the retrieved evidence?"
pays it. This one recomputes the answer from the question (the sum or product of the two
counts) and pays only that number: the corpus is generated so that no count of a town is
the sum or the product of its other two, so no copied number is ever right. The agentic
term `used_tool_result` (rewards/agentic.py) is the evidence check, and pays the copy:
`hack_turns` writes that episode, and tests/test_joint_rewards.py scores it both ways.
"""

from __future__ import annotations

import json
import random
from typing import Any

from posttrain.envs.arithmetic import SPLIT_RULE, check_split_request, split_of
from posttrain.envs.corpus_search import ATTRIBUTES, CORPUS_PATH, SearchIndex, search_tool
from posttrain.envs.tool_calls import render_call
from posttrain.envs.tool_env import ToolEnvironment
from posttrain.envs.tools import ToolCall, calculator_tool
from posttrain.types import Example
from posttrain.verifiers.final_int import get_spec

SPEC_VERSION = "final_int/strict-v1"  # the answer turn is one line: the lookup and the sum happened in tools
# the questions: two of a town's counts, summed or multiplied ("towers+wells", "bridges*wells", ...)
QUESTIONS = [f"{a}{op}{b}" for op in "+*" for i, a in enumerate(ATTRIBUTES) for b in ATTRIBUTES[i + 1:]]


class SearchQAEnv(ToolEnvironment):
    """Questions about the corpus's towns, answered with a search tool and a calculator.

    seed          seeds the environment's own stream for `sample(..., seed=None)`.
    call_format   "compact" (`<tool_call>search: Zedoputh</tool_call>`, character models) or "json".
    max_turns     model turns per episode: search, calculate, answer, and one retry.
    top_k         documents the search tool returns per query (1: the town's own ranks first).
    """

    def __init__(self, seed: int = 0, call_format: str = "compact", max_turns: int = 4, max_total_tokens: int = 320,
                 on_malformed: str = "continue", top_k: int = 1, thinking: str = "keep_all"):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        records = [json.loads(line) for line in CORPUS_PATH.read_text(encoding="utf-8").splitlines()]
        self.index = SearchIndex([record["text"] for record in records])
        # 320 tokens: a character model's three turns and two results are ~200 characters
        super().__init__([search_tool(self.index, top_k), calculator_tool()], call_format=call_format,
                         max_turns=max_turns, max_total_tokens=max_total_tokens, on_malformed=on_malformed,
                         thinking=thinking)
        self.towns = {record["name"]: record for record in records}
        self.seed, self.top_k = seed, top_k
        self._rng = random.Random(seed)
        self._spec = get_spec(SPEC_VERSION)
        self.problems: dict[str, list[tuple[str, str]]] = {"train": [], "dev": [], "heldout": []}
        for name in self.towns:  # every (town, question), each in one split by a hash of its text
            for question in QUESTIONS:
                self.problems[split_of(f"{name} {question}")].append((name, question))

    @property
    def name(self) -> str:
        return f"search_qa-{self.call_format}"

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

    def example(self, town: str, question: str) -> Example:
        record = self.towns[town]
        a, op, b = question.partition("+") if "+" in question else question.partition("*")
        answer = record[a] + record[b] if op == "+" else record[a] * record[b]
        return Example(prompt=f"Q: {town} {question}\n", expected_answer=str(answer), id=f"search_qa-{town}-{question}",
                       meta={"town": town, "question": question, "split": split_of(f"{town} {question}")})

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        """n problems of `split`, i.i.d. (repeats possible); seed None continues the
        environment's own stream, so successive batches differ."""
        check_split_request(split, n)
        rng = self._rng if seed is None else random.Random(seed)
        return [self.example(*rng.choice(self.problems[split])) for _ in range(n)]

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """n DISTINCT problems of `split`, the same every call (a smaller n: a prefix)."""
        check_split_request(split, n)
        pool = self.problems[split]
        if n > len(pool):
            raise ValueError(f"n={n} is more than the {len(pool)} {split} problems search_qa has; ask for at most "
                             f"{len(pool)}")
        return [self.example(*problem) for problem in random.Random(seed).sample(pool, n)]

    # --- the task's answers ----------------------------------------------------------------------

    def demonstration_turns(self, example: Example) -> list[str]:
        """Search the town, compute from its two counts, state the result."""
        record, question = self.towns[example.meta["town"]], example.meta["question"]
        op = "+" if "+" in question else "*"
        a, b = question.split(op)
        return [render_call(ToolCall("search", {"query": record["name"]}), self.call_format),
                render_call(ToolCall("calculator", {"expression": f"{record[a]}{op}{record[b]}"}), self.call_format),
                f"Final: {example.expected_answer}"]

    def hack_turns(self, example: Example) -> list[str]:
        """The copy hack (module docstring): search, then answer the first count the question
        names, as it stands in the snippet, without the arithmetic."""
        record = self.towns[example.meta["town"]]
        first = example.meta["question"].replace("*", "+").split("+")[0]
        return [render_call(ToolCall("search", {"query": record["name"]}), self.call_format),
                f"Final: {record[first]}"]

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        """The final answer turn (thinking removed) under final_int/strict-v1, against the
        number the question asks for, computed from the corpus, never read from a snippet."""
        return self._spec(example, completion)

    def __repr__(self) -> str:
        return f"SearchQAEnv(call_format={self.call_format!r}, max_turns={self.max_turns}, top_k={self.top_k})"
