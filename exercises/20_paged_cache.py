"""Exercise 20 · A batch's KV cache: used, reserved contiguously, and paged (lesson 20).

Each token costs `bytes_per_token` of keys and values (every layer's K and V). Sequence b
ends up `lengths[b]` tokens long (prompt + response). Three numbers:

    used        the bytes the tokens themselves hold
    contiguous  every sequence reserves `reserved_tokens` (prompt + max_new_tokens) up front
    paged       every sequence takes whole blocks of `block_tokens`: ceil(length / block) of them

Return them as a float64 tensor [used, contiguous, paged]. (No sequence is longer than its
reservation: the sampler stops it at max_new_tokens.)

Check:  posttrain check 20
"""

import torch


def cache_bytes(lengths: torch.Tensor, reserved_tokens: int, block_tokens: int,
                bytes_per_token: float) -> torch.Tensor:
    """lengths (B,) integer tokens per sequence → (3,) bytes: used, contiguous, paged."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 20: write cache_bytes")
    # ---- END OF YOUR CODE ----
