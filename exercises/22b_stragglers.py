"""Exercise 22b · What a ragged batch costs to decode (lesson 22b).

A decode step costs `a` seconds whatever its rows (reading the weights) plus `b` seconds per
row still running (its FLOPs and its KV cache). Given each row's length in tokens, return
the batch's decode time three ways, as a float tensor of 3 numbers:

    static    every row is kept to the end of the batch:       (a + b · n) · max(L)
    packed    a row leaves the batch when it ends:              a · max(L) + b · Σ L
    capped    packed, with every length first cut at `cap`:     the same with min(L, cap)

(A row of length L is alive for L decode steps: that is where Σ L comes from.)

Check:  posttrain check 22b
"""

import torch


def decode_seconds_by_patch(lengths: torch.Tensor, a: float, b: float, cap: float) -> torch.Tensor:
    """(3,) [static, packed, capped] seconds from lengths (n,) of the rows, in tokens."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 22b: write decode_seconds_by_patch")
    # ---- END OF YOUR CODE ----
