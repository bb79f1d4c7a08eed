"""Scaling the rollout and trainer roles out of one process.

    rollout_workers.py  Ray actors that each hold a policy copy: scatter shards, gather
                        episodes, push versioned weights, restart a worker that dies (sync)
    async_rollout.py    the same workers sampling batch s+1..s+k while the trainer updates
    data_parallel.py    a trainer whose ranks all-reduce gradients over torch.distributed (gloo);
                        `--dist.trainer_ranks N` runs the RL trainer on N local processes

The rollout interface these implement, and the single-process rollout, are roles/rollout.py;
the off-policy correction they apply is roles/off_policy.py. Nothing here imports Ray at module
load: a colocated run never needs it.
"""
