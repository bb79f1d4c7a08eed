"""Exercise 19 · The cost of one weight sync, in four parts (lesson 19).

After each update the trainer's new weights must reach the rollout engines. By an
alpha-beta model (time = bytes / bandwidth, latency left out here), with P parameters:

    all-gather  the trainer's n GPUs each hold 1/n of the master weights (ZeRO-3 / FSDP);
                in a ring each receives the other (n − 1)/n of them, at master_bytes each,
                over the link. One GPU gathers nothing.
    cast        read master_bytes and write engine_bytes per parameter at memory bandwidth;
                nothing to do when the two are equal
    broadcast   the engine-dtype weights cross the link once (a pipelined broadcast costs the
                same whatever the number of receivers); colocated engines read them in place: 0
    reshard     each engine GPU copies its 1/tp slice into place: read + write of
                P · engine_bytes / tp at memory bandwidth

Return the four times in seconds as a float64 tensor [all_gather, cast, broadcast, reshard].

Check:  posttrain check 19
"""

import torch


def weight_sync_parts(parameters: float, train_gpus: int, link_bytes_per_second: float,
                      memory_bytes_per_second: float, master_bytes: float = 4, engine_bytes: float = 2,
                      colocated: bool = False, engine_tensor_parallel: int = 1) -> torch.Tensor:
    """(4,) seconds: all-gather, cast, broadcast, reshard."""
    # ---- YOUR CODE HERE (replace the line below) ----
    raise NotImplementedError("exercise 19: write weight_sync_parts")
    # ---- END OF YOUR CODE ----
