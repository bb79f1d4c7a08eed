"""The sentiment demo's reward and what its alignment tax is measured in.

    vader_reward / score   VADER's compound score of a completion (Hutto & Gilbert 2014): the
                           stand-in for a learned reward model, fixed, imperfect, exploitable
    distinct_n             unique n-grams / all n-grams (Li et al. 2016): how varied the text is
    real_word_fraction     the share of words the training corpus uses: is the text still fluent
"""

from __future__ import annotations

import re
from functools import lru_cache

from posttrain.teach.demos import reviews
from posttrain.types import Example

CORPUS_SIZE = 4000  # distinct enough that the model learns the templates, not the texts


@lru_cache(maxsize=1)
def _analyzer():
    # Imported and built on first use: the lexicon takes ~0.1 s to load, and only this demo needs it.
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def vader_reward(text: str) -> float:
    """VADER's compound score of `text`, in [−1, 1]; 0 for text with no sentiment words
    (the empty string included). Only the completion is scored, not the prompt: the
    policy is rewarded for what it wrote."""
    return float(_analyzer().polarity_scores(text)["compound"])


def score(example: Example, completion: str) -> dict:
    """The environment's verifier signature (`score_episodes` calls it): reward + details."""
    scores = _analyzer().polarity_scores(completion)
    return {"reward": float(scores["compound"]), "details": {k: scores[k] for k in ("pos", "neu", "neg")}}


_WORD = re.compile(r"[a-z']+|[^\sa-z]")  # a word, or one punctuation mark: "great!!" -> great ! !


def words(text: str) -> list[str]:
    """Lowercased words and punctuation marks, each its own item: "Great, but slow!" ->
    ["great", ",", "but", "slow", "!"]. Punctuation counts because VADER counts it."""
    return _WORD.findall(text.lower())


def distinct_n(texts: list[str], n: int) -> float:
    """Unique n-grams / all n-grams of `words` over `texts` (Li et al. 2016,
    arXiv:1510.03055): 1 = no n-gram repeats anywhere, near 0 = the same words again and
    again. n-grams never cross texts; 0 when there are none.

        distinct_n(["very good.", "very bad."], 1) -> 4 unique / 6 = 0.667"""
    grams = [tuple(w[i : i + n]) for w in map(words, texts) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


@lru_cache(maxsize=1)
def corpus_words() -> frozenset[str]:
    """Every word the corpus's continuations use (60 of them)."""
    return frozenset(w for _, text in reviews.reviews(CORPUS_SIZE) for w in words(text) if w.isalpha())


def real_word_fraction(texts: list[str]) -> float:
    """The fraction of the words in `texts` that the corpus uses: 1 for fluent text, lower
    when a policy drifts into "greael" and "wastlrrtel" (punctuation is not counted). 1
    when there are no words at all: saying nothing is not misspelling."""
    found = [w in corpus_words() for text in texts for w in words(text) if w[0].isalpha()]
    return sum(found) / len(found) if found else 1.0
