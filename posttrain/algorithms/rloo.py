"""RLOO: REINFORCE Leave-One-Out (Kool, van Hoof & Welling, "Buy 4 REINFORCE samples, get a
baseline for free!", ICLR 2019 workshop; for LLMs: Ahmadian et al., "Back to Basics",
arXiv:2402.14740).

Background. REINFORCE with a per-prompt mean baseline ("group_mean") lets each sample's
own reward into its baseline, so b depends on y and the estimate is slightly biased.
RLOO samples K responses per prompt and gives each one the mean of the *other* K − 1:

    b_i = (Σ_j r_j − r_i) / (K − 1)              A_i = r_i − b_i

b_i is independent of y_i, so the gradient stays unbiased, and it costs nothing beyond
the K samples. The diff from REINFORCE is that one baseline; the loss is REINFORCE's
(no ratio, no clip: Ahmadian et al. argue PPO's clip is rarely active in this setting).

Algebra worth seeing: with m the group mean, r_i − b_i = (K r_i − Σ_j r_j) / (K − 1)
= K/(K − 1) · (r_i − m). So RLOO advantages are GRPO's with adv_norm="none" scaled by
K/(K − 1): no division by the group std, and a constant factor that only matters for the
step size. (tests/test_rloo.py checks this identity.)

Conventions: a group of one sample has no "others"; its baseline is its own reward and
its advantage 0 (no signal), like GRPO. `ema_decay` is inherited from REINFORCE and unused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.core import group_mean_std
from posttrain.algorithms.reinforce import REINFORCE


def leave_one_out_baseline(rewards: torch.Tensor, group_ids: torch.Tensor,
                           weights: torch.Tensor | None = None) -> torch.Tensor:
    """b_i = (Σ_{j in group} r_j − r_i) / (K − 1) for each row, (B,).

    Args:
        rewards:   (B,) float.
        group_ids: (B,) long; the K samples of one prompt share an id (K may differ by group).
        weights:   (B,) or None: a row's share of its episode (RolloutBatch.row_weights);
                   K and the sum then count episodes, and "the others" are the other episodes.

    A group of size 1 gets b_i = r_i (advantage 0) instead of 0 / 0.
    """
    mean, _, count = group_mean_std(rewards, group_ids, weights)  # (B,) each
    total = mean * count  # (B,) Σ_j r_j of the row's group
    others = (count - 1).clamp(min=1)  # (B,) K − 1, never 0
    # > 1.5: a weighted count is exact only up to rounding (core.group_mean_std)
    return torch.where(count > 1.5, (total - rewards) / others, rewards)


@dataclass
class RLOO(REINFORCE):
    """REINFORCE whose baseline is the mean reward of the other samples of the same prompt."""

    name: ClassVar[str] = "rloo"
    BASELINES: ClassVar[tuple[str, ...]] = ("leave_one_out",)
    needs_groups: ClassVar[bool] = True  # the baseline is the other K − 1 samples

    baseline: str = "leave_one_out"  # the only choice: REINFORCE offers the others

    def sequence_baseline(self, rewards: torch.Tensor, group_ids: torch.Tensor,
                          weights: torch.Tensor | None = None) -> torch.Tensor:
        return leave_one_out_baseline(rewards, group_ids, weights)
