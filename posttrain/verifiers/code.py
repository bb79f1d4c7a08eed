"""Code tasks: the reward is whether (or how many of) the example's tests pass when the
model's code runs in the sandbox (posttrain/guards/sandbox.py).

    example.meta["tests"]   ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]
    completion              "Here you go:\\n```python\\ndef add(a, b):\\n    return a + b\\n```"
    score(...)              {"reward": 1.0, "details": {"reason": "ok", "verdict": "parent", ...}}

Threat model. The code comes from a policy that is paid for passing: expect it to try
whatever runs in its own process. Rebinding a builtin the harness calls later; reaching the
harness's state (its tests, its nonce) through frames, tracebacks, `__main__` or `gc`;
patching the json encoder the harness reports through; printing lines that look like
reports; returning an object whose `__eq__` always says yes (an int subclass too); exiting
early. Each of these paid 1.0 for a wrong `add` when the harness judged inside the sandbox.
A verdict computed in the same interpreter as the solution can always be forged, so here it
is computed in the trusted parent:

  1. Each assert is split (code_probes.py) into probes, what only the solution can compute
     (`add(2, 3)`), and a judge (`_p0 == 5`). The sandbox gets the solution and the probe
     expressions, never an expected value, a judge or a test's source.
  2. After the solution ran, the probe harness evaluates each probe and prints its value as
     plain data: None, bool, int, float, complex, str, bytes, and lists, tuples, sets and
     dicts of them, exact types only, written by hand in hex (no json module to patch).
  3. The parent decodes each value into fresh objects of exact builtin types, so no method
     of the solution's ever runs here, and evaluates the judge itself. A probe whose value
     never arrives, arrives twice or does not decode fails its test; reward 1.0 only when
     every test was judged and passed (the partial spec pays the fraction that passed).

  One process per example, not per test (measured: a sandbox run costs ~33 ms here, so a
  process per test would cost ~33 ms x tests; a 3-test example takes ~34 ms, ~40 ms before
  this design). A forger in the probe process can write any report it likes, but it cannot
  know which value the parent wants: nothing in that process depends on an expected value.
  Tampering with another test's report is therefore no better than answering that test,
  and a wrong answer stays wrong. `assert is_prime(7)` and `assert not is_prime(8)` both
  send only `is_prime(...)`: which truth value is wanted stays here.

  The weaker path. A test the parent cannot judge (loops, helper variables, `all(f(i) == i
  ...)`, `isinstance(f(x), int)`: code_probes.py lists the rules) runs whole in a second
  sandbox run with the old in-process harness, whose nonce-stamped reports the solution CAN
  forge. `details["verdict"]` is "sandbox" when any test of the example took that path
  ("parent" otherwise) and `details["test_verdicts"]` says which. Write tests as `assert
  f(args) == literal` (or `!=`, `<`, `in`, `not f(...)`, `abs(f(x) - y) < eps`, ...) to get
  the parent's verdict.

  Out of scope: a solution that hardcodes the tests' inputs (right on every test, which is
  all tests can see); answers the sandbox can read (in namespace mode its filesystem holds
  no project, data or run directory; in prelude-only mode it holds all of them); the inputs
  a probe passes (`f([x for x in ...])`) are evaluated in the sandbox, as they are questions,
  not answers.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from posttrain.guards.sandbox import SandboxResult, run_sandboxed, weak_sandbox_refusal
from posttrain.types import Example
from posttrain.verifiers.code_harness import HARNESS, PROBE_HARNESS
from posttrain.verifiers.code_probes import Plan, decode, judge, plan_for, read_reports
from posttrain.verifiers.contract import CONTRACT_REASONS, admit, shown

DEFAULT_SPEC = "code/tests-v1"  # all or nothing: a half-working function is not a solution

# The closed set of reason codes. The reason names the FIRST thing that went wrong, in
# the order of the tests: extract code, compile, define, test 1..n.
REASONS: dict[str, str] = {
    "ok": "every test passed",
    "no_code": "the completion (or its fenced block) holds no code, only whitespace",
    "syntax_error": "the code does not compile (SyntaxError, null bytes, bad encoding)",
    "runtime_error": "the code raised while being defined, before any test ran",
    "wrong_answer": "a test's assert failed (AssertionError)",
    "test_error": "a test raised something other than AssertionError (NameError, ...)",
    "not_plain": "a probe (e.g. add(2, 3)) returned something other than plain data (None, bool, int, "
    "float, complex, str, bytes, or lists, tuples, sets, dicts of them, exact types): the parent judges "
    "only what it can rebuild, so an object with its own __eq__ (an int subclass too) cannot vouch for itself",
    "timeout": "the CPU or wall-clock limit ended the run",
    "memory_limit": "the code ran out of its memory limit",
    "output_limit": "the code printed more than the output limit",
    "exited_early": "the process ended before every test was reported (os._exit, a signal, "
    "closed stdout): a test whose report never arrives earns nothing",
    "sandbox_error": "the sandbox could not start the program (a host problem, not the model)",
    "sandbox_refused": "no namespace sandbox here and the weak one was not allowed; details['error'] "
    "says how to get namespaces or opt in (--env.allow_weak_sandbox)",
    "bad_tests": "the example's meta['tests'] is missing, not a str or a list of str, or does not "
    "compile: a dataset bug (details['error'] says which); fix the tests, loaders refuse such problems",
    **CONTRACT_REASONS,  # bad_example, not_text
}

_STATUS_REASON = {"timeout": "timeout", "cpu_limit": "timeout", "memory_limit": "memory_limit",
                  "output_limit": "output_limit", "sandbox_error": "sandbox_error",
                  "refused": "sandbox_refused"}  # fmt: skip
_OUTCOME_REASON = {"fail": "wrong_answer", "error": "test_error", "not_plain": "not_plain"}

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
    code/tests-partial-v1 (`partial=True`): reward = passed tests / all tests, so tests
    judged before a later timeout still count.

    Each test is one str (one or more asserts; a str instead of a list is a single
    all-or-nothing test), judged in the parent where it can be (module docstring), else run
    in the sandbox. The code runs with `python -I -S`: only the standard library is
    importable.

    Contract (posttrain/verifiers/contract.py): total (a malformed example, missing or
    uncompilable tests, a completion that is not a str: reward 0.0 with a reason and
    `details["error"]`), explainable (`details["reason"]` in REASONS), deterministic for
    deterministic code; `wall_seconds` and `cpu_seconds` in details are measurements and
    vary run to run. `format_ok` in details: code was found and it compiled."""

    def __init__(self, partial: bool = False, cpu_seconds: int = 2, wall_seconds: float = 5,
                 memory_mb: int = 256, max_output_bytes: int = 64_000):  # fmt: skip
        self.partial = partial
        self.version = "code/tests-partial-v1" if partial else "code/tests-v1"
        # run_sandboxed's keyword arguments
        self.limits: dict[str, Any] = dict(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                                           memory_mb=memory_mb, max_output_bytes=max_output_bytes)  # fmt: skip

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        example, refused, error = admit(example, completion)
        if refused:
            return self._result(refused, [], error, None, [], None)
        tests, error = _tests_of(example)
        if error:
            return self._result("bad_tests", [], error, None, [], None)
        code, where = extract_code(completion)
        if code.strip() == "":
            return self._result("no_code", [None] * len(tests), None, where, [], None)
        plan = plan_for(tests, code)
        outcomes: list[dict | None] = [None] * len(tests)  # None: never judged
        runs, program = [], None  # program: (reason, error) when the code itself failed
        if plan.checks:
            run, program = self._judge_in_parent(code, plan, outcomes)
            runs.append(run)
        if plan.sandbox_tests and program is None:
            run, program = self._run_in_sandbox(code, tests, plan, outcomes)
            runs.append(run)
        if program is not None:
            reason, error = program
            outcomes = [None] * len(tests)  # nothing was judged: the code never got that far
        else:
            reason, error = "ok", None
            for index, outcome in enumerate(outcomes):
                if outcome is None:  # its report never came: the run's ending says why
                    run = runs[0] if index not in plan.sandbox_tests else runs[-1]
                    reason, error = _STATUS_REASON.get(run.status, "exited_early"), None
                    if run.status == "refused":
                        error = run.stderr
                    break
                if outcome["outcome"] != "pass":
                    reason, error = _OUTCOME_REASON[outcome["outcome"]], outcome.get("error")
                    break
        return self._result(reason, outcomes, error, where, runs, plan)

    def _judge_in_parent(self, code: str, plan: Plan, outcomes: list) -> tuple[SandboxResult, Any]:
        """Run the probes in the sandbox, judge each check here; fill `outcomes` of the
        parent-judged tests. Returns (run, (reason, error) when the code failed first)."""
        nonce = secrets.token_hex(16)
        program = PROBE_HARNESS + f"_probe({code!r}, {list(plan.setup)!r}, {list(plan.probes)!r}, {nonce!r})\n"
        run = run_sandboxed(program, **self.limits)
        results: dict[int, tuple] = {}
        for event in read_reports(run.stdout, nonce):
            kind, args = event[0], event[1:]
            if kind in ("syntax_error", "runtime_error") and len(args) == 1:
                return run, (kind, _text(args[0]))
            if kind == "setup_error" and len(args) == 1:
                results = {i: ("error", "a test's import failed: " + _text(args[0])) for i in range(len(plan.probes))}
                break
            if not args or type(args[0]) is not int or not 0 <= args[0] < len(plan.probes):
                continue
            index, result = args[0], _probe_result(kind, args[1:])
            # a second report for one probe: someone imitates the harness; trust neither
            results[index] = ("error", "two reports for one probe") if index in results else result
        decided = set()  # tests whose first failing (or unreported) assert is known
        for check in plan.checks:
            if check.test in decided:
                continue
            got = [results.get(i) for i in check.probes]
            first_bad = next((k for k, r in enumerate(got) if r is None or r[0] != "value"), None)
            bad = None if first_bad is None else got[first_bad]
            if first_bad is not None and bad is None:
                outcome = None  # never reported: the run's status says why
            elif bad is not None:
                outcome = {"outcome": bad[0], "error": bad[1], "verdict": "parent"}
            else:
                # every probe reported a value here (no first_bad)
                passed, error = judge(check, {i: r[1] for i, r in zip(check.probes, got) if r is not None})
                verdict = "pass" if passed else ("fail" if passed is False else "error")
                outcome = {"outcome": verdict, "error": error, "verdict": "parent"}
            outcomes[check.test] = outcome
            if outcome is None or outcome["outcome"] != "pass":
                decided.add(check.test)
        return run, None

    def _run_in_sandbox(self, code: str, tests: list[str], plan: Plan, outcomes: list):
        """The weaker path: the old in-process harness for the tests the parent cannot judge."""
        nonce = secrets.token_hex(16)
        chosen = [tests[i] for i in plan.sandbox_tests]
        run = run_sandboxed(HARNESS + f"_harness({code!r}, {chosen!r}, {nonce!r})\n", **self.limits)
        for event in read_reports(run.stdout, nonce):
            if event[0] in ("syntax_error", "runtime_error") and len(event) == 2:
                return run, (event[0], event[1])
            if event[0] == "test" and len(event) == 4 and type(event[1]) is int and event[1] in range(len(chosen)) \
                    and event[2] in ("pass", "fail", "error"):
                index = plan.sandbox_tests[event[1]]
                if outcomes[index] is None:  # the first report counts
                    outcomes[index] = {"outcome": event[2], "error": event[3], "verdict": "sandbox"}
        return run, None

    def check_example(self, example: Example) -> str | None:
        """What is wrong with the example's tests, or why no test could run on this
        machine (no namespace sandbox, weak one not allowed), or None when they can run."""
        return _tests_of(example)[1] or weak_sandbox_refusal()

    def _result(self, reason, outcomes, error, where, runs: list[SandboxResult], plan: Plan | None):
        passed = sum(1 for o in outcomes if o and o.get("outcome") == "pass")
        if self.partial:
            reward = passed / len(outcomes) if outcomes else 0.0  # no tests ran: nothing earned
        else:
            reward = 1.0 if reason == "ok" and passed == len(outcomes) > 0 else 0.0
        # the run that explains the ending: the first that did not end normally
        run = next((r for r in runs if r.status != "ok"), runs[-1] if runs else None)
        sandboxed = set(plan.sandbox_tests) if plan else set()
        return {
            "reward": reward,
            "details": {
                "reason": reason,
                "spec_version": self.version,
                # code was found and compiled (the tests judge it): what a format reward pays
                "format_ok": where is not None and reason not in ("no_code", "syntax_error"),
                "tests_passed": passed,
                "tests_total": len(outcomes),
                "test_outcomes": [o["outcome"] if o else "not_run" for o in outcomes],
                # who decided: "parent" (plain values judged here) or "sandbox" (the weak path)
                "verdict": None if plan is None else ("sandbox" if sandboxed else "parent"),
                "test_verdicts": [] if plan is None else
                ["sandbox" if i in sandboxed else "parent" for i in range(len(outcomes))],
                "error": error,
                "code_source": where,
                "status": run.status if run else None,
                "exit_code": run.exit_code if run else None,
                "stderr": run.stderr[-2000:] if run else "",  # the end holds the traceback
                "isolation": run.isolation if run else None,
                "wall_seconds": round(sum(r.wall_seconds for r in runs), 3),
                "cpu_seconds": round(sum(r.cpu_seconds for r in runs), 3),
            },
        }

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


