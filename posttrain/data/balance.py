"""Balancing by subsampling: bucket the records, cap each bucket, draw what stays with a
seeded generator. What pair curation (data/pair_balance.py) and the RL prompt pool's topic
balance (pipelines/curation.py, rl.curation.balance_topics) share.

    topic_label(meta)                  meta["topic"], else "difficulty d" or "level l", else None
    balance_by(records, key, caps_for, rng)
                                       (kept records in their original order, {bucket: {"before", "kept"}})
    median_caps(sizes)                 every bucket capped at the median bucket's size, rounded up

Subsampling, never reweighting: every kept record is trained on as an ordinary one. The median
cap takes most from the largest buckets, and one rare bucket cannot shrink the whole set to its
own size, as an equal-counts rule would.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")


def topic_label(meta: Mapping[str, Any]) -> str | None:
    """The topic a record's meta names: meta["topic"] (a `topic` column of a data file), else
    its difficulty label (meta["difficulty"], else meta["level"]: arithmetic's level), written
    with its name so a report reads "level 2", not "2"; None when it has none of them."""
    if meta.get("topic") is not None:
        return str(meta["topic"])
    for label in ("difficulty", "level"):
        if meta.get(label) is not None:
            return f"{label} {meta[label]}"
    return None


def subsample(indices_by_bucket: dict[str, list[int]], caps: dict[str, int], rng: random.Random) -> set[int]:
    """The indices kept: every bucket's, cut to its cap by a seeded draw."""
    kept: set[int] = set()
    for bucket, indices in indices_by_bucket.items():
        cap = caps.get(bucket, len(indices))
        kept |= set(indices if len(indices) <= cap else rng.sample(indices, cap))
    return kept


def balance_by(records: Sequence[T], key: Callable[[T], str], caps_for: Callable[[dict[str, int]], dict[str, int]],
               rng: random.Random) -> tuple[list[T], dict[str, dict[str, int]]]:
    """Records kept after capping each key's bucket (caps_for: bucket sizes -> caps), in
    their original order, and {bucket: {"before", "kept"}}."""
    by_bucket: dict[str, list[int]] = {}
    for i, record in enumerate(records):
        by_bucket.setdefault(key(record), []).append(i)
    kept = subsample(by_bucket, caps_for({b: len(ix) for b, ix in by_bucket.items()}), rng)
    report = {b: {"before": len(ix), "kept": sum(i in kept for i in ix)} for b, ix in sorted(by_bucket.items())}
    return [r for i, r in enumerate(records) if i in kept], report


def median_caps(sizes: dict[str, int]) -> dict[str, int]:
    """Every bucket capped at the median bucket's size, rounded up."""
    counts = sorted(sizes.values())
    middle = len(counts) // 2
    median = counts[middle] if len(counts) % 2 else math.ceil((counts[middle - 1] + counts[middle]) / 2)
    return {topic: median for topic in sizes}
