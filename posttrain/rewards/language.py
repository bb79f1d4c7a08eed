"""DeepSeek-R1's language-consistency reward (arXiv:2501.12948, Sec. 2.3.2), as a reward term.

R1-Zero's chains of thought mixed languages, which made them hard to read. In R1's reasoning
RL stage the reward is the accuracy reward plus the share of the chain of thought's words that
are in the target language, the two summed directly; the paper's ablation found it costs a
little accuracy and buys readability. Here:

    language = (words of the reasoning in the prompt's language) / (words of the reasoning)

  - the reasoning is the text inside <think>...</think> when the completion has such a block,
    else everything before its first `Final:` line (the whole completion when it has none);
  - a word is a run of digits ("26") or of letters, hyphens joining letter runs ("twenty-six");
    "+", "=", "," and spaces are punctuation, in no language;
  - the languages are those of the arithmetic task with env.arithmetic.words
    (verifiers/number_words.py): digits, and English number words. The prompt's language is the one
    most of the prompt's own words are in ("Q: six+six+four" is words, "Q: 6+6+4" digits);
  - a word in neither language (a stray "xq") is not in the prompt's language: it counts
    against the share as a word of another language would;
  - reasoning with no word at all scores 0.0, so that skipping the reasoning never pays more
    than reasoning in the prompt's language.

On a one-language task (arithmetic in digits) the term is 1.0 for any clean chain: it moves
only where the policy can mix, which is what env.arithmetic.words makes possible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from posttrain.verifiers.number_words import is_number_word
from posttrain.rewards.stack import Scored
from posttrain.types import Example
from posttrain.verifiers.think_tags import THINK_OPEN, split_thinking

WORD = re.compile(r"[0-9]+|[A-Za-z]+(?:-[A-Za-z]+)*")
DIGITS, WORDS = "digits", "words"
FINAL_LINE = re.compile(r"^Final:", re.M)


def reasoning_of(completion: str) -> str:
    """The chain of thought of a completion: its <think> blocks, else what precedes the first
    line that starts with `Final:`."""
    if THINK_OPEN in completion:
        return " ".join(split_thinking(completion)[0])
    final = FINAL_LINE.search(completion)
    return completion[: final.start()] if final else completion


def language_of(word: str) -> str:
    """"digits", "words" (an English number word), or "" for a word of neither language."""
    if word.isdigit():
        return DIGITS
    return WORDS if is_number_word(word) else ""


def prompt_language(prompt: str) -> str:
    """The language most of the prompt's numbers are written in; digits on a tie or none."""
    languages = [language_of(word) for word in WORD.findall(prompt)]
    return WORDS if languages.count(WORDS) > languages.count(DIGITS) else DIGITS


def language_consistency(prompt: str, completion: str) -> float:
    """The share of the reasoning's words in the prompt's language, in [0, 1]; 0.0 for
    reasoning without words (the module docstring says why)."""
    words = WORD.findall(reasoning_of(completion))
    if not words:
        return 0.0
    target = prompt_language(prompt)
    return sum(language_of(word) == target for word in words) / len(words)


@dataclass(frozen=True)
class LanguageConsistency:
    """rl.reward.terms's "language": R1's language-consistency reward on one sample."""

    name: str = "language"

    @property
    def spec(self) -> str:
        return f"{self.name}(share of reasoning words in the prompt's language)"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        return language_consistency(example.prompt, completion)
