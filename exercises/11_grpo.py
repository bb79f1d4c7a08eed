"""Exercise 11 · GRPO's group advantages (lesson 11).

Rows with the same group id are the K samples of one prompt. Each row's advantage is its
reward's distance from its group's mean, in units of its group's spread:

    A_i = (r_i − mean of its group) / (std of its group + 1e-6)

with the unbiased std (divide by n − 1). A group of a single sample has std 0 by
convention (there is no spread to estimate), so its advantage is 0 / 1e-6 = 0.
Group ids can be any integers, in any order.

Check:  posttrain check 11
"""

import torch


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """(B,) advantages from rewards (B,) float and group ids (B,) long."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 11: write grpo_advantages")
    # ---- END OF YOUR CODE ----
