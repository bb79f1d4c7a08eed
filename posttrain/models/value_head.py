"""A value head: V(prefix) read out of the policy's final hidden state.

PPO needs a critic. On a laptop the cheapest one shares the policy's trunk: one extra
linear layer on the hidden state, trained by the value loss alongside the policy loss
(the shared-trunk design of the original RLHF work). Production systems often use a
separate critic model instead; the algorithm does not care which, it only reads
`outputs.values` and `batch.values`.

It has no training loop of its own: the one Trainer (roles/trainer.py, `critic=`) runs it
in the policy's forward pass on the same hidden states and steps its weights with the
policy's, on the value loss inside the algorithm's loss object (PPO's `vf_coef` term).

Alignment matches `old_logp`: `values[:, t]` is V of the state in which `tokens[:, t]`
was chosen, i.e. of the prefix `tokens[:, :t]`, so it is read from the hidden state at
position t − 1. Position 0 has no prefix and holds 0.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class ValueHead(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 1)
        # start at V = 0 everywhere: the first advantages are then plain reward-to-go,
        # instead of noise from a random critic
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, D) hidden states -> (B, T) values aligned with the tokens."""
        v = self.proj(hidden).squeeze(-1)  # (B, T): v[:, t] = V(tokens[:, :t+1])
        return torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)  # (B, T), shifted by one
