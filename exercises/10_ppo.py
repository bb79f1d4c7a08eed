"""Exercise 10 · PPO's clipped surrogate loss (lesson 10).

Per response token, with ratio = exp(logp − old_logp):

    loss_t = max( −adv · ratio,  −adv · clamp(ratio, 1 − eps, 1 + eps) )

(the max of the two losses is the min of the two objectives: PPO's pessimism), then the
mean over all response tokens of the batch. old_logp and adv are constants. Positions
with mask 0 may hold NaN; they must not reach the loss or its gradient.

Check:  posttrain check 10   (it compares the gradient too: the clip table of lesson 10)
"""

import torch


def clipped_surrogate_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                           eps: float = 0.2) -> torch.Tensor:
    """Scalar loss; every tensor argument is (B, T)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 10: write clipped_surrogate_loss")
    # ---- END OF YOUR CODE ----
