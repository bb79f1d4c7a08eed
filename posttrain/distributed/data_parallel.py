"""Data-parallel training over torch.distributed (gloo, so it runs on CPU).

Every rank holds a full replica of the policy and its optimizer. For each optimizer
step each rank takes its own contiguous slice of the minibatch rows, computes the loss
and backward on that slice only, and then the ranks all-reduce (sum) their gradients.
Each rank's loss is weighted by its share of the rows, so the sum is the gradient of the
whole minibatch; every rank then clips and steps the same gradient from the same state,
and the replicas stay identical without ever sending weights.

    rank 0: rows [0, B/2)   ─ backward ─┐
                                        ├─ all_reduce(sum) ─ clip ─ AdamW step (same on both)
    rank 1: rows [B/2, B)   ─ backward ─┘

The result equals one process on the whole minibatch exactly for losses that average
per sequence (`seq-mean-*` aggregations, GRPO's default) and up to the usual
per-shard token-mean approximation for `token-mean` (see Trainer._step).

`DataParallelTrainer` differs from `Trainer` in `_step` only: slice the rows, weight by
the global share, and the all-reduce before clipping. `spawn` starts N CPU processes
that join one gloo group, for tests, benchmarks and single-machine use; on a cluster the
ranks come from `torchrun` or Ray Train instead, and the class is the same.
"""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict
from typing import Callable

import torch
import torch.distributed as dist

from posttrain.roles.trainer import LossFn, Trainer
from posttrain.types import RolloutBatch


def rank_rows(batch_size: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous slice of [0, batch_size): near-equal sizes, every row once."""
    return torch.arange(batch_size * rank // world_size, batch_size * (rank + 1) // world_size)


class DataParallelTrainer(Trainer):
    """A Trainer on one rank of an initialised torch.distributed group."""

    def _step(self, minibatch: RolloutBatch, loss_fn: LossFn) -> dict[str, float]:
        rank, world = dist.get_rank(), dist.get_world_size()
        B = minibatch.batch_size
        local = minibatch.select(rank_rows(B, rank, world))
        self.optimizer.zero_grad(set_to_none=True)
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        size = self.micro_batch_size or max(1, local.batch_size)
        sums: dict[str, float] = defaultdict(float)
        for start in range(0, local.batch_size, size):
            micro = local.select(torch.arange(start, min(local.batch_size, start + size)))
            share = micro.batch_size / B  # of the whole minibatch, not of this rank's slice
            loss, metrics = loss_fn(self.forward(micro), micro)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"rank {rank}: the loss is {loss.item()} (not finite); metrics {metrics}")
            (loss * share).backward()
            for key, value in metrics.items():
                sums[key] += value * share
        # one flat all-reduce instead of one per tensor: gloo's cost is per call
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        keys = sorted(sums)
        flat = torch.cat([flat, torch.tensor([sums[k] for k in keys], dtype=flat.dtype)])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p, g in zip(parameters, grads):
            p.grad = flat[offset: offset + g.numel()].view_as(p).clone()
            offset += g.numel()
        out = {k: flat[offset + i].item() for i, k in enumerate(keys)}
        norm = torch.nn.utils.clip_grad_norm_(parameters, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        out["grad_norm"] = norm.item()
        return out


def _worker(rank: int, world_size: int, init_file: str, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)  # one core per rank
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *args) -> None:
    """Run fn(rank, world_size, *args) in world_size fresh processes joined in one gloo
    group; fn must be importable (a module-level function)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world_size, os.path.join(tmp, "rendezvous"), fn, args), nprocs=world_size, join=True)
