"""Exercise 22c · The schedule of a pipelined RL run (lesson 22c).

Step s samples batch s (rollout_seconds[s]), trains on it (train_seconds[s]) and then
sends the new weights, version s + 1 (sync_seconds). Weight version 0 exists at time 0;
version v + 1 exists once step v's sync has ended. The trainer does one thing at a time:
it trains step s only after batch s is sampled *and* its own previous sync has ended. The
rollout lane also samples one batch at a time. When may rollout s start?

    max_staleness = 0 (sync)    when version s exists: the engines wait for every update
    max_staleness = k ≥ 1       when the rollout lane is free and version s − k exists
                                (for s < k, version 0): the engines run up to k batches ahead

Return when each step's sync ends, as a float tensor of len(rollout_seconds) numbers.
Worked by hand: rollouts [2, 2, 2], updates [1, 1, 1], sync 0.5, k = 1 → [3.5, 5.5, 7.5].

Check:  posttrain check 22c
"""

import torch


def step_end_times(rollout_seconds: list[float], train_seconds: list[float], sync_seconds: float,
                   max_staleness: int) -> torch.Tensor:
    """(S,) the time each step's weight sync ends."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 22c: write step_end_times")
    # ---- END OF YOUR CODE ----
