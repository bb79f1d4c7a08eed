"""A bundled corpus of short, review-like text: what the sentiment_steering demo's small
language model learns to write before RL steers it.

Nothing is downloaded: reviews are drawn from templates and word lists with a fixed seed,
so every run (and every test) sees the same corpus. Each review is an opening, the prompt,
and a continuation, the response the model learns to write after it:

    prompt   "To be honest the room was"
    response " great and the coffee was lovely as always!"

The mood of a review is drawn uniformly from positive, negative, neutral and mixed, so a
model trained on the corpus starts near-neutral on average: a VADER compound score of
about 0, with some samples far above and some far below. That spread is what RL can select
from. The sentiment words and subjects are `data/sentiment_pairs.py`'s (the bundled preference
pairs use them too); the neutral words, fillers and openings are this module's. Three of
those sentiment words, "tasty", "bland" and "slow", are not in VADER's lexicon, so VADER
scores them 0: a reward model's blind spot, left in on purpose. Every character is
printable ASCII, so CharTokenizer encodes the corpus without an `<unk>`.
"""

from __future__ import annotations

import random

from posttrain.data.sentiment_pairs import INTENSIFIERS, LEXICON, SUBJECTS

CORPUS_VERSION = "reviews-v1"  # bump when the templates change: a model trained on v1 saw v1's text

POSITIVE = tuple(sorted(w for w, v in LEXICON.items() if v > 0))  # excellent, good, lovely, ...
NEGATIVE = tuple(sorted(w for w, v in LEXICON.items() if v < 0))  # awful, bad, rude, ...
# Words that describe without judging (VADER scores each 0), so a neutral review is neutral.
NEUTRAL = ("average", "busy", "cold", "crowded", "expensive", "ordinary", "quiet", "small", "warm", "new")
MOODS = ("positive", "negative", "neutral", "mixed")

OPENINGS = ("The {s} was", "I thought the {s} was", "Overall the {s} was", "To be honest the {s} was")
# Neutral time and place phrases: they make the text varied (distinct-n has something to
# lose) without moving its sentiment.
FILLERS = ("", "", "", " at lunch", " last week", " on Friday", " this time", " for the price", " as always")


def prompts() -> list[str]:
    """Every review opening, in a fixed order: 4 openings x 10 subjects = 40 prompts."""
    return [opening.format(s=s) for opening in OPENINGS for s in SUBJECTS]


def _phrase(rng: random.Random, words: tuple[str, ...]) -> str:
    """An adjective from `words`, with an intensifier 30% of the time ("very good")."""
    word = rng.choice(words)
    return f"{rng.choice(sorted(INTENSIFIERS))} {word}" if rng.random() < 0.3 else word


def continuation(rng: random.Random, mood: str, subject: str) -> str:
    """The rest of a review in the given mood, starting with a space and ending with . or !"""
    if mood == "mixed":  # one good thing, one bad, in either order, joined by "but"
        first, second = (POSITIVE, NEGATIVE) if rng.random() < 0.5 else (NEGATIVE, POSITIVE)
        body = f"{_phrase(rng, first)}, but {_phrase(rng, second)}"
    else:
        words = {"positive": POSITIVE, "negative": NEGATIVE, "neutral": NEUTRAL}[mood]
        body = _phrase(rng, words)
        if rng.random() < 0.5:  # a second judgement, of the same or of another subject
            other = rng.choice([s for s in SUBJECTS if s != subject])
            body += rng.choice((" and ", f" and the {other} was ")) + _phrase(rng, words)
    end = rng.choices((".", "!", "!!"), weights=(8, 3, 1))[0]  # VADER counts "!" as emphasis
    return f" {body}{rng.choice(FILLERS)}{end}"


def reviews(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """n (prompt, response) pairs; the same n and seed give the same list.

        reviews(2) -> [("To be honest the room was", " great and the coffee was lovely as always!"),
                       ("Overall the movie was", " bad and quite dull on Friday!")]
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        subject = rng.choice(SUBJECTS)
        prompt = rng.choice(OPENINGS).format(s=subject)
        out.append((prompt, continuation(rng, rng.choice(MOODS), subject)))
    return out
