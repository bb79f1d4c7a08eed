"""Dr. GRPO: "GRPO Done Right" (Liu et al., "Understanding R1-Zero-Like Training: A Critical
Perspective", arXiv:2503.20783, Sec. 3).

Background. GRPO's objective (arXiv:2402.03300, Eq. 3) divides twice by something that
depends on the samples:

    GRPO      1/G Σ_i  1/|o_i|  Σ_t  min(ρ_t Â_i, clip(ρ_t) Â_i),   Â_i = (r_i − mean r) / std r
    Dr. GRPO  1/G Σ_i  1/L_max  Σ_t  min(ρ_t Â_i, clip(ρ_t) Â_i),   Â_i =  r_i − mean r

1. 1/|o_i| (response-level length bias): a wrong answer (Â < 0) is penalised less per
   token the longer it is, so training drifts towards long wrong answers. Dr. GRPO sums
   over tokens and divides by a constant, the generation budget L_max.
2. 1/std r (question-level difficulty bias): prompts the model nearly always gets right
   or wrong have a small std, so their advantages are blown up and they weigh more.

Delete both and what remains is plain REINFORCE with a group-mean baseline and PPO's clip.
This file is exactly that diff: GRPO's class with two defaults changed.

Conventions: max_len is the rollout's max_new_tokens (the constant L_max), with no default
of its own: `make_algorithm(..., budget=...)` and `posttrain train` fill it in from
rl.sampling.max_new_tokens. Since it is a constant, a mismatch only rescales the gradient
(like the learning rate; Adam largely undoes even that); it never changes its direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from posttrain.algorithms.grpo import GRPO


@dataclass
class DrGRPO(GRPO):
    """GRPO with the two divisors deleted: no /std in the advantage, no /|o_i| in the loss."""

    name: ClassVar[str] = "dr_grpo"

    adv_norm: str = "none"  # deleted divisor 1: A_i = r_i − mean(r), no / std(r)
    loss_agg: str = "seq-mean-token-sum-norm"  # deleted divisor 2: Σ_t ... / L_max, not / |o_i|
