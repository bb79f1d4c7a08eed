"""Rooflines of decoding, prefill and training: FLOPs and bytes per token, and which bounds.

A kernel takes at least max(FLOPs / FLOP/s, bytes moved / bandwidth) (the roofline,
Williams et al. 2009). For a transformer with N matmul weights (shapes.matmul_parameter_count):

    forward FLOPs per token   2·N  +  4·layers·heads·head_dim·context   (QKᵀ and AV)
    training FLOPs per token  3 × forward (backward costs twice the forward), 4 × with
                              activation checkpointing (the forward runs again in backward)
    decode bytes per step     every weight once, whatever the batch, + every row's KV cache

So one decode step of B rows does B × 2N FLOPs but reads the weights once: at small B it
waits on memory, and it turns compute-bound at the crossover batch

    B* ≈ (FLOP/s / bandwidth) × bytes per weight / 2

(~300 rows for bf16 on an H100, ~10 for float32 on this 2-core CPU), later once the KV
cache's reads grow with the context. Prefill runs every prompt token through the weights
at once, so it is compute-bound from a few hundred tokens on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from posttrain.systems.hardware import Device
from posttrain.systems.kv_cache import kv_bytes_per_token
from posttrain.systems.shapes import ModelShape, matmul_parameter_count


@dataclass(frozen=True)
class Roofline:
    """One piece of work against one device: its FLOPs, its bytes, and the time each ceiling allows."""

    flops: float
    bytes: float
    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        """The bound: the slower of the two ceilings."""
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    @property
    def flops_per_byte(self) -> float:
        """Arithmetic intensity: compare with Device.balance_flops_per_byte."""
        return self.flops / self.bytes if self.bytes else math.inf


def roofline(flops: float, bytes_moved: float, device: Device) -> Roofline:
    return Roofline(flops, bytes_moved, flops / device.flops_per_second, bytes_moved / device.bytes_per_second)


def attention_flops_per_token(shape: ModelShape, context_tokens: float) -> float:
    """QKᵀ and attention × V for one new token against `context_tokens` keys, every layer:
    2 FLOPs per multiply-add, head_dim per key per head, twice."""
    return 4 * shape.n_layers * shape.n_heads * shape.head_dim * context_tokens


def forward_flops_per_token(shape: ModelShape, context_tokens: float = 0) -> float:
    """A forward pass through one token that attends to `context_tokens` positions."""
    return 2 * matmul_parameter_count(shape) + attention_flops_per_token(shape, context_tokens)


def decode_step(shape: ModelShape, device: Device, rows: int, context_tokens: float, weight_bytes: float,
                kv_bytes: float) -> Roofline:
    """One decoding step: `rows` sequences each append one token after `context_tokens`.
    Bytes: every matmul weight read once (`weight_bytes` each) and every row's cache read
    (its new K, V written too); the embedding row lookups are negligible."""
    flops = rows * forward_flops_per_token(shape, context_tokens + 1)
    kv = kv_bytes_per_token(shape, kv_bytes)
    moved = matmul_parameter_count(shape) * weight_bytes + rows * (context_tokens + 1) * kv
    return roofline(flops, moved, device)


def decode_bytes_per_token(shape: ModelShape, rows: int, context_tokens: float, weight_bytes: float,
                           kv_bytes: float) -> float:
    """Bytes moved per generated token at this batch: the weights' read shared by `rows`."""
    kv = kv_bytes_per_token(shape, kv_bytes)
    return matmul_parameter_count(shape) * weight_bytes / rows + (context_tokens + 1) * kv


def prefill(shape: ModelShape, device: Device, rows: int, prompt_tokens: int, weight_bytes: float,
            kv_bytes: float) -> Roofline:
    """`rows` prompts of `prompt_tokens` each in one pass: token t attends to t + 1
    positions (causal), so the attention FLOPs sum to T(T+1)/2 keys per row; the bytes are
    one read of the weights and the cache written."""
    T = prompt_tokens
    flops = rows * (2 * matmul_parameter_count(shape) * T + attention_flops_per_token(shape, T * (T + 1) / 2))
    moved = matmul_parameter_count(shape) * weight_bytes + rows * T * kv_bytes_per_token(shape, kv_bytes)
    return roofline(flops, moved, device)


