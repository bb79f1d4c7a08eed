"""One correction wherever the sampler is not the trainer.

The log-probs a rollout brings (`old_logp` as collated: log π_sampler, captured where each
token was drawn, roles/engines/) are not the trainer's whenever the sampler decodes

    with other weights      rl.sampling.weights int8
    in another precision    --dtype bfloat16: the sampler's one-token matmuls round differently
                            from the trainer's whole-sequence ones
    with other code         an engine other than posttrain's own "torch" (vLLM: its own kernels)
    with older weights      dist.topology async: up to dist.max_staleness updates stale

Each case takes the same path (`MismatchCorrection.correct`): π_old is recomputed by the
trainer's own forward pass (off_policy.current_logp), so the algorithm's ratio π_θ / π_old is
exactly 1 before the first optimizer step, and each response token's advantage is weighted by
an importance weight w built from

    ρ_t = π_trainer(y_t | y_<t) / π_sampler(y_t | y_<t)

as rl.mismatch.mode says, a level times a bound:

    token       ρ_t                    low variance, biased (Yao et al. 2025, "Your efficient RL
                                       framework secretly brings you off-policy RL training")
    sequence    Π_t ρ_t                the whole response's exact weight: unbiased, high variance
    geometric   (Π_t ρ_t)^(1/|y|)      length-normalised (GSPO's sequence ratio)
    truncate    w = clamp(ρ, lower, cap)                truncated IS (Ionides 2008)
    mask        w = ρ if lower <= ρ <= cap, else 0      masked IS; both sides with lower > 0 (IcePop)

These are TRL 1.16's `vllm_importance_sampling_mode` (token/sequence × truncate/mask, bounds
clip_min and clip_max) and verl 0.9's rollout_corr_helper.py (rollout_is token/sequence truncated
at a threshold, or masked outside a "lower_upper" one; rollout_rs token_k1, seq_sum_k1 and
seq_mean_k1 masks, whose "a_b" bounds k1 = −log ρ: ρ in [1/b, 1/a]); tests/test_mismatch.py
reproduces their numbers on fixed tensors, tests/test_peer_oracles.py runs their own code on them.

w multiplies the advantage, as TRL multiplies each token's policy-gradient term: for a
constant w >= 0, min(r·A, clip(r)·A)·w = min(r·wA, clip(r)·wA), in every loss here. The KL and
entropy terms regularise the current policy and are left unweighted, and a masked token still
counts in the loss's normalisation (TRL's choice; verl's rejection also drops it from the count).

Every corrected step logs, over the response tokens of the rows the update trains
(off_policy.trained_mask), with verl's and TRL's names for the same numbers in brackets:

    mismatch/kl                 KL(sampler ‖ trainer), k1: mean(log π_sampler − log π_trainer)  [kl]
    mismatch/k3_kl              the same, k3: mean(ρ − 1 − log ρ), never negative               [k3_kl]
    mismatch/chi2_token         E[ρ_t²] − 1; chi2_seq: E[(Π_t ρ_t)²] − 1 over the responses    [chi2_*]
    mismatch/ess                (Σw)² / (n Σw²) of the weights applied, in [0, 1]: the share of the
                                tokens the weighted update is worth                  [eff_sample_size]
    mismatch/ratio_max, _min    the largest and smallest ρ of the mode's level, before the bounds
    mismatch/weight_mean        the mean w applied                       [importance_sampling_ratio]
    mismatch/logp_diff_mean, _max  |log π_trainer − log π_sampler| per token [sampling_logp_difference]
    mismatch/trainer_ppl, sampler_ppl  exp(−mean log π) of each response, averaged [*_ppl]
    mismatch/truncated_fraction  (truncate modes) the tokens whose ρ the bounds clamped
    mismatch/masked_fraction, seq_masked_fraction  (mask modes) the tokens, and the responses with
                                any token, that lost their gradient                  [masked_fraction]

runs/monitors.py::sampler_mismatch warns when logp_diff_mean or masked_fraction passes its line.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from posttrain.algorithms.core import masked_mean
from posttrain.models.policy import Policy
from posttrain.roles.off_policy import current_logp, trained_mask
from posttrain.roles.trainer import Trainer
from posttrain.types import RolloutBatch

# exp(20) ≈ 5e8, past any cap: a sequence's summed log-ratio is clamped here before exp, so a
# long response cannot overflow to inf (and inf · 0 off the response to NaN); verl's bound
SAFETY_BOUND = 20.0
# the engines that sample with the trainer's own forward code: in float32 and at the trainer's
# weights their log-probs are the trainer's up to float rounding. Any other engine (vLLM, a
# server) is a different policy by construction, and the update corrects for it
TRAINER_ENGINES = ("torch",)


def sampler_is_trainer(engine: str, weights: str, compute_dtype: torch.dtype, topology: str) -> bool:
    """Whether the episodes were drawn by the very policy the update starts from: the torch
    engine, float32 weights and activations, and no batch sampled ahead (async)."""
    return engine in TRAINER_ENGINES and weights == "float32" and compute_dtype == torch.float32 \
        and topology != "async"


def level_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """log ρ at `level` from the per-token log ρ_t: (B, T) for token, (B, 1) for sequence
    (their sum over the response) and geometric (their mean over it); 0 off the response."""
    log_ratio = log_ratio * mask  # (B, T)
    if level == "token":
        return log_ratio
    if level == "sequence":
        return log_ratio.sum(dim=-1, keepdim=True)  # (B, 1)
    if level == "geometric":
        return masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1)  # (B, 1)
    raise ValueError(f"level={level!r}: expected token, sequence or geometric")


def importance_weights(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float, lower: float = 0.0) -> torch.Tensor:
    """w of every response token under `mode` (see the module docstring), (B, T); 0 off the
    response. A sequence-level w is its response's, on each of its tokens."""
    level, bound = mode.split("_")
    ratio = level_log_ratio(trainer_logp - sampler_logp, mask, level).clamp(max=SAFETY_BOUND).exp()
    if bound == "truncate":
        weights = ratio.clamp(min=lower, max=cap)
    elif bound == "mask":
        weights = ratio * ((ratio >= lower) & (ratio <= cap))
    else:
        raise ValueError(f"mode={mode!r}: expected LEVEL_truncate or LEVEL_mask")
    return weights * mask  # (B, T), a (B, 1) weight broadcast over its row


