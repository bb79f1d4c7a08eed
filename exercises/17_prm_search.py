"""Exercise 17 · The unbiased pass@k estimator (lesson 17).

Best-of-k with a perfect verifier solves a problem when any of its k samples is right:
that rate is pass@k. From n ≥ k samples of a problem, c of them right, the unbiased
estimate (Chen et al. 2021) is the chance that k samples drawn from the n without
replacement include at least one of the c right ones:

    pass@k = 1 − C(n − c, k) / C(n, k)        (1 when n − c < k)

`correct` holds c for each of P problems. Return (P,) floats.

Check:  posttrain check 17
"""

import torch


def pass_at_k(n: int, correct: torch.Tensor, k: int) -> torch.Tensor:
    """(P,) pass@k estimates from n samples per problem and the right ones among them (P,)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 17: write pass_at_k")
    # ---- END OF YOUR CODE ----
