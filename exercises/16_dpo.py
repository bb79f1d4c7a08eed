"""Exercise 16 · The DPO loss (lesson 16).

Each argument holds one number per pair: log π(y | x) of a whole answer, summed over its
tokens, under the policy being trained and under the frozen reference. With the
log-ratio margin

    Δ = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r))

the loss is the mean over the B pairs of −log σ(β · Δ). It must stay finite when Δ is
thousands of nats, and carry the gradient.

Check:  posttrain check 16
"""

import torch


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """Scalar loss from four (B,) tensors of summed log-probs and the KL strength β."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 16: write dpo_loss")
    # ---- END OF YOUR CODE ----
