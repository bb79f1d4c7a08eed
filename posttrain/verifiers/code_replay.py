"""The replay: how code/tests-v2 judges a test the parent cannot split (code_probes.py): a
loop over random inputs, helper variables, a helper function the problem gives, `for x in
range(2, 8): assert change_base(x, x + 1) == str(x)`. Under code/tests-v1 such a test ran
whole beside the solution, which could forge its verdict: an object whose `__eq__` always
says yes scored 1.0 on 6 HumanEval problems that way.

Here the test runs in a sandbox run of its own (code_harness.REPLAY_HARNESS) that never
holds the solution: its names are stubs, and a call is a question. The solution answers the
questions in ITS run, as probes beside the parent's (plain data, code_values.py), and the
answers come back into the next replay as literals:

    round 0   replay, no answers     each call is reported as a question, `change_base(2, 3)`;
                                     an Unknown stands in for its value and, while a test waits
                                     for answers, a failing assert does not stop it
    sandbox   the solution's run     the questions, evaluated as probes
    round 1   replay, the answers    the verdict, computed by the test's own code on plain data
    ...                              a test whose next question depends on an answer asks it
                                     in the next round, up to MAX_ROUNDS

Nothing of the solution's runs in the replay, so what it reports is the test's verdict:
rebinding a builtin, walking frames, exiting or printing the nonce all act in a process
the replay never meets. Random inputs are seeded (random.seed(0) before each test), so
every round asks the same questions.

Which names are the solution's. A name the test uses but does not bind: the example's
`entry_point` always; a builtin's name (`len`, `sum`, `str`) never when an entry point is
declared (so `odd_sum = sum(...)` is the real sum whatever the solution rebinds); a name
`test_setup` binds (trusted code the tests may use, HumanEval's header: `encode_cyclic`)
never; any other name always. With no entry point declared, a builtin's name the solution
may bind too (code_probes.solution_binds) is ambiguous: the test's verdict is withheld.

What it cannot replay, and withholds (the test earns nothing, `details["test_outcomes"]`
says "withheld", `details["error"]` why): a call whose arguments are not plain data (a
lambda, an object), questions still depending on answers after MAX_ROUNDS. What the replay
does not carry: changes the solution makes to its arguments, state kept between calls
(one answer per question), an exception's own class (a builtin exception is raised again
by its name, any other as RuntimeError), names the solution binds that are not called (a
constant, a class whose instance is used).

Who decided each test is in `details["test_verdicts"]` (VERDICTS); verdict_counts and
describe_verdicts sum them for a console (posttrain eval's report).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import json
import secrets
from typing import Any

from posttrain.guards.sandbox import SandboxResult, run_sandboxed
from posttrain.verifiers.code_harness import REPLAY_HARNESS
from posttrain.verifiers.code_probes import module_bindings, solution_binds
from posttrain.verifiers.code_values import decode, literal_source, read_reports

MAX_ROUNDS = 4  # replays after the first; each costs two sandbox runs (~70 ms), and HumanEval needs one
BUILTIN_NAMES = frozenset(dir(builtins))


# Who decided a test (details["test_verdicts"]), weakest first: details["verdict"] is the
# weakest of an example's, and a console summing them says how far its numbers can be trusted.
VERDICTS: dict[str, str] = {
    "sandbox": "run whole beside the solution, which can forge it (code/tests-v1's weaker path)",
    "withheld": "no verdict: the test could not be judged out of the solution's reach, so it earns nothing",
    "replay": "the test's own code, run in a sandbox that never held the solution, on its answers",
    "parent": "judged by the trainer on plain values the solution computed",
}


@dataclasses.dataclass(frozen=True)
class ReplayPlan:
    tests: dict[int, str]  # test index -> its source, asserts made tolerant
    stubs: tuple[str, ...]  # the solution's names, asked from its sandbox run
    setup: str  # trusted code run before each test (meta["test_setup"])
    withheld: dict[int, str]  # test index -> why it cannot be replayed either


def replay_plan(tests: list[str], indices: tuple[int, ...], code: str, setup: str,
                entry_point: str | None) -> ReplayPlan:  # fmt: skip
    """The replay of tests[i] for i in `indices` (module docstring: which names are stubs)."""
    trusted = module_bindings(setup) or frozenset()
    replayed, stubs, withheld = {}, set(), {}
    for index in indices:
        free = _free_names(tests[index])
        ambiguous = sorted(solution_binds(code, free & BUILTIN_NAMES)) if entry_point is None else []
        if ambiguous:
            withheld[index] = (f"the test uses {', '.join(ambiguous)}, a builtin's name the solution binds too: "
                               "which one it means cannot be told; name the solution's function in "
                               "meta['entry_point']")
            continue
        stubs |= {n for n in free if n == entry_point or (n not in BUILTIN_NAMES and n not in trusted)}
        replayed[index] = tolerant(tests[index])
    return ReplayPlan(replayed, tuple(sorted(stubs)), setup, withheld)


@functools.lru_cache(maxsize=4096)  # the same problem is scored K times per step
def _free_names(source: str) -> frozenset[str]:
    """Names `source` reads and binds nowhere (a name bound anywhere in it counts as its own)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return frozenset(loaded - bound)


