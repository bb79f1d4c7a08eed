"""Code tasks: the reward is whether (or how many of) the example's tests pass when the
model's code runs in the sandbox (posttrain/sandbox.py).

    example.meta["tests"]   ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]
    completion              "Here you go:\\n```python\\ndef add(a, b):\\n    return a + b\\n```"
    score(...)              {"reward": 1.0, "details": {"reason": "ok", ...}}

The scorer's reward-hacking defence: a naive verifier that rewards "exit code 0" pays
for `import os; os._exit(0)` placed before the tests. Here the harness reports each test
on stdout as a line stamped with a random nonce, and only stamped lines count. Code that
walks interpreter frames could still find the nonce and forge lines; look at samples.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from posttrain.sandbox import SandboxResult, run_sandboxed
from posttrain.types import Example
from posttrain.verifiers.contract import CONTRACT_REASONS, admit, shown

DEFAULT_SPEC = "code/tests-v1"  # all or nothing: a half-working function is not a solution

# The closed set of reason codes. The reason names the FIRST thing that went wrong, in
# the order the harness runs: extract code, compile, define, test 1..n, finish.
REASONS: dict[str, str] = {
    "ok": "every test passed",
    "no_code": "the completion (or its fenced block) holds no code, only whitespace",
    "syntax_error": "the code does not compile (SyntaxError, null bytes, bad encoding)",
    "runtime_error": "the code raised while being defined, before any test ran",
    "wrong_answer": "a test's assert failed (AssertionError)",
    "test_error": "a test raised something other than AssertionError (NameError, ...)",
    "timeout": "the CPU or wall-clock limit ended the run",
    "memory_limit": "the code ran out of its memory limit",
    "output_limit": "the code printed more than the output limit",
    "exited_early": "the process ended before the harness finished (os._exit, a signal, "
    "closed stdout): a finish that carries no nonce earns nothing",
    "sandbox_error": "the sandbox could not start the program (a host problem, not the model)",
    "bad_tests": "the example's meta['tests'] is missing, not a str or a list of str, or does not "
    "compile: a dataset bug (details['error'] says which); fix the tests, loaders refuse such problems",
    **CONTRACT_REASONS,  # bad_example, not_text
}

_STATUS_REASON = {"timeout": "timeout", "cpu_limit": "timeout", "memory_limit": "memory_limit",
                  "output_limit": "output_limit", "sandbox_error": "sandbox_error"}  # fmt: skip

# One lazy span per fence, scanning forward only: linear time even on a megabyte of
# backticks. An unclosed fence (a generation cut off by max_new_tokens) runs to the end.
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(completion: str) -> tuple[str, str]:
    """(code, where): the LAST ```python fenced block, because models often show a draft
    before the final version; else the whole completion. `where` is "fenced" or "whole"."""
    blocks = _FENCE.findall(completion)
    if blocks:
        return blocks[-1], "fenced"
    return completion, "whole"


# Runs in the sandbox after the prelude. It reports on stdout, one JSON line per event,
# each prefixed with the nonce; the parent trusts no other line. Everything the harness
# needs is bound before the untrusted code runs, so monkeypatching cannot reach it.
HARNESS = r'''
def _harness(solution, tests, nonce):
    import json, os
    dumps, write, exit_now = json.dumps, os.write, os._exit

    def report(**event):
        write(1, ("\n" + nonce + " " + dumps(event) + "\n").encode())

    def describe(error):
        name = type(error).__name__
        try:
            message = str(error)
        except BaseException:
            message = ""  # a hostile __str__ must not break the report
        return (name + ": " + message)[:300] if message else name

    try:
        code = compile(solution, "solution.py", "exec")
    except MemoryError:
        raise
    except BaseException as error:  # SyntaxError, ValueError (null bytes), RecursionError
        report(event="syntax_error", error=describe(error))
        exit_now(0)
    # __name__ is not "__main__": an `if __name__ == "__main__":` block reading stdin
    # would otherwise run and fail on the empty stdin.
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(code, namespace)
    except MemoryError:
        raise
    except BaseException as error:  # SystemExit too: exiting is not passing
        report(event="runtime_error", error=describe(error))
        exit_now(0)
    for index, test in enumerate(tests):
        try:
            exec(compile(test, "test_%d.py" % index, "exec"), namespace)
            report(event="test", index=index, outcome="pass")
        except MemoryError:
            raise
        except AssertionError as error:
            report(event="test", index=index, outcome="fail", error=describe(error))
        except BaseException as error:
            report(event="test", index=index, outcome="error", error=describe(error))
    report(event="done")
    exit_now(0)  # skip atexit hooks and non-daemon threads the code may have left
'''


def _tests_of(example: Example) -> tuple[list[str], str | None]:
    """(tests, None): the example's tests as a list of sources, each checked to compile
    (here, in the trusted parent), or ([], what is wrong with them). Bad tests are a
    dataset bug: loaders refuse them (`check_example`), and scoring gives "bad_tests"."""
    tests = example.meta.get("tests")
    if isinstance(tests, str):
        tests = [tests]  # one block of asserts: all or nothing
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        return [], (f"meta['tests'] must be a str or a non-empty list of str (Python assert "
                    f"statements), got {shown(tests, 120)}")  # fmt: skip
    for index, test in enumerate(tests):
        try:
            compile(test, f"test_{index}.py", "exec")
        except (SyntaxError, ValueError, MemoryError, RecursionError) as error:  # deep nesting too
            return [], f"meta['tests'][{index}] does not compile: {type(error).__name__}: {error}"[:300]
    return tests, None


class CodeTests:
    """code/tests-v1: reward 1.0 iff every test in `example.meta["tests"]` passes after
    the completion's code ran (the last ```python block, else the whole text).
    code/tests-partial-v1 (`partial=True`): reward = passed tests / all tests, counted
    from nonce-stamped reports only, so tests passed before a later timeout still count.

    Tests run in the solution's namespace, in order; each is one str (typically one
    assert). A str instead of a list is a single all-or-nothing test. The code runs with
    `python -I -S`: only the standard library is importable.

    Contract (posttrain/verifiers/contract.py): total (a malformed example, missing or
    uncompilable tests, a completion that is not a str: reward 0.0 with a reason and
    `details["error"]`), explainable (`details["reason"]` in REASONS), deterministic for
    deterministic code; `wall_seconds` and `cpu_seconds` in details are measurements and
    vary run to run. `format_ok` in details: code was found and it compiled."""

    def __init__(self, partial: bool = False, cpu_seconds: int = 2, wall_seconds: float = 5,
                 memory_mb: int = 256, max_output_bytes: int = 64_000):  # fmt: skip
        self.partial = partial
        self.version = "code/tests-partial-v1" if partial else "code/tests-v1"
        self.limits = dict(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                           memory_mb=memory_mb, max_output_bytes=max_output_bytes)  # fmt: skip

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        example, refused, error = admit(example, completion)
        if refused:
            return self._result(refused, [], error, None, None)
        tests, error = _tests_of(example)
        if error:
            return self._result("bad_tests", [], error, None, None)
        code, where = extract_code(completion)
        if code.strip() == "":
            return self._result("no_code", [None] * len(tests), None, where, None)
        nonce = secrets.token_hex(16)
        program = HARNESS + f"_harness({code!r}, {tests!r}, {nonce!r})\n"
        run = run_sandboxed(program, **self.limits)
        events = _read_reports(run.stdout, nonce)
        outcomes: list[dict | None] = [None] * len(tests)
        reason, error = None, None
        for event in events:
            kind = event.get("event")
            if kind in ("syntax_error", "runtime_error"):
                reason, error = kind, event.get("error")
            elif kind == "test" and event.get("index") in range(len(tests)):
                outcomes[event["index"]] = event
                if event.get("outcome") != "pass" and reason is None:
                    reason = "wrong_answer" if event["outcome"] == "fail" else "test_error"
                    error = event.get("error")
            elif kind == "done" and reason is None:
                reason = "ok"
        if reason is None:  # no failure reported before the run ended: the sandbox says why
            reason = _STATUS_REASON.get(run.status, "exited_early")
        return self._result(reason, outcomes, error, where, run)

    def check_example(self, example: Example) -> str | None:
        """What is wrong with the example's tests, or None when they can run."""
        return _tests_of(example)[1]

    def _result(self, reason, outcomes, error, where, run: SandboxResult | None):
        passed = sum(1 for o in outcomes if o and o.get("outcome") == "pass")
        if self.partial:
            reward = passed / len(outcomes) if outcomes else 0.0  # no tests ran: nothing earned
        else:
            reward = 1.0 if reason == "ok" else 0.0
        return {
            "reward": reward,
            "details": {
                "reason": reason,
                "spec_version": self.version,
                # code was found and compiled (the tests judge it): what a format reward pays
                "format_ok": where is not None and reason not in ("no_code", "syntax_error"),
                "tests_passed": passed,
                "tests_total": len(outcomes),
                "test_outcomes": [o.get("outcome", "?") if o else "not_run" for o in outcomes],
                "error": error,
                "code_source": where,
                "status": run.status if run else None,
                "exit_code": run.exit_code if run else None,
                "stderr": run.stderr[-2000:] if run else "",  # the end holds the traceback
                "isolation": run.isolation if run else None,
                "wall_seconds": run.wall_seconds if run else 0.0,
                "cpu_seconds": run.cpu_seconds if run else 0.0,
            },
        }

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


def _read_reports(stdout: str, nonce: str) -> list[dict]:
    """The harness's events, in order: lines that start with the nonce and parse."""
    events = []
    for line in stdout.split("\n"):
        if line.startswith(nonce + " "):
            try:
                event = json.loads(line[len(nonce) + 1 :])
            except ValueError:
                continue  # a line cut by the output limit
            if isinstance(event, dict):
                events.append(event)
    return events


SPECS: dict[str, CodeTests] = {s.version: s for s in (CodeTests(), CodeTests(partial=True))}


def score(example: Any, completion: Any, spec_version: str = DEFAULT_SPEC) -> dict[str, Any]:
    """Score one completion under a named spec version ("code/tests-v1" or
    "code/tests-partial-v1")."""
    if spec_version not in SPECS:
        raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(SPECS)}")
    return SPECS[spec_version](example, completion)
