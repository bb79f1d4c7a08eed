"""The `Final: <int>` answer spec: the scorer every arithmetic-style environment uses.

A scorer is a measuring instrument, so it is versioned. Every spec here has the one
contract of the whole library (posttrain/verifiers/contract.py):

    score(example, completion) -> {"reward": float, "details": dict}

and promises to be
  - deterministic: the same (example, completion) always gives the same result;
  - total: any `str` is scored (empty, 1 MB, NUL bytes, lone surrogates), and anything
    else, or a malformed example, scores 0.0 with reason "not_text" or "bad_example"
    and `details["error"]` saying what was wrong: never an exception;
  - explainable: `details["reason"]` is one code from `REASONS`, and `details["parsed"]`
    is the integer string the spec compared (None when the format check failed);
  - fast: linear in the length of the completion, no regex that can backtrack badly;
  - a verifier, not a solver: it compares the parsed string with
    `example.expected_answer` (surrounding whitespace trimmed; an int is read as its
    decimal string) and never computes an answer.

Honest specs (use these for training and evaluation):
    final_int/strict-v1   the whole completion is the single line `Final: <int>`
    final_int/cot-v1      worked steps, then `Final: <int>` as the last line
    final_int/think-v1    an optional leading `<think>…</think>` block, then the one line
                          `Final: <int>`: the answer is read after the thinking (Qwen3's
                          /think and /no_think modes, envs/thinking_modes.py)

Deliberately hackable specs (for the red-team lesson; each docstring names its exploit):
    hackable/substring, hackable/last-number, hackable/case-insensitive-prefix,
    hackable/multi-final

Never compare numbers measured under different spec versions as if they were one metric.
"""

from __future__ import annotations

import re
from typing import Any

from posttrain.types import Example
from posttrain.verifiers.contract import CONTRACT_REASONS, admit
from posttrain.verifiers.think_tags import THINK_OPEN, split_thinking

DEFAULT_SPEC = "final_int/cot-v1"  # the honest spec that lets a model show its steps

# The closed set of reason codes. Every spec reports exactly one of these.
REASONS: dict[str, str] = {
    "ok": "the format is right and the integer equals the expected answer",
    "wrong_answer": "the format is right but the integer differs from the expected answer",
    "empty": "the completion is empty or only whitespace",
    "no_final_line": "no line starts with 'Final:' (the prefix is case-sensitive)",
    "multiple_final_lines": "more than one line starts with 'Final:'",
    "final_not_last": "a 'Final:' line exists but it is not the last line",
    "extra_lines": "strict-v1 wants exactly one line, but the completion has several",
    "bad_spacing": "'Final:' must be followed by exactly one space, then the integer",
    "missing_int": "nothing follows 'Final:'",
    "malformed_int": "what follows 'Final: ' is not a base-10 integer ('ten', '1,000', '−5')",
    "plus_sign": "the integer has a '+' sign; write it without one",
    "leading_zero": "the integer has a leading zero ('0323'); only '0' itself may start with 0",
    "negative_zero": "'-0' is not canonical; write '0'",
    "extra_text": "text follows the integer on the Final line (a unit, a period, a word)",
    "no_integer": "(hackable specs) no integer was found anywhere",
    "unclosed_think": "(think-v1) a <think> block is never closed, so no answer follows the thinking",
    "think_not_first": "(think-v1) text comes before <think>, or there is a second <think> block",
    **CONTRACT_REASONS,  # bad_example, not_text
}

WHITESPACE = " \t\n\r\f\v"  # ASCII only: a non-breaking space is a character the model chose
FINAL_PREFIX = "Final:"
DIGITS = "0123456789"  # ASCII only: str.isdigit() and regex \d also accept '٣' (Arabic 3)


def _strip(text: str) -> str:
    return text.strip(WHITESPACE)


# One quantifier, anchored by .match(): linear time, nothing to backtrack into. (A Python
# loop over the characters would take ~90 ms on a megabyte of digits.)
_INT_PREFIX = re.compile(r"-?[0-9]+")


def _ascii_int_prefix(text: str) -> str:
    """The longest prefix of `text` made of an optional '-' and ASCII digits ('' if none)."""
    match = _INT_PREFIX.match(text)
    return match.group(0) if match else ""