@torch.no_grad()
def diagnostics(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                mode: str, cap: float, lower: float = 0.0) -> dict[str, float]:
    """The mismatch/* metrics of the module docstring over the tokens of `mask`, (B, T), given
    the weights applied; {} when it holds no token."""
    mask = mask.to(trainer_logp.dtype)
    rows = mask.sum(dim=-1) > 0  # (B,) the responses measured
    if not rows.any():
        return {}
    level, bound = mode.split("_")
    tokens = mask.bool()
    log_ratio = (trainer_logp - sampler_logp) * mask  # (B, T) log ρ_t
    ratio = log_ratio.clamp(max=SAFETY_BOUND).exp()  # (B, T)
    sequence_log_ratio = log_ratio.sum(dim=-1)[rows].clamp(max=SAFETY_BOUND)  # (b,) log Π_t ρ_t
    level_ratio = level_log_ratio(trainer_logp - sampler_logp, mask, level).clamp(max=SAFETY_BOUND).exp()
    at_level = level_ratio[tokens] if level == "token" else level_ratio[rows, 0]  # one ρ per token, or per response
    outside = ((level_ratio < lower) | (level_ratio > cap)).expand_as(mask) & tokens  # (B, T)
    applied = weights[tokens]  # (n,)
    squares = applied.square().sum()
    ppl = lambda logp: torch.exp(-masked_mean(logp, mask, dim=-1))[rows].mean()  # noqa: E731
    metrics = {
        "kl": masked_mean(sampler_logp - trainer_logp, mask),
        "k3_kl": masked_mean(ratio - 1 - log_ratio, mask),
        "chi2_token": masked_mean(ratio.square(), mask) - 1,
        "chi2_seq": (2 * sequence_log_ratio).exp().mean() - 1,
        "ess": applied.sum().square() / (applied.numel() * squares) if squares > 0 else 0.0,  # 0: all masked
        "ratio_max": at_level.max(),
        "ratio_min": at_level.min(),
        "weight_mean": applied.mean(),
        "logp_diff_mean": log_ratio[tokens].abs().mean(),
        "logp_diff_max": log_ratio[tokens].abs().max(),
        "trainer_ppl": ppl(trainer_logp),
        "sampler_ppl": ppl(sampler_logp),
    }
    if bound == "truncate":
        metrics["truncated_fraction"] = outside[tokens].float().mean()
    else:
        metrics["masked_fraction"] = outside[tokens].float().mean()
        metrics["seq_masked_fraction"] = outside.any(dim=-1)[rows].float().mean()
    return {f"mismatch/{name}": float(value) for name, value in metrics.items()}


class Correction(Protocol):
    """What the rollout role asks before an update (Rollout.off_policy_correction): the batch
    the algorithm should see, and what the correction measured."""

    def correct(self, batch: RolloutBatch, trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict[str, float]]: ...


class SamplerIsTrainer:
    """No correction: the episodes were drawn by the weights about to be updated, through the
    trainer's own float32 forward, so old_logp already is log π_old (the default, `make run`)."""

    def correct(self, batch: RolloutBatch, trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict[str, float]]:
        return batch, {}


@dataclasses.dataclass(frozen=True)
class MismatchCorrection:
    """π_old recomputed by the trainer and the advantages weighted by w (rl.mismatch)."""

    mode: str = "token_truncate"
    cap: float = 2.0
    lower: float = 0.0

    def correct(self, batch: RolloutBatch, trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict[str, float]]:
        return self.apply(batch, current_logp(trainer, batch))

    def apply(self, batch: RolloutBatch, trainer_logp: torch.Tensor) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch with old_logp = `trainer_logp` (B, T) and its advantages weighted; the
        diagnostics over the rows the update trains."""
        if batch.advantages is None:
            raise ValueError("the mismatch correction weights the batch's advantages, and it has none yet: compute "
                             "them first (algorithm.compute_advantages)")
        weights = importance_weights(trainer_logp, batch.old_logp, batch.response_mask, self.mode, self.cap,
                                     self.lower)  # (B, T)
        metrics = diagnostics(trainer_logp, batch.old_logp, trained_mask(batch), weights, self.mode, self.cap,
                              self.lower)
        return dataclasses.replace(batch, old_logp=trainer_logp, advantages=batch.advantages * weights), metrics
