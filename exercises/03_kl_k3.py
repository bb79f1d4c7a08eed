"""Exercise 03 · the k3 estimator of KL(π ‖ π_ref), per token (lesson 03).

The tokens were sampled from π, so each position gives a one-sample estimate of the KL.
k3 uses r = π_ref / π:

    k3 = r − log r − 1,    r = exp(ref_logp − logp)

It is unbiased (E_π[r] = 1), never negative (log r ≤ r − 1), and exactly 0 where the two
policies agree.

Check:  posttrain check 03
"""

import torch


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate, (B, T), from log π (B, T) and log π_ref (B, T)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 03: write kl_k3")
    # ---- END OF YOUR CODE ----
