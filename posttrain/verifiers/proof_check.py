"""Proof checkers: one interface for "is this step-by-step argument valid, and if not, why".

DeepSeekMath-V2's self-verifying setup has three parts: a proof generator (here, the policy),
a verifier that judges the proof, and a meta-verifier that judges the verifier. A proof
checker is what either of the last two is made of: `check(proof) -> ProofVerdict`, a verdict
per step and a reason for every step it rejects.

    proof = Proof.of(example, "7+5=12,12+3=15\\nFinal: 15")   # Q: 7+5+9+3, the 9 skipped
    StepArithmeticChecker().check(proof).valid   # True: each line's own sum holds
    ArithmeticProofChecker().check(proof).valid  # False: the answer is 24
    ArithmeticProofChecker().check(proof).reasons
    # ("step 2 '12+3=15': not the problem's next operation on the previous result",
    #  "step 3 'Final: 15': the chain skipped terms")

Today's implementations are arithmetic, on the chain format of envs/arithmetic.py:

    ArithmeticProofChecker   the ground truth (verifiers/steps.py::check_arithmetic_steps): every
                             step holds, does the problem's next operation from the previous
                             result, and the final answer is the expected one. No false
                             positives by construction; the meta-verifier
    StepArithmeticChecker    each step's own arithmetic, read line by line with no memory of the
                             problem: a lenient verifier, the way a careless grader reads a proof.
                             It passes a chain that skips a term or copies an operand wrong, so
                             it has false positives for a meta-verifier to catch
    LeanProofChecker         Lean 4 through lean-interact: refuses, naming what is missing (the
                             toolchain cannot be installed without internet access; below)

What a Lean checker would be fed (`to_lean`, the spec's Lean4Translator): one Lean 4 `example`
per chain step, stating that step's own arithmetic, and one for the final claim, stating that
the problem's expression equals the Final line's number. Lean accepts the file only if every
statement is true, so it rejects a wrong sum (its step) and a skipped term (the final claim):

    print(to_lean(Proof.of(example, "7+5=12,12+3=15\\nFinal: 15")))
    import Mathlib.Tactic.NormNum
    -- the problem: 7+5+9+3
    -- step 1
    example : (7 : Int) + 5 = 12 := by norm_num
    -- step 2
    example : (12 : Int) + 3 = 15 := by norm_num
    -- step 3: the final claim
    example : (7 : Int) + 5 + 9 + 3 = 15 := by norm_num

The numbers are integers (`Int`), not Lean's default `Nat`, whose subtraction stops at 0 and
would prove 3 − 5 = 0. A step that is not 'a+b=c' or 'Final: n' has no statement: it becomes a
comment, and a checker must count it invalid without asking Lean.

Why Lean is not here. lean-interact (PyPI, 0.11.6 checked) is a 44 kB pure-Python package, but
at first use it clones the Lean REPL from GitHub and builds it with `lake`, which comes with a
Lean 4 toolchain that elan downloads from GitHub; its own `install-lean` pipes elan's install
script from raw.githubusercontent.com into sh. This machine reaches a package index and
nothing else, and no apt package ships a Lean toolchain (Debian's `elan` is the manager alone,
which then downloads the toolchain). So the Lean class states what is missing instead of
pretending; where a network exists, install elan and lean-interact, and write the runner that
feeds `to_lean`'s source to lean-interact's REPL and reads one verdict per statement from its
messages: a runner that cannot be run here would be untested code.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from dataclasses import dataclass
from typing import Protocol

from posttrain.types import Example
from posttrain.verifiers.steps import StepVerdict, check_arithmetic_steps, problem_of, split_steps

_STEP_NOT_PARSED = "not 'a+b=c' or 'Final: n'"
_CHAIN_STEP = re.compile(r"(-?[0-9]{1,40})([+-])([0-9]{1,40})=(-?[0-9]{1,40})")
_FINAL_LINE = re.compile(r"Final: (-?[0-9]{1,40})")
# norm_num, Mathlib's tactic for numerals: it proves a true equation between integer expressions
# and fails on a false one
LEAN_HEADER = "import Mathlib.Tactic.NormNum"


@dataclass(frozen=True)
class Proof:
    """A step-by-step argument for one problem: the steps in order, the last one the answer
    line ("Final: 24") when the completion has one."""

    example: Example
    steps: tuple[str, ...]

    @classmethod
    def of(cls, example: Example, completion: str) -> Proof:
        """The completion cut into steps by verifiers/steps.py::split_steps (total: never raises)."""
        return cls(example, tuple(split_steps(completion)))


@dataclass(frozen=True)
class ProofVerdict:
    """valid: the whole proof is accepted (at least one step, every step valid).
    step_valid: one bool per step. reasons: one sentence per rejected step, or why the
    proof as a whole was rejected; empty when valid."""

    valid: bool
    step_valid: tuple[bool, ...]
    reasons: tuple[str, ...]


class ProofChecker(Protocol):
    """Judges a proof. `name` is what logs and reward specs call it."""

    @property
    def name(self) -> str: ...

    def check(self, proof: Proof) -> ProofVerdict: ...


def _verdict(step_valid: list[bool], reasons: list[str]) -> ProofVerdict:
    if not step_valid:
        reasons = ["no steps: an empty completion proves nothing"]
    return ProofVerdict(bool(step_valid) and all(step_valid), tuple(step_valid), tuple(reasons))


def _sum_of(step: str) -> str:
    """'12+9=20' -> '12+9 is 21, not 20'; '' when the step is not a chain step. The pattern is
    steps.py's (ASCII digits, at most 40): model output is untrusted, and int() refuses a
    string of more than 4,300 digits."""
    match = _CHAIN_STEP.fullmatch(step)
    if match is None:
        return ""
    a, op, b, written = match.groups()
    true = int(a) + int(b) if op == "+" else int(a) - int(b)
    return f"{a}{op}{b} is {true}, not {written}"


def _does_not_hold(step: str) -> str:
    """Why a step's own arithmetic fails: the true sum, a Final line that is not the last
    result, or a step that does not parse."""
    return _sum_of(step) or ("not the last step's result" if step.startswith("Final:") else _STEP_NOT_PARSED)


@dataclass(frozen=True)
class ArithmeticProofChecker:
    """The ground truth of an arithmetic chain: a step is valid when it and every step before
    it hold and follow the problem, and the Final line gives the expected answer
    (check_arithmetic_steps' first-error label). Raises ValueError on a non-arithmetic example."""

    name: str = "arithmetic"

    def check(self, proof: Proof) -> ProofVerdict:
        verdicts = check_arithmetic_steps(proof.example, proof.steps)
        reasons, after_error = [], False
        for i, verdict in enumerate(verdicts, start=1):
            if not verdict.label:
                reasons.append(f"step {i} {verdict.step!r}: {self.why(verdict, proof.example, after_error)}")
                after_error = True
        return _verdict([v.label for v in verdicts], reasons)

    @staticmethod
    def why(verdict: StepVerdict, example: Example, after_error: bool) -> str:
        """The first thing wrong with a step the ground truth rejects."""
        if not verdict.arithmetic_holds:
            return _does_not_hold(verdict.step)
        if not verdict.follows_problem:
            return "the chain skipped terms" if verdict.step.startswith("Final:") else "not the problem's next operation on the previous result"
        return "builds on an earlier error" if after_error else f"not the expected answer {example.expected_answer}"


@dataclass(frozen=True)
class StepArithmeticChecker:
    """Each step's own arithmetic and nothing else: 'a+b=c' holds, and the Final line repeats
    the last result. It never reads the problem's terms or expected answer, so a chain that is
    consistent but wrong (a skipped term, a copied operand changed) passes: a verifier with
    false positives, the kind a meta-verifier exists to catch."""

    name: str = "step_arithmetic"

    def check(self, proof: Proof) -> ProofVerdict:
        verdicts = check_arithmetic_steps(proof.example, proof.steps)
        reasons = [f"step {i} {v.step!r}: {_does_not_hold(v.step)}"
                   for i, v in enumerate(verdicts, start=1) if not v.arithmetic_holds]
        return _verdict([v.arithmetic_holds for v in verdicts], reasons)


def lean_claim(terms: list[int], ops: list[str], value: str) -> str:
    """`example : (7 : Int) + 5 = 12 := by norm_num`: the integers `terms` joined by `ops`,
    left to right as the chain computes them, equal `value` (a signed integer as written)."""
    left = f"({terms[0]} : Int)" + "".join(f" {op} {term}" for op, term in zip(ops, terms[1:]))
    return f"example : {left} = {value} := by norm_num"


def lean_statements(proof: Proof) -> list[str | None]:
    """One Lean statement per step (module docstring): a chain step's own arithmetic, the
    Final line's claim about the problem, None for a step that is neither. Raises
    ValueError on a non-arithmetic example, as check_arithmetic_steps does."""
    problem = problem_of(proof.example)
    if problem is None:
        raise ValueError(f"not an arithmetic example, so no Lean statement of it: {proof.example.prompt!r}")
    terms, ops = problem
    statements: list[str | None] = []
    for step in proof.steps:
        chain, final = _CHAIN_STEP.fullmatch(step), _FINAL_LINE.fullmatch(step)
        if chain is not None:
            a, op, b, written = chain.groups()
            statements.append(lean_claim([int(a), int(b)], [op], written))
        elif final is not None:
            statements.append(lean_claim(terms, ops, final.group(1)))
        else:
            statements.append(None)
    return statements


def to_lean(proof: Proof) -> str:
    """The Lean 4 source a Lean checker would be fed for `proof` (module docstring): a header,
    the problem as a comment, then each step's statement under a comment naming the step. Only
    numbers parsed from the steps reach the source: the model's own text never does."""
    statements = lean_statements(proof)  # raises first on a non-arithmetic example
    terms, ops = problem_of(proof.example) or ([], [])
    problem = str(terms[0]) + "".join(f"{op}{term}" for op, term in zip(ops, terms[1:]))
    lines = [LEAN_HEADER, f"-- the problem: {problem}"]
    for i, (step, statement) in enumerate(zip(proof.steps, statements), start=1):
        if statement is None:
            lines.append(f"-- step {i}: {_STEP_NOT_PARSED}, so no statement (invalid without Lean)")
        else:
            lines += [f"-- step {i}" + (": the final claim" if step.startswith("Final:") else ""), statement]
    return "\n".join(lines) + "\n"


class ProofCheckerUnavailable(RuntimeError):
    """A proof checker that cannot run here; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class LeanProofChecker:
    """Lean 4 as the proof checker, through lean-interact. Not available: `check` raises
    ProofCheckerUnavailable naming what is missing (module docstring). No fallback: a
    proof checker that silently checks something else would report a Lean verdict it never got."""

    name: str = "lean4"

    def missing(self) -> list[str]:
        """What this machine lacks for Lean checking, in the order it must be installed."""
        lacking = [tool for tool in ("elan", "lake", "lean") if shutil.which(tool) is None]
        if importlib.util.find_spec("lean_interact") is None:
            lacking.append("the Python package lean-interact")
        # nothing installs this: to_lean writes the source, but nothing here hands it to Lean yet
        lacking.append("a runner that feeds to_lean's source to lean-interact and reads its verdicts")
        return lacking

    def check(self, proof: Proof) -> ProofVerdict:
        raise ProofCheckerUnavailable(
            "Lean 4 proof checking is not available: missing " + "; ".join(self.missing()) + ". Where a network "
            "exists: install elan (curl https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh -sSf "
            "| sh, which also installs lake and lean), then `pip install lean-interact` (at first use it clones the "
            "Lean REPL from GitHub and builds it with lake). Offline, neither works. Use ArithmeticProofChecker "
            "for the arithmetic task meanwhile.")
