"""Problems a guess can pass: multiple-choice and true/false items, kept out of RL data.

A verifiable reward is worth training on when earning it means solving the problem. An
item whose answer is one of two words or one of a few letters pays a blind guess 1/2 or
1/k of the time, and a policy that learns to guess well (the option that is most often
right, the longest one, "True") is paid as if it reasoned: reward rises, held-out accuracy
on open problems does not. Kimi k1.5's RL prompt set left such items out for this reason
(arXiv:2501.12599, section 2.1: multiple-choice, true/false and proof questions, as prone
to hacking), and the R1-style recipes built on verifiable answers do the same.

    guessable(example) -> why or None   "true/false: a guess is paid 1/2 of the time",
                                        "multiple choice (4 options): ... 1/4 ...", None

The rule reads the expected answer first, the prompt second, so an open problem is never
dropped for its wording alone:
  - true/false: the answer is true, false, yes or no (any case, a final period allowed);
  - multiple choice: the answer is one option letter ("B", "(B)", "B.") and the prompt lists
    at least two options, each on its own line as "A) ...", "(A) ...", "A. ..." or "A: ...",
    among them the answer's letter.

`rl.curation.exclude_guessable` applies it to a curated pool (pipelines/curation.py): the
items it finds are screened out like duplicates, each with its reason in curation.jsonl.
"""

from __future__ import annotations

import re

from posttrain.types import Example

TRUE_FALSE = {"true", "false", "yes", "no"}
_LETTER_ANSWER = re.compile(r"\(?([A-J])\)?\.?")
_OPTION_LINE = re.compile(r"^[ \t]*\(?([A-J])[\).:][ \t]+\S", re.MULTILINE)


def guessable(example: Example) -> str | None:
    """Why a blind guess can pass `example` (module docstring), or None when it cannot."""
    answer = example.expected_answer.strip()
    if answer.rstrip(".").lower() in TRUE_FALSE:
        return "true/false: a guess is paid 1/2 of the time"
    letter = _LETTER_ANSWER.fullmatch(answer)
    if letter is None:
        return None
    options = set(_OPTION_LINE.findall(example.prompt))
    if len(options) < 2 or letter.group(1) not in options:
        return None
    return f"multiple choice ({len(options)} options): a guess is paid 1/{len(options)} of the time"
