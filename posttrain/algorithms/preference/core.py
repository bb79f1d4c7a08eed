"""Shared pieces of the preference losses (DPO and its family).

Unlike the RL algorithms next door, these losses never need advantages: they read pairs of
(prompt, chosen, rejected) responses, or unpaired (prompt, completion, desirable) examples
for KTO, and only ever need one number per response, its log-probability under teacher
forcing:

    log π(y | x) = Σ_t log π(y_t | x, y_<t)      summed over the response tokens (EOS included)

They train through the same Trainer as the RL losses (roles/trainer.py: warmup,
micro-batches, checkpoints), on a RolloutBatch whose rows are the responses: a pair is a
group of two adjacent rows sharing a group id, the chosen one with reward 1 and the
rejected one with reward 0 (a desirable KTO example has reward 1, an undesirable one 0),
and `ref_logp` holds log π_ref per token (computed once, without gradients, since π_ref
never changes). `PreferenceLoss.compute_loss` sums each row's log-probs into a
`PreferenceLogps`, and each loss is one method on it:

    loss, metrics = preference_loss.loss(logps)     # logps: PreferenceLogps

For paired data row i of `chosen` and `rejected` is pair i. KTO reads `chosen` as its
desirable examples and `rejected` as its undesirable ones; those need not be paired, nor
equal in number. A loss whose `uses_reference` is False never reads the reference.

Why only lengths besides log-probs: everything else a loss in the family needs is a
function of the four log-prob vectors and the lengths. SimPO and ORPO length-normalise
(Σ log π / |y|), and ORPO's NLL term on the chosen response is −Σ log π_θ(y_c) / |y_c|,
the same per-token cross-entropy SFT minimises.
"""

from __future__ import annotations

from dataclasses import Field, dataclass
from typing import Any, ClassVar

import torch

from posttrain.algorithms.core import masked_sum
from posttrain.types import PolicyOutputs, RolloutBatch


@dataclass
class PreferenceLogps:
    """log π(y | x) of each side, summed over the response tokens, and the response lengths."""

    chosen: torch.Tensor  # (Bc,) Σ log π_θ over each chosen / desirable response
    rejected: torch.Tensor  # (Br,) the same for each rejected / undesirable response
    chosen_lengths: torch.Tensor  # (Bc,) float, tokens in each chosen response (EOS included)
    rejected_lengths: torch.Tensor  # (Br,)
    ref_chosen: torch.Tensor | None = None  # (Bc,) Σ log π_ref, None when the loss reads no reference
    ref_rejected: torch.Tensor | None = None  # (Br,)
    # (Bc,) each pair's weight in the loss (gap_weights: mean 1 over the step's pairs); None = 1 each
    weights: torch.Tensor | None = None

    @staticmethod
    def of_rows(logps: torch.Tensor, lengths: torch.Tensor, is_chosen: torch.Tensor,
                ref_logps: torch.Tensor | None = None, pair_weights: torch.Tensor | None = None) -> PreferenceLogps:
        """Split per-row values (N,) into the chosen rows and the rejected rows, each side
        in row order (so with pairs laid out as adjacent rows, index i is pair i). A pair's
        weight is read off its chosen row (both rows hold it: RolloutBatch.pair_weights)."""
        return PreferenceLogps(logps[is_chosen], logps[~is_chosen], lengths[is_chosen], lengths[~is_chosen],
                               ref_chosen=None if ref_logps is None else ref_logps[is_chosen],
                               ref_rejected=None if ref_logps is None else ref_logps[~is_chosen],
                               weights=None if pair_weights is None else pair_weights[is_chosen])

    def cat(self, other: PreferenceLogps) -> PreferenceLogps:
        """Both sides of two batches, one after the other (held-out pairs scored in chunks)."""
        def join(a, b):
            return None if a is None else torch.cat([a, b])

        return PreferenceLogps(*(join(getattr(self, f), getattr(other, f)) for f in self.__dataclass_fields__))


GAP_WEIGHTINGS = ("none", "linear", "sqrt")  # what DPO's gap_weighting can name (gap_weights below)


