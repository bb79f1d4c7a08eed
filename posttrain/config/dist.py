"""Where the rollout and trainer roles run (`dist`): one process, Ray rollout workers in a
sync or async topology, and a data-parallel trainer; a Ray address given with workers is
checked for a listener before anything starts."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from posttrain.config.checks import check, check_non_negative


TOPOLOGIES = ("auto", "colocated", "sync", "async")


@dataclass
class DistConfig:
    """Where the rollout and trainer roles run (posttrain/distributed/). The default is
    today's single process; `--workers N` moves sampling into N Ray actors, and the flag
    `--dist.trainer_ranks N` makes the trainer data-parallel over N processes."""

    workers: int = 0  # Ray rollout actors holding a policy copy; 0 = sample in this process
    # colocated: one process; sync: workers sample, then the trainer updates, then weights are
    # pushed; async: workers sample the next batch while the trainer updates (off-policy by up
    # to max_staleness versions, corrected with importance weights: rl.mismatch). auto = colocated
    # without workers, sync with them.
    topology: str = "auto"
    # the batch's prompts are split into this many shards of whole groups, each sampled with
    # its own seed (seed, step, shard): the shard, not the worker, is the unit of
    # reproducibility, so runs with equal shard counts draw the same samples whatever the
    # worker count. 0 = one shard per worker (1 when colocated: today's single-stream draws)
    rollout_shards: int = 0
    max_staleness: int = 1  # async: a batch is sampled by weights at most this many updates old
    # async: partial rollouts. A batch sampled ahead draws at most this many tokens a row between two
    # weight pushes; a push lands between chunks, and the rows still running continue under the new
    # weights (each token keeps the log-prob of the weights that drew it; the correction weighs it). 0 =
    # off, whole responses from one version: every async number in BENCHMARKS.md was measured that way
    partial_rollout_tokens: int = 0
    ray_address: str = ""  # "" = start a local Ray cluster; else connect (e.g. "auto", "ray://head:10001")
    num_cpus: int = 0  # CPUs of the local cluster Ray starts; 0 = this machine's count
    # the RL trainer role data-parallel over this many processes on this machine (gloo): the
    # controller is rank 0 and starts the others; each takes a slice of every minibatch and
    # the gradients are all-reduced. 1 = one process. Same results up to float rounding;
    # faster only when every rank has cores of its own
    trainer_ranks: int = 1

    def resolved_topology(self) -> str:
        if self.topology == "auto":
            return "sync" if self.workers > 0 else "colocated"
        return self.topology

    def validate(self, prefix: str = "dist") -> None:
        check(self.topology in TOPOLOGIES, f"{prefix}.topology", self.topology, f"one of {list(TOPOLOGIES)}")
        check_non_negative(self, prefix, "workers", "rollout_shards", "num_cpus")
        if self.topology in ("sync", "async"):
            check(self.workers > 0, f"{prefix}.workers", self.workers,
                  f"at least 1 with {prefix}.topology={self.topology!r} (try --workers 2)")
        if self.topology == "colocated":
            check(self.workers == 0, f"{prefix}.workers", self.workers,
                  f"0 with {prefix}.topology='colocated' (or choose topology sync or async)")
        check(self.max_staleness >= 1, f"{prefix}.max_staleness", self.max_staleness,
              "an integer >= 1 (topology sync is the on-policy case)")
        check_non_negative(self, prefix, "partial_rollout_tokens")
        if self.partial_rollout_tokens:
            check(self.resolved_topology() == "async", f"{prefix}.partial_rollout_tokens", self.partial_rollout_tokens,
                  f"0 with {prefix}.topology={self.topology!r}: only the async topology samples ahead of a push "
                  f"(add --dist.topology async, or drop --{prefix}.partial_rollout_tokens)")
        check(isinstance(self.trainer_ranks, int) and self.trainer_ranks >= 1, f"{prefix}.trainer_ranks",
              self.trainer_ranks, "an integer >= 1 (1 = train in this process; N > 1 starts N-1 more trainer processes)")
        if self.ray_address and self.workers > 0:
            # fail now, not after SFT and Ray's own connection timeout (many minutes)
            check(_listening(self.ray_address), f"{prefix}.ray_address", self.ray_address,
                  "the address of a running Ray cluster (nothing answers there; start one with `ray start --head`)")


def _listening(address: str) -> bool:
    """Whether something accepts connections at HOST:PORT (or ray://HOST:PORT); other
    forms ("auto") are left for Ray to resolve."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not port.isdigit():
        return True
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        return True
    except OSError:
        return False
