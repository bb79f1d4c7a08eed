"""Math answers: the completion's final answer is checked for mathematical equivalence
with the expected answer by math-verify (https://github.com/huggingface/Math-Verify).

    example.expected_answer   "\\frac{1}{2}"
    completion                "... so the probability is \\boxed{0.5}."
    score(...)                {"reward": 1.0, "details": {"reason": "ok", ...}}

Same contract as `final_int` (posttrain/verifiers/contract.py: deterministic, total,
explainable through a closed set of reason codes, fast, versioned) with one honest
exception, stated below: the time limit. An int expected answer is read as its decimal
string; a malformed example or a completion that is not a str scores 0.0 with reason
"bad_example" or "not_text".

Spec math/boxed-or-final-v1, in three steps:

  1. Extract (here, in plain Python, linear time; a megabyte takes ~15 ms). The answer is whichever comes LAST in
     the completion: the contents of the last `\\boxed{...}` (nested braces matched,
     `\\{` and `\\}` are literal braces and do not count), or the rest of the last line
     that starts with `Final:`. Surrounding whitespace, `$` signs and one trailing period
     are dropped ('Final: $5$.' reads as '5'). Only the last answer counts, so stating
     several ('\\boxed{3} or maybe \\boxed{4}') cannot launder a guess; one box holding
     several ('\\boxed{3, 4}') is a set, and a set is not equal to 4 (but math-verify
     lets a one-element set such as '\\{4\\}' equal 4: v2 refuses that).
  2. Parse both the answer and `example.expected_answer` with math-verify's `parse`
     (LaTeX first, then plain expressions) into sympy objects.
  3. Compare with math-verify's `verify(gold, answer)`: numbers within its rounding
     ('\\frac{1}{2}' = '0.5' = '1/2', '0.333333' = '1/3'), symbolic equality
     ('2\\sqrt{2}' = '\\sqrt{8}'), sets and intervals ('\\{1,2\\}' = '\\{2,1\\}',
     '(0,1]'), equations against values ('x=2' = '2'). math-verify also drops units and
     `\\text{}` around numbers ('3\\text{ cm}' = '3'): that is its rule, not ours.

What the reward cannot tell apart: '\\pi' versus '3.14159' is wrong (too few digits for
its 6-place rounding); an answer math-verify reads only as text is compared as text.

Spec math/boxed-or-final-v2 (the default; v1 stays registered, unchanged, so old runs
compare) is v1 plus refusals where math-verify credits what it cannot judge. With 4
expected, v1 pays 1.0 for '5 = 4' (math-verify reads a false equation by its right-hand
side), '4\\%' (it takes 4% for 0.04 and for 4), '4 \\approx 5' (it drops what follows
the ≈), '5 \\to 4', '5 := 4', 'x = 4', '4 \\text{ percent}', '\\{4\\}' and '4, 4' (a
one-element set equals its element); and '4' for an expected '\\{4\\}'. v2 refuses, with
reward 0 and one of these reasons, before comparing:

  relation_unjudged      the answer holds ≈ ∼ ≃ ≅ ≡ ∝ → ⇒ ∈ ⊂ ∣ := \\not (or their LaTeX
                         commands): math-verify keeps one side and drops the other, so
                         it cannot judge them, whatever the expected answer is.
  relation_not_expected  the answer states = < > ≤ ≥ ≠ more often than the expected
                         answer does (< and > count as one relation with its sides
                         swapped, ≤ and ≥ too). An expected '4' takes no relation, true
                         ('4 = 4') or false: say the value. An expected 'x = 2' takes
                         'x=2', '2 = x' and the bare '2' (the equation names a value and
                         math-verify compares that value), never 'x = 3 = 2'.
  percent_not_expected   the answer has %, \\%, 'percent' or 'pct' and the expected
                         answer has none. '10\\%' for 0.1 is refused too: a right answer
                         lost so that '4\\%' never pays for 4. An expected '10\\%' takes
                         math-verify's rule: 10\\%, 10 and 0.1.
  set_for_scalar         the answer parsed to a set, interval, tuple or matrix and the
                         expected answer to a single value,
  scalar_for_set         or the other way round. Two sets meet math-verify's rule ('(1,2)'
                         read as an interval equals '1,2' read as a set).

The first three read the text (no sympy); the last two what math-verify parsed
(details["answer_kind"], details["expected_kind"]; details["refused_symbol"] names the
sign a text refusal found). Units other than % are math-verify's rule, as in v1.

The time limit. sympy can take minutes or hang on small inputs (`\\boxed{9^{9^{9^{9}}}}`
is a power tower no computer can hold), so:

  - Cheap guards first: an answer longer than MAX_ANSWER_CHARS or nested deeper than
    MAX_NESTING brackets is refused before any sympy runs.
  - Steps 2 and 3 run in a child process that is killed when the deadline passes
    (posttrain/verifiers/math_worker.py says how and why); the reason is then "timeout".
    `details["worker"]` says whether the child process or the fallback thread answered.

Because of the deadline, a comparison that is merely slow can score "timeout" on a busy
machine and "ok" on an idle one: the only place this scorer depends on anything but its
input. Timeouts are rare for real answers (the slowest of our golden cases takes ~0.25 s).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from posttrain.types import Example
from posttrain.verifiers import math_worker
from posttrain.verifiers.contract import CONTRACT_REASONS, admit

# The closed set of reason codes. Every call reports exactly one of these.
REASONS: dict[str, str] = {
    "ok": "the answer is mathematically equal to the expected answer",
    "wrong_answer": "the answer parsed, but it is not equal to the expected answer",
    "empty": "the completion is empty or only whitespace",
    "no_answer": "no \\boxed{...} and no line starting with 'Final:'",
    "empty_answer": "the box or the Final line holds nothing ('\\boxed{}', 'Final:')",
    "unclosed_box": "a \\boxed{ is never closed (a generation cut off mid-answer?)",
    "answer_too_long": "the answer is longer than the limit (MAX_ANSWER_CHARS)",
    "nesting_too_deep": "the answer nests brackets deeper than the limit (MAX_NESTING)",
    "unparsable": "math-verify could not read the answer as math (and text did not match)",
    "timeout": "parsing or comparing took longer than the deadline; the worker was killed",
    "expected_unparsable": "math-verify could not read the EXPECTED answer: a dataset bug",
    "verifier_error": "the verifier process died or answered garbage (see details['error'])",
    # v2 only (v1 never refuses these; see the module docstring)
    "relation_unjudged": "the answer holds ≈, →, ∈, := or another relation math-verify cannot judge",
    "relation_not_expected": "the answer states =, <, >, ≤, ≥ or ≠ more often than the expected answer",
    "percent_not_expected": "the answer has a % (or 'percent') and the expected answer has none",
    "set_for_scalar": "the answer is a set, interval, tuple or matrix; the expected answer one value",
    "scalar_for_set": "the answer is one value; the expected answer a set, interval, tuple or matrix",
    **CONTRACT_REASONS,  # bad_example, not_text
}

MAX_ANSWER_CHARS = 1000  # real final answers are short; 800 chars of 'a+a+...' take ~0.6 s
MAX_NESTING = 8  # ( [ { depth: '\left(\frac{\sqrt{3}}{2}\right)^{2}' is 3; sets 8 deep ~1.3 s
DEFAULT_TIMEOUT_SECONDS = 3.0  # >10x the slowest honest case, short enough not to stall a step
DEFAULT_SPEC = "math/boxed-or-final-v2"  # v1 credits relations and percentages it cannot judge

WHITESPACE = " \t\n\r\f\v"
BOXED = "\\boxed"
FINAL_PREFIX = "Final:"


# ---------------------------------------------------------------------------------------
# Step 1: extraction (pure Python, linear in the completion, never calls sympy)
# ---------------------------------------------------------------------------------------


# Both markers are found by searching the REVERSED completion once: the first match there
# is the last one here, found in one C-level pass (a Python loop over 150k '\boxed' took
# ~100 ms). Each pattern has one quantifier over spaces only, so nothing backtracks badly.
_BOXED_REVERSED = re.compile(r"\{[ \t]*" + re.escape(BOXED[::-1]))  # '\boxed {' backwards
_FINAL_REVERSED = re.compile(re.escape(FINAL_PREFIX[::-1]) + r"[ \t]*(?=\n|\Z)")  # line start = '\n' after


def _last_boxed(text: str, reversed_text: str) -> int:
    """Index of the '{' that opens the last `\\boxed{` (spaces allowed before the brace),
    or -1."""
    match = _BOXED_REVERSED.search(reversed_text)
    return len(text) - match.start() - 1 if match else -1


def _box_contents(text: str, open_at: int) -> tuple[str, str | None]:
    """(reason, contents) of the brace group opening at `open_at`. The scan stops after
    MAX_ANSWER_CHARS, so a megabyte after an unclosed brace costs no more than a short
    answer."""
    depth = 0
    i = open_at
    stop = min(len(text), open_at + MAX_ANSWER_CHARS + 2)
    while i < stop:
        c = text[i]
        if c == "\\":
            i += 2  # '\{', '\}', '\\': an escaped character never opens or closes a group
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return "ok", text[open_at + 1 : i]
        i += 1
    return ("answer_too_long" if stop < len(text) else "unclosed_box"), None


def _last_final_line(text: str, reversed_text: str) -> int:
    """Index just past 'Final:' on the last line that starts with it (indentation
    allowed), or -1."""
    match = _FINAL_REVERSED.search(reversed_text)
    return len(text) - match.start() if match else -1


def _clean(answer: str) -> str:
    answer = answer.strip(WHITESPACE)
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1]  # 'Final: 5.' ends a sentence; '5.' alone parses as text
    return answer.strip(WHITESPACE).strip("$").strip(WHITESPACE)


def _nesting(answer: str) -> int:
    depth = deepest = 0
    for c in answer:  # at most MAX_ANSWER_CHARS characters
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth = max(depth - 1, 0)
    return deepest


def extract_answer(completion: str) -> tuple[str, str | None, str | None]:
    """(reason, answer, source): reason "ok" with the answer string and where it came
    from ("boxed" or "final_line"), or a failure code from REASONS with None, and the
    source when one was found."""
    if completion.strip(WHITESPACE) == "":
        return "empty", None, None
    reversed_text = completion[::-1]
    box = _last_boxed(completion, reversed_text)
    final = _last_final_line(completion, reversed_text)
    if box < 0 and final < 0:
        return "no_answer", None, None
    if box > final:  # the later of the two is the final answer
        source = "boxed"
        reason, answer = _box_contents(completion, box)
        if answer is None:
            return reason, None, source
    else:
        source = "final_line"
        newline = completion.find("\n", final)
        answer = completion[final : newline if newline >= 0 else len(completion)]
        if len(answer) > MAX_ANSWER_CHARS + 2:
            return "answer_too_long", None, source
    answer = _clean(answer)
    if answer == "":
        return "empty_answer", None, source
    if len(answer) > MAX_ANSWER_CHARS:
        return "answer_too_long", None, source
    if _nesting(answer) > MAX_NESTING:
        return "nesting_too_deep", None, source
    return "ok", answer, source


# ---------------------------------------------------------------------------------------
# v2's text rules: relations and percentages, read before any sympy runs
# ---------------------------------------------------------------------------------------

# Relations math-verify parses into a sympy relation it can compare, by class: '>' is '<'
# with its sides swapped, so 'x < 2' and '2 > x' state the same relation.
JUDGED_RELATIONS = {"=": "=", "<": "<", ">": "<", "≤": "≤", "≥": "≤", "≠": "≠", "\\lt": "<", "\\gt": "<",
                    "\\le": "≤", "\\leq": "≤", "\\leqslant": "≤", "\\ge": "≤", "\\geq": "≤",
                    "\\geqslant": "≤", "\\ne": "≠", "\\neq": "≠"}  # fmt: skip
# Relations it cannot: it keeps one side ('5 \\to 4' reads as 4, '4 \\approx 5' as 4).
UNJUDGED_RELATIONS = frozenset({
    "≈", "∼", "≃", "≅", "≡", "∝", "→", "⇒", "⟹", "⇔", "∈", "∉", "⊂", "⊆", "⊃", "⊇", "∣", ":=", "\\approx",
    "\\sim", "\\simeq", "\\cong", "\\equiv", "\\propto", "\\doteq", "\\not", "\\to", "\\gets", "\\rightarrow",
    "\\leftarrow", "\\Rightarrow", "\\Leftarrow", "\\longrightarrow", "\\Longrightarrow", "\\implies", "\\iff",
    "\\Leftrightarrow", "\\leftrightarrow", "\\mapsto", "\\in", "\\notin", "\\ni", "\\subset", "\\subseteq",
    "\\supset", "\\supseteq", "\\mid", "\\parallel", "\\perp", "\\ll", "\\gg", "\\lesssim", "\\gtrsim",
    "\\prec", "\\succ",
})  # fmt: skip
# A whole command name ('\\leq', never the '\\le' inside '\\left'), ':=' before '=', or one sign.
_RELATION_TOKEN = re.compile(r"\\[A-Za-z]+|:=|[=<>≤≥≠≈∼≃≅≡∝→⇒⟹⇔∈∉⊂⊆⊃⊇∣]")
# What math-verify reads as "per cent" (its parser's words), '\\%' included.
_PERCENT = re.compile(r"%|(?<![A-Za-z])(?:percent(?:age)?|pct)(?![A-Za-z])", re.IGNORECASE)


def relations(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """([(sign, class)] of the relations math-verify judges, [signs of those it cannot])
    in `text`, in order. Linear in the text, never calls sympy."""
    judged, unjudged = [], []
    for token in _RELATION_TOKEN.findall(text):
        if token in JUDGED_RELATIONS:
            judged.append((token, JUDGED_RELATIONS[token]))
        elif token in UNJUDGED_RELATIONS:
            unjudged.append(token)
    return judged, unjudged


# ---------------------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------------------


class MathAnswerSpec:
    """math/boxed-or-final-v1: reward 1.0 iff the last `\\boxed{...}` or `Final:` line
    of the completion is mathematically equal to `example.expected_answer`, as decided by
    math-verify within `timeout_seconds`. See the module docstring for every rule.

    details: reason (REASONS), parsed (the extracted answer string, None if none),
    expected, answer_source ("boxed" | "final_line" | None), format_ok (an answer was
    found and was short and shallow enough to check), answer_math / expected_math (what
    sympy made of them, cut to 200 characters), worker ("process" | "thread" | None),
    error (what went wrong for verifier_error, bad_example, not_text; else None),
    spec_version."""

    version = "math/boxed-or-final-v1"

    def __init__(self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds!r}")
        self.timeout_seconds = timeout_seconds

    def _details(self) -> dict[str, Any]:
        return {
            "reason": None, "parsed": None, "expected": None, "answer_source": None,
            "format_ok": False, "answer_math": None, "expected_math": None, "worker": None,
            "error": None, "spec_version": self.version,
        }  # fmt: skip

    def refuse_text(self, expected: str, answer: str, details: dict[str, Any]) -> str | None:
        """A reason to refuse `answer` from its text alone, before math-verify: v1 has none."""
        return None

    def refuse_kinds(self, reply: dict[str, Any], details: dict[str, Any]) -> str | None:
        """A reason to refuse what math-verify parsed, before its verdict: v1 has none."""
        return None

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        details = self._details()
        example, refused, error = admit(example, completion)
        if refused:
            details["reason"], details["error"] = refused, error
            return {"reward": 0.0, "details": details}
        expected = details["expected"] = example.expected_answer.strip(WHITESPACE)
        reason, answer, source = extract_answer(completion)
        details["answer_source"] = source
        if reason != "ok" or answer is None:  # an answer comes with "ok", and only with it
            details["reason"] = reason
            return {"reward": 0.0, "details": details}
        details["parsed"] = answer
        details["format_ok"] = True
        refused = self.refuse_text(expected, answer, details)
        if refused:
            details["reason"] = refused
            return {"reward": 0.0, "details": details}
        reply, details["worker"] = math_worker.ask(expected, answer, self.timeout_seconds)
        if reply is None:
            details["reason"] = "timeout"
            return {"reward": 0.0, "details": details}
        status = reply.get("status")
        details["answer_math"] = reply.get("answer_math")
        details["expected_math"] = reply.get("expected_math")
        if status == "ok":
            refused = self.refuse_kinds(reply, details)
            details["reason"] = refused or ("ok" if reply.get("equal") else "wrong_answer")
        elif status in ("unparsable", "expected_unparsable"):
            details["reason"] = status
        else:
            details["reason"] = "verifier_error"
            details["error"] = reply.get("error", f"unexpected reply {reply!r:.100}")
        return {"reward": 1.0 if details["reason"] == "ok" else 0.0, "details": details}

    def format_ok(self, completion: Any) -> bool:
        """Whether an answer can be extracted at all, right or wrong (no sympy involved)."""
        return isinstance(completion, str) and extract_answer(completion)[0] == "ok"

    def check_example(self, example: Example) -> str | None:
        """Refuse an empty expected answer (nothing to compare with). Whether math-verify
        can parse a non-empty one is left to scoring time ("expected_unparsable"): asking
        sympy about every problem of a file at each load would cost ~10 ms a problem."""
        if example.expected_answer.strip(WHITESPACE) == "":
            return "expected_answer is empty; give the answer a correct completion must equal, e.g. \\frac{1}{2}"
        return None

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


class MathAnswerSpecV2(MathAnswerSpec):
    """math/boxed-or-final-v2: v1, refusing an answer whose kind (relation, percentage, set
    or single value) the expected answer does not share; the module docstring lists the
    rules. details adds expected_kind and answer_kind ("scalar" | "set" | "relation" |
    "text" | None, from math-verify's parse) and refused_symbol (the sign a text rule
    refused, else None)."""

    version = "math/boxed-or-final-v2"

    def _details(self) -> dict[str, Any]:
        return {**super()._details(), "expected_kind": None, "answer_kind": None, "refused_symbol": None}

    def refuse_text(self, expected: str, answer: str, details: dict[str, Any]) -> str | None:
        judged, unjudged = relations(answer)
        if unjudged:
            details["refused_symbol"] = unjudged[0]
            return "relation_unjudged"
        allowed = Counter(cls for _, cls in relations(expected)[0])
        for sign, cls in judged:  # more of a relation than the expected answer states
            allowed[cls] -= 1
            if allowed[cls] < 0:
                details["refused_symbol"] = sign
                return "relation_not_expected"
        percent = _PERCENT.search(answer)
        if percent and not _PERCENT.search(expected):
            details["refused_symbol"] = percent.group()
            return "percent_not_expected"
        return None

    def refuse_kinds(self, reply: dict[str, Any], details: dict[str, Any]) -> str | None:
        expected = details["expected_kind"] = reply.get("expected_kind")
        answer = details["answer_kind"] = reply.get("answer_kind")
        if expected == "scalar" and answer == "set":
            return "set_for_scalar"
        if expected == "set" and answer == "scalar":
            return "scalar_for_set"
        if expected == "scalar" and answer == "relation":  # a relation the text rules missed
            return "relation_not_expected"
        return None


SPECS: dict[str, MathAnswerSpec] = {s.version: s for s in (MathAnswerSpec(), MathAnswerSpecV2())}


def score(example: Any, completion: Any, spec_version: str = DEFAULT_SPEC) -> dict[str, Any]:
    """Score one completion under a named spec version (math/boxed-or-final-v2 unless told)."""
    if spec_version not in SPECS:
        raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(SPECS)}")
    return SPECS[spec_version](example, completion)

