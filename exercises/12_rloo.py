"""Exercise 12 · RLOO's leave-one-out baseline (lesson 12).

Each sample is judged against the mean reward of the *other* samples of its prompt:

    b_i = (Σ_{j in i's group} r_j − r_i) / (K − 1)

A group of one sample has no others: give it its own reward as baseline (so its
advantage r_i − b_i is 0) rather than dividing by zero. Group ids can be any integers.

Check:  posttrain check 12
"""

import torch


def leave_one_out_baseline(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) baselines from rewards (B,) float and group ids (B,) long."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 12: write leave_one_out_baseline")
    # ---- END OF YOUR CODE ----
