"""Exercise 09 · the REINFORCE loss (lesson 09).

Its gradient must be the score-function estimator: for each completion, its advantage
times the gradient of its log-probability, which is the sum of its tokens' log-probs.
Averaged over the B completions:

    loss = − (1/B) Σ_b Σ_t mask[b, t] · adv[b, t] · logp[b, t]

B counts every row. Positions with mask 0 (prompt, padding) may hold NaN in logp and adv;
they must not change the loss or its gradient.

Check:  posttrain check 09
"""

import torch


def reinforce_loss(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar loss from log-probs (B, T), advantages (B, T) and the response mask (B, T)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 09: write reinforce_loss")
    # ---- END OF YOUR CODE ----
