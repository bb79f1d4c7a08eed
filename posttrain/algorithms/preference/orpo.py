"""ORPO: Odds Ratio Preference Optimization (Hong et al. 2024, "ORPO: Monolithic Preference
Optimization without Reference Model", arXiv:2403.07691).

The diff on DPO: no reference model and no separate SFT stage. ORPO adds a preference
term to the ordinary SFT loss on the chosen response (Eq. 6):

    L = L_SFT + λ · L_OR,
    L_SFT = −(1/|y_c|) Σ_t log π_θ(y_c,t | x, y_c,<t)         (the chosen response's NLL)
    L_OR  = −log σ( log odds(y_c) − log odds(y_r) )           (Eq. 7)

with the odds of a response taken on its length-normalised likelihood (Eq. 4),

    P(y|x) = exp( (1/|y|) Σ_t log π_θ(y_t | x, y_<t) ),   odds(y|x) = P / (1 − P).

Where DPO measures "more likely than before" (a log-ratio to π_ref), ORPO measures "more
likely than the rejected response" on the odds scale; the SFT term is what keeps the policy
anchored instead of π_ref. It is reference-free: `uses_reference` is False and the
training loop never loads a reference model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from posttrain.algorithms.contract import check_field
from posttrain.algorithms.preference.core import PreferenceLogps, PreferenceLoss, pair_metrics, require_paired

# log(1 − e^x) is −inf at x = 0, i.e. when the model gives a whole response probability 1.
# Capping the average log-prob at −1e-6 (P ≤ 0.999999) keeps it finite; any response that
# close to certain is already as chosen as it can get.
MAX_MEAN_LOGP = -1e-6


def log_odds(mean_logp: torch.Tensor) -> torch.Tensor:
    """log(P / (1 − P)) from log P, elementwise, computed without forming P − 1 by
    subtraction (which loses all precision when P is near 1)."""
    x = mean_logp.clamp(max=MAX_MEAN_LOGP)
    # log(1 − e^x): expm1 is exact near x = 0, log1p is exact for small e^x (Mächler 2012)
    log1m_exp = torch.where(x > -math.log(2), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))
    return x - log1m_exp


@dataclass
class ORPO(PreferenceLoss):
    """Odds Ratio Preference Optimization. Fields are the hyperparameters."""

    name: ClassVar[str] = "orpo"

    lam: float = 0.1  # λ, the weight of the odds-ratio term; the paper's main setting is 0.1

    def __post_init__(self) -> None:
        check_field(self, "lam", self.lam >= 0, "a number >= 0 (0 is plain SFT on the chosen responses)")

    @property
    def uses_reference(self) -> bool:
        return False

    def loss(self, logps: PreferenceLogps) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean over the B pairs of NLL(y_c) + λ · −log σ(log odds ratio). The ref_* inputs
        are ignored (pass None); every other input is (B,)."""
        require_paired("ORPO", logps)
        chosen_mean_logp = logps.chosen / logps.chosen_lengths.clamp(min=1)  # (B,) (1/|y|) log π
        rejected_mean_logp = logps.rejected / logps.rejected_lengths.clamp(min=1)  # (B,)
        nll = -chosen_mean_logp  # (B,) L_SFT, the per-token cross-entropy on y_c
        log_odds_ratio = log_odds(chosen_mean_logp) - log_odds(rejected_mean_logp)  # (B,)
        or_losses = -F.logsigmoid(log_odds_ratio)  # (B,) DPO's −log σ, on log odds instead of β·Δ
        loss = (nll + self.lam * or_losses).mean()
        # ORPO has no β; its natural per-response score is the length-normalised log-prob
        metrics = pair_metrics(chosen_mean_logp.detach(), rejected_mean_logp.detach())
        return loss, {
            "loss": loss.item(),
            "nll": nll.mean().item(),
            "or_loss": or_losses.mean().item(),
            "log_odds_ratio": log_odds_ratio.mean().item(),
            **metrics,
        }
