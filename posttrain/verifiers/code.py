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

  A test the parent cannot judge (loops, helper variables, random inputs, `all(f(i) == i
  ...)`: code_probes.py lists the rules). code/tests-v2 (the default) REPLAYS it
  (code_replay.py): the test's own code runs in a sandbox run that never holds the
  solution, its calls of the solution become questions the solution answers as probes, and
  the replay judges on those answers; a test it cannot replay is withheld and earns nothing.
  code/tests-v1, the spec it replaces (kept, so runs scored by it stay comparable), ran such
  a test whole beside the solution, whose nonce-stamped reports the solution CAN forge: an
  always-equal object scored 1.0 that way on 6 of HumanEval's 164 problems.
  `details["test_verdicts"]` says who decided each test (VERDICTS: "parent", "replay",
  "withheld", v1's "sandbox") and `details["verdict"]` the weakest of them. Write tests as
  `assert f(args) == literal` (or `!=`, `<`, `in`, `not f(...)`, `abs(f(x) - y) < eps`, ...)
  for the parent's verdict, which costs one sandbox run instead of three.

  Which names are the solution's: code/tests-v2 reads meta["entry_point"] (the function
  asked for; any other builtin's name in a test is the builtin, so a solution's own `abs`
  cannot pick `abs(f(x) - y)`'s value) and meta["test_setup"] (trusted helpers the tests
  call, HumanEval's header), both optional (code_replay.py).

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
from posttrain.verifiers.code_probes import Plan, judge, plan_for
from posttrain.verifiers.code_replay import MAX_ROUNDS, VERDICTS, Replay, replay_plan
from posttrain.verifiers.code_values import hex_text, probe_result, read_reports
from posttrain.verifiers.contract import CONTRACT_REASONS, admit, shown

DEFAULT_SPEC = "code/tests-v2"  # all or nothing: a half-working function is not a solution; no forgeable verdict

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
    "withheld": "code/tests-v2: a test could be judged neither here nor in a replay without the solution "
    "(an argument that is not plain data, questions depending on answers too deep, a builtin's name the "
    "solution binds too): its verdict is withheld and it earns nothing; details['error'] says which",
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
# (runs, (reason, error) when the code itself failed, the run that explains each unjudged test)
_Judged = tuple[list[SandboxResult], tuple[str, str] | None, dict[int, SandboxResult]]
_OUTCOME_REASON = {"fail": "wrong_answer", "error": "test_error", "not_plain": "not_plain", "withheld": "withheld"}

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


def _replay_inputs(example: Example) -> tuple[str | None, str, str | None]:
    """(entry_point, test_setup, None) as code/tests-v2 reads them from meta (code_replay.py:
    which names are the solution's), or (None, "", what is wrong with them)."""
    entry_point, setup = example.meta.get("entry_point"), example.meta.get("test_setup", "")
    if entry_point is not None and not (isinstance(entry_point, str) and entry_point.isidentifier()):
        return None, "", f"meta['entry_point'] must be the solution's function name, got {shown(entry_point)}"
    if not isinstance(setup, str):
        return None, "", f"meta['test_setup'] must be Python source (a str), got {shown(setup)}"
    try:
        compile(setup, "test_setup.py", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        return None, "", f"meta['test_setup'] does not compile: {type(error).__name__}: {error}"[:300]
    return entry_point, setup, None


class CodeTests:
    """code/tests-v2: reward 1.0 iff every test in `example.meta["tests"]` passes after
    the completion's code ran (the last ```python block, else the whole text).
    code/tests-partial-v2 (`partial=True`): reward = passed tests / all tests, so tests
    judged before a later timeout still count. `replay=False`: the v1 pair.

    Each test is one str (one or more asserts; a str instead of a list is a single
    all-or-nothing test), judged in the parent where it can be (module docstring), else
    replayed without the solution (v1: run beside it). The code runs with `python -I -S`:
    only the standard library is importable.

    Contract (posttrain/verifiers/contract.py): total (a malformed example, missing or
    uncompilable tests, a completion that is not a str: reward 0.0 with a reason and
    `details["error"]`), explainable (`details["reason"]` in REASONS), deterministic for
    deterministic code; `wall_seconds` and `cpu_seconds` in details are measurements and
    vary run to run. `format_ok` in details: code was found and it compiled."""

    def __init__(self, partial: bool = False, replay: bool = False, cpu_seconds: int = 2, wall_seconds: float = 5,
                 memory_mb: int = 256, max_output_bytes: int = 64_000):  # fmt: skip
        self.partial, self.replay = partial, replay
        self.version = ("code/tests-partial-" if partial else "code/tests-") + ("v2" if replay else "v1")
        # run_sandboxed's keyword arguments
        self.limits: dict[str, Any] = dict(cpu_seconds=cpu_seconds, wall_seconds=wall_seconds,
                                           memory_mb=memory_mb, max_output_bytes=max_output_bytes)  # fmt: skip

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        example, refused, error = admit(example, completion)
        if refused:
            return self._result(refused, [], error, None, [], [])
        tests, error = _tests_of(example)
        entry_point, setup = None, ""
        if self.replay and not error:
            entry_point, setup, error = _replay_inputs(example)
        if error:
            return self._result("bad_tests", [], error, None, [], [])
        code, where = extract_code(completion)
        if code.strip() == "":
            return self._result("no_code", [None] * len(tests), None, where, [], [])
        outcomes: list[dict | None] = [None] * len(tests)  # None: never judged
        if self.replay:
            plan = plan_for(tests, code, entry_point, strict=True)
            replay = Replay(replay_plan(tests, plan.sandbox_tests, code, setup, entry_point), self.limits)
            runs, program, ended_by = self._judge_v2(code, plan, replay, outcomes)
            paths = ["withheld" if i in replay.plan.withheld else "replay" if i in plan.sandbox_tests else "parent"
                     for i in range(len(tests))]  # fmt: skip
        else:
            plan = plan_for(tests, code)
            runs, program, ended_by = self._judge_v1(code, tests, plan, outcomes)
            paths = ["sandbox" if i in plan.sandbox_tests else "parent" for i in range(len(tests))]
        if program is not None:
            reason, error = program
            outcomes = [None] * len(tests)  # nothing was judged: the code never got that far
        else:
            reason, error = "ok", None
            for index, outcome in enumerate(outcomes):
                if outcome is None:  # its report never came: the run's ending says why
                    run = ended_by[index]
                    reason, error = _STATUS_REASON.get(run.status, "exited_early"), None
                    if run.status == "refused":
                        error = run.stderr
                    break
                if outcome["outcome"] != "pass":
                    reason, error = _OUTCOME_REASON[outcome["outcome"]], outcome.get("error")
                    break
        verdicts = [o["verdict"] if o else path for o, path in zip(outcomes, paths)]
        return self._result(reason, outcomes, error, where, runs, verdicts)

    def _judge_v1(self, code: str, tests: list[str], plan: Plan, outcomes: list) -> _Judged:
        """code/tests-v1: the probes judged here, the rest run whole beside the solution.
        Returns (runs, (reason, error) when the code failed first, the run that explains
        each test's missing report)."""
        runs, program = [], None
        if plan.checks:
            run, program = self._judge_in_parent(code, plan, outcomes)
            runs.append(run)
        if plan.sandbox_tests and program is None:
            run, program = self._run_in_sandbox(code, tests, plan, outcomes)
            runs.append(run)
        return runs, program, {i: runs[-1] if i in plan.sandbox_tests else runs[0] for i in range(len(outcomes))}

    def _judge_v2(self, code: str, plan: Plan, replay: Replay, outcomes: list) -> _Judged:
        """code/tests-v2: the probes judged here, the rest replayed without the solution
        (code_replay.py), its questions asked beside the probes; _judge_v1's return."""
        replayed = [replay.run()] if replay.pending else []  # round 0: what the tests ask
        keys, questions = replay.probes()
        probed, results, program = self._probe_run(code, plan.setup, plan.probes + tuple(questions))
        runs = replayed + [probed]
        ended_by = dict.fromkeys(range(len(outcomes)), probed)
        if program is not None:
            return runs, program, ended_by
        self._judge_checks(plan, results, outcomes)
        answered = replay.answer(keys, [results.get(len(plan.probes) + k) for k in range(len(keys))])
        while answered and keys and replay.pending and replay.rounds <= MAX_ROUNDS:
            replayed = [replay.run()]
            keys, questions = replay.probes()
            runs += replayed
            if keys:
                probed, results, program = self._probe_run(code, plan.setup, tuple(questions))
                runs.append(probed)
                if program is not None:
                    return runs, program, ended_by
                answered = replay.answer(keys, [results.get(k) for k in range(len(keys))])
        for index in replay.pending:  # no verdict: the run that ended early says why, else it is withheld
            ended_by[index] = probed if not answered else replayed[-1]
            if answered and replayed[-1].status == "ok":
                replay.outcomes[index] = {"outcome": "withheld", "verdict": "withheld", "error": (
                    f"no verdict after {replay.rounds} replays: the test's questions depend on the solution's "
                    "answers too deep, or could not be asked")}  # fmt: skip
        for index, outcome in replay.outcomes.items():
            outcomes[index] = outcome
        return runs, None, ended_by

    def _probe_run(self, code: str, setup: tuple[str, ...],
                   probes: tuple[str, ...]) -> tuple[SandboxResult, dict[int, tuple], tuple[str, str] | None]:
        """Run the solution and then `probes` in the sandbox: (run, {probe index: result},
        (reason, error) when the code failed first). A result is ("value", v) or ("fail" |
        "error" | "not_plain", message); a probe whose report never came has none."""
        nonce = secrets.token_hex(16)
        program = PROBE_HARNESS + f"_probe({code!r}, {list(setup)!r}, {list(probes)!r}, {nonce!r})\n"
        run = run_sandboxed(program, **self.limits)
        results: dict[int, tuple] = {}
        for event in read_reports(run.stdout, nonce):
            kind, args = event[0], event[1:]
            if kind in ("syntax_error", "runtime_error") and len(args) == 1:
                return run, results, (kind, hex_text(args[0]))
            if kind == "setup_error" and len(args) == 1:
                results = {i: ("error", "a test's import failed: " + hex_text(args[0])) for i in range(len(probes))}
                break
            if not args or type(args[0]) is not int or not 0 <= args[0] < len(probes):
                continue
            index, result = args[0], probe_result(kind, args[1:])
            # a second report for one probe: someone imitates the harness; trust neither
            results[index] = ("error", "two reports for one probe") if index in results else result
        return run, results, None

    def _judge_in_parent(self, code: str, plan: Plan, outcomes: list) -> tuple[SandboxResult, Any]:
        """Run the probes in the sandbox, judge each check here; fill `outcomes` of the
        parent-judged tests. Returns (run, (reason, error) when the code failed first)."""
        run, results, program = self._probe_run(code, plan.setup, plan.probes)
        if program is None:
            self._judge_checks(plan, results, outcomes)
        return run, program

    def _judge_checks(self, plan: Plan, results: dict[int, tuple], outcomes: list) -> None:
        """Judge each check of `plan` here on the probes' results; fill its tests' outcomes."""
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
        return _tests_of(example)[1] or (_replay_inputs(example)[2] if self.replay else None) or weak_sandbox_refusal()

    def _result(self, reason, outcomes, error, where, runs: list[SandboxResult], verdicts: list[str]):
        passed = sum(1 for o in outcomes if o and o.get("outcome") == "pass")
        if self.partial:
            reward = passed / len(outcomes) if outcomes else 0.0  # no tests ran: nothing earned
        else:
            reward = 1.0 if reason == "ok" and passed == len(outcomes) > 0 else 0.0
        # the run that explains the ending: the first that did not end normally
        run = next((r for r in runs if r.status != "ok"), runs[-1] if runs else None)
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
                # who decided each test (VERDICTS); "verdict" is the weakest of them
                "verdict": next((v for v in VERDICTS if v in verdicts), None),
                "test_verdicts": verdicts,
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


SPECS: dict[str, CodeTests] = {s.version: s for s in (CodeTests(), CodeTests(partial=True),
                                                      CodeTests(replay=True), CodeTests(partial=True, replay=True))}


def score(example: Any, completion: Any, spec_version: str = DEFAULT_SPEC) -> dict[str, Any]:
    """Score one completion under a named spec version (SPECS: code/tests-v2, the default,
    code/tests-partial-v2, and the v1 pair they replace)."""
    if spec_version not in SPECS:
        raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(SPECS)}")
    return SPECS[spec_version](example, completion)
