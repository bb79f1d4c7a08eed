"""Exercise 27 · Truncated importance weights for off-policy rollouts (lesson 27).

The rollouts were sampled by a behaviour policy (a stale or quantized sampler) with
per-token log-probs behaviour_logp; the trainer's policy gives them old_logp. Return,
per token, the importance weight π_old / π_behaviour = exp(old_logp − behaviour_logp),
capped from above at `cap` (never raised from below), and 0 wherever mask is 0.

All inputs are finite; cap > 0. Shapes: (B, T) tensors, a float cap; return (B, T).

Check:  posttrain check 27
"""

import torch


def truncated_is_weights(old_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """(B, T) min(π_old / π_behaviour, cap) on response tokens, 0 elsewhere."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 27: write truncated_is_weights")
    # ---- END OF YOUR CODE ----