def _text(field) -> str:
    """A hex-coded message from the probe harness, decoded; never raises."""
    try:
        return bytes.fromhex(field).decode("utf-8", "replace")[:300]
    except (TypeError, ValueError):
        return "?"


def _probe_result(kind: str, args: list) -> tuple:
    """("value", v) | ("fail" | "error" | "not_plain", message) from one probe event."""
    if kind == "value" and len(args) == 1:
        try:
            return "value", decode(args[0])
        except (ValueError, TypeError, RecursionError, OverflowError) as error:
            return "error", f"an undecodable report: {error}"[:300]
    if kind == "raised" and len(args) == 2:
        return ("fail" if args[0] == "assert" else "error"), _text(args[1])
    if kind == "not_plain" and len(args) == 1:
        return "not_plain", _text(args[0])
    return "error", f"an unknown report {kind!r}"


SPECS: dict[str, CodeTests] = {s.version: s for s in (CodeTests(), CodeTests(partial=True))}


def score(example: Any, completion: Any, spec_version: str = DEFAULT_SPEC) -> dict[str, Any]:
    """Score one completion under a named spec version ("code/tests-v1" or
    "code/tests-partial-v1")."""
    if spec_version not in SPECS:
        raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(SPECS)}")
    return SPECS[spec_version](example, completion)
