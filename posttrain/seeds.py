"""Seeds: every random draw of a run is seeded from (run seed, purpose, step, ...), never from
a global stream, so a run resumed from a checkpoint makes exactly the draws an
uninterrupted run makes, and a shard of prompts draws the same samples on any worker.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *parts: object) -> int:
    """A seed for one purpose at one step, independent of everything that ran before."""
    digest = hashlib.sha256(repr((seed, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator_for(seed: int, *parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *parts))
