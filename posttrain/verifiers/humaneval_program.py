"""HumanEval's scoring (Chen et al. 2021) in our sandbox: the function the model wrote,
run against the problem's tests by the code verifier (verifiers/code.py).

    example.meta   {"entry_point": "add", "header": "def add(x, y):\\n    \\"\\"\\"...\\"\\"\\"\\n",
                    "tests": ["assert add(2, 3) == 5", ...]}
    completion     "```python\\ndef add(x, y):\\n    return x + y\\n```"   (a whole function)
               or  "    return x + y\\n"                                   (the body alone)

HumanEval's own harness runs `prompt + completion + test`: the model continues the
function header. An instruct model answers with the whole function instead, often without
the header's imports (`from typing import List`). Both are scored here, as one program:

    the completion defines `def <entry_point>(`   header, then the completion's code
                                                  (the header's stub, a docstring only, is
                                                  redefined; its imports and helpers stay)
    it does not                                   header + the completion: a continuation

`details["program"]` says which ("function" or "continuation"). The code is the completion's
last ```python block, else all of it (code.py::extract_code). Everything else, the threat
model, the limits and the reasons, is the code verifier's: the tests are its `meta["tests"]`.

    humaneval/tests-v2   judged by code/tests-v2 (the default): no test's verdict is computed
                         where the solution runs. The entry point is the solution's only name
                         (a test's `abs`, `sum`, `str` are the builtins whatever it rebinds),
                         and the header is trusted setup for the replayed tests (their
                         `encode_cyclic`, `poly` are the header's, never the completion's)
    humaneval/tests-v1   judged by code/tests-v1: 7 problems' tests ran whole beside the
                         solution, and an always-equal object scored 1.0 on 6 of them; kept
                         so that runs scored by it can still be compared
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from posttrain.types import Example
from posttrain.verifiers.code import REASONS as CODE_REASONS
from posttrain.verifiers.code import SPECS as CODE_SPECS
from posttrain.verifiers.code import extract_code
from posttrain.verifiers.contract import admit, shown

REASONS = CODE_REASONS  # the code verifier decides, so its reason codes are these


def program_of(example: Example, completion: str) -> tuple[str, str]:
    """(the program to test, "function" or "continuation"), from the header and the code."""
    header, entry_point = example.meta["header"], example.meta["entry_point"]
    code, _ = extract_code(completion)
    if re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", code, flags=re.MULTILINE):
        return f"{header}\n\n{code}", "function"
    return header + code, "continuation"


class HumanEvalProgram:
    """humaneval/tests-v2: reward 1.0 iff every test passes on the program built from the
    problem's header and the completion (module docstring); code/tests-v2 judges it, told the
    entry point and given the header as the tests' trusted setup. `version="humaneval/tests-v1"`:
    code/tests-v1 judges it, as before."""

    def __init__(self, version: str = "humaneval/tests-v2") -> None:
        self.version = version
        self._code = CODE_SPECS["code/tests-" + version.rsplit("-", 1)[1]]

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        checked, _, _ = admit(example, completion)  # checked is None: refused
        problem = None if checked is None else self.check_example(checked)
        if checked is None or problem:  # the code verifier gives the reason (bad_example, not_text, bad_tests)
            result = self._code(example if checked is None else {**_fields(checked), "meta": {}}, completion)
            if problem:
                result["details"]["error"] = problem
        else:
            program, shape = program_of(checked, completion)
            # one fenced block, so the code verifier reads exactly this program
            result = self._code(self._for_code(checked), f"```python\n{program}\n```")
            result["details"]["program"] = shape
        result["details"]["spec_version"] = self.version
        return result

    def check_example(self, example: Example) -> str | None:
        for key in ("header", "entry_point"):
            if not isinstance(example.meta.get(key), str) or not example.meta[key]:
                return f"meta[{key!r}] must be a non-empty str (a HumanEval problem's), got {shown(example.meta.get(key))}"
        return self._code.check_example(self._for_code(example))

    def _for_code(self, example: Example) -> Example:
        """The example as the code verifier reads it: v2 is given the header as trusted setup."""
        if not self._code.replay:
            return example
        return dataclasses.replace(example, meta={**example.meta, "test_setup": example.meta["header"]})

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


def _fields(example: Example) -> dict[str, Any]:
    return {"prompt": example.prompt, "expected_answer": example.expected_answer, "id": example.id}


DEFAULT_SPEC = "humaneval/tests-v2"
SPECS: dict[str, HumanEvalProgram] = {s.version: s for s in (HumanEvalProgram("humaneval/tests-v1"),
                                                             HumanEvalProgram(DEFAULT_SPEC))}


def score(example: Any, completion: Any, spec_version: str = DEFAULT_SPEC) -> dict[str, Any]:
    """Score one completion under humaneval/tests-v2 (the default) or humaneval/tests-v1."""
    return SPECS[spec_version](example, completion)
