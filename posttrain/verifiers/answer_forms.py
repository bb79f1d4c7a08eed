"""One value, many spellings: the rule half of Kimi k1.5's answer-equivalence check, and the
labelled answers a learned judge trains on.

Kimi k1.5 (arXiv:2501.12599, Sec. 2.3.5) checks a math answer against its reference with
reward models because free-form answers defeat string rules. The arithmetic task's answers
are integers, but a policy that has read number words (env.arithmetic.words) can write one
integer many ways, and only some of them are the rule's:

    Final: 42            the rule's (final_int's strict `Final: <int>`)
    Final: forty-two     the rule's too (number_words spells 0..999)
    Final: 42.0          not the rule's: the same value, a form no rule here reads
    Final: forty two     not the rule's: a space where number_words wants a hyphen
    Final: 43            the rule's, and wrong

`read_final_line(line)` is the rule: (reason, the integer's canonical digits), the digits
None where it cannot parse.
`equivalence_pairs(count, seed)` writes (final line, reference, verdict) rows, the verdict
known by construction (we wrote the value, so we know it), never by a model: the data a
learned judge (rewards/equivalence_judge.py) is trained and measured on.

Every form below is one function of (value, rng). A right row writes the reference in one
form; a wrong row writes a near miss (off by one, the digits swapped, another value) in one
form, or a malformed near miss of the reference itself ("4 2", "42.5"). Forms the rule
parses are drawn as often as the others, so the rule's coverage is a property of the data
and is measured, not assumed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

from posttrain.verifiers.final_int import FINAL_PREFIX, parse_final_line
from posttrain.verifiers.number_words import WORD_VALUES, number_word

MAX_VALUE = 99  # references 0..99: every answer of arithmetic levels 1-3 (at most 45), in two digits or words
UNITS = ("apples", "cats", "marbles", "points")

Form = Callable[[int, random.Random], str]


def read_final_line(line: str) -> tuple[str, str | None]:
    """The rule: ("ok", the integer as canonical digits) when `line` is final_int's strict
    `Final: <int>` or `Final: <number in words>` (number_words' spelling, 0..999), else
    (reason, None) with final_int's reason for the digits parse. Exact and total: any str,
    linear time. Digits, not an int: Python refuses int() of more than 4,300 digits, and a
    megabyte of them is still an answer the rule reads (and finds wrong)."""
    reason, parsed = parse_final_line(line)
    if reason == "ok" and parsed is not None:
        return "ok", parsed
    body = line[len(FINAL_PREFIX) + 1 :] if line.startswith(FINAL_PREFIX + " ") else None
    if body is not None and body in WORD_VALUES:  # a dict lookup: no regex over untrusted text
        return "ok", str(WORD_VALUES[body])
    return reason, None


def last_final_line(completion: str) -> str:
    """The completion's last line that starts with 'Final:' (the answer a chain of thought
    ends with), else its last non-blank line; '' for blank text."""
    lines = [line.strip(" \t\r") for line in completion.split("\n")]
    finals = [line for line in lines if line.startswith(FINAL_PREFIX)]
    if finals:
        return finals[-1]
    filled = [line for line in lines if line]
    return filled[-1] if filled else ""


# ---------------------------------------------------------------------------------------
# Surface forms: what follows "Final:" on the line
# ---------------------------------------------------------------------------------------


FORMS: dict[str, Form] = {
    # the rule reads these two
    "digits": lambda v, rng: f" {v}",
    "words": lambda v, rng: f" {number_word(v)}",
    # the same value, written so that the strict rule refuses it
    "decimal": lambda v, rng: f" {v}.{'0' * rng.randint(1, 2)}",
    "plus_sign": lambda v, rng: f" +{v}",
    "unit": lambda v, rng: f" {v} {rng.choice(UNITS)}",
    "spaces": lambda v, rng: f"{' ' * rng.randint(2, 3)}{v}{' ' * rng.randint(1, 2)}",
    "equals": lambda v, rng: f" = {v}",
    "period": lambda v, rng: f" {v}.",
    "words_spaced": lambda v, rng: f" {number_word(v).replace('-', ' ')}",
    "words_capital": lambda v, rng: f" {number_word(v).capitalize()}",
    "words_unit": lambda v, rng: f" {number_word(v)} {rng.choice(UNITS)}",
}
RULE_FORMS = ("digits", "words")  # the forms read_final_line parses by design


def _near_miss(value: int, rng: random.Random, max_value: int) -> tuple[str, int]:
    """(kind, a different value a careless answer would give): off by one, the digits
    swapped, or any other value."""
    swapped = int(str(value)[::-1]) if value >= 10 else None
    kinds = ["off_by_one", "other"] + (["digit_swap"] if swapped is not None and swapped != value else [])
    kind = rng.choice(kinds)
    if kind == "digit_swap" and swapped is not None:
        return kind, swapped
    if kind == "off_by_one":
        return kind, value + 1 if value == 0 or rng.random() < 0.5 else value - 1
    other = rng.randint(0, max_value - 1)
    return "other", other + 1 if other >= value else other  # uniform over 0..max_value without `value`


# Malformed near misses of the reference itself: they look like it and are not it.
MALFORMED: dict[str, Form] = {
    "split_digits": lambda v, rng: " " + " ".join(str(v)) if v >= 10 else f" {v} {rng.randint(1, 9)}",
    "fraction_part": lambda v, rng: f" {v}.{rng.randint(1, 9)}",
    "extra_digit": lambda v, rng: f" {v}{rng.randint(0 if v else 1, 9)}",  # "00" would still be 0
}


@dataclass(frozen=True)
class AnswerPair:
    """One labelled answer: the final line a policy might write, the reference integer, and
    whether the line states that value (`equivalent`, by construction)."""

    line: str  # "Final: forty two"
    reference: int
    equivalent: bool
    form: str  # the surface form (FORMS or MALFORMED), for per-form error counts
    mistake: str  # "" for a right row; off_by_one, digit_swap, other, or the malformed form


SPLITS = ("train", "heldout")
HELDOUT_SHARE = 5  # one reference in five is held out: 20 of 0..99


def split_references(split: str, max_value: int = MAX_VALUE) -> list[int]:
    """The references of a split: a fixed shuffle of 0..max_value, the first four fifths
    for training and the rest held out. A held-out row's reference never appears as a
    training row's reference, so "held out" means the judge never saw that comparison (with
    100 values and 11 forms, two random draws would otherwise share most of their rows)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}; choose one of {SPLITS}")
    values = list(range(max_value + 1))
    random.Random("equivalence-split").shuffle(values)
    cut = len(values) - max(1, len(values) // HELDOUT_SHARE)
    return sorted(values[:cut] if split == "train" else values[cut:])


def equivalence_pairs(count: int, seed: int, split: str = "train", max_value: int = MAX_VALUE) -> list[AnswerPair]:
    """`count` labelled rows whose references are `split`'s (split_references), half right
    and half wrong (alternating), drawn from `seed` alone: the same arguments give the same
    rows. Wrong rows are near misses written in the same forms as right ones (3 in 4) or
    malformed copies of the reference (1 in 4)."""
    if count < 0 or not 0 < max_value <= 999:
        raise ValueError(f"equivalence_pairs needs count >= 0 and max_value in 1..999 (number words spell 0..999), "
                         f"got count={count}, max_value={max_value}")
    references = split_references(split, max_value)
    rng = random.Random(f"equivalence-pairs/{split}/{seed}")  # a str seed hashes the same in every process
    names = sorted(FORMS)
    rows = []
    for i in range(count):
        reference = rng.choice(references)
        if i % 2 == 0:
            form = rng.choice(names)
            rows.append(AnswerPair(FINAL_PREFIX + FORMS[form](reference, rng), reference, True, form, ""))
        elif rng.random() < 0.25:
            form = rng.choice(sorted(MALFORMED))
            rows.append(AnswerPair(FINAL_PREFIX + MALFORMED[form](reference, rng), reference, False, form, form))
        else:
            mistake, wrong = _near_miss(reference, rng, max_value)
            form = rng.choice(names)
            rows.append(AnswerPair(FINAL_PREFIX + FORMS[form](wrong, rng), reference, False, form, mistake))
    return rows
