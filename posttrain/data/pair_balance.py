"""Pair curation before a preference loss trains: take away the shortcuts a set of pairs
offers, so the loss has to learn the preference itself.

A sequence-level loss learns whatever separates chosen from rejected. When the chosen
response is usually the longer one, "be longer" lowers the loss as well as "be right", and
DPO's known failure is to learn exactly that (verbosity). When one topic supplies most of
the pairs, the loss mostly learns that topic's preference. Balancing removes both cues by
subsampling, never by reweighting, so every kept pair is trained on as an ordinary pair.

    length_bucket(pair)            "chosen longer", "chosen shorter" or "same length"
    topic_of(record)               the topic key a record is balanced by (the rule below)
    dedupe_prompts(records, n, rng) exact duplicates dropped, then at most n records a prompt
    balance_pairs(records, ...)    (kept records in their original order, report: counts per bucket)

The rules:

    prompts   (with a cap n) an exact duplicate, the same prompt and the same responses (and
              label) as a record before it, is dropped whatever its meta or scores; then a
              prompt with more than n records keeps n of them. A verifier that pairs every
              right sample with every wrong one gives a prompt with 4 right and 4 wrong samples
              16 pairs and one with 1 and 1 a single pair, so the prompts the policy half-solves
              would otherwise outweigh the rest, and a sample drawn twice would count twice.

    lengths   a pair whose lengths (characters) differ by at most SAME_LENGTH_TOLERANCE of
              the longer one is "same length": it carries no length cue and is always kept.
              Of the others, the larger of "chosen longer" / "chosen shorter" is subsampled
              to the size of the smaller, so on the kept pairs the longer response wins
              exactly half of the pairs that have a longer response.
    topics    a record's topic is meta["topic"] (a `topic` column of a pairs file), else its
              difficulty label (meta["difficulty"], else meta["level"]: arithmetic's level,
              which verifier-built pairs carry), else the first word of its prompt. Each
              topic with more records than the median topic is subsampled to the median
              (rounded up): the largest topics lose most, and one rare topic cannot shrink
              the whole set to its own size, as an equal-counts rule would.

Prompts are deduplicated first, topics balanced second, lengths third, each draw seeded
(seeds.py), so the same pairs and seed always keep the same records. The capping itself
(balance_by, median_caps) is data/balance.py's, shared with the RL prompt pool's topic balance.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

from posttrain.data.balance import balance_by, median_caps, topic_label
from posttrain.types import PreferencePair, UnpairedExample

Record = PreferencePair | UnpairedExample

# lengths within 5% of each other count as the same: an arithmetic chain of thought whose one
# wrong sum has a digit more or fewer (~40 characters) is not a length preference
SAME_LENGTH_TOLERANCE = 0.05
LONGER, SHORTER, SAME = "chosen longer", "chosen shorter", "same length"


def length_bucket(pair: PreferencePair, tolerance: float = SAME_LENGTH_TOLERANCE) -> str:
    """Which way the pair's length gap points: len(chosen) − len(rejected) in characters."""
    gap = len(pair.chosen) - len(pair.rejected)
    if abs(gap) <= tolerance * max(len(pair.chosen), len(pair.rejected)):
        return SAME
    return LONGER if gap > 0 else SHORTER


def topic_of(record: PreferencePair | UnpairedExample) -> str:
    """The topic a record is balanced by: its meta's topic or difficulty label
    (balance.topic_label), else the first word of its prompt ("" for an empty prompt)."""
    label = topic_label(record.meta)
    if label is not None:
        return label
    words = record.prompt.split()
    return words[0] if words else ""


def equal_length_caps(sizes: dict[str, int]) -> dict[str, int]:
    """"chosen longer" and "chosen shorter" both capped at the smaller of the two."""
    both = min(sizes.get(LONGER, 0), sizes.get(SHORTER, 0))
    return {LONGER: both, SHORTER: both}


def record_key(record: Record) -> tuple[str, str, str, str]:
    """What makes two records the same: the prompt and the responses (a KTO example: its
    completion and label); the meta and the ranker's scores do not."""
    if isinstance(record, PreferencePair):
        return ("pair", record.prompt, record.chosen, record.rejected)
    return ("unpaired", record.prompt, record.completion, str(record.desirable))


