"""Scaling the rollout and trainer roles out of one process.

    backend.py          the rollout interface the controller talks to, and the colocated
                        (single-process) implementation; shards of whole groups
    rollout_workers.py  Ray actors that each hold a policy copy: scatter shards, gather
                        episodes, push versioned weights, restart a worker that dies (sync)
    async_rollout.py    the same workers sampling batch s+1..s+k while the trainer updates
    off_policy.py       staleness of a batch and the truncated importance-sampling correction
    data_parallel.py    a trainer whose ranks all-reduce gradients over torch.distributed (gloo);
                        `--dist.trainer_ranks N` runs the RL trainer on N local processes

Nothing here imports Ray at module load: a colocated run never needs it.
"""
