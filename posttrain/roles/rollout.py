"""Rollout: the role that turns a step's prompts into sampled, versioned episodes.

The controller talks to a rollout through one small interface, `Rollout`, whatever samples
and wherever it runs:

    sample(step, round)    the episodes of a step: K completions of each of its prompts, each
                           stamped with the weight version that sampled it
    push()                 publish the trainer's fresh weights to the engine(s): a new version
    off_policy_correction  what the update must correct for: a sampler that is not the trainer
                           (int8 or bf16, another engine), episodes sampled by older weights
                           (async); one correction for all of them (roles/mismatch.py)
    state_dict()           what the rollout holds between steps (async's batches sampled ahead)
    engine                 the engine in this process, at the current weights: evaluation
                           samples from it

Implementations: `ColocatedRollout` below, the engine in the trainer's process (the default),
and `RayRollout` / `AsyncRayRollout` (distributed/), engines on Ray workers. What samples is an
Engine (roles/engines/), built by `make_engine` from `rl.sampling.engine`.

Reproducibility. A step's prompts are cut into `shards` of whole groups and shard i is
sampled with its own seed, derived from (run seed, step, round, i). Sampling a shard is a
pure function of (weights, prompts, seed), and a shard is always sampled as one batch (same
prompts, same padding), so where a shard runs — in this process or on any worker — does not
change a single draw. With one shard the seed is the one the controller has always used,
so colocated runs keep their numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from posttrain.config import SamplingParams
from posttrain.models.policy import Policy
from posttrain.roles.engines import Engine, make_engine
from posttrain.roles.hooks import CuratedPool
from posttrain.roles.mismatch import Correction, SamplerIsTrainer
from posttrain.roles.trainer import Trainer
from posttrain.roles.weight_sync import make_weight_sync
from posttrain.seeds import derive_seed
from posttrain.types import Environment, Episode, Example, RolloutBatch, Tokenizer


class Rollout(Protocol):
    """The rollout role as the controller sees it (see the module docstring)."""

    topology: str  # "colocated", "sync" (Ray workers) or "async" (Ray workers sampling ahead)
    engine: Engine  # the engine in this process, at the weights of `version`: evaluation samples from it

    @property
    def version(self) -> int:
        """The weight version the engines sample with now (pushes so far)."""
        ...

    @property
    def temperature(self) -> float:
        """The temperature the episodes' log-probs were taken at: the trainer scores at the same one."""
        ...

    def sample(self, step: int, round: int = 0) -> list[Episode]: ...

    def push(self, version: int | None = None) -> int:
        """Publish the trainer's weights; `version` restores a saved number (a resumed run)."""
        ...

    def off_policy_correction(self, batch: RolloutBatch,
                              trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch the update should see (π_old and importance weights where the sampler was
        not the trainer's current policy) and what the correction measured."""
        ...

    def step_metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


@dataclass
class RolloutRequest:
    """What one (step, round) samples: K completions of each example, from `seed`."""

    examples: list[Example]
    samples_per_prompt: int
    seed: int


class StepPrompts:
    """The request of each (step, round): prompts_per_step prompts drawn from the environment's
    train split (or from a curated pool: data/curation.py), each seeded by (seed, step, round)
    alone, so a resumed run draws what an uninterrupted one draws."""

    def __init__(self, env: Environment, prompts_per_step: int, samples_per_prompt: int, seed: int,
                 pool: CuratedPool | None = None):
        self.env, self.pool = env, pool
        self.prompts_per_step, self.samples_per_prompt, self.seed = prompts_per_step, samples_per_prompt, seed

    def __call__(self, step: int, round: int) -> RolloutRequest:
        tag = (step,) if round == 0 else (step, round)  # round 0 draws what a plain step draws
        examples = (self.pool.draw(step, round, self.prompts_per_step) if self.pool is not None else
                    self.env.sample("train", self.prompts_per_step, seed=derive_seed(self.seed, "rl-prompts", *tag)))
        return RolloutRequest(examples, self.samples_per_prompt, derive_seed(self.seed, "rl-sample", *tag))


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
Sampler = Callable[[Engine, list[Example], int, torch.Generator], list[Episode]]


def single_turn(engine: Engine, examples: list[Example], samples_per_prompt: int,
                generator: torch.Generator) -> list[Episode]:
    return engine.generate(examples, samples_per_prompt, generator)


def sample_shard(engine: Engine, shard: Shard, samples_per_prompt: int, sampler: Sampler = single_turn) -> list[Episode]:
    """The one place a shard is sampled, in the controller's process or in a worker."""
    episodes = sampler(engine, shard.examples, samples_per_prompt, torch.Generator().manual_seed(shard.seed))
    for e in episodes:  # group ids of the whole step, not of the shard
        e.group_id += shard.first_group
    return episodes


class ColocatedRollout:
    """The engine in the trainer's process, sampling from the trainer's own module (for an
    engine that shares weights): one copy of the weights, and weight sync is a version bump.

    `correction`: what the update corrects for before it trains (roles/mismatch.py): nothing
    when the engine samples as the trainer does (the default); importance weights when it
    samples with other weights or in another precision (rl.sampling.weights int8, bf16)."""

    topology = "colocated"

    def __init__(self, policy: Policy, tokenizer: Tokenizer, params: SamplingParams,
                 request: Callable[[int, int], RolloutRequest], shards: int = 1, sampler: Sampler = single_turn,
                 correction: Correction = SamplerIsTrainer()):
        self.engine = make_engine(policy, tokenizer, params, shares_weights=True)
        self.sync = make_weight_sync(policy, self.engine)
        self.request = request
        self.shards = shards
        self.sampler = sampler  # one completion per episode, or a multi-turn environment's agent loop
        self.correction = correction

    @property
    def version(self) -> int:
        return self.sync.version

    @property
    def temperature(self) -> float:
        return self.engine.params.temperature or 1.0  # greedy sampling's log-probs are of the T = 1 softmax

    def sample(self, step: int, round: int = 0) -> list[Episode]:
        request = self.request(step, round)
        return [e for shard in split_shards(request, self.shards)
                for e in sample_shard(self.engine, shard, request.samples_per_prompt, self.sampler)]

    def push(self, version: int | None = None) -> int:
        return self.sync.push(version)

    def off_policy_correction(self, batch: RolloutBatch,
                              trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict[str, float]]:
        batch, stats = self.correction.correct(batch, trainer)
        return batch, {**stats, **self.engine.metrics()}  # the engine's: int8's re-quantisation time

    def state_dict(self) -> dict:
        return {}  # nothing sampled ahead: a resumed step samples from the restored weights

    def load_state_dict(self, state: dict) -> None:
        pass

    def step_metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass
