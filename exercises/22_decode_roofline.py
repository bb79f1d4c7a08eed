"""Exercise 22 · One decode step against the roofline (lesson 22).

`rows` sequences each append one token after `context_tokens` tokens. Count, for the whole
step (shape is a posttrain.systems.shapes.ModelShape, device a posttrain.systems.hardware.Device):

    FLOPs  rows × (2·N  +  4 · n_layers · n_heads · head_dim · (context_tokens + 1))
           N: the matmul weights a token multiplies through (shapes.matmul_parameter_count);
           the second term is QKᵀ and attention × V against context_tokens + 1 keys
    bytes  N · weight_bytes  (every weight read once, whatever the batch)
           + rows · (context_tokens + 1) · 2 · n_layers · n_kv_heads · head_dim · kv_bytes
           (every row's keys and values, the new token's included)

Return [FLOPs / device.flops_per_second, bytes / device.bytes_per_second] as a float64
tensor: the two times the step cannot beat. The larger one binds.

Check:  posttrain check 22
"""

import torch

from posttrain.systems.shapes import matmul_parameter_count  # noqa: F401 - counting N is not the exercise


def decode_step_times(shape, device, rows: int, context_tokens: int, weight_bytes: float,
                      kv_bytes: float) -> torch.Tensor:
    """(2,) seconds: compute-bound time, memory-bound time."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 22: write decode_step_times")
    # ---- END OF YOUR CODE ----
