"""GSM8K's answer format, and its calculator annotations as checkable steps.

A GSM8K solution (Cobbe et al. 2021, arXiv:2110.14168) is worked lines of text, each
arithmetic result written with a calculator annotation, then the final answer on a line
of its own after four hashes:

    Each box holds 48/4 = <<48/4=12>>12 apples.
    Three boxes hold 12*3 = <<12*3=36>>36 apples.
    #### 36

    gsm8k/hash-v1          the completion's last line is `#### <int>` (thousands commas
                           allowed, as GSM8K writes 1,600), compared as an integer with
                           the expected answer; any worked lines may come before it
    calculator_annotations every `<<expression=result>>` in a text, each with whether the
                           expression, evaluated exactly, gives the result as written
                           (rounded to the result's own decimals: `<<10/3=3.33>>` holds)
    calculator_step_labels the lines of a solution as steps, labelled under the first-error
                           convention of verifiers/steps.py: a step is right while every
                           annotation so far holds, and the `####` line also needs the
                           expected answer

The annotations are what the dataset's authors computed with a calculator, so they are
the one part of a GSM8K chain of thought a program can check without reading the prose;
a process reward model trained on these labels learns arithmetic slips, not reasoning
errors (a right computation of the wrong quantity holds).

Like every spec here the scorer is total (contract.py): any str is scored, anything else
scores 0 with a reason, nothing raises; the expression evaluator accepts numbers, + - * /
% ** and parentheses only, bounded in size, and never calls eval().
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from posttrain.types import Example
from posttrain.verifiers.contract import CONTRACT_REASONS, admit

ANSWER_PREFIX = "####"
WHITESPACE = " \t\n\r\f\v"

REASONS: dict[str, str] = {
    "ok": "the last line is '#### <int>' and the integer equals the expected answer",
    "wrong_answer": "the '####' line is well formed but its integer differs from the expected answer",
    "empty": "the completion is empty or only whitespace",
    "no_answer_line": "no line starts with '####'",
    "answer_not_last": "a '####' line exists but it is not the last line",
    "multiple_answer_lines": "more than one line starts with '####'",
    "malformed_int": "what follows '#### ' is not an integer ('ten', '3.5', '1,00', a unit after it)",
    **CONTRACT_REASONS,
}

# an optional '-', then digits with optional thousands commas (1,600) or plain digits; ASCII only
_INTEGER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)")
_ANNOTATION = re.compile(r"<<([^<>=]{1,200})=([^<>]{1,60})>>")
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")  # no exponent: '1e999999' would be slow
MAX_ANSWER_CHARS = 100  # int() refuses strings past 4,300 digits; no GSM8K answer is near this
MAX_EXPONENT = 64  # `**` in an annotation: GSM8K's are squares and small powers


def parse_answer_integer(text: str) -> int | None:
    """The integer of a GSM8K answer ('72', '-3', '1,600'), or None when `text` is not one."""
    text = text.strip(WHITESPACE)
    if len(text) > MAX_ANSWER_CHARS or not _INTEGER.fullmatch(text):
        return None
    return int(text.replace(",", ""))


def _result(reason: str, parsed: int | None, expected: str | None) -> dict[str, Any]:
    return {"reward": 1.0 if reason == "ok" else 0.0,
            "details": {"reason": reason, "parsed": None if parsed is None else str(parsed), "expected": expected,
                        "format_ok": parsed is not None, "spec_version": HashV1.version}}


class HashV1:
    """gsm8k/hash-v1: GSM8K's own format, `#### <int>` as the last line (module docstring).

    Accepts: '12 apples a box.\\n#### 36', '#### 1,600' (for 1600), '####  36'.
    Rejects: '#### 36 apples', '#### 36.0', 'The answer is 36', '#### 36\\nDone.'."""

    version = "gsm8k/hash-v1"

    def check_example(self, example: Example) -> str | None:
        if parse_answer_integer(example.expected_answer) is None:
            return (f"expected_answer {example.expected_answer!r} is not an integer (GSM8K's answers are; digits, an "
                    "optional '-', thousands commas allowed): fix the row, or score it with another verifier "
                    "(--env.spec_version)")
        return None

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        example, refused, error = admit(example, completion)
        if refused:
            result = _result(refused, None, None)
            result["details"]["error"] = error
            return result
        expected = example.expected_answer.strip(WHITESPACE)
        text = completion.strip(WHITESPACE)
        if not text:
            return _result("empty", None, expected)
        lines = text.split("\n")
        answer_lines = [i for i, line in enumerate(lines) if line.startswith(ANSWER_PREFIX)]
        if not answer_lines:
            return _result("no_answer_line", None, expected)
        if len(answer_lines) > 1:
            return _result("multiple_answer_lines", None, expected)
        if answer_lines[0] != len(lines) - 1:
            return _result("answer_not_last", None, expected)
        parsed = parse_answer_integer(lines[-1][len(ANSWER_PREFIX):])
        if parsed is None:
            return _result("malformed_int", None, expected)
        return _result("ok" if parsed == parse_answer_integer(expected) else "wrong_answer", parsed, expected)

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


SPECS = {HashV1.version: HashV1()}
DEFAULT_SPEC = HashV1.version


def score(example: Any, completion: Any) -> dict[str, Any]:
    """Score under the default spec, gsm8k/hash-v1."""
    return SPECS[DEFAULT_SPEC](example, completion)


@dataclass(frozen=True)
class Annotation:
    """One `<<expression=result>>`: what the expression evaluates to (None when it is not
    plain arithmetic, or divides by zero) and whether that is the result as written."""

    expression: str
    written: str
    value: Fraction | None
    holds: bool


def evaluate(expression: str) -> Fraction | None:
    """The exact value of an arithmetic expression (numbers, + - * / % **, parentheses), or
    None for anything else: a name, a call, a division by zero, a power too large."""
    try:
        tree = ast.parse(expression.strip(WHITESPACE).replace(",", ""), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # what the parser raises on any str
        return None
    return _value(tree.body)


def _value(node: ast.AST) -> Fraction | None:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand)
        return None if inner is None else -inner if isinstance(node.op, ast.USub) else inner
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _value(node.left), _value(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, ast.Add):
        return left + right
    if isinstance(node.op, ast.Sub):
        return left - right
    if isinstance(node.op, ast.Mult):
        return left * right
    if isinstance(node.op, (ast.Div, ast.Mod)):
        if right == 0:
            return None
        return left / right if isinstance(node.op, ast.Div) else left % right
    if isinstance(node.op, ast.Pow) and right.denominator == 1 and abs(right) <= MAX_EXPONENT \
            and abs(left) < 10**12 and (left != 0 or right >= 0):
        return left ** int(right)
    return None


def _written_value(text: str) -> tuple[Fraction, int] | None:
    """(the number as written, its decimals), or None when it is not a plain number."""
    text = text.strip(WHITESPACE).replace(",", "")
    if not _NUMBER.fullmatch(text):
        return None
    decimals = len(text.partition(".")[2])
    return Fraction(text), decimals


def calculator_annotations(text: str) -> list[Annotation]:
    """Every `<<expression=result>>` of `text`, in order, each checked: it holds when the
    expression's exact value, rounded to as many decimals as the result is written with,
    is the result (`<<48/4=12>>`, `<<10/3=3.33>>`; not `<<48/4=13>>`)."""
    found = []
    for match in _ANNOTATION.finditer(text if isinstance(text, str) else ""):
        expression, written = match.group(1), match.group(2)
        value, parsed = evaluate(expression), _written_value(written)
        holds = value is not None and parsed is not None and \
            abs(value - parsed[0]) <= Fraction(1, 2 * 10 ** parsed[1])
        found.append(Annotation(expression, written.strip(WHITESPACE), value, holds))
    return found


def calculator_step_labels(example: Example, completion: str) -> tuple[list[str], list[bool]]:
    """(steps, labels) of a GSM8K-style solution: each non-empty line is a step; a line is
    right while every annotation on it and on the lines before it holds, and the `####` line
    also needs the expected answer (verifiers/steps.py's first-error convention)."""
    steps = [line.strip(WHITESPACE) for line in completion.split("\n") if line.strip(WHITESPACE)]
    labels, all_held = [], True
    expected = parse_answer_integer(example.expected_answer)
    for step in steps:
        all_held = all_held and all(note.holds for note in calculator_annotations(step))
        if step.startswith(ANSWER_PREFIX):
            all_held = all_held and expected is not None and \
                parse_answer_integer(step[len(ANSWER_PREFIX):]) == expected
        labels.append(all_held)
    return steps, labels
