"""The code exercises of the first systems lessons (19, 20, 21, 22, 22a) for `posttrain
check`: each one's reference, computed by posttrain/systems, its cases and its hint, as
(function, reference, cases, hint); exercises.py registers them beside the others. The
library's answers are plain Python numbers; the stubs return them as a float64 tensor.
"""

from __future__ import annotations

import torch

from posttrain.systems import gantt
from posttrain.systems.hardware import DEVICES
from posttrain.systems.kv_cache import paged_vs_contiguous
from posttrain.systems.roofline import decode_step
from posttrain.systems.scheduling import speculative_decoding_factor, speculative_tokens_per_pass
from posttrain.systems.shapes import PRESETS, ModelShape
from posttrain.systems.throughput import ROLES, RoleTimes, bottleneck, step_seconds


def _ref_sync_parts(parameters, train_gpus, link, memory, master_bytes=4, engine_bytes=2, colocated=False, tp=1):
    s = gantt.weight_sync(parameters, train_gpus=train_gpus, link_bytes_per_second=link,
                          memory_bytes_per_second=memory, master_bytes=master_bytes, engine_bytes=engine_bytes,
                          colocated=colocated, engine_tensor_parallel=tp)
    return torch.tensor([s.all_gather, s.cast, s.broadcast, s.reshard], dtype=torch.float64)


def _sync_cases():
    P, nvlink, hbm = 7.6e9, 450e9, 3.35e12  # Qwen2.5-7B, an H100's NVLink and HBM
    return [
        ("8 trainers, NVLink, fp32 master to bf16 engines", (P, 8, nvlink, hbm)),
        ("one trainer: nothing to gather", (P, 1, nvlink, hbm)),
        ("colocated: no broadcast", (P, 8, nvlink, hbm, 4, 2, True)),
        ("bf16 master and engine: no cast", (P, 4, 50e9, hbm, 2, 2)),
        ("an engine over 4 GPUs (tensor-parallel 4)", (P, 8, 3.125e9, hbm, 4, 2, False, 4)),
    ]


def _ref_cache_bytes(lengths, reserved_tokens, block_tokens, bytes_per_token):
    # a one-layer, one-head, width-1 shape: 2 · bytes_per_element bytes a token
    one = ModelShape("one", 1, 1, 1, 1, 1, 1, 1, False, 1)
    a = paged_vs_contiguous(one, lengths.tolist(), reserved_tokens, block_tokens, bytes_per_token / 2)
    return torch.tensor([a.used_bytes, a.contiguous_bytes, a.paged_bytes], dtype=torch.float64)


def _cache_cases():
    llama3 = 131072.0  # Llama-3-8B in bf16: 2 · 32 layers · 8 KV heads · 128 · 2 bytes
    return [
        ("three sequences, blocks of 4, by hand", (torch.tensor([5, 8, 1]), 10, 4, 1.0)),
        ("blocks of one token: paged holds exactly the tokens", (torch.tensor([3, 7, 2, 9]), 12, 1, 2.0)),
        ("every sequence at its full reservation", (torch.tensor([16, 16]), 16, 16, 3.0)),
        ("a GRPO batch of Llama-3-8B, blocks of 16", (torch.tensor([300, 1800, 257, 4100, 900, 8448]), 8448, 16,
                                                       llama3)),
    ]


def _ref_decode_times(shape, device, rows, context_tokens, weight_bytes, kv_bytes):
    step = decode_step(shape, device, rows, context_tokens, weight_bytes, kv_bytes)
    return torch.tensor([step.compute_seconds, step.memory_seconds], dtype=torch.float64)


def _decode_roofline_cases():
    h100, l4 = DEVICES["h100-80gb"], DEVICES["l4-24gb"]
    return [
        ("Qwen2.5-7B, one row, bf16 (the weights' read binds)", (PRESETS["qwen2.5-7b"], h100, 1, 1280, 2, 2)),
        ("Qwen2.5-7B, 1024 rows, no context (compute binds)", (PRESETS["qwen2.5-7b"], h100, 1024, 0, 2, 2)),
        ("Llama-2-7B (MHA), 64 rows of 4096, on an L4", (PRESETS["llama-2-7b"], l4, 64, 4096, 2, 2)),
        ("Gemma-2B (MQA, head_dim 256), int8 weights, fp8 cache", (PRESETS["gemma-2b"], h100, 256, 2048, 1, 1)),
        ("gpt_mini in float32", (PRESETS["gpt_mini"], h100, 32, 40, 4, 4)),
    ]


