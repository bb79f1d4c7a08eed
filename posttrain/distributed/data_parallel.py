"""Data-parallel training over torch.distributed (gloo, so it runs on CPU).

Every rank holds a full replica of the policy (and critic) and its optimizer. For each
optimizer step each rank takes its own contiguous slice of the minibatch rows, computes
the loss and backward on that slice only, and then the ranks all-reduce (sum) their
gradients. Each rank's loss is weighted by its share of the whole minibatch's (of its
tokens for a token-mean loss, of its rows otherwise: Trainer.accumulate), so the sum is
the gradient of the whole minibatch; every rank then clips and steps the same gradient
from the same state, and the replicas stay identical without ever sending weights.

    rank 0: rows [0, B/2)   ─ backward ─┐
                                        ├─ all_reduce(sum) ─ clip ─ AdamW step (same on both)
    rank 1: rows [B/2, B)   ─ backward ─┘

The result equals one process on the whole minibatch for every loss aggregation, up to
the order of float additions in the all-reduce. Logged metrics are each slice's, weighted
the same way.

    DataParallelTrainer  a Trainer on one rank of an initialised group: `_step` slices the
                         rows, weights by the global share, all-reduces before clipping
    RankZeroTrainer      `posttrain train --dist.trainer_ranks N`: the controller process is
                         rank 0 and starts N−1 follower processes (`_follow`) on this machine
    make_trainer         the factory the RL stage calls: a plain Trainer when N = 1
    spawn                N fresh processes in one gloo group, for tests and benchmarks

Every update rank 0 sends its followers the batch and the loss (the algorithm object), so
the algorithm's per-step state (the adaptive KL controller's current kl_coef) travels
with it. Before the first update (and after any
load_state_dict, i.e. a resume) rank 0 broadcasts the weights and the optimizer and
scheduler state, so the replicas start identical and a resumed run continues exactly.
Between updates a follower waits on a pipe from rank 0, not inside a collective: when
rank 0 exits, however it exits, the pipe closes and the follower ends; a follower that
dies breaks rank 0's next collective at once, and rank 0 names it.

On a cluster the ranks would come from `torchrun` or Ray Train instead, one machine (or
set of cores) each; DataParallelTrainer is the same there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import tempfile
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch
import torch.distributed as dist

from posttrain.algorithms.contract import Loss
from posttrain.models.policy import Policy
from posttrain.roles.trainer import Trainer, metrics_of_trained_rows
from posttrain.types import RolloutBatch


def rank_rows(batch_size: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous slice of [0, batch_size): near-equal sizes, every row once."""
    return torch.arange(batch_size * rank // world_size, batch_size * (rank + 1) // world_size)


class DataParallelTrainer(Trainer[Policy]):
    """A Trainer on one rank of an initialised torch.distributed group."""

    allreduce_seconds = 0.0  # wall time spent in the gradient all-reduce (includes waiting for the slowest rank)

    def _step(self, minibatch: RolloutBatch, loss: Loss) -> dict[str, float]:
        rank, world = dist.get_rank(), dist.get_world_size()
        B = minibatch.batch_size
        rows = rank_rows(B, rank, world)
        if rows.numel() == 0:  # its metrics would be missing from the all-reduce, which must match
            raise ValueError(f"rank {rank} of {world} has no rows of a {B}-row minibatch; use at most {B} ranks")
        self.optimizer.zero_grad(set_to_none=True)
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        # each micro-batch weighted by its share of the whole minibatch, not of this rank's slice
        sums = self.accumulate(minibatch, rows, loss)
        # one flat all-reduce instead of one per tensor: gloo's cost is per call
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        keys = sorted(sums)
        flat = torch.cat([flat, torch.tensor([sums[k] for k in keys], dtype=flat.dtype)])
        start = time.perf_counter()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        self.allreduce_seconds += time.perf_counter() - start
        offset = 0
        for p, g in zip(parameters, grads):
            p.grad = flat[offset: offset + g.numel()].view_as(p).clone()
            offset += g.numel()
        out = metrics_of_trained_rows({k: flat[offset + i].item() for i, k in enumerate(keys)})
        norm = torch.nn.utils.clip_grad_norm_(parameters, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        out["grad_norm"] = norm.item()
        return out


# ---------------------------------------------------------------------------------------
# posttrain train --dist.trainer_ranks N: the controller is rank 0, followers on this machine
# ---------------------------------------------------------------------------------------

# The longest one rank waits for another inside a collective. Both ranks do the same work
# between collectives, so only a stalled rank comes near it; a rank that dies closes its
# sockets and the others fail at once. Followers wait for rank 0 between updates (sampling,
# evaluation: minutes) on a pipe, outside any collective, so that wait has no limit.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)


def make_trainer(ranks: int, model: Policy, **trainer_kwargs: Any) -> Trainer[Policy]:
    """The RL stage's trainer role: one process (ranks = 1), or rank 0 of `ranks`."""
    if ranks == 1:
        return Trainer(model, **trainer_kwargs)
    return RankZeroTrainer(ranks, model, **trainer_kwargs)


class RankZeroTrainer(DataParallelTrainer):
    """Rank 0 of a gloo group whose other ranks are follower processes it starts itself.
    The controller uses it as it uses a Trainer; `close()` stops the followers."""

    def __init__(self, ranks: int, model: Policy, critic: torch.nn.Module | None = None,
                 timeout: timedelta = COLLECTIVE_TIMEOUT, **trainer_kwargs: Any):
        super().__init__(model, critic=critic, **trainer_kwargs)
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialised in this process (torchrun?); "
                               "--dist.trainer_ranks starts its own ranks: run without torchrun, "
                               "or with trainer_ranks 1")
        import torch.multiprocessing as mp

        # the rendezvous: a TCP store on a port the OS picks (port 0), so no port can clash and
        # no file is left behind by a killed run; the followers connect to it
        self._store = dist.TCPStore("127.0.0.1", 0, ranks, is_master=True, timeout=timeout, wait_for_workers=False)
        context = mp.get_context("spawn")  # a fresh interpreter: no copied locks, threads or Ray state
        self._followers, self._pipes = [], []
        self._needs_state = True  # the replicas are not yet known to equal this rank
        self._broken = False  # an update failed part-way: followers may sit inside a collective
        try:
            for rank in range(1, ranks):
                pipe, theirs = context.Pipe()
                # daemon: if this process exits without close(), Python still stops them
                process = context.Process(target=_follow, args=(rank, ranks, self._store.port, theirs, timeout),
                                          name=f"posttrain-dp-rank{rank}", daemon=True)
                process.start()
                theirs.close()  # only the follower holds its end: its recv() sees EOF when we exit
                self._followers.append(process)
                self._pipes.append(pipe)
            for process, pipe in zip(self._followers, self._pipes):
                # "started" once torch is imported; a follower that crashes first (EOF) must not hang us
                while not pipe.poll(0.1):
                    self._raise_if_dead()
                try:
                    pipe.recv()
                except EOFError:
                    process.join(timeout=10)
                    self._raise_if_dead()
                    raise
            dist.init_process_group("gloo", store=self._store, rank=0, world_size=ranks, timeout=timeout)
            # the replicas' structure; rank 0's current values follow before the first update
            self._send("init", (model, critic, trainer_kwargs))
        except BaseException:
            self._broken = True
            self.close()
            raise

    def _raise_if_dead(self) -> None:
        for rank, process in enumerate(self._followers, start=1):
            if not process.is_alive():
                self._broken = True
                raise RuntimeError(
                    f"data-parallel trainer rank {rank} (pid {process.pid}) exited with code {process.exitcode} "
                    "(its error, if it printed one, is above); the run stops. `posttrain train --resume RUN_DIR` "
                    "continues from the last checkpoint, with fewer --dist.trainer_ranks if a rank keeps failing")

    def _send(self, command: str, payload: Any) -> None:
        """Wake every follower with `command`, then broadcast `payload` (pickled, so tensors
        are copied: a torch.multiprocessing pipe would share their memory across ranks)."""
        for pipe in self._pipes:
            pipe.send(command)
        dist.broadcast_object_list([payload], src=0)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._needs_state = True  # a resume: the followers must load the same state

    def update(self, batch: RolloutBatch, loss: Loss, epochs: int = 1, minibatches: int = 1,
               generator: torch.Generator | None = None) -> dict[str, float]:
        self._raise_if_dead()
        self.allreduce_seconds = 0.0
        try:
            start = time.perf_counter()
            if self._needs_state:
                self._send("state", (self.model.state_dict(), self.state_dict()))
                self._needs_state = False
            # the loss reads tensors only; episodes (text, details) would just slow the pickle
            self._send("update", (dataclasses.replace(batch, episodes=[]), loss, epochs, minibatches,
                                  generator.get_state() if generator is not None else None))
            send_seconds = time.perf_counter() - start
            metrics = super().update(batch, loss, epochs, minibatches, generator)
        except BaseException as error:
            self._broken = True
            if isinstance(error, Exception):  # gloo: a peer closed its connection, or the timeout passed
                for process in self._followers:
                    process.join(timeout=1.0)  # a rank that is dying: let it finish so we can name it
                self._raise_if_dead()
            raise
        metrics["time/allreduce"] = self.allreduce_seconds
        metrics["time/dp_send"] = send_seconds
        return metrics

    def close(self) -> None:
        """Stop the followers: politely after a clean stage, by signal after a failure."""
        if self._broken or not all(p.is_alive() for p in self._followers):
            for process in self._followers:
                process.terminate()
        else:
            for pipe in self._pipes:
                with contextlib.suppress(OSError):  # a follower that died just now: killed below
                    pipe.send("stop")
        for process in self._followers:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
                process.join()
        self._followers, self._pipes = [], []
        if dist.is_initialized():
            dist.destroy_process_group()
        self._store = None  # stops the rendezvous server


def _follow(rank: int, world_size: int, port: int, pipe: Connection, timeout: timedelta) -> None:
    """A follower rank: hold a replica, and run every update rank 0 asks for."""
    # Ctrl-C reaches every process of the terminal's group; rank 0 alone decides when we stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)  # one core per rank
    parent = os.getppid()
    pipe.send("started")
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    trainer = None
    try:
        while True:
            try:
                command = pipe.recv()
            except EOFError:  # rank 0 exited without close(): nothing left to do
                return
            if command == "stop":
                return
            payload = [None]
            dist.broadcast_object_list(payload, src=0)
            if command == "init":
                model, critic, trainer_kwargs = payload[0]
                trainer = DataParallelTrainer(model, critic=critic, **trainer_kwargs)
            elif command == "state":
                model_state, trainer_state = payload[0]
                trainer.model.load_state_dict(model_state)
                trainer.load_state_dict(trainer_state)
            elif command == "update":
                batch, loss, epochs, minibatches, generator_state = payload[0]
                generator = None
                if generator_state is not None:
                    generator = torch.Generator()
                    generator.set_state(generator_state)
                trainer.update(batch, loss, epochs, minibatches, generator)
    except Exception:
        if os.getppid() != parent:  # rank 0 was killed mid-update: its error is the one to read
            return
        raise
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------
# tests and benchmarks: N fresh processes, all running the same function
# ---------------------------------------------------------------------------------------


def _worker(rank: int, world_size: int, init_file: str, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)  # one core per rank
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *args: Any) -> None:
    """Run fn(rank, world_size, *args) in world_size fresh processes joined in one gloo
    group; fn must be importable (a module-level function)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world_size, os.path.join(tmp, "rendezvous"), fn, args), nprocs=world_size, join=True)
