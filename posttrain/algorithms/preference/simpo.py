"""SimPO: Simple Preference Optimization (Meng et al. 2024, "SimPO: Simple Preference
Optimization with a Reference-Free Reward", arXiv:2405.14734).

The diff on DPO, two changes to the implicit reward and one to the loss:

    DPO    r(x, y) = β · (log π_θ(y|x) − log π_ref(y|x))
    SimPO  r(x, y) = (β / |y|) · log π_θ(y|x)                        (Eq. 4)

    L = −log σ( r(x, y_c) − r(x, y_r) − γ )                          (Eq. 6)

1. No π_ref: the reward is the policy's own average per-token log-prob, which is also the
   quantity generation (likelihood ranking, beam search) actually uses, so training and
   decoding agree. With no reference term, nothing ties the policy to π_ref; SimPO relies
   on starting from a good SFT model and a small learning rate instead.
2. Divide by |y|: without π_ref to cancel it, a summed log-prob favours short responses
   (every token adds a negative number); the average does not reward or punish length.
3. A target margin γ > 0: the chosen reward must beat the rejected one by γ before the
   loss saturates (Bradley–Terry with a margin).

Reference-free: `uses_reference` is False and the training loop never loads a reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.preference.core import PreferenceLogps, PreferenceLoss, pair_metrics, require_paired


@dataclass
class SimPO(PreferenceLoss):
    """Simple Preference Optimization. Fields are the hyperparameters."""

    name: ClassVar[str] = "simpo"

    # The paper tunes β in about 2.0–2.5: larger than DPO's because it scales an *average*
    # log-prob (a few tenths of a nat), not a summed log-ratio.
    beta: float = 2.0
    # γ/β = 0.5, in the range of the paper's tuned ratios; 0 gives a margin-free SimPO.
    gamma: float = 1.0

    def __post_init__(self) -> None:
        check_field(self, "beta", self.beta > 0, "a number > 0")
        check_field(self, "gamma", self.gamma >= 0, "a number >= 0")

    @property
    def uses_reference(self) -> bool:
        return False

    def loss(self, logps: PreferenceLogps) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over the B pairs of −log σ(r_c − r_r − γ). The ref_* inputs are ignored
        (pass None); every other input is (B,)."""
        require_paired("SimPO", logps)
        r_chosen = self.beta * logps.chosen / logps.chosen_lengths.clamp(min=1)  # (B,) DPO: β·(π − ref)
        r_rejected = self.beta * logps.rejected / logps.rejected_lengths.clamp(min=1)  # (B,)
        losses = -F.logsigmoid(r_chosen - r_rejected - self.gamma)  # (B,)
        metrics = pair_metrics(r_chosen.detach(), r_rejected.detach())
        return losses.mean(), {"loss": losses.mean().item(), **metrics}