def _ref_step_and_bottleneck(times, topology):
    t = RoleTimes(**times)
    return torch.tensor([step_seconds(t, topology), ROLES.index(bottleneck(t, topology))], dtype=torch.float64)


def _step_cases():
    step = {"rollout": 57.0, "verifier": 0.0, "reference": 2.0, "train": 6.0, "sync": 0.1}
    slow_verifier = {**step, "verifier": 128.0}
    return [
        ("colocated: the sum", (step, "colocated")),
        ("sync (split, lockstep): also the sum", (slow_verifier, "sync")),
        ("async, the rollout binds", (step, "async")),
        ("async, a slow verifier binds the trainer side", (slow_verifier, "async")),
        ("async, the trainer side binds by its update", ({"rollout": 3.0, "verifier": 0.5, "reference": 1.0,
                                                          "train": 2.5, "sync": 0.5}, "async")),
    ]


def _ref_speculative(acceptance, draft_tokens, draft_cost):
    return torch.tensor([speculative_tokens_per_pass(acceptance, draft_tokens),
                         speculative_decoding_factor(acceptance, draft_tokens, draft_cost)], dtype=torch.float64)


def _speculative_cases():
    return [
        ("α = 0.7, γ = 4, c = 0.05", (0.7, 4, 0.05)),
        ("α = 0: every draft rejected, one token a pass", (0.0, 3, 0.05)),
        ("a free draft (c = 0)", (0.5, 6, 0.0)),
        ("α = 0.3, γ = 10: speculation costs more than it yields", (0.3, 10, 0.05)),
        ("α = 0.95, γ = 10", (0.95, 10, 0.1)),
    ]


SYSTEMS_BASICS = {
    "19": ("weight_sync_parts", _ref_sync_parts, _sync_cases,
           "all_gather = (n − 1)/n · P · master_bytes / link (0 when n = 1); cast = P · (master_bytes + "
           "engine_bytes) / memory (0 when they are equal); broadcast = P · engine_bytes / link (0 when "
           "colocated); reshard = 2 · P · engine_bytes / tp / memory. See weight_sync in "
           "posttrain/systems/gantt.py."),
    "20": ("cache_bytes", _ref_cache_bytes, _cache_cases,
           "used = Σ lengths · bytes_per_token; contiguous = B · reserved_tokens · bytes_per_token; paged = "
           "Σ ceil(length / block_tokens) · block_tokens · bytes_per_token (integer ceiling: "
           "(length + block − 1) // block). See paged_vs_contiguous in posttrain/systems/kv_cache.py."),
    "21": ("speculative", _ref_speculative, _speculative_cases,
           "tokens = Σ_{i=0..γ} α^i = (1 − α^(γ+1)) / (1 − α) (the i = 0 term is the target's own token, "
           "so it is 1 at α = 0); factor = (1 + γ·c) / tokens. See speculative_tokens_per_pass in "
           "posttrain/systems/scheduling.py."),
    "22": ("decode_step_times", _ref_decode_times, _decode_roofline_cases,
           "N = matmul_parameter_count(shape); flops = rows · (2N + 4 · layers · n_heads · head_dim · (ctx + 1)) "
           "(n_heads, the query heads, not the KV heads); bytes = N · weight_bytes + rows · (ctx + 1) · 2 · "
           "layers · n_kv_heads · head_dim · kv_bytes. See decode_step in posttrain/systems/roofline.py."),
    "22a": ("step_and_bottleneck", _ref_step_and_bottleneck, _step_cases,
           "τ = sum of the five, or for async max(rollout, the other four summed). Bottleneck: "
           "max(ROLES, key=times.get) for a sum; under async 'rollout' if rollout ≥ the other side, "
           "else the largest of the other four. See step_seconds and bottleneck in "
           "posttrain/systems/throughput.py."),
}

