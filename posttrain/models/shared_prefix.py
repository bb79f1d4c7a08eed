"""Hidden states of a batch whose rows share prompts, each prompt computed once.

A GRPO-family batch holds K completions of every prompt, right-padded into rows of
`prompt + response`. The plain forward runs each prompt K times, in the update and in the
reference, and backward runs it K times again. Here the batch's G distinct prompts run
once (G rows, left-padded so they end in the same column, filling a KV cache), the cache
is copied out to the B rows (an index copy: memory, no FLOPs), and the responses run on
top of it. Backward sends each row's gradient through its copy of the cache into the one
prompt computation, where the K contributions add up to what K separate prompt passes
would have given (the observation behind Prefix Grouper, Liu et al. 2025). The result
equals `model.hidden_states(tokens)` at every real position up to float rounding
(tests/test_shared_prefix.py holds hidden states and gradients to 1e-5).

Any model with the calling convention of GPTMini and HFPolicy works: `hidden_states`
with `attention_mask` and `kv_cache`, `new_cache(rows, max_len)`, and a cache whose
`batch_select_indices` accepts repeated indices.

Shapes: B rows, G distinct prompts, T columns of the right-padded batch, P the longest
prompt, R the longest response, D model width.
"""

from __future__ import annotations

import torch

from posttrain.models.policy import Policy
from posttrain.types import RolloutBatch

# Share only when it leaves out at least this fraction of the batch's real tokens. Sharing
# adds a second pass, a copy of the cache and an attention mask; where almost nothing is
# shared (a short prompt answered twice) the plain forward is the cheaper one.
MIN_SAVED_FRACTION = 0.1
# ... and only for models at least this wide. The FLOPs a shared prompt saves grow with
# width² per token, the cache copied out to the rows with width: a narrow model is bound by
# memory traffic, not FLOPs. gpt_mini (width 128) gains 1.17x alone (BENCHMARKS.md), but
# inside `make run` the fresh copies page-fault (17M minor faults against 2.4M) and its
# reference pass took 54 s instead of 40 s; SmolLM2 (width 576) updates 1.54x faster.
MIN_WIDTH = 256


def prompt_groups(tokens: torch.Tensor, prompt_lengths: torch.Tensor,
                  group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each group (G,), group of each row (B,)), grouping rows by group_id;
    None when every group has one row, or when two rows of a group hold different prompt
    tokens (then the batch is not what its group ids say, and nothing is shared)."""
    labels, group_of_row = torch.unique(group_ids, return_inverse=True)  # (G,), (B,)
    if len(labels) == len(group_ids):
        return None
    rows = torch.arange(len(group_ids), device=group_ids.device)
    # the first row of each group: scatter_reduce keeps the smallest row index per group
    first_rows = torch.full_like(labels, len(group_ids)).scatter_reduce(0, group_of_row, rows, reduce="amin")
    first_of_row = first_rows[group_of_row]  # (B,)
    if not torch.equal(prompt_lengths, prompt_lengths[first_of_row]):
        return None
    columns = torch.arange(tokens.shape[1], device=tokens.device)[None, :]  # (1, T)
    in_prompt = columns < prompt_lengths[:, None]  # (B, T)
    if not torch.equal(tokens * in_prompt, tokens[first_of_row] * in_prompt):
        return None
    return first_rows, group_of_row


def saved_fraction(prompt_lengths: torch.Tensor, first_rows: torch.Tensor, real_tokens: int) -> float:
    """The share of the batch's real tokens that sharing leaves out: every prompt but one per group."""
    return float(prompt_lengths.sum() - prompt_lengths[first_rows].sum()) / max(1, real_tokens)


