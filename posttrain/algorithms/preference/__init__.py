"""The preference-loss registry: losses on chosen / rejected pairs (DPO and family).

Every entry is a dataclass of hyperparameters with the same two calls (see `core.py`):

    dpo = make_preference_loss("dpo", beta=0.1)
    loss, metrics = dpo.loss(logps)                  # the paper's equation on PreferenceLogps
    trainer.update(batch, dpo)                       # the Trainer's Loss contract (compute_loss)

(pipelines/preference_train.py trains any of them end to end and scores held-out pairs.)

    loss    needs π_ref   data       compared quantity                       paper
    dpo     yes           pairs      β·Δ log-ratio, logistic loss            Rafailov et al. 2023
    ipo     yes           pairs      Δ log-ratio, squared loss to 1/(2β)     Azar et al. 2023
    kto     yes           unpaired   log-ratio vs a KL reference point       Ethayarajh et al. 2024
    orpo    no            pairs      SFT NLL + log odds ratio                Hong et al. 2024
    simpo   no            pairs      β·mean log-prob, margin γ               Meng et al. 2024
"""

from __future__ import annotations

from typing import Any

from posttrain.algorithms.contract import make_from_registry
from posttrain.algorithms.preference.core import PreferenceLogps, PreferenceLoss, pair_metrics
from posttrain.algorithms.preference.dpo import DPO
from posttrain.algorithms.preference.ipo import IPO
from posttrain.algorithms.preference.kto import KTO
from posttrain.algorithms.preference.orpo import ORPO
from posttrain.algorithms.preference.simpo import SimPO

# Parent first: each entry is a small diff on DPO.
PREFERENCE_LOSSES: dict[str, type[PreferenceLoss]] = {
    "dpo": DPO,  # −log σ(β·Δ), Δ = the chosen-minus-rejected log-ratio to π_ref
    "ipo": IPO,  # DPO with a squared loss toward a finite target margin
    "kto": KTO,  # DPO's log-ratio per example, against a reference point, no pairs
    "orpo": ORPO,  # no π_ref: SFT loss + odds-ratio preference term
    "simpo": SimPO,  # no π_ref: length-normalised log-prob as reward, margin γ
}


def make_preference_loss(name: str, **params: Any) -> PreferenceLoss:
    """Build the preference loss registered as `name` with hyperparameters `params`;
    errors list the valid names or fields, exactly as `make_algorithm`'s do."""
    return make_from_registry(PREFERENCE_LOSSES, "preference loss", name, params)


__all__ = [
    "DPO",
    "IPO",
    "KTO",
    "ORPO",
    "PREFERENCE_LOSSES",
    "PreferenceLogps",
    "PreferenceLoss",
    "SimPO",
    "make_preference_loss",
    "pair_metrics",
]
