"""This machine, measured: what the systems lessons (19-22a) set beside the formulas of
posttrain/systems/, and what tests/test_systems_measured.py checks those formulas against.

    sampler_cache_bytes     the bytes of keys and values our sampler's cache holds once each
                            prompt's prefill is copied out to its K rows (kv_cache.sampler_kv_bytes)
    saved_activation_bytes  the bytes autograd keeps for backward in one forward pass
                            (memory.activation_bytes)
    training_state_held     the bytes a Trainer holds per piece of training state after a step:
                            weights, gradients, AdamW's moments (memory.training_state_bytes)

They call the library's real objects (Engine, the models, the Trainer's
optimizer) and only watch.
"""

from __future__ import annotations

import torch

from posttrain.config import SamplingParams
from posttrain.roles.engines import Engine, make_engine
from posttrain.types import Tokenizer


def held_cache_bytes(cache) -> int:
    """Bytes of the keys and values a sampler's cache holds: GPTMini's KVCache or the
    preallocated layers of a transformers Cache (models/hf.py)."""
    if isinstance(getattr(cache, "keys", None), list):
        return sum(t.numel() * t.element_size() for t in cache.keys + cache.values)
    return sum(layer.key_buffer.numel() * layer.key_buffer.element_size() * 2 for layer in cache.layers
               if layer.is_initialized)


def sampler_cache_bytes(model, tokenizer: Tokenizer, examples, samples_per_prompt: int, max_new_tokens: int,
                        seed: int = 0) -> int:
    """Sample with the real engine and record what its cache holds once each prompt's
    prefill has been copied out to its K rows (the cache's first batch_select_indices: the
    largest it gets, since dropping finished rows only shrinks it)."""
    held, new_cache = [], model.new_cache

    def recording(*args, **kwargs):
        cache = new_cache(*args, **kwargs)
        select = cache.batch_select_indices

        def select_and_record(indices):
            select(indices)
            held.append(held_cache_bytes(cache))
        cache.batch_select_indices = select_and_record
        return cache

    model.new_cache = recording  # an instance attribute over the method: watched for this call only
    try:
        make_engine(model, tokenizer, SamplingParams(max_new_tokens=max_new_tokens)).generate(
            examples, samples_per_prompt, torch.Generator().manual_seed(seed))
    finally:
        del model.new_cache
    if not held:
        raise RuntimeError("the sampler never copied its prefill out to the rows: nothing was measured")
    return held[0]


def saved_activation_bytes(model, input_ids: torch.Tensor) -> int:
    """Bytes autograd saves for backward in a forward pass over input_ids (B, T), each
    storage once, the model's own parameters and buffers left out."""
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in own:
            saved[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.hidden_states(input_ids)
    return sum(saved.values())


def training_state_held(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes the training state holds now: {"weights", "grads", "optimizer"} (the moments,
    tensors shaped like their parameter) and "optimizer other" (AdamW's step counters, one
    scalar per tensor). Call it after a step, once the optimizer's state exists."""
    params = [p for p in model.parameters() if p.requires_grad]
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    moments = other = 0
    for p in params:
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                moments += nbytes(value)
            elif isinstance(value, torch.Tensor):
                other += nbytes(value)
    return {"weights": sum(nbytes(p) for p in params),
            "grads": sum(nbytes(p.grad) for p in params if p.grad is not None),
            "optimizer": moments, "optimizer other": other}