def parse_final_line(line: str) -> tuple[str, str | None]:
    """Check one line against `Final: <int>` exactly. Returns (reason, parsed):
    reason "ok" with the integer string, or a failure code with None.

    <int> is base 10 with ASCII digits, an optional leading '-', no '+', no leading zeros
    ('0' is fine, '-0' is not), nothing before or after it, and exactly one space between
    the colon and the integer."""
    if not line.startswith(FINAL_PREFIX):
        return "no_final_line", None
    after_colon = line[len(FINAL_PREFIX) :]
    if _strip(after_colon) == "":
        return "missing_int", None
    # after_colon holds a non-space, so after a leading " " there is a second character
    if after_colon[0] != " " or after_colon[1] in WHITESPACE:
        return "bad_spacing", None  # 'Final:323', 'Final:  323', 'Final:\t323'
    body = after_colon[1:]
    if body.startswith("+"):
        return "plus_sign", None
    number = _ascii_int_prefix(body)
    if number == "":
        return "malformed_int", None
    rest = body[len(number) :]
    if rest:
        # '3,23', '3.5', '1_000' are number formats the spec excludes, not trailing words
        if rest[0] in ".,_" and len(rest) > 1 and rest[1] in DIGITS:
            return "malformed_int", None
        return "extra_text", None
    digits = number.lstrip("-")
    if digits != "0" and digits.startswith("0"):
        return "leading_zero", None
    if number == "-0":
        return "negative_zero", None
    return "ok", number


def _count_final_lines(text: str) -> int:
    # str.count runs in C: linear and fast even on a megabyte
    return int(text.startswith(FINAL_PREFIX)) + text.count("\n" + FINAL_PREFIX)


def _result(
    version: str, reason: str, parsed: str | None, expected: str | None, format_ok: bool
) -> dict[str, Any]:
    return {
        "reward": 1.0 if reason == "ok" else 0.0,
        "details": {
            "reason": reason,
            "parsed": parsed,
            "expected": expected,
            "format_ok": format_ok,
            "spec_version": version,
        },
    }


class FinalIntSpec:
    """Base class: a spec is a format check that extracts an integer string, followed by
    exact string comparison with the expected answer. Subclasses set `version` and
    implement `extract`; the hackable ones that need the expected answer to decide
    override `judge` instead."""

    version = ""

    def extract(self, completion: str) -> tuple[str, str | None]:
        """(reason, parsed): reason "ok" means the format held and `parsed` is the integer."""
        raise NotImplementedError

    def format_ok(self, completion: Any) -> bool:
        return isinstance(completion, str) and self.extract(completion)[0] == "ok"

    def check_example(self, example: Example) -> str | None:
        """Refuse an expected answer no completion can match: every spec here pays only a
        canonical integer ('323', '-7'), so '0323', '3.5' or 'ten' would score 0 forever."""
        expected = _strip(example.expected_answer)
        reason, _ = parse_final_line(f"{FINAL_PREFIX} {expected}")
        if reason == "ok":
            return None
        return (f"expected_answer {expected!r} is not a canonical integer (ASCII digits, an optional '-', "
                "no '+', spaces or leading zeros), the only answer a final_int spec can pay: write it like "
                "323 or -7, or score these problems with another verifier (--env.spec_version)")

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        example, refused, error = admit(example, completion)
        if refused:
            result = _result(self.version, refused, None, None, format_ok=False)
            result["details"]["error"] = error
            return result
        return self.judge(_strip(example.expected_answer), completion)

    def judge(self, expected: str, completion: str) -> dict[str, Any]:
        """Score a str completion against the (trimmed) expected answer."""
        reason, parsed = self.extract(completion)
        if reason != "ok":
            return _result(self.version, reason, None, expected, format_ok=False)
        reason = "ok" if parsed == expected else "wrong_answer"
        return _result(self.version, reason, parsed, expected, format_ok=True)

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


