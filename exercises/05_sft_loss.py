"""Exercise 05 · the SFT loss the trainer minimises before any RL (lesson 05).

Supervised fine-tuning maximises the log-likelihood of the demonstration's response
tokens; the prompt is given, not learned. As a loss: the mean negative log-probability
over the positions where response_mask is 1.

    loss = − Σ_{b,t} logp[b, t] · mask[b, t]  /  Σ_{b,t} mask[b, t]

Careful: positions with mask 0 may hold anything, even NaN, and must not change the loss
or its gradient (NaN · 0 is NaN).

Check:  posttrain check 05
"""

import torch


def sft_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar loss from log-probs (B, T) and the response mask (B, T)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 05: write sft_loss")
    # ---- END OF YOUR CODE ----
