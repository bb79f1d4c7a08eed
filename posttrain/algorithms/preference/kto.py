"""KTO: Kahneman–Tversky Optimization (Ethayarajh et al. 2024, "KTO: Model Alignment as
Prospect Theoretic Optimization", arXiv:2402.01306).

The diff on DPO: no pairs. Each example is one completion with a binary label, desirable
or undesirable ("thumbs up / thumbs down"), which is far cheaper data to collect. Instead of
comparing a chosen with a rejected response, each response's implicit reward

    r(x, y) = log π_θ(y|x) − log π_ref(y|x)                     (DPO's log-ratio, Sec. 4.1)

is compared with a reference point z_ref, through a saturating "value function" borrowed
from prospect theory (Eq. 8):

    v(x, y) = λ_D · σ(β (r − z_ref))    if y is desirable
              λ_U · σ(β (z_ref − r))    if y is undesirable
    L_KTO   = E_{x,y} [ λ_y − v(x, y) ].

σ saturates, so an example that is already well on its side of z_ref stops contributing
(the same self-limiting weight as DPO's σ(−βΔ)). λ_D and λ_U weigh gains against losses;
the paper recommends λ_D · n_D / (λ_U · n_U) in [1, 4/3] when the classes are imbalanced.

The reference point. In the paper z_ref is the KL divergence KL(π_θ ‖ π_ref), clamped
at 0 and *not* back-propagated: a baseline, not a target. It is estimated per batch; the
paper does so on mismatched pairs (x_i, y_j), the completion of one prompt scored under
another prompt, which costs an extra policy and reference forward pass. We estimate it
from the batch's own completions instead, needing no extra pass:

    z_ref = max(0, mean over the batch's rows of (log π_θ(y|x) − log π_ref(y|x)))   (detached)

It is a rougher estimate (the rows being trained move it too), but it has the property
that matters: it is ≈ 0 at the start, and it grows as the policy drifts from π_ref
overall, so each example must beat the general drift, not just zero.

Layout: the "chosen" slot of the common signature holds the desirable examples (B_D,),
the "rejected" slot the undesirable ones (B_U,); B_D and B_U may differ (either may be 0).
Paired data also works: each pair gives one example of each kind (as the paper does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.preference.core import PreferenceLogps, PreferenceLoss, require_reference


@dataclass
class KTO(PreferenceLoss):
    """Kahneman–Tversky Optimization. Fields are the hyperparameters."""

    name: ClassVar[str] = "kto"
    paired: ClassVar[bool] = False

    beta: float = 0.1  # the paper's default β (Sec. 4.2), the same KL-leash role as in DPO
    desirable_weight: float = 1.0  # λ_D; the paper's default for balanced data
    undesirable_weight: float = 1.0  # λ_U; raise one of the two when classes are imbalanced

    def __post_init__(self) -> None:
        check_field(self, "beta", self.beta > 0, "a number > 0")
        check_field(self, "desirable_weight", self.desirable_weight > 0, "a number > 0")
        check_field(self, "undesirable_weight", self.undesirable_weight > 0, "a number > 0")

    def loss(self, logps: PreferenceLogps) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over all B_D + B_U examples of λ_y − v(x, y). Desirable inputs (B_D,),
        undesirable inputs (B_U,)."""
        ref_chosen, ref_rejected = require_reference("KTO", logps)  # (B_D,), (B_U,)
        r_desirable = logps.chosen - ref_chosen  # (B_D,) implicit reward / β
        r_undesirable = logps.rejected - ref_rejected  # (B_U,)
        n = r_desirable.numel() + r_undesirable.numel()
        if n == 0:
            raise ValueError("KTO got an empty batch: no desirable and no undesirable examples")
        # z_ref: a detached batch estimate of KL(π_θ ‖ π_ref), clamped at 0 (module docstring)
        z_ref = torch.cat([r_desirable, r_undesirable]).detach().mean().clamp(min=0)
        losses_desirable = self.desirable_weight * (1 - torch.sigmoid(self.beta * (r_desirable - z_ref)))  # (B_D,)
        losses_undesirable = self.undesirable_weight * (1 - torch.sigmoid(self.beta * (z_ref - r_undesirable)))
        # E over examples, not mean of two class means: each example weighs the same
        loss = (losses_desirable.sum() + losses_undesirable.sum()) / n

        with torch.no_grad():
            # accuracy: the fraction of examples on the right side of the reference point
            right = (r_desirable > z_ref).sum() + (r_undesirable < z_ref).sum()
            rewards_d = self.beta * r_desirable.mean() if r_desirable.numel() else r_desirable.new_zeros(())
            rewards_u = self.beta * r_undesirable.mean() if r_undesirable.numel() else r_undesirable.new_zeros(())
        metrics = {
            "loss": loss.item(),
            "accuracy": (right / n).item(),
            "rewards_chosen": rewards_d.item(),
            "rewards_rejected": rewards_u.item(),
            "margin": (rewards_d - rewards_u).item(),
            "kl_ref_point": z_ref.item(),
        }
        return loss, metrics
