"""Training on preference pairs through the one Trainer the RL losses use (warmup, cosine
decay, micro-batches, gradient clipping, checkpointable state).

    rows = preference_episodes(pairs, tokenizer)          each pair as two adjacent rows
    cache_reference_logps(reference, rows, pad_id)        log π_ref once: π_ref never changes
    for step:
        batch = preference_batch(rows, batch_indices(len(rows), batch_size, seed, step), pad_id)
        trainer.update(batch, loss)                       loss.compute_loss, backward, clip, AdamW

`train_preference` is that loop on its own (notebooks, tests); the preference stage of a
run (pipelines/preference.py) runs the same steps with rounds (pipelines/preference_rounds.py),
checkpoints and evaluations.
`evaluate_preference` scores held-out pairs with the loss's own metrics.

Caching the reference log-probs is exact and saves the reference a forward pass per step;
a reference-free loss (SimPO, ORPO) never builds or runs a reference at all.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any, Callable, Sequence

import torch

from posttrain.algorithms.preference import PreferenceLogps, PreferenceLoss, make_preference_loss
from posttrain.algorithms.preference.core import gap_weights
from posttrain.data.preference_rows import pair_gaps, preference_episodes
from posttrain.eval.calibration import expected_calibration_error
from posttrain.models.device import autocast, model_device
from posttrain.models.logprobs import response_logp, sequence_logps
from posttrain.models.policy import Policy
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, PreferencePair, RolloutBatch, Tokenizer, UnpairedExample


def batch_indices(n: int, batch_size: int, seed: int, step: int) -> list[int]:
    """The records of step `step`: each epoch is a fresh shuffle of range(n), and a batch
    that reaches the end of one epoch is completed from the next (with fewer than
    batch_size records in all, a batch is the n records). A pure function of its
    arguments, so a resumed run draws what an uninterrupted one drew."""
    rng = random.Random(seed)
    order: list[int] = []
    for _ in range(step + 1):
        order = order[batch_size:]
        if len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order += epoch
    return order[:batch_size]


def preference_batch(rows: list[list[Episode]], indices: Sequence[int], pad_id: int,
                     gap_weighting: str = "none") -> RolloutBatch:
    """The rows of the records at `indices`, each record's rows adjacent and its own group.
    With a `gap_weighting` (the loss's: DPO's gap_weighting), each pair's weight from its
    score gap, scaled to mean 1 over these pairs, in `pair_weights`: computed here, on the
    whole step, so that micro-batches of the step share one normalisation."""
    batch = RolloutBatch.collate([dataclasses.replace(e, group_id=g) for g, i in enumerate(indices) for e in rows[i]],
                                 pad_id)
    if gap_weighting != "none":
        weights = gap_weights(torch.tensor(pair_gaps([rows[i] for i in indices])), gap_weighting)  # (B,)
        batch.pair_weights = weights.repeat_interleave(2)  # (2B,) both rows of a pair, adjacent
    return batch


def frozen_copy(model: Policy) -> Policy:
    """The reference policy: a deep copy with gradients off, in eval mode."""
    return copy.deepcopy(model).eval().requires_grad_(False)


@torch.no_grad()
def cache_reference_logps(reference: Policy, rows: list[list[Episode]], pad_id: int,
                          batch_size: int = 64) -> None:
    """Give every row its `ref_logp`: log π_ref of each response token, computed once."""
    flat = [e for record in rows for e in record]
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        logp = response_logp(reference, RolloutBatch.collate(chunk, pad_id))  # (b, T)
        for e, row in zip(chunk, logp):
            P = len(e.prompt_ids)
            e.ref_logp = row[P : P + len(e.response_ids)].tolist()


def check_records(pairs: Sequence, loss: PreferenceLoss, name: str) -> None:
    if not pairs:
        raise ValueError("no preference data: pass a non-empty list of pairs")
    if loss.paired and not all(isinstance(p, PreferencePair) for p in pairs):
        raise ValueError(f"{name!r} compares a chosen with a rejected response and needs PreferencePairs; "
                         "for unpaired (desirable / undesirable) data use loss_name='kto'")


def train_preference(
    policy: Policy,
    pairs: Sequence[PreferencePair] | Sequence[UnpairedExample],
    loss_name: str = "dpo",
    steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    loss_params: dict[str, Any] | None = None,
    tokenizer: Tokenizer | None = None,
    reference: Policy | None = None,
    seed: int = 0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    trainer: Trainer | None = None,
    start_step: int = 0,
) -> list[dict[str, float]]:
    """Train `policy` in place on preference data with one loss of the family; return one
    metrics dict per optimizer step.

    policy:      a causal LM with `hidden_states` and `lm_head` (GPTMini, HFPolicy).
    pairs:       PreferencePairs, or UnpairedExamples (KTO only), e.g. from
                 `posttrain.data.preference.load_preference_jsonl(path)`.
    loss_name:   a key of PREFERENCE_LOSSES: "dpo", "ipo", "kto", "orpo", "simpo".
    steps:       optimizer steps; batches cycle through the data, reshuffled every epoch.
    lr:          learning rate of the default trainer. 1e-4 suits a from-scratch GPTMini;
                 DPO on 7B models uses ~5e-7, so lower it for pretrained models.
    batch_size:  records per step (a pair counts once; its two rows share the step).
    loss_params: the loss's hyperparameters, e.g. {"beta": 0.1}; see make_preference_loss.
    tokenizer:   encodes prompts and responses; default CharTokenizer (GPTMini's).
    reference:   the frozen π_ref for losses that need one; default a copy of `policy` as it
                 is now. Never built for reference-free losses (SimPO, ORPO).
    seed:        batch order.
    on_step:     called as on_step(step, metrics) after every step.
    trainer:     the Trainer to step (default: AdamW at `lr`, no warmup, cosine decay over
                 `steps`); pass one to keep its state for a resume.
    start_step:  resume: run steps [start_step, steps) only. The batch order is a pure
                 function of the step, so with the policy and trainer restored from the end
                 of step start_step − 1 the run continues exactly as if it had never stopped.

    Metrics per step: the loss's own (loss, accuracy, rewards_chosen, rewards_rejected,
    margin, ...), logps_chosen / logps_rejected (mean Σ log π_θ of each side), response_len,
    grad_norm and lr.
    """
    loss = make_preference_loss(loss_name, **(loss_params or {}))
    tokenizer = tokenizer or CharTokenizer()
    check_records(pairs, loss, loss_name)
    for name, value, low in (("steps", steps, 1), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(start_step, bool) or not isinstance(start_step, int) or not 0 <= start_step <= steps:
        raise ValueError(f"start_step must be an int in [0, steps={steps}], got {start_step!r}")
    rows = preference_episodes(pairs, tokenizer, getattr(getattr(policy, "config", None), "max_seq_len", None))
    if loss.uses_reference:
        cache_reference_logps(reference if reference is not None else frozen_copy(policy), rows, tokenizer.pad_id)
    if loss.gap_weighting != "none":
        pair_gaps(rows)  # every pair scored, or the record without scores named now, before any step
    trainer = trainer or Trainer(policy, lr=lr, total_steps=steps)
    history = []
    for step in range(start_step, steps):
        batch = preference_batch(rows, batch_indices(len(rows), batch_size, seed, step), tokenizer.pad_id,
                                 loss.gap_weighting)
        metrics = trainer.update(batch, loss)
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    policy.eval()
    return history


@torch.no_grad()
def evaluate_preference(
    policy: Policy,
    pairs: Sequence[PreferencePair] | Sequence[UnpairedExample],
    loss_name: str = "dpo",
    loss_params: dict[str, Any] | None = None,
    tokenizer: Tokenizer | None = None,
    reference: Policy | None = None,
    batch_size: int = 64,
) -> dict[str, float]:
    """The loss's own metrics on data it was not trained on: loss, accuracy (the fraction of
    pairs whose implicit-reward margin is > 0), rewards_chosen, rewards_rejected, margin.
    Training accuracy reaches 1.0 on any small set; this is the number that says whether
    the learned preference generalises. `reference` is required by losses that use one."""
    loss = make_preference_loss(loss_name, **(loss_params or {}))
    tokenizer = tokenizer or CharTokenizer()
    check_records(pairs, loss, loss_name)
    if loss.uses_reference and reference is None:
        raise ValueError(f"{loss_name!r} scores pairs against a reference model; pass reference=")
    was_training = policy.training
    policy.eval()
    rows = preference_episodes(pairs, tokenizer, getattr(getattr(policy, "config", None), "max_seq_len", None))
    logps = None
    for start in range(0, len(rows), batch_size):
        batch = preference_batch(rows, range(start, min(len(rows), start + batch_size)), tokenizer.pad_id)
        batch = batch.to(model_device(policy))  # the reference lives where the policy does
        ref = sequence_logps(reference, batch) if loss.uses_reference and reference is not None else None
        part = PreferenceLogps.of_rows(sequence_logps(policy, batch), batch.response_lengths(), batch.rewards > 0, ref)
        logps = part if logps is None else logps.cat(part)
    policy.train(was_training)
    assert logps is not None  # check_records refused empty data: there was a batch
    return {**loss.loss(logps)[1], **preference_health(logps, loss)}


def preference_health(logps: PreferenceLogps, loss: PreferenceLoss) -> dict[str, float]:
    """The checks that catch a preference loss going wrong where the training accuracy cannot:

    logps_chosen_per_token   mean log π_θ(y_c) per token: DPO only needs the chosen response
                             to beat the rejected one, and lowering both does that, so the
                             chosen answers can become unlikely while accuracy climbs (the
                             chosen_likelihood_collapse monitor watches this)
    implicit_reward_ece      how calibrated the implicit reward's preference probability
                             σ(β·Δ) is on held-out pairs (each pair in both orders, so a 0.9
                             should be right 90% of the time); DPO's β sets the scale, and an
                             overconfident policy has moved far from the reference
                             (paired losses with a reference and a β: DPO, IPO)"""
    health = {"logps_chosen_per_token": (logps.chosen / logps.chosen_lengths.clamp(min=1)).mean().item()}
    beta = getattr(loss, "beta", None)
    if (loss.paired and loss.uses_reference and beta is not None and logps.chosen.numel()
            and logps.ref_chosen is not None and logps.ref_rejected is not None):  # (set when uses_reference)
        margin = beta * ((logps.chosen - logps.ref_chosen) - (logps.rejected - logps.ref_rejected))  # (B,)
        probs = torch.sigmoid(torch.cat([margin, -margin])).tolist()  # chosen ≻ rejected, and the reverse
        labels = [1.0] * len(margin) + [0.0] * len(margin)
        health["implicit_reward_ece"] = expected_calibration_error(probs, labels)
    return health


@torch.no_grad()
def mean_token_kl(policy: Policy, reference: Policy, batch: RolloutBatch) -> float:
    """Exact KL(π_θ ‖ π_ref) of the next-token distributions, summed over the vocabulary and
    averaged over the response positions of `batch`: how far training moved the policy,
    measured where the data lives."""
    batch = batch.to(model_device(policy))
    with autocast(policy):  # the policy's precision; the log-softmax below reads the logits in float32
        logits, ref_logits = policy(batch.tokens)[:, :-1], reference(batch.tokens)[:, :-1]  # (N, T-1, V) each
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, T-1, V)
    ref_logp = torch.log_softmax(ref_logits.float(), dim=-1)  # (N, T-1, V)
    kl = (logp.exp() * (logp - ref_logp)).sum(-1)  # (N, T-1), position t-1 predicts token t
    mask = batch.response_mask[:, 1:]  # (N, T-1)
    return ((kl * mask).sum() / mask.sum().clamp(min=1)).item()
