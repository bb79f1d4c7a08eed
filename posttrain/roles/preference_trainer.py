"""Offline preference training: one loop for every loss in the family.

    metrics = train_preference(policy, pairs, "dpo", steps=200, lr=1e-4)

Pseudocode (Rafailov et al. 2023, and the step list in spec/seeds/002):

    if the loss uses a reference:                     # DPO, IPO, KTO
        π_ref = frozen copy of the policy
        cache log π_ref(y|x) of every response        # one no-grad pass over the data, then π_ref is freed
    repeat `steps` times:
        draw a batch of pairs (or unpaired examples)
        one forward pass over [chosen rows; rejected rows] -> Σ log π_θ(y|x) per row
        loss, metrics = loss_fn(π_chosen, π_rejected, ref_chosen | None, ref_rejected | None, lengths)
        backward; clip the gradient norm; AdamW step   # π_ref is never updated

Caching the reference log-probs is exact (π_ref is frozen, so they never change) and halves
the forward passes per step; it also means a reference model is alive only during the first
pass. SimPO and ORPO are reference-free: no copy is made at all.

This trains on a static dataset (offline, off-policy): no sampling happens here.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from posttrain.algorithms.core import masked_sum
from posttrain.algorithms.preference import make_preference_loss
from posttrain.algorithms.preference.core import PreferenceInfo
from posttrain.models.logprobs import token_logp
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.rollout import encode_prompt
from posttrain.types import PreferencePair, UnpairedExample


@dataclass
class SequenceBatch:
    """N right-padded `[bos] prompt response` rows, the input of `sequence_logps`.

    Paired data is laid out chosen rows first, then rejected rows, in the same pair order:

        rows 0 .. B-1     chosen response of pair 0 .. B-1       is_chosen = True
        rows B .. 2B-1    rejected response of pair 0 .. B-1     is_chosen = False

    so `logps[is_chosen]` and `logps[~is_chosen]` line up pair by pair, and one forward pass
    covers both halves. Unpaired (KTO) data uses the same layout with is_chosen = desirable.
    """

    tokens: torch.Tensor  # (N, T) long, right padded
    response_mask: torch.Tensor  # (N, T) float, 1 on the response tokens (EOS included)
    is_chosen: torch.Tensor  # (N,) bool: a chosen / desirable row

    def __post_init__(self) -> None:
        if self.tokens.shape != self.response_mask.shape or self.is_chosen.shape != self.tokens.shape[:1]:
            raise ValueError(
                f"SequenceBatch shapes disagree: tokens {tuple(self.tokens.shape)}, response_mask "
                f"{tuple(self.response_mask.shape)}, is_chosen {tuple(self.is_chosen.shape)}; "
                "want (N, T), (N, T), (N,)"
            )

    def lengths(self) -> torch.Tensor:
        return self.response_mask.sum(dim=1)  # (N,) response tokens per row


def sequence_logps(model: torch.nn.Module, batch: SequenceBatch, length_normalize: bool = False) -> torch.Tensor:
    """log π(y | x) of every row, (N,): the token log-probs summed over the response mask,
    or divided by the response length with `length_normalize` (the average per-token
    log-prob that SimPO and ORPO use; the losses here take sums and divide themselves).

    Right padding needs no attention mask: a real token only attends to earlier tokens,
    which are all real (types.py). Differentiable when called with gradients enabled."""
    logits = model(batch.tokens)  # (N, T, V)
    logp = token_logp(logits, batch.tokens)  # (N, T), position t = log π(tokens[t] | tokens[<t])
    total = masked_sum(logp, batch.response_mask, dim=1)  # (N,)
    return total / batch.lengths().clamp(min=1) if length_normalize else total


@dataclass(frozen=True)
class Row:
    """One tokenized `[bos] prompt response [eos]` sequence."""

    ids: tuple[int, ...]
    prompt_len: int  # tokens before the response ([bos] + prompt)
    is_chosen: bool  # chosen / desirable


def encode_row(tokenizer, prompt: str, response: str, is_chosen: bool, max_len: int | None, where: str) -> Row:
    """[bos] + prompt, then response + [eos]: the layout the rollout engine samples, so the
    EOS is an action the policy is trained to take (or not) like any other token."""
    prompt_ids = encode_prompt(tokenizer, prompt)
    response_ids = tokenizer.encode(response) + [tokenizer.eos_id]
    ids = tuple(prompt_ids + response_ids)
    if max_len is not None and len(ids) > max_len:
        raise ValueError(
            f"{where}: prompt + response is {len(ids)} tokens, more than the model's max_seq_len={max_len}; "
            "shorten or drop this record, or use a model with a larger max_seq_len"
        )
    return Row(ids, len(prompt_ids), is_chosen)


def encode_records(
    records: Sequence[PreferencePair | UnpairedExample], tokenizer, max_len: int | None = None
) -> list[list[Row]]:
    """Each record's rows: a pair gives [chosen, rejected], an unpaired example one row."""
    out = []
    for i, r in enumerate(records):
        where = f"record {i}"
        if isinstance(r, PreferencePair):
            out.append([encode_row(tokenizer, r.prompt, r.chosen, True, max_len, where),
                        encode_row(tokenizer, r.prompt, r.rejected, False, max_len, where)])
        elif isinstance(r, UnpairedExample):
            out.append([encode_row(tokenizer, r.prompt, r.completion, r.desirable, max_len, where)])
        else:
            raise TypeError(f"{where}: expected PreferencePair or UnpairedExample, got {type(r).__name__}")
    return out


