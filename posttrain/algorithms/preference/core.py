"""Shared pieces of the offline preference losses (DPO and its family).

Unlike the RL algorithms next door, these losses never sample: they read a fixed set of
(prompt, chosen, rejected) pairs, or unpaired (prompt, completion, desirable) examples for
KTO, and only ever need one number per sequence, its log-probability under teacher forcing:

    log π(y | x) = Σ_t log π(y_t | x, y_<t)      summed over the response tokens (EOS included)

The contract every loss follows (so the registry is a plain dict and the training loop
never asks which loss it is running):

    loss, metrics = loss_fn(policy_chosen_logps,    # (Bc,) Σ log π_θ over each chosen response
                            policy_rejected_logps,  # (Br,) the same for each rejected response
                            ref_chosen_logps,       # (Bc,) Σ log π_ref, or None
                            ref_rejected_logps,     # (Br,) or None
                            info)                   # PreferenceInfo: response lengths

For paired data Bc = Br = B and row i of both tensors is the same pair. KTO reads the
"chosen" slot as its desirable examples and the "rejected" slot as its undesirable ones;
those need not be paired, nor equal in number. Reference log-probs are constants (computed
once, without gradients, and cached by the training loop); a loss whose `uses_reference` is
False receives None and must not need them.

Why `info` holds only lengths: everything else a loss in the family needs is a function of
the four log-prob tensors and the lengths. SimPO and ORPO length-normalise (Σ log π / |y|),
and ORPO's NLL term on the chosen response is −Σ log π_θ(y_c) / |y_c|, the same per-token
cross-entropy SFT minimises, so it needs no separate field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch


@dataclass
class PreferenceInfo:
    """What a loss may need besides log-probs: the response length |y| of every row."""

    chosen_lengths: torch.Tensor  # (Bc,) float, tokens in each chosen / desirable response
    rejected_lengths: torch.Tensor  # (Br,) float, tokens in each rejected / undesirable response

    @staticmethod
    def from_batch(batch) -> PreferenceInfo:
        """From a batch with `lengths()` and an `is_chosen` row mask (roles/preference_trainer.py)."""
        lengths = batch.lengths()  # (N,)
        return PreferenceInfo(lengths[batch.is_chosen], lengths[~batch.is_chosen])


class PreferenceLoss(Protocol):
    """A `@dataclass` whose fields are the loss's hyperparameters (validated in
    `__post_init__` with `posttrain.algorithms.core.check_field`)."""

    name: ClassVar[str]  # the registry key, e.g. "dpo"
    paired: ClassVar[bool]  # False: accepts unpaired desirable / undesirable examples (KTO)

    @property
    def uses_reference(self) -> bool:
        """True when the loss reads ref_*_logps; the training loop only builds (and caches
        the log-probs of) a reference model then."""
        ...

    def __call__(
        self,
        policy_chosen_logps: torch.Tensor,
        policy_rejected_logps: torch.Tensor,
        ref_chosen_logps: torch.Tensor | None,
        ref_rejected_logps: torch.Tensor | None,
        info: PreferenceInfo,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """(scalar loss to minimise, metrics as python floats)."""
        ...


def require_reference(name: str, ref_chosen_logps, ref_rejected_logps) -> None:
    if ref_chosen_logps is None or ref_rejected_logps is None:
        raise ValueError(
            f"{name} needs reference log-probs (ref_chosen_logps, ref_rejected_logps), got None; "
            "compute them with sequence_logps(reference_model, batch) under torch.no_grad()"
        )


def require_paired(name: str, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
    if chosen.shape != rejected.shape:
        raise ValueError(
            f"{name} compares pair by pair, but got {tuple(chosen.shape)} chosen and "
            f"{tuple(rejected.shape)} rejected log-probs; use KTO for unpaired data"
        )


@torch.no_grad()
def pair_metrics(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> dict[str, float]:
    """The numbers that teach for any pairwise loss, from each side's implicit reward (B,):
    accuracy = fraction of pairs whose chosen reward beats the rejected one (ties count
    as wrong), the mean reward of each side, and their mean margin."""
    margin = r_chosen - r_rejected  # (B,)
    return {
        "accuracy": (margin > 0).float().mean().item(),
        "rewards_chosen": r_chosen.mean().item(),
        "rewards_rejected": r_rejected.mean().item(),
        "margin": margin.mean().item(),
    }
