"""From a model's outputs to per-token log-probs and entropies: what the trainer, the
reference and the preference losses read.

    token_logp / token_entropy        from full (B, T, V) logits
    lm_head_float32                   the output layer in float32, whatever autocast says
    response_logp_and_entropy         from hidden states, at response positions only, in
                                      chunks: never the full (B, T, V) tensor
    response_logp(model, batch)       the same from a model and a batch, each shared prompt
                                      computed once: the reference's call
    sequence_logps(model, batch)      log π(y | x) of whole responses (the DPO family)
    response_logp_at(hidden, ...)     log π of given tokens (k per position) at response positions:
                                      the student's side of a top-k distillation loss
    response_topk(model, batch, k)    a frozen model's sampled-token log-probs and its k likeliest
                                      next tokens at each response position: the teacher's side

Position t of every (B, T) result holds log π(tokens[t] | tokens[<t]), predicted from
position t − 1; position 0 has no prediction and holds 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from posttrain.models.device import autocast, model_device
from posttrain.models.policy import Policy
from posttrain.types import RolloutBatch

from .shared_prefix import batch_hidden_states


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: (..., V) -> (...).

    H = logsumexp(z) − Σ_v softmax(z)_v z_v, which needs one (…, V) softmax and no
    log-softmax copy."""
    probs = torch.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # (B, T)


def _next_token_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits[:, t-1] predicts tokens[:, t]: drop the last position (it predicts past the
    end), and divide by the sampling temperature so log-probs match the distribution the
    rollout actually sampled from."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    shifted = logits[:, :-1]  # (B, T-1, V) a view, no copy
    return shifted if temperature == 1.0 else shifted / temperature