def batch_hidden_states(model: Policy, batch: RolloutBatch, share_prompt: bool = True) -> torch.Tensor:
    """Final hidden states (B, T, D) of a right-padded batch, as `model.hidden_states(batch.tokens)`
    gives them; with `share_prompt`, each group's prompt is computed once when that saves
    at least MIN_SAVED_FRACTION of the work on a model at least MIN_WIDTH wide (see above)."""
    tokens = batch.tokens
    if not share_prompt or model.config.dim < MIN_WIDTH:
        return model.hidden_states(tokens)  # right padding: a real token never attends to the padding after it
    real_lengths = batch.attention_mask.sum(1).long()  # (B,)
    # the prompt ends at a row's first response token: a multi-turn row's mask has holes (tool
    # output), so counting masked tokens would move environment tokens into the "prompt"
    has_response = batch.response_mask.any(dim=1)  # (B,)
    prompt_lengths = torch.where(has_response, batch.response_mask.argmax(dim=1), real_lengths)  # (B,)
    groups = prompt_groups(tokens, prompt_lengths, batch.group_ids)
    if groups is None or int(prompt_lengths.min()) == 0 or int((real_lengths - prompt_lengths).max()) == 0:
        return model.hidden_states(tokens)
    first_rows, group_of_row = groups
    if saved_fraction(prompt_lengths, first_rows, int(real_lengths.sum())) < MIN_SAVED_FRACTION:
        return model.hidden_states(tokens)
    return shared_prefix_hidden_states(model, tokens, prompt_lengths, real_lengths, first_rows, group_of_row)


def shared_prefix_hidden_states(model: Policy, tokens: torch.Tensor, prompt_lengths: torch.Tensor,
                                real_lengths: torch.Tensor, first_rows: torch.Tensor,
                                group_of_row: torch.Tensor) -> torch.Tensor:
    """The prompt-once forward. Rows of one group must hold the same prompt (prompt_groups)."""
    B, T = tokens.shape
    device = tokens.device
    group_prompt_lengths = prompt_lengths[first_rows]  # (G,)
    P = int(group_prompt_lengths.max())
    response_lengths = real_lengths - prompt_lengths  # (B,)
    R = int(response_lengths.max())

    # 1. the G prompts, left-padded: prompt column c of group g holds its token c - (P - P_g)
    columns = torch.arange(P, device=device)[None, :]  # (1, P)
    source = columns - (P - group_prompt_lengths)[:, None]  # (G, P); negative = padding
    prompt_is_real = source >= 0
    prompt_ids = tokens[first_rows].gather(1, source.clamp(min=0))  # (G, P); padding repeats token 0, masked
    prompt_mask = prompt_is_real.to(torch.float32)
    cache = model.new_cache(len(first_rows), P + R)
    prompt_hidden = model.hidden_states(prompt_ids, attention_mask=prompt_mask, kv_cache=cache)  # (G, P, D)

    # 2. each row's response on top of its group's cached prompt
    cache.batch_select_indices(group_of_row)  # (B rows): row b reads its group's keys and values
    response_columns = torch.arange(R, device=device)[None, :]  # (1, R)
    response_ids = tokens.gather(1, (prompt_lengths[:, None] + response_columns).clamp(max=T - 1))  # (B, R)
    response_is_real = (response_columns < response_lengths[:, None]).to(torch.float32)  # (B, R)
    mask = torch.cat([prompt_mask[group_of_row], response_is_real], dim=1)  # (B, P + R)
    response_hidden = model.hidden_states(response_ids, attention_mask=mask, kv_cache=cache)  # (B, R, D)

    # 3. back to the right-padded layout: in [prompt (left-padded to P) | response] a row's
    # column t of the batch sits at P - P_b + t, for prompt and response positions alike
    shared_layout = torch.cat([prompt_hidden[group_of_row], response_hidden], dim=1)  # (B, P + R, D)
    index = (P - prompt_lengths[:, None] + torch.arange(T, device=device)[None, :]).clamp(max=P + R - 1)  # (B, T)
    # columns past a row's end read a clamped real position: padding, which nothing reads
    return shared_layout.gather(1, index[:, :, None].expand(B, T, shared_layout.shape[-1]))  # (B, T, D)
