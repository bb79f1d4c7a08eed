"""IPO: Identity Preference Optimization (Azar et al. 2023, "A General Theoretical Paradigm
to Understand Learning from Human Preferences", arXiv:2310.12036).

The diff on DPO: replace the logistic loss on the margin by a squared loss toward a fixed
target margin.

Why. When a pair's preference is (nearly) deterministic, DPO's −log σ(βΔ) keeps
decreasing as Δ → ∞: nothing stops the policy from pushing log π(y_r) toward −∞, however
strong β is, so on finite data DPO can overfit and walk far from π_ref. IPO instead
regresses the log-ratio margin

    h = (log π_θ(y_c) − log π_ref(y_c)) − (log π_θ(y_r) − log π_ref(y_r))     (the same Δ as DPO)

onto a finite target (Sec. 5.1, Eq. 17):

    L = ( h − 1/(2τ) )².

Convention: the field is called `beta` and plays IPO's τ, so that across the family a larger
β always means "stay closer to π_ref": the target margin 1/(2β) shrinks as β grows (TRL
names it the same way).

Option, one line of the math:
    length_normalize    divide each log-ratio by its response length before the margin, so
                        h is a per-token margin and the target 1/(2β) does not depend on
                        how long the responses are. The paper's Eq. 17 writes sequence
                        log-probs (the default here); TRL 1.16's `loss_type="ipo"` always
                        normalises (its comment says the paper's experiments used the
                        normalised form). With summed log-probs, a target of 5 nats is a
                        large per-token move on a 2-token answer and a tiny one on a
                        200-token answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.preference.core import (
    PreferenceLogps,
    PreferenceLoss,
    pair_metrics,
    require_paired,
    require_reference,
)


@dataclass
class IPO(PreferenceLoss):
    """Identity Preference Optimization. Fields are the hyperparameters."""

    name: ClassVar[str] = "ipo"

    beta: float = 0.1  # IPO's τ; 0.1 gives a target margin of 5 nats, comparable to DPO's β = 0.1 scale
    length_normalize: bool = False  # the paper's Eq. 17 sums log-probs; True is TRL's per-token IPO

    def __post_init__(self) -> None:
        check_field(self, "beta", self.beta > 0, "a number > 0")
        check_field(self, "length_normalize", isinstance(self.length_normalize, bool), "True or False")

    def loss(self, logps: PreferenceLogps) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over the B pairs of (h − 1/(2β))²; every input (B,)."""
        ref_chosen, ref_rejected = require_reference("IPO", logps)  # (B,) each
        require_paired("IPO", logps)
        chosen_logratio = logps.chosen - ref_chosen  # (B,)
        rejected_logratio = logps.rejected - ref_rejected  # (B,)
        if self.length_normalize:
            chosen_logratio = chosen_logratio / logps.chosen_lengths.clamp(min=1)
            rejected_logratio = rejected_logratio / logps.rejected_lengths.clamp(min=1)
        h = chosen_logratio - rejected_logratio  # (B,) DPO's Δ
        losses = (h - 1 / (2 * self.beta)) ** 2  # DPO: -logsigmoid(beta * h)
        metrics = pair_metrics(self.beta * chosen_logratio, self.beta * rejected_logratio)
        return losses.mean(), {"loss": losses.mean().item(), **metrics}
