"""Lite PPO (Liu et al., "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
arXiv:2508.08221).

Background. The paper re-runs the tricks of recent RL-for-reasoning recipes one at a time,
in one framework, on base and aligned models: how advantages are normalised, clip-higher,
token- vs sequence-level loss aggregation, overlong filtering. Its conclusion is a recipe of
two of them on PPO's plain clipped loss without a critic, which it calls Lite PPO:

1. Advantages centred on the group's mean but scaled by the std of the whole batch's
   rewards. A group whose rewards barely differ (7 of 8 right on an easy prompt) has a
   tiny std of its own, and dividing by it blows a one-sample difference up into a large
   advantage; the batch std is one scale for every group (adv_norm="group-mean-batch-std",
   grpo.py::group_advantages).
2. A token-level loss: every token of the batch weighs the same (loss_agg="token-mean"),
   rather than every sequence, so a long response is not diluted per token.

    GRPO      A_i = (r_i − mean_g r) / std_g r       J = 1/G Σ_i 1/|o_i| Σ_t min(ρ_t A_i, clip(ρ_t) A_i)
    Lite PPO  A_i = (r_i − mean_g r) / std_B r       J = 1/Σ_i |o_i|  Σ_i Σ_t min(ρ_t A_i, clip(ρ_t) A_i)

(g: the prompt's group, B: the batch.) The other two tricks stay as in PPO: a symmetric
clip (no clip-higher) and every sample in the loss (no overlong filtering). This file is
exactly that diff: GRPO's class with two defaults changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posttrain.algorithms.grpo import GRPO


@dataclass
class LitePPO(GRPO):
    """GRPO with the group mean over the batch std, and a token-level loss."""

    name: ClassVar[str] = "lite_ppo"

    adv_norm: str = "group-mean-batch-std"  # trick 1: group mean, batch std (arXiv:2508.08221)
    loss_agg: str = "token-mean"  # trick 2: every token of the batch weighs the same
