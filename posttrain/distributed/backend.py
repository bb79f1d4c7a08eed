"""The rollout role behind one small interface, wherever it runs.

The controller asks for the episodes of a step (`sample(step, round)`), pushes fresh
weights after every update (`push()`), evaluates with a local engine (`engine`), and
checkpoints what the rollout holds between steps (`state_dict()`: the async topology's
batches sampled ahead).
Three implementations (pipelines/build.py::make_rollout picks one):

    ColocatedRollout   the engine lives in the controller's process (today's default)
    RayRollout         N Ray actors each hold a policy copy (rollout_workers.py)
    AsyncRayRollout    the same actors, sampling ahead while the trainer updates (async_rollout.py)

Reproducibility. A step's prompts are cut into `shards` of whole groups and shard i is
sampled with its own seed, derived from (run seed, step, round, i). Sampling a shard is
a pure function of (weights, prompts, seed), and a shard is always sampled as one batch
(same prompts, same padding), so where a shard runs — in this process or on any
worker — does not change a single draw. With one shard the seed is the one the
controller has always used, so colocated runs keep their numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from posttrain.config import SamplingParams
from posttrain.distributed.off_policy import sampler_mismatch
from posttrain.roles.rollout import RolloutEngine
from posttrain.roles.weight_sync import SharedWeights
from posttrain.seeds import derive_seed
from posttrain.types import Episode, Example, RolloutBatch


@dataclass
class RolloutRequest:
    """What one (step, round) samples: K completions of each example, from `seed`."""

    examples: list[Example]
    samples_per_prompt: int
    seed: int


@dataclass
class Shard:
    """Whole groups [first_group, first_group + len(examples)) of a request, with their seed."""

    index: int
    first_group: int
    examples: list[Example]
    seed: int


def split_shards(request: RolloutRequest, shards: int) -> list[Shard]:
    """Contiguous, near-equal runs of whole groups; shard i's seed depends on i alone."""

    n = len(request.examples)
    shards = max(1, min(shards, n))
    bounds = [n * i // shards for i in range(shards + 1)]
    return [Shard(i, bounds[i], request.examples[bounds[i]: bounds[i + 1]],
                  request.seed if shards == 1 else derive_seed(request.seed, "shard", i))
            for i in range(shards)]


# how a shard's episodes are drawn: (engine, examples, samples_per_prompt, generator) -> episodes grouped
# by example; `single_turn` (one completion each) or a multi-turn environment's roles/agent.py::AgentLoop
Sampler = Callable[[RolloutEngine, list[Example], int, torch.Generator], list[Episode]]


def single_turn(engine: RolloutEngine, examples: list[Example], samples_per_prompt: int,
                generator: torch.Generator) -> list[Episode]:
    return engine.generate(examples, samples_per_prompt, generator)


def sample_shard(engine: RolloutEngine, shard: Shard, samples_per_prompt: int,
                 sampler: Sampler = single_turn) -> list[Episode]:
    """The one place a shard is sampled, in the controller or in a worker."""
    episodes = sampler(engine, shard.examples, samples_per_prompt, torch.Generator().manual_seed(shard.seed))
    for e in episodes:  # group ids of the whole step, not of the shard
        e.group_id += shard.first_group
    return episodes


class ColocatedRollout:
    """Today's single process: the engine samples from the trainer's own module, so
    there is one copy of the weights and weight sync is a version bump.

    `mismatch_cap`: None when the engine samples with the trainer's weights (on-policy,
    nothing to correct); a cap C when it samples with other ones (rl.sampling.weights
    int8), so the update corrects with importance weights min(π_trainer / π_sampler, C)."""

    topology = "colocated"

    def __init__(self, policy: torch.nn.Module, tokenizer, params: SamplingParams,
                 request: Callable[[int, int], RolloutRequest], shards: int = 1, sampler: Sampler = single_turn,
                 mismatch_cap: float | None = None):
        self.engine = RolloutEngine(policy, tokenizer, params, shares_weights=True)
        self.sync = SharedWeights(policy, self.engine)
        self.request = request
        self.shards = shards
        self.sampler = sampler  # one completion per episode, or a multi-turn environment's agent loop
        self.mismatch_cap = mismatch_cap

    @property
    def version(self) -> int:
        return self.sync.version

    def sample(self, step: int, round: int = 0) -> list[Episode]:
        request = self.request(step, round)
        return [e for shard in split_shards(request, self.shards)
                for e in sample_shard(self.engine, shard, request.samples_per_prompt, self.sampler)]

    def push(self, version: int | None = None) -> int:
        """Publish the trainer's weights to the engine; `version` restores a saved number."""
        self.sync.push()
        if version is not None:
            self.sync.version = self.engine.weight_version = version
        return self.sync.version

    def off_policy_correction(self, batch: RolloutBatch, trainer) -> tuple[RolloutBatch, dict]:
        if self.mismatch_cap is None:
            return batch, {}  # on-policy: every episode was sampled by the weights about to be updated
        batch, stats = sampler_mismatch(batch, trainer, self.mismatch_cap, self.engine.params.weights)
        return batch, {**stats, f"{self.engine.params.weights}/requantize_seconds": self.engine.requantize_seconds}

    def state_dict(self) -> dict:
        return {}  # nothing sampled ahead: a resumed step samples from the restored weights

    def load_state_dict(self, state: dict) -> None:
        pass

    def step_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


