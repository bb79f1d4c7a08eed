"""Exercise 13 · DAPO's soft overlong penalty (lesson 13).

A response may use max_len − cache_len tokens for free. Over the last cache_len tokens
of the budget the penalty ramps linearly from 0 down to −1, and beyond the budget it
stays at −1:

    R(len) = 0                                         len ≤ max_len − cache_len
           = ((max_len − cache_len) − len) / cache_len  up to max_len
           = −1                                        len > max_len

cache_len = 0 switches the penalty off (all zeros). Return float32.

Check:  posttrain check 13
"""

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """(B,) penalties from response lengths (B,) long."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 13: write overlong_penalty")
    # ---- END OF YOUR CODE ----