def collate_rows(rows: Sequence[Row], pad_id: int) -> SequenceBatch:
    """Right-pad rows into a SequenceBatch, chosen rows first, then rejected rows, each
    half in the given order (so pair i's chosen and rejected rows line up)."""
    ordered = [r for r in rows if r.is_chosen] + [r for r in rows if not r.is_chosen]
    N, T = len(ordered), max(len(r.ids) for r in ordered)
    tokens = torch.full((N, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros(N, T)
    for b, r in enumerate(ordered):
        tokens[b, : len(r.ids)] = torch.tensor(r.ids)
        response_mask[b, r.prompt_len : len(r.ids)] = 1.0
    is_chosen = torch.tensor([r.is_chosen for r in ordered], dtype=torch.bool)
    return SequenceBatch(tokens, response_mask, is_chosen)


def batch_order(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Record indices for step 0, 1, 2, ...: each epoch is a fresh shuffle of range(n), and a
    batch that reaches the end of one epoch is completed from the next (with fewer than
    batch_size records in all, a batch is the n records). A pure function of (n, batch_size,
    seed), so a resumed run can replay it."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order += epoch
        yield order[:batch_size]
        order = order[batch_size:]


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference policy: a deep copy with gradients off, in eval mode."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def cache_reference_logps(reference: torch.nn.Module, rows: list[list[Row]], pad_id: int,
                          batch_size: int = 32) -> list[list[float]]:
    """log π_ref(y|x) of every row of every record, in the same nesting as `rows`: computed
    once, since π_ref never changes."""
    return row_logps(reference, rows, pad_id, batch_size)


@torch.no_grad()
def row_logps(model: torch.nn.Module, rows: list[list[Row]], pad_id: int, batch_size: int = 32) -> list[list[float]]:
    """log π(y|x) under `model` of every row of every record, in the same nesting as `rows`."""
    flat = [(i, j, row) for i, record in enumerate(rows) for j, row in enumerate(record)]
    out: list[list[float]] = [[0.0] * len(record) for record in rows]
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        # collate_rows puts chosen rows first; rebuild the same order to read the results back
        order = [c for c in chunk if c[2].is_chosen] + [c for c in chunk if not c[2].is_chosen]
        logps = sequence_logps(model, collate_rows([c[2] for c in chunk], pad_id))  # (n,)
        for (i, j, _), value in zip(order, logps.tolist()):
            out[i][j] = value
    return out


def train_preference(
    policy: torch.nn.Module,
    pairs: Sequence[PreferencePair] | Sequence[UnpairedExample],
    loss_name: str = "dpo",
    steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    loss_params: dict[str, Any] | None = None,
    tokenizer=None,
    reference: torch.nn.Module | None = None,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    start_step: int = 0,
) -> list[dict[str, float]]:
    """Train `policy` in place on preference data with one loss of the family; return one
    metrics dict per optimizer step.

    policy:      a causal LM with `forward(tokens (N, T)) -> logits (N, T, V)` (GPTMini).
    pairs:       PreferencePairs, or UnpairedExamples (KTO only), e.g. from
                 `posttrain.preference_data.load_preference_jsonl(path)`.
    loss_name:   a key of PREFERENCE_LOSSES: "dpo", "ipo", "kto", "orpo", "simpo".
    steps:       optimizer steps; batches cycle through the data, reshuffled every epoch.
    lr:          AdamW learning rate. 1e-4 suits a from-scratch GPTMini; DPO on 7B models
                 uses ~5e-7, so lower it for pretrained models.
    batch_size:  records per step (a pair counts once, its two rows share a forward pass).
    loss_params: the loss's hyperparameters, e.g. {"beta": 0.1}; see make_preference_loss.
    tokenizer:   encodes prompts and responses; default CharTokenizer (GPTMini's).
    reference:   the frozen π_ref for losses that need one; default a copy of `policy` as it
                 is now. Ignored (never built) for reference-free losses (SimPO, ORPO).
    max_grad_norm: clip the global gradient norm; a step on a pair the policy has pushed far
                 from π_ref can be large, and the clip bounds it.
    seed:        batch order.
    on_step:     called as on_step(step, metrics) after every step (progress, logging,
                 checkpoints).
    optimizer:   the optimizer to step; default a fresh AdamW(lr). Pass one to save its
                 state in checkpoints and restore it on resume.
    start_step:  resume: run steps [start_step, steps) only. The batch order of the skipped
                 steps is replayed (not computed), so with the policy and optimizer restored
                 from the end of step start_step − 1 the run continues exactly as if it had
                 never stopped.

    Metrics per step: the loss's own (loss, accuracy, rewards_chosen, rewards_rejected,
    margin, ...), plus logps_chosen / logps_rejected (mean Σ log π_θ of each side),
    response_len and grad_norm.
    """

    loss_fn = make_preference_loss(loss_name, **(loss_params or {}))
    if tokenizer is None:

        tokenizer = CharTokenizer()
    if not pairs:
        raise ValueError("train_preference got no data: pass a non-empty list of pairs")
    if loss_fn.paired and not all(isinstance(p, PreferencePair) for p in pairs):
        raise ValueError(
            f"{loss_name!r} compares a chosen with a rejected response and needs PreferencePairs; "
            "for unpaired (desirable / undesirable) data use loss_name='kto'"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(start_step, bool) or not isinstance(start_step, int) or not 0 <= start_step <= steps:
        raise ValueError(f"start_step must be an int in [0, steps={steps}], got {start_step!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    max_len = getattr(getattr(policy, "config", None), "max_seq_len", None)
    rows = encode_records(pairs, tokenizer, max_len)

    ref_logps = None
    if loss_fn.uses_reference:
        ref_model = reference if reference is not None else frozen_copy(policy)
        ref_logps = cache_reference_logps(ref_model, rows, tokenizer.pad_id)
        del ref_model  # never needed again: every π_ref value the loop will read is cached

    if optimizer is None:
        optimizer = torch.optim.AdamW(policy.parameters(), lr=lr, weight_decay=0.0)  # no decay: a short fine-tune
    batches = batch_order(len(rows), batch_size, seed)
    for _ in range(start_step):  # resume: replay the order of the steps already taken
        next(batches)
    history = []
    policy.train()
    for step in range(start_step, steps):
        idx = next(batches)  # plumbing: the next batch of records, reshuffled each epoch
        batch_rows = [row for i in idx for row in rows[i]]
        batch = collate_rows(batch_rows, tokenizer.pad_id)
        info = PreferenceInfo.from_batch(batch)

        # ---- the algorithm
        logps = sequence_logps(policy, batch)  # (N,) one forward pass for both sides
        ref_chosen = ref_rejected = None
        if ref_logps is not None:
            # the same chosen-first order collate_rows used
            cached = [ref_logps[i][j] for want in (True, False) for i in idx
                      for j, row in enumerate(rows[i]) if row.is_chosen == want]
            ref = torch.tensor(cached)  # (N,)
            ref_chosen, ref_rejected = ref[batch.is_chosen], ref[~batch.is_chosen]
        loss, metrics = loss_fn(logps[batch.is_chosen], logps[~batch.is_chosen], ref_chosen, ref_rejected, info)

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
        if not math.isfinite(grad_norm.item()):
            raise FloatingPointError(
                f"step {step}: gradient norm is {grad_norm.item()}; lower lr or check the data (metrics: {metrics})"
            )
        optimizer.step()

        with torch.no_grad():
            chosen, rejected = logps[batch.is_chosen], logps[~batch.is_chosen]
            metrics |= {
                "logps_chosen": chosen.mean().item() if chosen.numel() else 0.0,
                "logps_rejected": rejected.mean().item() if rejected.numel() else 0.0,
                "response_len": batch.lengths().mean().item(),
                "grad_norm": grad_norm.item(),
            }
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
    policy.eval()
    return history


@torch.no_grad()
def mean_token_kl(policy: torch.nn.Module, reference: torch.nn.Module, batch: SequenceBatch) -> float:
    """Exact KL(π_θ ‖ π_ref) of the next-token distributions, summed over the vocabulary and
    averaged over the response positions of `batch`: how far training moved the policy,
    measured where the data lives."""
    logp = torch.log_softmax(policy(batch.tokens)[:, :-1].float(), dim=-1)  # (N, T-1, V)
    ref_logp = torch.log_softmax(reference(batch.tokens)[:, :-1].float(), dim=-1)  # (N, T-1, V)
    kl = (logp.exp() * (logp - ref_logp)).sum(-1)  # (N, T-1), position t-1 predicts token t
    mask = batch.response_mask[:, 1:]  # (N, T-1)
    return ((kl * mask).sum() / mask.sum().clamp(min=1)).item()


@torch.no_grad()
def evaluate_preference(
    policy: torch.nn.Module,
    pairs: Sequence[PreferencePair] | Sequence[UnpairedExample],
    loss_name: str = "dpo",
    loss_params: dict[str, Any] | None = None,
    tokenizer=None,
    reference: torch.nn.Module | None = None,
) -> dict[str, float]:
    """The loss's own metrics on data it was not trained on: loss, accuracy (the fraction of
    pairs whose implicit-reward margin is > 0), rewards_chosen, rewards_rejected, margin.
    Training accuracy reaches 1.0 on any small set; this is the number that says whether
    the learned preference generalises. `reference` is required by losses that use one."""

    loss_fn = make_preference_loss(loss_name, **(loss_params or {}))
    if tokenizer is None:

        tokenizer = CharTokenizer()
    if not pairs:
        raise ValueError("evaluate_preference got no data: pass a non-empty list of pairs")
    if loss_fn.uses_reference and reference is None:
        raise ValueError(f"{loss_name!r} scores pairs against a reference model; pass reference=")
    was_training = policy.training
    policy.eval()
    rows = encode_records(pairs, tokenizer, getattr(getattr(policy, "config", None), "max_seq_len", None))
    flat = [row for record in rows for row in record]
    is_chosen = torch.tensor([row.is_chosen for row in flat])  # (N,) in record order

    def logps_of(model) -> torch.Tensor:
        return torch.tensor([v for record in row_logps(model, rows, tokenizer.pad_id) for v in record])

    logps = logps_of(policy)  # (N,)
    ref = logps_of(reference) if loss_fn.uses_reference else None
    lengths = torch.tensor([float(len(row.ids) - row.prompt_len) for row in flat])  # (N,)
    info = PreferenceInfo(lengths[is_chosen], lengths[~is_chosen])
    _, metrics = loss_fn(logps[is_chosen], logps[~is_chosen], None if ref is None else ref[is_chosen],
                         None if ref is None else ref[~is_chosen], info)
    policy.train(was_training)
    return metrics
