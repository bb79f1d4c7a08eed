"""Exercise 22a · The throughput equation (lesson 22a).

`times` maps the five roles, in this order, to seconds per step:

    ROLES = ("rollout", "verifier", "reference", "train", "sync")

    colocated or sync   τ = the sum of the five
    async               τ = max(rollout, verifier + reference + train + sync)

The bottleneck is the role whose speed-up shortens the step most: the largest term; under
async only a role on the side of the max that binds (the rollout when rollout ≥ the other
side, else the largest of the other four). On ties, the role that comes first in ROLES.

Return a float64 tensor [τ, index of the bottleneck in ROLES].

Check:  posttrain check 22a
"""

import torch

ROLES = ("rollout", "verifier", "reference", "train", "sync")


def step_and_bottleneck(times: dict[str, float], topology: str) -> torch.Tensor:
    """(2,): seconds per step, and ROLES.index(the bottleneck)."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 22a: write step_and_bottleneck")
    # ---- END OF YOUR CODE ----