def token_logp(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs aligned with `tokens`.

    Args:
        logits: (B, T, V) the model's output at every position.
        tokens: (B, T) long, the sequence the logits were computed on.
        temperature: divide the logits by this first (the rollout's sampling temperature).

    Returns (B, T): out[:, t] = log p(tokens[:, t] | tokens[:, :t]), computed from
    logits[:, t-1]. Position 0 has no prediction and holds 0.
    """
    z = _next_token_logits(logits, temperature)  # (B, T-1, V)
    # log softmax(z)[tok] = z[tok] − logsumexp(z): gathers one logit per position instead
    # of materialising the full (B, T-1, V) log-softmax.
    picked = z.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    logp = picked - torch.logsumexp(z, dim=-1)  # (B, T-1)
    return F.pad(logp, (1, 0))  # (B, T) position 0 gets 0


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the next-token distribution aligned like `token_logp`: out[:, t] is
    H(p(· | tokens[:, :t])) from logits[:, t-1], temperature applied; out[:, 0] = 0. (B, T)"""
    z = _next_token_logits(logits, temperature)  # (B, T-1, V)
    return F.pad(entropy_from_logits(z), (1, 0))  # (B, T)


def lm_head_float32(lm_head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """lm_head(hidden) computed in float32 even inside autocast, (..., V) float32.

    Under --dtype bfloat16 autocast would run the head's matmul in bf16 and round every logit
    to 3 significant digits (±0.06 on a logit of 16) before the log-softmax: log-probs the
    trainer then compares with the sampler's (the ratio π_θ / π_old, the mismatch correction's
    ρ) would differ by that rounding alone. The head is one matmul of the whole model, so
    float32 here costs little; it is the fix reported for RL runs whose learning stalled as the
    sampler/trainer mismatch grew (issue #40 cites open-instruct #1473 and NeMo-RL #4243).
    Without autocast (float32 runs) it is the same operation on the same float32 tensors: bit
    for bit the logits of lm_head(hidden)."""
    with torch.autocast(hidden.device.type, enabled=False):
        return lm_head(hidden.float())


# Logits for a 49k-token vocabulary are the largest tensor in a training step: 64 rows ×
# 110 positions × 49152 × 4 bytes is 1.4 GB, and backward keeps a copy. The trainer only
# needs log-probs where the loss looks (the response), so it computes the logits there and
# only there, a chunk of positions at a time, and recomputes each chunk's logits during
# backward instead of storing them.
LOGITS_BUDGET = 2**25  # elements of one chunk of logits (128 MB in float32)


def response_logp_and_entropy(
    hidden: torch.Tensor,
    lm_head: torch.nn.Linear,
    tokens: torch.Tensor,
    response_mask: torch.Tensor,
    temperature: float = 1.0,
    logits_budget: int = LOGITS_BUDGET,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logp` and `token_entropy` on the response positions only, (B, T) each,
    exactly 0 wherever response_mask is 0.

    hidden (B, T, D) are the final hidden states; lm_head is the (D -> V) output layer. Position t
    is predicted from hidden[:, t-1]. Chunks of at most `logits_budget` logits are run
    under activation checkpointing when there is more than one, so peak memory is one
    chunk's logits, whatever the batch."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, _ = hidden.shape
    rows, cols = response_mask[:, 1:].nonzero(as_tuple=True)  # cols + 1 are the predicted positions
    states, targets = hidden[rows, cols], tokens[rows, cols + 1]  # (n, D), (n,)

    def logp_and_entropy(h: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the upcast point under --dtype bfloat16: the head's matmul, logsumexp and softmax over V
        # logits all run in float32 (lm_head_float32), where rounding stays below 1e-6
        z = lm_head_float32(lm_head, h) / temperature  # (c, V)
        log_norm = torch.logsumexp(z, dim=-1)  # (c,)
        logp = z.gather(-1, target[:, None]).squeeze(-1) - log_norm
        entropy = log_norm - (torch.softmax(z, dim=-1) * z).sum(-1)
        return logp, entropy

    chunk = max(1, logits_budget // lm_head.weight.shape[0])  # positions per chunk
    chunked = len(states) > chunk and torch.is_grad_enabled()
    parts = [torch.utils.checkpoint.checkpoint(logp_and_entropy, states[i : i + chunk], targets[i : i + chunk],
                                               use_reentrant=False) if chunked
             else logp_and_entropy(states[i : i + chunk], targets[i : i + chunk])
             for i in range(0, len(states), chunk)]
    if parts:
        logp, entropy = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    else:  # no response token at all (every row filtered out of the loss): keep the graph, so a
        # loss on these rows is an exact 0 with a gradient of exact 0 for every parameter
        logp, entropy = (x[:0] for x in logp_and_entropy(hidden[:1, 0], tokens[:1, 0]))
    index = (rows, cols + 1)
    # float32 whatever hidden's dtype (bf16 under autocast): the ratio exp(logp − old_logp)
    # and the KL read differences of log-probs that bf16's 3 significant digits would erase
    return (hidden.new_zeros(B, T, dtype=torch.float32).index_put(index, logp.float()),
            hidden.new_zeros(B, T, dtype=torch.float32).index_put(index, entropy.float()))


def response_logp(model: Policy, batch: RolloutBatch, share_prompt: bool = True) -> torch.Tensor:
    """log π(token | prefix) of the batch's response tokens under `model`, (B, T), exactly 0
    off the response; with `share_prompt`, the prompt of a group of rows runs once
    (models/shared_prefix.py)."""
    batch = batch.to(model_device(model))  # a no-op when the caller already put it there
    with autocast(model):  # the model's precision (models/device.py); logp comes back float32
        hidden = batch_hidden_states(model, batch, share_prompt)  # (B, T, D)
        logp, _ = response_logp_and_entropy(hidden, model.lm_head, batch.tokens, batch.response_mask,
                                            batch.temperature)
    return logp


def sequence_logps(model: Policy, batch: RolloutBatch) -> torch.Tensor:
    """log π(y | x) of every row, (B,): the response tokens' log-probs summed (EOS included)."""
    return response_logp(model, batch).sum(dim=1)  # exactly 0 off the response


def response_logp_at(hidden: torch.Tensor, lm_head: torch.nn.Linear, ids: torch.Tensor, response_mask: torch.Tensor,
                     temperature: float = 1.0, logits_budget: int = LOGITS_BUDGET) -> torch.Tensor:
    """log softmax(z / temperature)[ids] at every response position, (B, T, k) float32, exactly
    0 off the response; z is predicted from hidden[:, t-1] as in `response_logp_and_entropy`.

    ids (B, T, k) long are the tokens to read at each position (a teacher's top k). It runs
    the output layer over the response positions a second time (the trainer's forward has
    already run it once for logp and entropy): k log-probs out of V, chunked and, under
    gradients, recomputed in backward like `response_logp_and_entropy`, so peak memory is one
    chunk's logits."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    B, T, _ = hidden.shape
    k = ids.shape[-1]
    rows, cols = response_mask[:, 1:].nonzero(as_tuple=True)  # cols + 1 are the predicted positions
    states, wanted = hidden[rows, cols], ids[rows, cols + 1]  # (n, D), (n, k)

    def logp_at(h: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
        z = lm_head_float32(lm_head, h) / temperature  # (c, V)
        return z.gather(-1, want) - torch.logsumexp(z, dim=-1, keepdim=True)  # (c, k)

    chunk = max(1, logits_budget // lm_head.weight.shape[0])
    chunked = len(states) > chunk and torch.is_grad_enabled()
    parts = [torch.utils.checkpoint.checkpoint(logp_at, states[i : i + chunk], wanted[i : i + chunk],
                                               use_reentrant=False) if chunked
             else logp_at(states[i : i + chunk], wanted[i : i + chunk])
             for i in range(0, len(states), chunk)]
    # no response token at all: an empty (0, k) piece that keeps the graph (see response_logp_and_entropy)
    picked = torch.cat(parts) if parts else logp_at(hidden[:1, 0], ids[:1, 0])[:0]  # (n, k)
    return hidden.new_zeros(B, T, k, dtype=torch.float32).index_put((rows, cols + 1), picked.float())


@torch.no_grad()
def response_topk(model: Policy, batch: RolloutBatch, k: int,
                  share_prompt: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From one forward pass of a frozen `model` over the batch: (logp (B, T), the log-probs
    of the sampled tokens as `response_logp` gives them; topk_logp (B, T, k), the log-probs
    of its k likeliest next tokens, largest first; topk_ids (B, T, k) long, those tokens).
    All three are 0 off the response. k is at most the vocabulary size."""
    batch = batch.to(model_device(model))
    B, T = batch.tokens.shape
    with autocast(model):
        hidden = batch_hidden_states(model, batch, share_prompt)  # (B, T, D)
        logp, _ = response_logp_and_entropy(hidden, model.lm_head, batch.tokens, batch.response_mask,
                                            batch.temperature)
        rows, cols = batch.response_mask[:, 1:].nonzero(as_tuple=True)
        states = hidden[rows, cols]  # (n, D)
        chunk = max(1, LOGITS_BUDGET // model.lm_head.weight.shape[0])
        values, indices = [], []
        for i in range(0, len(states), chunk):
            z = lm_head_float32(model.lm_head, states[i : i + chunk]) / batch.temperature  # (c, V)
            top = torch.topk(torch.log_softmax(z, dim=-1), k, dim=-1)  # (c, k) each, largest first
            values.append(top.values)
            indices.append(top.indices)
    index = (rows, cols + 1)
    topk_logp = torch.zeros(B, T, k, device=hidden.device)
    topk_ids = torch.zeros(B, T, k, dtype=torch.long, device=hidden.device)
    if values:
        topk_logp = topk_logp.index_put(index, torch.cat(values).float())
        topk_ids = topk_ids.index_put(index, torch.cat(indices))
    return logp, topk_logp, topk_ids
