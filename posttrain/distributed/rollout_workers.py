"""Rollout workers as Ray actors: scatter shards of prompts, gather episodes, push
versioned weights, and survive a worker that dies.

    controller                        worker 0            worker 1
    ----------                        --------            --------
    split the step's prompts into shards
    sample(shard 0) ───────────────►  generate
    sample(shard 1) ─────────────────────────────────────► generate
    gather (shard order) ◄──────────  episodes  ◄──────── episodes
    score, reference, update
    push(state_dict, version) ─────►  load        ──────► load

Each worker holds its own copy of the policy in an engine (the same sampler the
colocated run uses, see roles/rollout.py::sample_shard), and stamps every episode with the weight
version it sampled with. With `rl.sampling.engine vllm` that engine is vLLM's LLM inside the
worker: the sampler in a process of its own, sent the trainer's parameters that train at every
push (all of them, or a LoRA policy's adapters) and copying them into vLLM's there. Each shard comes back
with the worker's engine metrics (vllm/load_weights_seconds and _mb: what its last load cost),
logged as the step's. The controller's own copy, for dev-set evaluation, is always the torch
engine: the rollout role starts no vLLM beside the trainer, nor reserves a KV cache there (the
held-out evaluations before and after RL, pipelines/run.py, still sample with the chosen engine).

Fault handling. A worker is a restartable actor (`max_restarts`). When one dies mid-call
the gather sees RayActorError, waits for Ray to bring the actor back, pushes it the
current weights and version, and re-issues exactly the shards that worker had not
returned. Episodes only enter the batch when a whole shard comes back, so none is lost
and none is counted twice; a re-issued shard keeps its seed and, in the synchronous
topology, the weights, so it even draws the same samples the lost call would have. A
restarted actor that was killed between calls comes back without weights (version -1):
it refuses to sample, and the same recovery applies.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from typing import Any, Callable

import torch

from posttrain.config import ConfigError, DistConfig, SamplingParams
from posttrain.models.policy import Policy
from posttrain.roles.engines import make_engine
from posttrain.roles.engines.contract import PartialRows, ResumableEngine, example_prompt_ids
from posttrain.roles.mismatch import Correction, SamplerIsTrainer
from posttrain.roles.off_policy import staleness_stats
from posttrain.roles.rollout import RolloutRequest, Sampler, Shard, sample_shard, single_turn, split_shards
from posttrain.roles.trainer import Trainer
from posttrain.runs.console import console
from posttrain.types import Episode, RolloutBatch, Tokenizer

# A worker that keeps dying is a bug to look at, not something to retry forever.
MAX_RESTARTS = 4
RESTART_TIMEOUT_S = 120.0  # a restart re-imports torch and rebuilds the model: seconds, not minutes


@dataclasses.dataclass
class PushedWeights:
    """The trained tensors of a state dict as a push sends them, each tensor once. Ray
    serialises every value of a dict on its own, so a tensor under two names (a tied embedding
    and LM head) would cross twice: SmolLM2-135M's 113 MB embedding, a sixth of its push."""

    tensors: dict[str, torch.Tensor]  # a copy of each distinct tensor, under the first name that holds it
    holders: dict[str, str]  # every name of the state dict, in its order -> its name in `tensors`

    @classmethod
    def copy_of(cls, state: dict[str, torch.Tensor]) -> PushedWeights:
        first: dict[tuple, str] = {}  # where a tensor's storage, shape and layout were first seen
        tensors, holders = {}, {}
        for name, tensor in state.items():
            holder = first.setdefault((tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype), name)
            if holder == name:  # a copy: the trainer keeps updating its own tensors while the workers load these
                tensors[name] = tensor.detach().clone()
            holders[name] = holder
        return cls(tensors, holders)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Every name again, a tied pair as one tensor (so an engine that counts bytes counts it once)."""
        return {name: self.tensors[holder] for name, holder in self.holders.items()}


# what a worker's sampling call returns: (its pid, the shard's episodes or None, seconds sampling, its engine's metrics)
ShardResult = tuple[int, list[Episode] | None, float, dict[str, float]]


class RolloutWorker:
    """The body of one Ray actor (wrapped by ray.remote in RayRollout)."""

    def __init__(self, model: Policy, tokenizer: Tokenizer, params: SamplingParams, sampler: Sampler = single_turn):
        # one intra-op thread per worker, as it holds one Ray CPU. (Sampled numbers can
        # depend on the thread count, so a single-process run reproduces a distributed
        # one exactly with --threads 1.)
        torch.set_num_threads(1)
        self.engine = make_engine(model, tokenizer, params)
        # the weights this worker was built with (also after a restart: the run's first policy); a push
        # replaces the trained ones, and the frozen ones (LoRA's base) never cross again
        self.weights = model.state_dict()
        self.engine.weight_version = -1  # no weights pushed yet (also what a restarted actor has)
        self.sampler = sampler  # single-turn completions, or a multi-turn environment's agent loop (a copy of it)
        self.crash_armed = False
        # partial rollouts (async_rollout.py): (step, shard index) -> (shard, its rows so far, seconds spent on them)
        self.partials: dict[tuple[int, int], tuple[Shard, PartialRows, float]] = {}

    def load_weights(self, weights: PushedWeights, version: int) -> tuple[int, int]:
        self.weights.update(weights.state_dict())
        self.engine.load_weights(self.weights)  # an engine that loads only what changed (vLLM's LoRA) picks it
        self.engine.weight_version = version
        return self.status()

    def sample(self, shard: Shard, samples_per_prompt: int, min_version: int) -> ShardResult:
        """(pid, episodes, seconds, engine metrics); episodes is None when this worker's weights
        are older than `min_version` (it restarted and has not been given weights yet)."""
        if self.engine.weight_version < min_version:
            return os.getpid(), None, 0.0, {}
        if self.crash_armed:  # fault drills: die in the middle of a call, as an OOM kill would
            os._exit(1)
        start = time.perf_counter()
        episodes = sample_shard(self.engine, shard, samples_per_prompt, self.sampler)
        return os.getpid(), episodes, time.perf_counter() - start, self.engine.metrics()

    # -- partial rollouts: a shard sampled a chunk at a time, its rows kept here between calls -----

    def start_partial(self, key: tuple[int, int], shard: Shard, samples_per_prompt: int, tokens: int) -> None:
        """Begin the shard's rows and draw their first `tokens` tokens. A worker without
        weights (restarted) keeps nothing, and the shard's finish call reports it missing."""
        if not self.resumable() or self.engine.weight_version < 0:
            return
        prompts = [example_prompt_ids(self.engine.tokenizer, e) for e in shard.examples]
        rows = PartialRows.start(prompts, samples_per_prompt, self.engine.params.max_new_tokens,
                                 torch.Generator().manual_seed(shard.seed))
        self.partials[key] = (shard, rows, 0.0)
        self.advance_partial(key, tokens)

    def advance_partial(self, key: tuple[int, int], tokens: int) -> None:
        if key not in self.partials or not isinstance(self.engine, ResumableEngine):
            return  # lost with a restart (or never begun): the finish call says so
        shard, rows, seconds = self.partials[key]
        start = time.perf_counter()
        self.engine.advance(rows, tokens)
        self.partials[key] = (shard, rows, seconds + time.perf_counter() - start)

    def finish_partial(self, key: tuple[int, int]) -> ShardResult:
        """(pid, episodes, seconds spent on this shard in all its calls, engine metrics), as
        `sample` returns; episodes None when this worker no longer holds the rows (Ray
        restarted it since they began)."""
        # the calls before this one return nothing the controller reads: a refusal is raised here
        if not self.resumable():
            raise ValueError(f"rl.sampling.engine={self.engine.params.engine!r} with the sampler "
                             f"{type(self.sampler).__name__} cannot sample in "
                             "chunks: partial rollouts (dist.partial_rollout_tokens) resume single completions of the "
                             "torch engine; set it to 0 (pipelines/checks.py refuses the others before a run starts)")
        if key not in self.partials:
            return os.getpid(), None, 0.0, {}
        shard, rows, _ = self.partials[key]
        self.advance_partial(key, rows.budget)  # to the end: a chunk as long as the whole budget
        _, rows, seconds = self.partials.pop(key)
        episodes = rows.episodes(shard.examples, self.engine.tokenizer)
        for e in episodes:  # group ids of the whole step, as sample_shard numbers them
            e.group_id += shard.first_group
        return os.getpid(), episodes, seconds, self.engine.metrics()

    def resumable(self) -> bool:
        return isinstance(self.engine, ResumableEngine) and self.sampler is single_turn

    def partial_states(self) -> dict[tuple[int, int], tuple[Shard, PartialRows, float]]:
        """The rows this worker holds, as the calls sent before this one left them (a checkpoint)."""
        return copy.deepcopy(self.partials)

    def put_partials(self, states: dict[tuple[int, int], tuple[Shard, PartialRows, float]]) -> None:
        self.partials.update(states)  # a resumed run's rows, as its checkpoint saved them

    def status(self) -> tuple[int, int]:
        """(process id, weight version): a new pid means Ray restarted this worker."""
        return os.getpid(), self.engine.weight_version

    def arm_crash(self) -> None:
        """Make the next `sample` call kill this worker's process (for tests and drills).
        A restarted actor is a fresh object, so it does not inherit the flag."""
        self.crash_armed = True