def crossover_rows(shape: ModelShape, device: Device, context_tokens: float, weight_bytes: float,
                   kv_bytes: float) -> float:
    """The decode batch at which compute time catches up with memory time, for rows of
    `context_tokens` context: solve B·f/F = (W + B·c)/BW for B, with f the FLOPs per token,
    W the weight bytes and c one row's cache bytes. math.inf when it never does (a long
    context's cache reads grow as fast as the FLOPs: attention alone is bandwidth-bound)."""
    f = forward_flops_per_token(shape, context_tokens + 1)
    W = matmul_parameter_count(shape) * weight_bytes
    c = (context_tokens + 1) * kv_bytes_per_token(shape, kv_bytes)
    per_row_gap = f / device.flops_per_second - c / device.bytes_per_second
    return W / device.bytes_per_second / per_row_gap if per_row_gap > 0 else math.inf


def decode_seconds(shape: ModelShape, device: Device, active_rows: list[int], prompt_tokens: int,
                   weight_bytes: float, kv_bytes: float) -> float:
    """A whole decode whose step t runs `active_rows[t]` rows (rows leave as they finish,
    as our sampler drops them): the sum of each step's bound."""
    return sum(decode_step(shape, device, n, prompt_tokens + t, weight_bytes, kv_bytes).seconds
               for t, n in enumerate(active_rows) if n > 0)


def training_flops_per_token(shape: ModelShape, context_tokens: float, checkpointing: bool = False) -> float:
    """Forward + backward through one token (Kaplan et al. 2020's 6N, plus attention):
    backward costs two forwards (gradients w.r.t. activations and w.r.t. weights);
    activation checkpointing runs the forward once more."""
    return (4 if checkpointing else 3) * forward_flops_per_token(shape, context_tokens)


def train_pass(shape: ModelShape, device: Device, tokens: int, mean_context: float, weight_bytes: float,
               checkpointing: bool = False) -> Roofline:
    """Forward + backward over `tokens` tokens in batches: compute-bound (the weights are
    read about three times per micro-batch, which large micro-batches make negligible)."""
    flops = tokens * training_flops_per_token(shape, mean_context, checkpointing)
    return roofline(flops, 3 * matmul_parameter_count(shape) * weight_bytes, device)


def optimizer_step(device: Device, trained_parameters: int, bytes_per_parameter: float = 28) -> Roofline:
    """The optimizer's pass over its state, no FLOPs to speak of: AdamW on float32 reads
    weight, gradient, m and v and writes weight, m and v, 7 × 4 = 28 bytes a parameter. It
    runs after the backward pass, not beside it: add its time to the train pass's."""
    return roofline(10 * trained_parameters, trained_parameters * bytes_per_parameter, device)


def forward_pass(shape: ModelShape, device: Device, tokens: int, mean_context: float, weight_bytes: float) -> Roofline:
    """A no-gradient forward over `tokens` tokens in large batches (the reference's pass):
    compute-bound unless the batch is tiny."""
    flops = tokens * forward_flops_per_token(shape, mean_context)
    return roofline(flops, matmul_parameter_count(shape) * weight_bytes, device)


def low_precision_decode_speedup(shape: ModelShape, device: Device, rows: int, context_tokens: float,
                                 weight_bytes: float, low_weight_bytes: float, kv_bytes: float) -> float:
    """How much faster a decode step runs with weights of `low_weight_bytes` (int8/fp8: 1)
    instead of `weight_bytes`: the ratio of the two bounds. Up to weight_bytes /
    low_weight_bytes while the weights' read binds (few rows, short context), nothing once
    the step is compute-bound or the KV cache's reads dominate. (The kernels must also
    compute at low precision for the compute bound to move; this counts bytes only.)"""
    high = decode_step(shape, device, rows, context_tokens, weight_bytes, kv_bytes).seconds
    return high / decode_step(shape, device, rows, context_tokens, low_weight_bytes, kv_bytes).seconds