def dedupe_prompts(records: Sequence[Record], max_per_prompt: int,
                   rng: random.Random) -> tuple[list[Record], dict[str, dict[str, int]]]:
    """The records left once exact duplicates are dropped and every prompt is capped at
    `max_per_prompt` by a seeded draw, in their original order, and a report of three
    buckets {"before", "kept"}: the exact duplicates (none kept), the records of prompts over
    the cap, and those of prompts within it."""
    if isinstance(max_per_prompt, bool) or not isinstance(max_per_prompt, int) or max_per_prompt < 1:
        raise ValueError(f"max_per_prompt {max_per_prompt!r} must be a whole number >= 1 (records kept a prompt)")
    seen: set[tuple[str, str, str, str]] = set()
    distinct = []
    for record in records:
        key = record_key(record)
        if key not in seen:
            seen.add(key)
            distinct.append(record)
    kept, by_prompt = balance_by(distinct, lambda r: r.prompt, lambda sizes: dict.fromkeys(sizes, max_per_prompt), rng)
    over = [n for n in by_prompt.values() if n["before"] > max_per_prompt]
    within = [n for n in by_prompt.values() if n["before"] <= max_per_prompt]
    report = {"exact duplicates": {"before": len(records) - len(distinct), "kept": 0},
              f"on prompts with more than {max_per_prompt}": {"before": sum(n["before"] for n in over),
                                                              "kept": sum(n["kept"] for n in over)},
              f"on prompts with at most {max_per_prompt}": {"before": sum(n["before"] for n in within),
                                                            "kept": sum(n["kept"] for n in within)}}
    return kept, report


def balance_pairs(records: Sequence[Record], lengths: bool, topics: bool, seed: int,
                  max_per_prompt: int = 0) -> tuple[list[Record], dict[str, dict[str, dict[str, int]]]]:
    """The records kept by prompt deduplication (when `max_per_prompt` > 0), topic and length
    balancing (the module's rules), in their original order, and a report {"prompts":
    {bucket: {"before", "kept"}}, "topics": {topic: ...}, "lengths": {bucket: ...}} (a part
    only when it is on; each counted on what the one before kept).

    Raises ValueError when length balancing is asked of unpaired examples (they have no
    length gap), or when nothing is left (every pair's chosen response longer, or every one
    shorter, is a length cue balancing can only remove by removing the pairs)."""
    rng = random.Random(seed)
    kept, report = list(records), {}
    if max_per_prompt:
        kept, report["prompts"] = dedupe_prompts(kept, max_per_prompt, rng)
    if topics:
        kept, report["topics"] = balance_by(kept, topic_of, median_caps, rng)
    if lengths:
        unpaired = next((i for i, r in enumerate(records) if not isinstance(r, PreferencePair)), None)
        if unpaired is not None:
            raise ValueError(f"record {unpaired} is an unpaired example, and length balancing compares a pair's "
                             "chosen and rejected lengths: give pairs, or set rl.preference.balance_lengths false")
        pairs = [r for r in kept if isinstance(r, PreferencePair)]  # all of them: checked above
        balanced, report["lengths"] = balance_by(pairs, length_bucket, equal_length_caps, rng)
        kept = [*balanced]
        if not kept:
            counts = Counter(length_bucket(p) for p in pairs)
            raise ValueError(f"length balancing left no pairs: of {len(pairs)} pairs {counts[LONGER]} have the "
                             f"longer chosen response and {counts[SHORTER]} the shorter one, so length alone tells "
                             "them apart and balancing removes them all; set rl.preference.balance_lengths false, "
                             "or add pairs whose chosen response is the shorter one")
    return kept, report


def balance_lines(report: dict[str, dict[str, dict[str, int]]]) -> list[str]:
    """One line per balanced part: "lengths: chosen longer 40 → 12, chosen shorter 12 → 12, ..."."""
    return [f"{part}: " + ", ".join(f"{bucket} {n['before']} → {n['kept']}" for bucket, n in buckets.items())
            for part, buckets in report.items()]
