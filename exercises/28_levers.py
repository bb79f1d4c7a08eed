"""Exercise 28 · What each optimization saves on its own (lesson 28).

`times` gives a step's five terms in seconds: rollout, verifier, reference, train, sync. The
step is their sum when the roles take turns (topology "colocated"), and when the rollout
runs ahead (topology "async") the longer of the rollout and everything else:

    colocated   rollout + verifier + reference + train + sync
    async       max(rollout, verifier + reference + train + sync)

A lever multiplies some roles' times: {"rollout": 0.5} makes sampling twice as fast,
{"reference": 0.0} removes the reference pass. Return the seconds each lever saves when it
is applied alone to `times`, in the order given, as a float tensor.

Check:  posttrain check 28
"""

import torch


def seconds_saved(times: dict[str, float], topology: str, levers: list[dict[str, float]]) -> torch.Tensor:
    """(L,) seconds of the step each lever saves on its own."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 28: write seconds_saved")
    # ---- END OF YOUR CODE ----
