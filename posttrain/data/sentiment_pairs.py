"""A bundled preference set with no verifier, the kind of preference a rule cannot check
exactly: short review sentences ranked by a lexicon sentiment score (`lexicon_sentiment`),
standing in for human raters. `review` writes the sentences; `sentiment_pairs` pairs two
reviews of one subject, the more positive one chosen."""

from __future__ import annotations

import hashlib
import random
import re

from posttrain.types import PreferencePair

# Word valences on a rough −3..3 scale (the shape of VADER's lexicon, our own values).
LEXICON: dict[str, float] = {
    "excellent": 3.0, "wonderful": 3.0, "superb": 3.0, "great": 2.0, "lovely": 2.0,
    "friendly": 2.0, "tasty": 2.0, "good": 1.5, "pleasant": 1.5, "fine": 0.5,
    "horrible": -3.0, "terrible": -3.0, "awful": -3.0, "rude": -2.0, "poor": -2.0,
    "dirty": -2.0, "bad": -1.5, "bland": -1.0, "dull": -1.0, "slow": -1.0,
}
NEGATIONS = frozenset({"not", "never"})
INTENSIFIERS = {"very": 1.5, "really": 1.5, "quite": 1.2, "slightly": 0.5}
NEGATION_SCALE = -0.5  # "not good" is mildly bad, not as bad as "bad" (VADER uses −0.74)
CLAUSE_BREAKS = frozenset({"and", "but", ".", ",", "!", "?", ";"})
_WORDS = re.compile(r"[a-z]+|[.,!?;]")


def lexicon_sentiment(text: str) -> float:
    """A transparent sentiment score: the sum of word valences from `LEXICON`, where an
    intensifier scales the next sentiment word and a negation flips and halves it, within
    the same clause. Any str is scored (unknown words count 0); higher is more positive.

        "The soup was good."            ->  1.5
        "The soup was very good."       ->  1.5 · 1.5 = 2.25
        "The soup was not good."        ->  1.5 · −0.5 = −0.75
        "Great room, but rude staff."   ->  2 − 2 = 0
    """
    score, scale, negated = 0.0, 1.0, False
    for word in _WORDS.findall(text.lower()):
        if word in NEGATIONS:
            negated = True
        elif word in INTENSIFIERS:
            scale *= INTENSIFIERS[word]
        elif word in LEXICON:
            score += LEXICON[word] * scale * (NEGATION_SCALE if negated else 1.0)
            scale, negated = 1.0, False
        elif word in CLAUSE_BREAKS:
            scale, negated = 1.0, False
    return score


SUBJECTS = ("pizza", "hotel", "movie", "service", "coffee", "book", "room", "staff", "soup", "concert")


def review(rng: random.Random, subject: str) -> str:
    """'The hotel was very good and slow.': one or two sentiment phrases (one in two of
    three reviews), each with a negation 15% of the time and an intensifier 30%, the word
    uniform over LEXICON. The writer behind `sentiment_pairs`; lesson 15 samples it as the
    policy RLHF starts from."""
    phrases = []
    for _ in range(rng.choice((1, 1, 2))):
        words = []
        if rng.random() < 0.15:
            words.append(rng.choice(sorted(NEGATIONS)))
        if rng.random() < 0.3:
            words.append(rng.choice(sorted(INTENSIFIERS)))
        words.append(rng.choice(sorted(LEXICON)))
        phrases.append(" ".join(words))
    return f"The {subject} was {' and '.join(phrases)}."


def _split_of(text: str) -> str:
    """train (80%) or heldout (20%), from a stable hash of the pair's text."""
    bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 100
    return "train" if bucket < 80 else "heldout"


def sentiment_pairs(n: int, seed: int = 0, split: str = "train", min_gap: float = 1.0) -> list[PreferencePair]:
    """n review pairs for one prompt each: two reviews of the same subject, the one with the
    higher `lexicon_sentiment` chosen. Pairs whose scores differ by less than `min_gap` are
    redrawn: near-ties are the pairs human raters disagree on, and filtering them is the
    usual curation step (default 1.0: "good" vs "fine" stays, "fine" vs "not bad" goes; 0
    drops only exact ties). A pair's split is a hash of its text, so "train" and "heldout"
    never share a pair whatever the seeds.

        prompt "Review the soup:\\n"  chosen "The soup was tasty."  rejected "The soup was not good."
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not 0 <= min_gap <= 4:
        raise ValueError(f"min_gap must be in [0, 4] (larger gaps are too rare to fill n pairs), got {min_gap!r}")
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        subject = rng.choice(SUBJECTS)
        a, b = review(rng, subject), review(rng, subject)
        score_a, score_b = lexicon_sentiment(a), lexicon_sentiment(b)
        if score_a == score_b or abs(score_a - score_b) < min_gap:
            continue  # a tie is no preference; a near-tie a noisy one
        prompt = f"Review the {subject}:\n"
        if _split_of(prompt + "\0" + "\0".join(sorted((a, b)))) != split:
            continue
        chosen, rejected = (a, b) if score_a > score_b else (b, a)
        pairs.append(PreferencePair(prompt, chosen, rejected, score_chosen=max(score_a, score_b),
                                    score_rejected=min(score_a, score_b)))
    return pairs
