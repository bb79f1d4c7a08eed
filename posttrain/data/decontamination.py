"""Dedup and decontamination of training prompts, by exact and by n-gram match.

A training prompt that is also a held-out prompt turns part of the held-out score into a
training score; two copies of one prompt in a pool draw it twice as often as its
neighbours. Before a curated pool is measured (data/curation.py), each of its prompts is
compared with the held-out and dev prompts the run will be scored on (decontamination),
then with the pool's earlier prompts (dedup), and dropped at its first match:

    exact   the normalised texts are equal: lower case, whitespace runs made one space,
            ends stripped ("Q: 7+5\\n" and "q:  7+5" are one prompt)
    ngram   also: at least `min_overlap` of the prompt's n-grams occur in ONE other prompt.
            Tokens are words, numbers and single symbols ("7+5" is three tokens), so
            formulas match as finely as prose. A prompt of at most n tokens is one
            n-gram, all of its tokens: it matches only a prompt of the same tokens, so
            for short prompts lower n (arithmetic's are 11 tokens).

This is the check GPT-3 (Brown et al. 2020, appendix C: 13-grams) and Llama 2 made against
their benchmarks, with two differences a small task needs: the overlap is a fraction of the
prompt's own n-grams, not "any shared 13-gram" (a templated task shares its template with
every prompt), and it is counted against one prompt at a time, so a match names the prompt
it matched. Finding that one prompt is an inverted index from n-gram to prompt: the work is
the number of (n-gram, prompt) pairs that share, not pool size × held-out size.

On the arithmetic task exact decontamination finds nothing by construction (a problem's
split is a hash of its expression, envs/arithmetic.py), and n-gram matching finds neighbours,
not leaks: "7+5+9+3+1" and "7+5+9+3+2" share 3 of their 4 8-grams and have different
answers. The n-gram test is for users' data, where a held-out problem reworded, or copied
with another name in it, is the usual leak.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

MATCHES = ("exact", "ngram")
TOKEN = re.compile(r"\w+|[^\w\s]")  # a word or number, or one symbol


def normalise(text: str) -> str:
    """The text exact matching compares: lower case, whitespace runs as one space, stripped."""
    return " ".join(text.lower().split())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    """The n-grams of a text's tokens; a text of fewer than n tokens is its one n-gram."""
    tokens = TOKEN.findall(normalise(text))
    if len(tokens) <= n:
        return {tuple(tokens)}
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


@dataclass(frozen=True)
class Match:
    """What a prompt matched: prompt `index` of the `against` set ("heldout" or "pool"), by
    `kind` ("exact" or "ngram"), sharing `overlap` of its n-grams (1.0 for exact)."""

    against: str
    index: int
    kind: str
    overlap: float

    def reason(self, matched_text: str) -> str:
        what = "a held-out or dev prompt" if self.against == "heldout" else "an earlier prompt of the pool"
        how = "exact" if self.kind == "exact" else f"{self.overlap:.0%} of its n-grams"
        return f"matches {what} ({how}): {matched_text.strip()[:80]!r}"


class PromptIndex:
    """Prompts by normalised text and by n-gram, to find which one a new prompt matches."""

    def __init__(self, n: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n (tokens per n-gram) must be a positive int, got {n!r}")
        self.n = n
        self.texts: dict[str, int] = {}  # normalised text -> the first prompt with it
        self.postings: dict[tuple[str, ...], list[int]] = defaultdict(list)  # n-gram -> prompts that hold it

    def add(self, index: int, text: str, with_ngrams: bool = True) -> None:
        self.texts.setdefault(normalise(text), index)
        if with_ngrams:
            for gram in ngrams(text, self.n):
                self.postings[gram].append(index)

    def match(self, text: str, min_overlap: float | None) -> tuple[str, int, float] | None:
        """("exact", prompt, 1.0), or ("ngram", prompt, overlap) for the prompt sharing the
        most of `text`'s n-grams (the earliest on a tie) when that is at least
        `min_overlap`; None when nothing matches (min_overlap None: exact only)."""
        exact = self.texts.get(normalise(text))
        if exact is not None:
            return "exact", exact, 1.0
        if min_overlap is None:
            return None
        grams = ngrams(text, self.n)
        shared = Counter(index for gram in grams for index in self.postings.get(gram, ()))
        if not shared:
            return None
        index, count = min(shared.items(), key=lambda item: (-item[1], item[0]))
        overlap = count / len(grams)
        return ("ngram", index, overlap) if overlap >= min_overlap else None


def screen(prompts: list[str], heldout: list[str], match: str = "exact", n: int = 13,
           min_overlap: float = 0.5) -> list[Match | None]:
    """For each training prompt, in order: None when it stays, else its first Match — against
    the held-out prompts (decontamination), then against the pool's earlier prompts that
    stayed (dedup). `match` "exact" or "ngram" (module docstring)."""
    if match not in MATCHES:
        raise ValueError(f"match must be one of {list(MATCHES)}, got {match!r}")
    if not 0 < min_overlap <= 1:
        raise ValueError(f"min_overlap must be in (0, 1], got {min_overlap!r}")
    threshold = min_overlap if match == "ngram" else None
    held, pool = PromptIndex(n), PromptIndex(n)
    for i, text in enumerate(heldout):
        held.add(i, text, with_ngrams=threshold is not None)
    verdicts: list[Match | None] = []
    for i, text in enumerate(prompts):
        found = held.match(text, threshold)
        against = "heldout"
        if found is None:
            found, against = pool.match(text, threshold), "pool"
        if found is None:
            pool.add(i, text, with_ngrams=threshold is not None)
            verdicts.append(None)
        else:
            kind, index, overlap = found
            verdicts.append(Match(against, index, kind, overlap))
    return verdicts