def connect(dist: DistConfig) -> bool:
    """Connect to the cluster at dist.ray_address, or start a local one. True when this
    call started Ray (and so should shut it down).

    A local cluster dies with this process even without ray.shutdown (SIGKILL): Ray starts
    its GCS and raylet with a parent-death signal and the raylet takes its workers along.
    Measured (Ray 2.60, 2 cores, one actor spinning): 5 of its 8 processes gone within
    0.5 s, the actor within 4 s; the two per-node agents (ray::DashboardAgent,
    ray::RuntimeEnvAgent) see the raylet die at once but then wait out Ray's fixed 60 s
    timeout reporting that to the dead GCS, idle, and exit ~61 s after the kill. No
    setting shortens that wait, so we leave it (tests/test_processes.py checks all this)."""

    try:
        import ray
    except ImportError:
        raise ConfigError(f"dist.workers={dist.workers} needs Ray, which is not installed: "
                          "pip install 'posttrain[ray]' (or run without --workers)") from None
    if ray.is_initialized():
        return False
    if dist.ray_address:
        try:
            ray.init(address=dist.ray_address, log_to_driver=False)
        except ConnectionError as error:
            raise ConfigError(f"dist.ray_address={dist.ray_address!r}: no Ray cluster answered ({error}); start "
                              "one with `ray start --head`, or leave --dist.ray_address out for a local cluster") from None
    else:
        # every worker asks for one CPU: make sure a small machine can still place them all
        num_cpus = max(dist.num_cpus or os.cpu_count() or 1, dist.workers)
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    return True


