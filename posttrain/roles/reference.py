"""Reference: a frozen copy of the starting policy.

Its log-probs anchor the KL term that keeps the trained policy from drifting far from
where it started (where the reward is still trustworthy and the text still fluent).
It is a separate copy, never updated; it is only run when the algorithm asks for it
(`algorithm.uses_reference`), because the extra forward pass is not free.
"""

from __future__ import annotations

import copy

import torch

from posttrain.algorithms.core import token_logp
from posttrain.types import RolloutBatch


class Reference:
    def __init__(self, policy: torch.nn.Module):
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)

    @torch.no_grad()
    def logp(self, batch: RolloutBatch) -> torch.Tensor:
        """log π_ref(token | prefix), (B, T), zero off the response."""
        logits = self.model(batch.tokens)  # (B, T, V)
        return token_logp(logits, batch.tokens, batch.temperature) * batch.response_mask
