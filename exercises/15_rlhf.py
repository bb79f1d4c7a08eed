"""Exercise 15 · The Bradley–Terry loss of a reward model (lesson 15).

A rater prefers the chosen answer over the rejected one with probability
σ(r_c − r_r). Maximum likelihood on B pairs, with an optional margin m per pair that the
chosen reward must beat the rejected one by (Llama 2 uses a larger m for pairs the raters
found clearly different), is:

    loss = (1/B) Σ_b −log σ( r_c[b] − r_r[b] − m[b] )

It must stay finite when two rewards are hundreds apart. Return a scalar tensor that
carries the gradient.

Check:  posttrain check 15
"""

import torch


def bt_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor) -> torch.Tensor:
    """Scalar loss from the rewards of the chosen (B,) and rejected (B,) answers, margins (B,)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 15: write bt_loss")
    # ---- END OF YOUR CODE ----