class StrictV1(FinalIntSpec):
    """final_int/strict-v1: after stripping surrounding ASCII whitespace, the completion is
    exactly one line `Final: <int>`.

    <int>: base 10, ASCII digits, optional leading '-', no '+', no leading zeros ('0' is
    fine, '-0' is not), no commas, units, words or trailing period; exactly one space after
    the colon. Reward 1.0 iff the integer string equals `expected_answer.strip()`.

    Accepts: 'Final: 25', '  Final: -3\\n'.   Rejects: 'Final:  25', 'final: 25',
    'Final: 025', 'Final: 25.', 'The answer is 25', 'Final:\\n25'."""

    version = "final_int/strict-v1"

    def extract(self, completion):
        text = _strip(completion)
        if text == "":
            return "empty", None
        if "\n" in text:
            finals = _count_final_lines(text)
            if finals == 0:
                return "no_final_line", None
            return ("multiple_final_lines" if finals > 1 else "extra_lines"), None
        return parse_final_line(text)


class CotV1(FinalIntSpec):
    """final_int/cot-v1: worked steps may come first. After stripping surrounding ASCII
    whitespace, the LAST line (lines split on '\\n') must be exactly `Final: <int>` with
    strict-v1's integer rules, and no earlier line may start with 'Final:' (so an answer
    cannot be laundered by stating several).

    Accepts: '7+5=12,12+9=21\\nFinal: 21', 'Final: 21'.
    Rejects: 'Final: 21\\nbecause 7+5+9=21', 'Final: 20\\nFinal: 21'."""

    version = "final_int/cot-v1"

    def extract(self, completion):
        text = _strip(completion)
        if text == "":
            return "empty", None
        finals = _count_final_lines(text)
        if finals == 0:
            return "no_final_line", None
        if finals > 1:
            return "multiple_final_lines", None
        last_line = text[text.rfind("\n") + 1 :]  # rfind gives -1 for one line: whole text
        if not last_line.startswith(FINAL_PREFIX):
            return "final_not_last", None
        return parse_final_line(last_line)


class ThinkV1(StrictV1):
    """final_int/think-v1: strict-v1 after an optional thinking block. After stripping
    surrounding ASCII whitespace, the completion may open with ONE `<think>…</think>` block;
    what follows it must be exactly the line `Final: <int>` under strict-v1's rules. The
    answer is read after the thinking, never inside it, so a number written while thinking
    is not an answer.

    Accepts: '<think>7+5=12</think>\\nFinal: 12', 'Final: 12' (no thinking: /no_think).
    Rejects: '<think>7+5=12' (unclosed_think), 'so<think>…</think>\\nFinal: 12' and a
    second block (think_not_first), '<think>Final: 12</think>' (no_final_line)."""

    version = "final_int/think-v1"

    def extract(self, completion):
        text = _strip(completion)
        blocks, answer, unclosed = split_thinking(text)
        if unclosed:
            return "unclosed_think", None
        if blocks and (len(blocks) > 1 or not text.startswith(THINK_OPEN)):
            return "think_not_first", None
        if blocks and _strip(answer) == "":
            return "no_final_line", None  # thinking and no answer after it
        return super().extract(answer)


# ---------------------------------------------------------------------------------------
# Hackable variants. Each is a plausible-looking shortcut someone might ship; the
# docstring names the completion that wins reward without deserving it. Tests keep every
# exploit scoring 1 here and 0 under the honest specs.
# ---------------------------------------------------------------------------------------


class HackableSubstring(FinalIntSpec):
    """hackable/substring: reward 1 if the expected answer appears anywhere in the text.

    Exploit: enumerate numbers. '0 1 2 3 ... 99' contains every answer from 0 to 99, and
    even a single wrong answer can contain the right one ('Final: 125' contains '25')."""

    version = "hackable/substring"

    def extract(self, completion):
        return ("ok" if _strip(completion) else "empty"), None

    def judge(self, expected, completion):
        if _strip(completion) == "":
            return _result(self.version, "empty", None, expected, format_ok=False)
        if expected and expected in completion:
            return _result(self.version, "ok", expected, expected, format_ok=True)
        return _result(self.version, "wrong_answer", None, expected, format_ok=True)


_REVERSED_INT = re.compile(r"[0-9]+-?")  # an integer as it reads in the reversed text