class _Tolerant(ast.NodeTransformer):
    """`assert E, M` -> `try: assert E, M` / `except Exception: if not pending: raise`."""

    def visit_Assert(self, node: ast.Assert) -> ast.Try:
        pending = ast.Call(ast.Name("__posttrain_pending__", ast.Load()), [], [])
        handler = ast.ExceptHandler(ast.Name("Exception", ast.Load()), None,
                                    [ast.If(ast.UnaryOp(ast.Not(), pending), [ast.Raise()], [])])  # fmt: skip
        return ast.copy_location(ast.Try([node], [handler], [], []), node)


@functools.lru_cache(maxsize=4096)
def tolerant(source: str) -> str:
    """`source` with every assert made tolerant of a pending test (REPLAY_HARNESS)."""
    return ast.unparse(ast.fix_missing_locations(_Tolerant().visit(ast.parse(source))))


class Replay:
    """The rounds of one example's replay. code.py calls `run` (a replay), hands `probes()`
    to the solution's sandbox run with the parent's, then `answer` with what came back, and
    again while `pending`; `outcomes` holds each replayed test's verdict when it is final."""

    def __init__(self, plan: ReplayPlan, limits: dict[str, Any]):
        self.plan, self.limits = plan, limits
        self.outcomes: dict[int, dict] = {i: {"outcome": "withheld", "error": why, "verdict": "withheld"}
                                          for i, why in plan.withheld.items()}  # fmt: skip
        self.pending = set(plan.tests)  # tests whose verdict waits for answers (or a first run)
        self.answers: dict[str, str] = {}  # question key -> its entry in the replay's table, as source
        self.asked: dict[str, str] = {}  # question key -> its probe source
        self.to_ask: list[str] = []  # keys not yet sent to the solution
        self.rounds = 0

    def run(self) -> SandboxResult:
        """Replay the pending tests with the answers so far: final verdicts, new questions."""
        nonce, order = secrets.token_hex(16), sorted(self.pending)
        table = "{" + ", ".join(f"{key!r}: {entry}" for key, entry in self.answers.items()) + "}"
        program = (REPLAY_HARNESS + f"_replay({self.plan.setup!r}, {[self.plan.tests[i] for i in order]!r}, "
                   f"{list(self.plan.stubs)!r}, {table}, {nonce!r})\n")  # fmt: skip
        run = run_sandboxed(program, **self.limits)
        self.rounds += 1
        for event in read_reports(run.stdout, nonce):
            if event[0] == "question" and len(event) == 2 and type(event[1]) is str:
                self._question(event[1])
            elif (event[0] == "test" and len(event) == 4 and type(event[1]) is int and 0 <= event[1] < len(order)
                  and event[2] in ("pass", "fail", "error", "not_plain", "withheld")):  # fmt: skip
                verdict = "withheld" if event[2] == "withheld" else "replay"
                self.outcomes[order[event[1]]] = {"outcome": event[2], "error": event[3], "verdict": verdict}
                self.pending.discard(order[event[1]])
        return run

    def _question(self, key: str) -> None:
        if key in self.asked:
            return
        try:
            name, args, kwargs = json.loads(key)
            if name not in self.plan.stubs or not all(k.isidentifier() for k, _ in kwargs):
                raise ValueError(key)
            shown = [literal_source(decode(a)) for a in args] + [f"{k}={literal_source(decode(v))}" for k, v in kwargs]
        except (ValueError, TypeError, RecursionError, AttributeError):
            return  # not a question the harness asks: the test stays pending, then withheld
        self.asked[key] = f"{name}({', '.join(shown)})"
        self.to_ask.append(key)

    def probes(self) -> tuple[list[str], list[str]]:
        """(keys, probe sources) of the questions not yet sent to the solution."""
        keys, self.to_ask = self.to_ask, []
        return keys, [self.asked[key] for key in keys]

    def answer(self, keys: list[str], results: list[tuple | None]) -> bool:
        """Record the solution's answers (code.py's probe results); False when one is missing."""
        for key, result in zip(keys, results):
            if result is None:
                return False
            kind, payload = result
            if kind == "value":
                self.answers[key] = f"('value', lambda: {literal_source(payload)})"  # a fresh copy per call
            elif kind == "not_plain":
                self.answers[key] = repr(("not_plain", payload))
            else:  # raised: "fail" is an AssertionError, "error" anything else, named in its message
                name = "AssertionError" if kind == "fail" else payload.partition(":")[0]
                self.answers[key] = repr(("raised", name, payload))
        return True


def verdict_counts(details: list[dict[str, Any]]) -> dict[str, int]:
    """How many tests each kind of verdict decided, over scored examples' details (VERDICTS'
    order; {} where no code verifier scored them)."""
    counts = dict.fromkeys(VERDICTS, 0)
    for detail in details:
        for verdict in detail.get("test_verdicts") or ():
            counts[verdict] = counts.get(verdict, 0) + 1
    return counts if sum(counts.values()) else {}


def describe_verdicts(counts: dict[str, int]) -> str:
    """One line for a console: where the tests' verdicts came from."""
    return (f"test verdicts: {counts.get('parent', 0)} judged by the trainer, {counts.get('replay', 0)} replayed "
            f"without the solution, {counts.get('sandbox', 0)} computed inside the solution's sandbox (forgeable), "
            f"{counts.get('withheld', 0)} withheld (earned nothing)")