def gap_weights(gaps: torch.Tensor, weighting: str) -> torch.Tensor:
    """Each pair's weight from its score gap Δs = score_chosen − score_rejected (B,), scaled so
    that the weights average 1 over the B pairs: the learning rate then means what it means
    unweighted, and only the pairs' shares of the step change.

        none     1 for every pair
        linear   w ∝ Δs        a pair twice as clearly ranked counts twice
        sqrt     w ∝ √Δs       the same order, milder: a huge gap does not drown the batch

    Equal gaps give weight 1 each (so the loss is the unweighted one), and all-zero gaps too
    (no pair is more certain than another). A negative gap is a pair whose "chosen" scored
    lower: a mislabelled pair, refused rather than weighted negatively (which would train it
    backwards). Returns (B,)."""
    if weighting not in GAP_WEIGHTINGS:
        raise ValueError(f"gap weighting {weighting!r} is unknown: expected one of {list(GAP_WEIGHTINGS)}")
    if gaps.numel() and (gaps.isnan().any() or (gaps < 0).any()):
        bad = gaps[gaps.isnan() | (gaps < 0)][0].item()
        raise ValueError(f"a pair's score gap (score_chosen − score_rejected) is {bad}: the chosen response must score "
                         "at least as high as the rejected one; fix the pair's scores or its order")
    if weighting == "none":
        return torch.ones_like(gaps)
    raw = gaps if weighting == "linear" else gaps.sqrt()  # (B,)
    total = raw.sum()
    if total <= 0:  # every gap 0: nothing to tell the pairs apart
        return torch.ones_like(gaps)
    return raw * (raw.numel() / total)  # (B,) mean 1


class PreferenceLoss:
    """What every loss of the family is: a `@dataclass` subclass whose fields are the loss's
    hyperparameters (validated in `__post_init__` with contract.check_field) and whose
    `loss(logps)` is the paper's equation. `compute_loss` is the trainer's Loss contract
    (algorithms/contract.py), written once for all of them."""

    name: ClassVar[str]  # the registry key, e.g. "dpo"
    paired: ClassVar[bool] = True  # False: accepts unpaired desirable / undesirable examples (KTO)
    # A mean over pairs (KTO: over examples) of a function of each row's summed log-prob: a
    # micro-batch of whole pairs weighs its share of the rows, which makes accumulation exact
    loss_agg: ClassVar[str] = "seq-mean-token-sum"
    # how a pair's score gap weighs its loss (gap_weights); "none" for every loss but DPO,
    # whose field of the same name overrides it. The caller that assembles a step's batch
    # (pipelines/preference_train.py::preference_batch) turns the gaps into
    # RolloutBatch.pair_weights over the whole step, so micro-batches see the step's weights.
    # A plain class attribute, not a ClassVar: DPO's is an instance field (a hyperparameter)
    gap_weighting: str = "none"
    # what @dataclass gives every subclass, declared so a type checker lets dataclasses.fields read it
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def uses_reference(self) -> bool:
        """True when the loss reads ref_* (DPO, IPO, KTO); the trainer then needs
        `batch.ref_logp`, and reference-free losses (SimPO, ORPO) never build a reference."""
        return True

    def loss(self, logps: PreferenceLogps) -> tuple[torch.Tensor, dict[str, float]]:
        """(scalar loss to minimise, metrics as python floats)."""
        raise NotImplementedError

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of a batch of preference rows (module docstring: reward 1 marks the
        chosen / desirable rows), plus the mean Σ log π_θ of each side and the mean
        response length."""
        mask = batch.response_mask  # (N, T)
        is_chosen = batch.rewards > 0  # (N,)
        ref = None
        if self.uses_reference:
            if batch.ref_logp is None:
                raise ValueError(f"{type(self).__name__} needs batch.ref_logp, the reference's log-probs; "
                                 "run the reference over the pairs first")
            ref = masked_sum(batch.ref_logp, mask, dim=1)  # (N,)
        logps = PreferenceLogps.of_rows(masked_sum(outputs.logp, mask, dim=1), batch.response_lengths(),
                                        is_chosen, ref, batch.pair_weights)
        loss, metrics = self.loss(logps)
        with torch.no_grad():
            metrics |= {
                "logps_chosen": logps.chosen.mean().item() if logps.chosen.numel() else 0.0,
                "logps_rejected": logps.rejected.mean().item() if logps.rejected.numel() else 0.0,
                "response_len": batch.response_lengths().mean().item(),
            }
        return loss, metrics


def require_reference(name: str, logps: PreferenceLogps) -> tuple[torch.Tensor, torch.Tensor]:
    """(ref_chosen, ref_rejected), or ValueError naming the loss `name` when either is None.
    Returned, not only checked, so the loss holds Tensors, never Optionals."""
    if logps.ref_chosen is None or logps.ref_rejected is None:
        raise ValueError(
            f"{name} needs reference log-probs (ref_chosen, ref_rejected), got None; compute them with the "
            "reference model under torch.no_grad()"
        )
    return logps.ref_chosen, logps.ref_rejected


def require_paired(name: str, logps: PreferenceLogps) -> None:
    if logps.chosen.shape != logps.rejected.shape:
        raise ValueError(
            f"{name} compares pair by pair, but got {tuple(logps.chosen.shape)} chosen and "
            f"{tuple(logps.rejected.shape)} rejected log-probs; use KTO for unpaired data"
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
