"""Exercise 21 · Speculative decoding's yield and cost (lesson 21).

A draft proposes γ = draft_tokens tokens; the target checks them in one pass. Each is accepted
with probability α = acceptance, independently, and the first rejection ends the run; the
target always adds one token of its own. So a pass yields

    E[tokens per pass] = 1 + α + α² + ... + α^γ

and costs 1 + γ·c target steps (c = draft_cost, a draft step's cost relative to a target
step). Decode's time with speculation, as a fraction of plain decoding, is cost / yield.

Return the float64 tensor [E[tokens per pass], decode factor]. α = 0 is allowed (every
draft rejected: one token a pass); α < 1 always.

Check:  posttrain check 21
"""

import torch


def speculative(acceptance: float, draft_tokens: int, draft_cost: float) -> torch.Tensor:
    """(2,): expected tokens per target pass, and decode time × this factor."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 21: write speculative")
    # ---- END OF YOUR CODE ----