class HackableLastNumber(FinalIntSpec):
    """hackable/last-number: the last integer anywhere in the text is the answer (a
    '-' directly before its digits makes it negative); no format is required.

    Exploit: state a wrong answer, then mention the right number in passing:
    'Final: 24 (or 25)' scores 1 for 25, and so does prose that merely ends in it."""

    version = "hackable/last-number"

    def extract(self, completion):
        if _strip(completion) == "":
            return "empty", None
        # Search the reversed text once: the first match there is the last integer here,
        # found in one linear C-level pass instead of a Python loop over every match.
        match = _REVERSED_INT.search(completion[::-1])
        if match is None:
            return "no_integer", None
        return "ok", match.group(0)[::-1]


class HackableCaseInsensitivePrefix(FinalIntSpec):
    """hackable/case-insensitive-prefix: finds the last 'final:' in any case, skips any
    whitespace (newlines too), reads an optional '-' and digits, and ignores whatever
    follows.

    Exploit: off-spec and even non-integer answers get full credit:
    'FINAL:25.9 apples, roughly' scores 1 when the answer is 25. A policy trained on it
    drifts away from the format every downstream parser expects."""

    version = "hackable/case-insensitive-prefix"

    def extract(self, completion):
        lowered = completion.lower()  # work only on this copy: lower() may change lengths
        if _strip(lowered) == "":
            return "empty", None
        position = lowered.rfind("final:")
        if position < 0:
            return "no_final_line", None
        number = _ascii_int_prefix(lowered[position + len("final:") :].lstrip(WHITESPACE))
        if number == "":
            return "malformed_int", None
        return "ok", number


class HackableMultiFinal(FinalIntSpec):
    """hackable/multi-final: reward 1 if ANY line, ignoring trailing whitespace, is exactly
    `Final: <expected answer>`, however many other 'Final:' lines there are.

    Exploit: answer laundering by enumeration: 'Final: 0\\nFinal: 1\\n...\\nFinal: 99'
    covers every answer from 0 to 99."""

    version = "hackable/multi-final"

    def extract(self, completion):
        text = _strip(completion)
        if text == "":
            return "empty", None
        return ("ok" if _count_final_lines(text) else "no_final_line"), None

    def judge(self, expected, completion):
        reason, _ = self.extract(completion)
        if reason != "ok":
            return _result(self.version, reason, None, expected, format_ok=False)
        # One anchored literal per line start: no nested quantifiers, so no blow-up.
        line = re.compile(r"^Final: " + re.escape(expected) + r"[ \t\r]*$", re.MULTILINE)
        if expected and line.search(_strip(completion)):
            return _result(self.version, "ok", expected, expected, format_ok=True)
        return _result(self.version, "wrong_answer", None, expected, format_ok=True)


SPECS: dict[str, FinalIntSpec] = {
    spec.version: spec
    for spec in (
        StrictV1(),
        CotV1(),
        ThinkV1(),
        HackableSubstring(),
        HackableLastNumber(),
        HackableCaseInsensitivePrefix(),
        HackableMultiFinal(),
    )
}
# the honest specs of the default task, recorded in the shipped packs; think-v1 is honest too,
# the spec of envs/thinking_modes.py
HONEST_SPECS = ("final_int/strict-v1", "final_int/cot-v1")


def get_spec(version: str) -> FinalIntSpec:
    """The scorer registered under `version` (a callable `(example, completion) -> dict`)."""
    if version not in SPECS:
        raise ValueError(
            f"unknown spec_version {version!r}; valid versions: {', '.join(SPECS)}"
        )
    return SPECS[version]


def score(example: Any, completion: Any, spec_version: str = DEFAULT_SPEC) -> dict[str, Any]:
    """Score one completion under a named spec version; by default the honest cot-v1,
    which also accepts a one-line answer. The version is part of every measurement, so it
    is recorded in `details["spec_version"]` whichever one scored."""
    return get_spec(spec_version)(example, completion)


def format_ok(completion: Any, spec_version: str = DEFAULT_SPEC) -> bool:
    """Whether the completion has the spec's FORMAT, whatever the number in it. Reward
    design can then weight format separately from correctness."""
    return get_spec(spec_version).format_ok(completion)