class RayRollout:
    """The synchronous topology: workers sample, then the trainer updates, then sync.
    `correction` as in roles/rollout.py::ColocatedRollout: importance weights when the workers
    sample with other weights than the trainer's (int8: each worker quantises the weights it is pushed)."""

    topology = "sync"

    def __init__(self, dist: DistConfig, policy: Policy, tokenizer: Tokenizer, params: SamplingParams,
                 request: Callable[[int, int], RolloutRequest], shards: int, sampler: Sampler = single_turn,
                 correction: Correction = SamplerIsTrainer()):
        self.correction = correction
        self.started_ray = connect(dist)
        import ray

        self.ray = ray
        self.policy = policy
        self.request = request
        self.shards = shards
        # the controller's own copy, for dev-set evaluation (greedy, small) and temperature: the torch
        # engine whatever the workers sample with, so a vLLM run starts no vLLM beside the trainer
        self.engine = make_engine(copy.deepcopy(policy), tokenizer, dataclasses.replace(params, engine="torch"))
        self.version = 0
        self.restarts = 0
        self.rollout_compute = 0.0  # the slowest worker's sampling time in the last gather
        self.pushed_mb = 0.0  # what the last push sent each worker (what a vLLM one loaded: vllm/load_weights_mb)
        self.engine_metrics: dict[str, float] = {}  # the workers' engine metrics in the last gather, each one's largest
        actor = ray.remote(RolloutWorker).options(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=0)
        # Ray re-runs the constructor with these arguments on a restart: hold the reference
        # for the life of the workers, or a restart would find the model gone
        self._model = ray.put(copy.deepcopy(policy))
        # the sampler travels pickled: a multi-turn environment's copy in each worker resets its own episodes
        self.workers = [actor.remote(self._model, tokenizer, params, sampler) for _ in range(dist.workers)]
        self.pids = [pid for pid, _ in ray.get([w.status.remote() for w in self.workers])]
        self.push(version=0, wait=True)  # every worker starts (and has started) from the controller's policy

    @property
    def temperature(self) -> float:
        return self.engine.params.temperature or 1.0  # greedy sampling's log-probs are of the T = 1 softmax

    # -- weights ---------------------------------------------------------------------------

    def push(self, version: int | None = None, wait: bool = True) -> int:
        """Ship the trainer's weights to every worker under a new version number (or the
        given one, when a run resumes). One ray.put, so the state is serialised once. Only the
        parameters that train cross: the frozen ones (LoRA's base) are the ones every worker,
        restarted or not, was built with."""
        self.version = self.version + 1 if version is None else version
        state = self.policy.state_dict()
        self.engine.load_weights(state)
        self.engine.weight_version = self.version
        trained = {name for name, p in self.policy.named_parameters(remove_duplicate=False) if p.requires_grad}
        weights = PushedWeights.copy_of({name: tensor for name, tensor in state.items() if name in trained})
        self.pushed_mb = sum(t.numel() * t.element_size() for t in weights.tensors.values()) / 1e6
        self._weights = (self.ray.put(weights), self.version)  # kept to re-push to a restarted worker
        calls = [w.load_weights.remote(*self._weights) for w in self.workers]
        if wait:
            for i, call in enumerate(calls):
                try:
                    pid, _ = self.ray.get(call)
                    self._note(i, pid, "restarted between calls")
                except self.ray.exceptions.RayActorError as error:
                    self._recover(i, error)
        return self.version

    def _note(self, i: int, pid: int, reason: str) -> None:
        """Count and log a restart the first time worker i answers from a new process."""

        if pid != self.pids[i]:
            self.pids[i] = pid
            self.restarts += 1
            console.print(f"[yellow]rollout worker {i} died ({reason}); Ray restarted it (pid {pid}); it was given "
                          f"weights v{self._weights[1]} and its unfinished prompts re-issued; the run continues")

    def _recover(self, i: int, error: object) -> None:
        """Wait until worker i answers again (Ray restarts a dead one), say so if it is a new
        process, and make sure it holds the current weights."""
        # calls to an actor that is restarting wait for it; one that fails outright means
        # the actor is gone for good (out of restarts) or died again in the meantime
        deadline, failures = time.monotonic() + RESTART_TIMEOUT_S, 0
        while True:
            try:
                pid, version = self.ray.get(self.workers[i].status.remote(), timeout=10)
                break
            except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError) as again:
                failures += isinstance(again, self.ray.exceptions.ActorDiedError)
                if time.monotonic() > deadline or failures > MAX_RESTARTS:
                    raise RuntimeError(f"rollout worker {i} died and did not come back (within "
                                       f"{RESTART_TIMEOUT_S:.0f} s, {MAX_RESTARTS} restarts): {again}") from again
                time.sleep(0.5)
        if version != self._weights[1]:
            self.ray.get(self.workers[i].load_weights.remote(*self._weights))
        self._note(i, pid, error if isinstance(error, str) else type(error).__name__)  # once, however many calls failed

    # -- sampling --------------------------------------------------------------------------

    def submit(self, request: RolloutRequest, min_version: int) -> list[tuple[Shard, object]]:
        shards = split_shards(request, self.shards)
        return [(s, self._call(s, request.samples_per_prompt, min_version)) for s in shards]

    def _call(self, shard: Shard, k: int, min_version: int) -> Any:  # a Ray ObjectRef of the shard's episodes
        return self.workers[shard.index % len(self.workers)].sample.remote(shard, k, min_version)

    def gather(self, calls: list[tuple[Shard, object]], k: int, min_version: int) -> list[Episode]:
        """Episodes of every shard, in shard order; a shard whose worker died is re-issued."""
        results: dict[int, list[Episode]] = {}
        compute = 0.0
        worst: dict[str, float] = {}
        pending = list(calls)
        while pending:
            shard, call = pending.pop(0)
            worker = shard.index % len(self.workers)
            try:
                pid, episodes, seconds, engine_metrics = self.ray.get(call)
            except self.ray.exceptions.RayActorError as error:
                self._recover(worker, error)
                pending.append((shard, self._call(shard, k, self._weights[1])))
                continue
            if episodes is None:  # restarted between calls: it has no weights
                self._recover(worker, "restarted between calls")
                pending.append((shard, self._call(shard, k, self._weights[1])))
                continue
            self._note(worker, pid, "restarted between calls")  # e.g. given weights by a push before this call
            results[shard.index] = episodes
            compute = max(compute, seconds)
            for name, value in engine_metrics.items():  # the slowest worker's load is the one the step waited for
                worst[name] = max(worst.get(name, value), value)
        self.rollout_compute = compute
        self.engine_metrics = worst
        return [e for index in sorted(results) for e in results[index]]

    def sample(self, step: int, round: int = 0) -> list[Episode]:
        request = self.request(step, round)
        # on-policy: every shard must be sampled by the weights the trainer holds now
        return self.gather(self.submit(request, self.version), request.samples_per_prompt, self.version)

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        # nothing is sampled ahead (the async topology adds its batches); the count of
        # restarts is logged as a running total, so a resumed run carries it on
        return {"worker_restarts": self.restarts}

    def load_state_dict(self, state: dict) -> None:
        self.restarts = state.get("worker_restarts", 0)

    # -- what the controller logs ------------------------------------------------------------

    def off_policy_correction(self, batch: RolloutBatch, trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict]:
        stats = staleness_stats(batch, self.version, max_staleness=0)
        batch, mismatch = self.correction.correct(batch, trainer)
        return batch, {**stats, **mismatch}

    def step_metrics(self) -> dict[str, float]:
        return {"worker_restarts": self.restarts, "time/rollout_compute": self.rollout_compute, **self.engine_metrics}

    def close(self) -> None:
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []
        if self.started_ray:
            self.ray.shutdown()
