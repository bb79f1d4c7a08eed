"""Exercise 26 · The three-forces simulator's scoring rule (lesson 26).

Each of D designs has a loss in [0, 1] for each force, in the order (signal, estimator,
cost): losses[d] = (signal loss, estimator loss, cost loss), 0 is best. The user weighs
the forces with three numbers >= 0, not all 0, that need not sum to 1.

Return each design's score, lower is better:

    score[d] = Σ_f w_f · losses[d, f]  +  0.001 · Σ_f losses[d, f]

where w = weights / weights.sum() (the point of the triangle). The second term breaks
exact ties: a design that is worse on a force you gave no weight should still lose.

Check:  posttrain check 26
"""

import torch


def design_scores(losses: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(D,) scores of the (D, 3) losses under the (3,) weights."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 26: write design_scores")
    # ---- END OF YOUR CODE ----
