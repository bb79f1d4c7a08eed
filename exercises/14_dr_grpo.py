"""Exercise 14 · Dr. GRPO's loss aggregation, "seq-mean-token-sum-norm" (lesson 14).

GRPO divides each response's summed token losses by the response's own length |o_i|.
Dr. GRPO divides by a constant, the generation budget max_len, instead:

    loss = (1/B) Σ_b ( Σ_t loss_mat[b, t] · mask[b, t] ) / max_len

B counts every row. Positions with mask 0 may hold NaN; they must not reach the result
or its gradient.

Check:  posttrain check 14
"""

import torch


def seq_mean_token_sum_norm(loss_mat: torch.Tensor, mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """Scalar from per-token losses (B, T) and the response mask (B, T)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 14: write seq_mean_token_sum_norm")
    # ---- END OF YOUR CODE ----
