"""The KV cache: what decoding keeps per token, and three ways to allocate it.

Each layer stores one key and one value vector per token, each of n_kv_heads × head_dim
numbers, so a token costs

    kv_bytes_per_token = 2 (K and V) × n_layers × n_kv_heads × head_dim × bytes per element

MHA keeps a K/V head per query head; GQA shares one among a group (Llama-3-8B: 8 for 32
query heads, a quarter of MHA's cache); MQA keeps a single one (Shazeer 2019).

How the cache is allocated decides how much of it holds tokens:

    contiguous   every sequence reserves prompt + max_new_tokens up front (what our sampler
                 does, roles/rollout.py, and what servers did before vLLM); a sequence that
                 stops early leaves the rest of its reservation empty
    paged        fixed blocks of B tokens, taken as the sequence grows (PagedAttention, Kwon
                 et al. 2023, https://arxiv.org/abs/2309.06180): at most one partly filled
                 block per sequence is wasted
    prefix tree  K samples of one prompt hold the prompt's blocks once (RadixAttention,
                 Zheng et al. 2024, https://arxiv.org/abs/2312.07104): a GRPO group of K
                 stores P + K·R tokens instead of K·(P + R)

Every function takes token counts and bytes per element and returns bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from posttrain.systems.shapes import ModelShape


def kv_bytes_per_token(shape: ModelShape, bytes_per_element: float) -> float:
    """Keys and values of one token in every layer."""
    return 2 * shape.n_layers * shape.kv_dim * bytes_per_element


def kv_bytes_per_sequence(shape: ModelShape, tokens: int, bytes_per_element: float) -> float:
    """One sequence of `tokens` tokens (prompt and response together)."""
    return tokens * kv_bytes_per_token(shape, bytes_per_element)


def kv_cache_bytes(shape: ModelShape, rows: int, positions: int, bytes_per_element: float) -> float:
    """A contiguous cache of `rows` sequences, each with room for `positions` tokens: the
    (rows, n_kv_heads, positions, head_dim) key and value tensors of every layer."""
    return rows * kv_bytes_per_sequence(shape, positions, bytes_per_element)


def sampler_kv_bytes(shape: ModelShape, prompts: int, samples_per_prompt: int, longest_prompt_tokens: int,
                     max_new_tokens: int, bytes_per_element: float) -> float:
    """What our sampler's cache holds once each prompt's prefill has been copied out to its
    K rows (roles/rollout.py `_sample_rows`): prompts × K rows, each with a column for every
    position of the left-padded batch, longest prompt + max_new_tokens.

    The prefill itself fills a cache of `prompts` rows (each distinct prompt runs once), and
    while it is copied out both exist, so the allocator briefly holds (prompts + prompts × K)
    rows. Rows that finish are dropped by copying the cache again, which only shrinks it."""
    return kv_cache_bytes(shape, prompts * samples_per_prompt, longest_prompt_tokens + max_new_tokens,
                          bytes_per_element)


@dataclass(frozen=True)
class CacheAllocation:
    """The same sequences under a contiguous and a paged allocation, in bytes."""

    used_bytes: float  # the tokens the sequences hold
    contiguous_bytes: float  # every sequence's full reservation
    paged_bytes: float  # whole blocks only
    block_tokens: int

    @property
    def contiguous_waste(self) -> float:
        """Fraction of the contiguous allocation that holds no token."""
        return 1 - self.used_bytes / self.contiguous_bytes if self.contiguous_bytes else 0.0

    @property
    def paged_waste(self) -> float:
        """Fraction of the paged allocation that holds no token: under one block per sequence."""
        return 1 - self.used_bytes / self.paged_bytes if self.paged_bytes else 0.0


def paged_vs_contiguous(shape: ModelShape, lengths: list[int], reserved_tokens: int, block_tokens: int,
                        bytes_per_element: float) -> CacheAllocation:
    """The cache of sequences of `lengths` tokens each (prompt + response, as they end up),
    allocated contiguously (`reserved_tokens` per sequence: prompt + max_new_tokens) or in
    blocks of `block_tokens` (vLLM's default block is 16 tokens)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens={block_tokens}: a block holds at least one token (vLLM uses 16)")
    too_long = [n for n in lengths if n > reserved_tokens]
    if too_long:
        raise ValueError(f"a sequence of {max(too_long)} tokens does not fit its reservation of {reserved_tokens}: "
                         "reserve prompt + max_new_tokens")
    per_token = kv_bytes_per_token(shape, bytes_per_element)
    used = sum(lengths) * per_token
    contiguous = len(lengths) * reserved_tokens * per_token
    paged = sum(math.ceil(n / block_tokens) * block_tokens for n in lengths) * per_token
    return CacheAllocation(used, contiguous, paged, block_tokens)


@dataclass(frozen=True)
class PrefixSharing:
    """A batch of G prompts × K samples with and without a shared prefix tree, in bytes."""

    separate_bytes: float  # every sample holds its own copy of the prompt
    shared_bytes: float  # each prompt once, plus each sample's response

    @property
    def saved_fraction(self) -> float:
        return 1 - self.shared_bytes / self.separate_bytes if self.separate_bytes else 0.0


def prefix_sharing(shape: ModelShape, prompts: int, samples_per_prompt: int, prompt_tokens: int,
                   response_tokens: float, bytes_per_element: float, system_tokens: int = 0,
                   block_tokens: int = 1) -> PrefixSharing:
    """KV bytes of `prompts` groups of K samples (mean `response_tokens` each), every prompt
    of `prompt_tokens` tokens after a `system_tokens` preamble common to all prompts.

    Separate: G·K·(S + P + R) tokens. Shared (a radix tree over the batch): S + G·(P + K·R).
    With blocks of more than one token, a prefix that ends inside a block cannot share that
    block (the K samples write different tokens after it), so each sample copies it:
    up to block_tokens − 1 more tokens per sample, counted here as the partial block."""
    G, K = prompts, samples_per_prompt
    if G < 1 or K < 1:
        raise ValueError(f"prompts={G}, samples_per_prompt={K}: both must be at least 1")
    per_token = kv_bytes_per_token(shape, bytes_per_element)
    separate = G * K * (system_tokens + prompt_tokens + response_tokens)
    partial = (system_tokens + prompt_tokens) % block_tokens  # the shared prefix's last, partly filled block
    shared = system_tokens + G * (prompt_tokens + K * (response_tokens + partial))
    return PrefixSharing(separate * per_token, shared * per_token)


def max_cached_tokens(shape: ModelShape, free_bytes: float, bytes_per_element: float) -> int:
    """How many tokens of KV cache `free_bytes` hold: the batch × context an inference
    engine can keep in flight after its weights are loaded."""
    return max(0, int(free_bytes // kv_bytes_per_token(shape, bytes_per_element)))
