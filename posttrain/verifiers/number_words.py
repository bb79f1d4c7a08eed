"""Numbers as English words: the second "language" of the arithmetic task (env.arithmetic.words).

DeepSeek-R1's chains of thought mixed languages (Sec. 2.3.2), and its language-consistency
reward pays the share of the chain written in the prompt's language
(rewards/language.py). A one-language task has nothing to mix, so the arithmetic task can
write its numbers as words instead of digits:

    prompt      "Q: six+six+four\\n"
    in words    "six+six=twelve,twelve+four=sixteen\\nFinal: 16"
    in digits   "6+6=12,12+4=16\\nFinal: 16"

Both chains are right (the verifier reads only the Final line, in digits as ever), and a
policy that learned from demonstrations of both can mix them within one completion: the two
languages. `number_word` covers 0..999, every running sum of levels 1-4 (level 5's minus
sign would read as a hyphen inside "twenty-six", so the words variant leaves it out).
"""

from __future__ import annotations

import re

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
        "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
HUNDRED = "hundred"
# every word a number is spelt with, and so the vocabulary of the words language
NUMBER_WORDS = frozenset(ONES + TENS[2:] + [HUNDRED])
WORD_RUN = re.compile(r"[a-z]+(?:[- ][a-z]+)*")  # "twenty-six", "one hundred four": one number


def number_word(n: int) -> str:
    """n in words: 26 -> "twenty-six", 104 -> "one hundred four"."""
    if not 0 <= n <= 999:
        raise ValueError(f"number_word spells 0..999 (every running sum of arithmetic levels 1-4), got {n}")
    hundreds, rest = divmod(n, 100)
    head = f"{ONES[hundreds]} {HUNDRED}" if hundreds else ""
    if hundreds and not rest:
        return head
    tail = ONES[rest] if rest < 20 else TENS[rest // 10] + (f"-{ONES[rest % 10]}" if rest % 10 else "")
    return f"{head} {tail}".strip()


WORD_VALUES = {number_word(n): n for n in range(1000)}


def words_to_digits(text: str) -> str:
    """Every number written in words replaced by its digits: "six+six" -> "6+6"; ValueError
    naming a run of letters that is not a number."""
    def digits(match: re.Match[str]) -> str:
        if match[0] not in WORD_VALUES:
            raise ValueError(f"{match[0]!r} in {text!r} is not a number in words (e.g. 'twenty-six')")
        return str(WORD_VALUES[match[0]])

    return WORD_RUN.sub(digits, text)


def is_number_word(token: str) -> bool:
    """A token of the words language: "six", "twenty-six" ("twenty" and "six" joined)."""
    return bool(token) and all(part in NUMBER_WORDS for part in token.split("-"))


def digits_to_words(text: str) -> str:
    """Every number written in digits replaced by its words: "6+6=12" -> "six+six=twelve"."""
    return re.sub(r"[0-9]+", lambda match: number_word(int(match[0])), text)
