"""Exercise 04 · compute_advantages, the first half of the algorithm contract (lesson 04).

Write the advantages of "REINFORCE with a group-mean baseline": each completion's reward
minus the mean reward of its group (the K samples of the same prompt), copied onto every
response token, and 0 on every other position. No division by the std.

    A[b, t] = (rewards[b] − mean of rewards over b's group) · response_mask[b, t]

`batch` is a posttrain.types.RolloutBatch: use batch.rewards (B,), batch.group_ids (B,)
and batch.response_mask (B, T). Return a (B, T) tensor.

Check:  posttrain check 04
"""

import torch


def compute_advantages(batch) -> torch.Tensor:
    """(B, T) advantages: reward minus its group's mean, on response tokens only."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 04: write compute_advantages")
    # ---- END OF YOUR CODE ----
