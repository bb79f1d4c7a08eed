"""Exercise 08 · the masked mean that makes tool masking safe (lesson 08).

Every loss in the library reduces per-token values with a masked mean over the response
mask. Lesson 08 showed why it must be airtight: the tool's tokens (mask 0) may hold
anything, even NaN, and must not reach the result or its gradient.

    masked_mean(x, mask) = Σ x · mask / Σ mask     over the positions where mask is 1

and 0 (not NaN) when the mask is all zero.

Check:  posttrain check 08
"""

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scalar mean of x (B, T) over the positions where mask (B, T) is 1."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 08: write masked_mean")
    # ---- END OF YOUR CODE ----
