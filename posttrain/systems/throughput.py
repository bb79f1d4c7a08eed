"""The throughput equation of an RL step: five terms, composed by topology.

    τ_step = rollout + verifier + reference + train + sync          colocated, sync
    τ_step = max(rollout, verifier + reference + train + sync)      async (k ≥ 1 steps ahead)

Colocated and sync run the roles one after another (sync on two sets of devices that
take turns); async overlaps the rollout with everything the trainer does (in our
controller the trainer side also scores and runs the reference, roles/controller.py), at
the price of staleness (gantt.py). Which side of the max binds is where a speed-up pays;
a speed-up on the other side buys nothing.

`role_times_from_metrics` reads the five terms from a run's metrics.jsonl row (the
controller logs them as time/*); `roofline_role_times` predicts them for a model, a device
and a workload; `rank_levers` says which optimisation buys the most (lesson 28's budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from posttrain.systems.gantt import TOPOLOGIES, weight_sync
from posttrain.systems.hardware import Device
from posttrain.systems.roofline import decode_step, forward_pass, optimizer_step, prefill, train_pass
from posttrain.systems.scheduling import speculative_decoding_factor
from posttrain.systems.shapes import ModelShape, matmul_parameter_count, parameter_count
from posttrain.systems.stragglers import expected_lengths

ROLES = ("rollout", "verifier", "reference", "train", "sync")
# the metric each role's time is logged as (roles/controller.py); PRIME's implicit PRM
# (time/process_reward) is trainer-side work and counts as train
METRICS = {"rollout": "time/rollout", "verifier": "time/score", "reference": "time/reference", "train": "time/train",
           "sync": "time/sync"}


@dataclass(frozen=True)
class RoleTimes:
    """Seconds per step of each role."""

    rollout: float = 0.0
    verifier: float = 0.0
    reference: float = 0.0
    train: float = 0.0
    sync: float = 0.0

    @property
    def trainer_side(self) -> float:
        """What the trainer's process does while an async rollout samples the next batch."""
        return self.verifier + self.reference + self.train + self.sync

    def as_dict(self) -> dict[str, float]:
        return {role: getattr(self, role) for role in ROLES}

    def scaled(self, factors: dict[str, float]) -> RoleTimes:
        """These times with some roles multiplied (0.5 = twice as fast, 0 = removed)."""
        unknown = sorted(set(factors) - set(ROLES))
        if unknown:
            raise ValueError(f"roles {unknown} are not known: expected some of {ROLES}")
        return RoleTimes(**{role: getattr(self, role) * factors.get(role, 1.0) for role in ROLES})


def role_times_from_metrics(row: dict, rollout_key: str = "time/rollout") -> RoleTimes:
    """The five terms of one metrics.jsonl row. rollout_key "time/rollout_compute" reads a
    Ray run's sampling time itself (the slowest worker's) instead of the controller's wait."""
    times = {role: float(row.get(key, 0.0)) for role, key in METRICS.items()}
    times["rollout"] = float(row.get(rollout_key, row.get("time/rollout", 0.0)))
    times["train"] += float(row.get("time/process_reward", 0.0))
    return RoleTimes(**times)


def step_seconds(times: RoleTimes, topology: str, max_staleness: int = 1) -> float:
    """τ_step by topology: the sum, or for async (max_staleness ≥ 1) the longer of the
    rollout and the trainer side, in steady state."""
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology={topology!r}: expected one of {TOPOLOGIES}")
    if topology == "async" and max_staleness >= 1:
        return max(times.rollout, times.trainer_side)
    return sum(times.as_dict().values())


def bottleneck(times: RoleTimes, topology: str) -> str:
    """The role whose speed-up shortens the step most: the largest term, and under async
    only a role on the binding side of the max."""
    if topology == "async":
        if times.rollout >= times.trainer_side:
            return "rollout"
        return max(ROLES[1:], key=lambda r: getattr(times, r))
    return max(ROLES, key=lambda r: getattr(times, r))


@dataclass(frozen=True)
class Workload:
    """One RL step's work: G prompts × K samples, prompt and response lengths."""

    prompts: int
    samples_per_prompt: int
    prompt_tokens: int
    mean_response_tokens: float
    response_cv: float = 1.0  # std / mean of the response lengths (log-normal): reasoning traces are near 1
    weight_bytes: float = 2  # the engine's and the trainer's compute dtype (bf16)
    kv_bytes: float = 2
    reference: bool = True  # a KL term or a KL log needs the reference's forward pass
    checkpointing: bool = False
    share_prompt: bool = True  # each group's prompt once in prefill, reference and update
    verifier_seconds_per_sample: float = 0.0
    verifier_workers: int = 1  # processes scoring in parallel
    optimizer_bytes_per_parameter: float = 28  # AdamW's pass over its state (roofline.optimizer_step)
    cap_tokens: float = 0  # a length cap: responses end there (0 = none, the log-normal's tail runs on)

    @property
    def rows(self) -> int:
        return self.prompts * self.samples_per_prompt


def trained_tokens(w: Workload) -> float:
    """Tokens through the reference and the update: each prompt once per group with share_prompt."""
    prompt = w.prompts * w.prompt_tokens if w.share_prompt else w.rows * w.prompt_tokens
    return prompt + w.rows * w.mean_response_tokens


def rollout_seconds(shape: ModelShape, device: Device, w: Workload, engines: int) -> float:
    """Prefill and decode on the busiest of `engines` data-parallel engines: rows dealt out
    round-robin in length order, so one engine holds the longest row; finished rows leave."""
    lengths = expected_lengths(w.rows, w.mean_response_tokens, w.response_cv)
    if w.cap_tokens:
        lengths = [min(L, w.cap_tokens) for L in lengths]
    # the engine dealt the last (longest) row: rows (rows − 1) mod engines, + engines, ...
    mine = sorted(lengths[(len(lengths) - 1) % engines :: engines] if engines <= w.rows else lengths[-1:])
    distinct = math.ceil(w.prompts / engines) if w.share_prompt else len(mine)
    seconds = prefill(shape, device, distinct, w.prompt_tokens, w.weight_bytes, w.kv_bytes).seconds
    alive = len(mine)
    for t in range(math.ceil(mine[-1])):
        while alive and mine[len(mine) - alive] <= t:  # rows whose length is reached have left
            alive -= 1
        seconds += decode_step(shape, device, alive, w.prompt_tokens + t, w.weight_bytes, w.kv_bytes).seconds
    return seconds


def roofline_role_times(shape: ModelShape, device: Device, w: Workload, gpus: int = 1,
                        rollout_tensor_parallel: int = 1, colocated: bool = True) -> RoleTimes:
    """The five terms at the device's ceilings (a lower bound: derate the device for real
    kernels, hardware.Device.derated). Rollout on gpus / tp data-parallel engines; the
    reference and the update data-parallel over all gpus; the verifier on CPU workers."""
    engines = max(1, gpus // rollout_tensor_parallel)
    tokens = trained_tokens(w) / gpus
    context = w.prompt_tokens + w.mean_response_tokens / 2
    parameters = parameter_count(shape)
    reference = forward_pass(shape, device, tokens, context, w.weight_bytes).seconds if w.reference else 0.0
    train = (train_pass(shape, device, tokens, context, w.weight_bytes, w.checkpointing).seconds
             + optimizer_step(device, parameters / gpus, w.optimizer_bytes_per_parameter).seconds)
    sync = weight_sync(parameters, train_gpus=gpus, link_bytes_per_second=device.link_bytes_per_second,
                       memory_bytes_per_second=device.bytes_per_second, engine_bytes=w.weight_bytes,
                       colocated=colocated, engine_tensor_parallel=rollout_tensor_parallel).total
    verifier = w.rows * w.verifier_seconds_per_sample / w.verifier_workers
    return RoleTimes(rollout_seconds(shape, device, w, engines), verifier, reference, train, sync)


def decode_flops_share(shape: ModelShape, w: Workload) -> float:
    """Of the FLOPs of a step, the share spent decoding (2N per response token; the update
    costs 6N per token): why rollout dominates even when each token is cheap."""
    n = matmul_parameter_count(shape)
    decode = 2 * n * w.rows * w.mean_response_tokens
    other = (2 * n if w.reference else 0) * trained_tokens(w) + 6 * n * trained_tokens(w)
    return decode / (decode + other)


@dataclass(frozen=True)
class Lever:
    """An optimisation: role times multiplied by factors (0.5 = twice as fast, 0 = removed),
    or a change of topology."""

    name: str
    factors: dict[str, float] = field(default_factory=dict)
    topology: str = ""  # "" keeps the run's
    note: str = ""


@dataclass(frozen=True)
class LeverGain:
    lever: Lever
    before_seconds: float
    after_seconds: float

    @property
    def saved_seconds(self) -> float:
        return self.before_seconds - self.after_seconds

    @property
    def speedup(self) -> float:
        return self.before_seconds / self.after_seconds if self.after_seconds else math.inf


def rank_levers(times: RoleTimes, topology: str, levers: list[Lever], max_staleness: int = 1) -> list[LeverGain]:
    """Each lever applied alone to this step, the one saving the most seconds first: a
    lever on a small term, or on the side of an async max that does not bind, saves little
    however large its own factor."""
    before = step_seconds(times, topology, max_staleness)
    gains = [LeverGain(lever, before, step_seconds(times.scaled(lever.factors), lever.topology or topology,
                                                   max_staleness)) for lever in levers]
    return sorted(gains, key=lambda g: -g.saved_seconds)


# Typical factors, each from a measurement in this repository or its paper; lesson 28 and
# `posttrain systems` rank them for a run's own times.
DEFAULT_LEVERS = [
    Lever("async, one step ahead", topology="async", note="overlaps rollout with the trainer side; staleness 1 (TIS)"),
    Lever("speculative decoding", {"rollout": speculative_decoding_factor(0.7, 4, 0.05)},
          note="α = 0.7, γ = 4 drafts at 5% of a target step: 2.3× decode while bandwidth-bound"),
    Lever("low-precision rollout", {"rollout": 0.6}, note="int8 weights, SmolLM2 1 thread: 1.6× (BENCHMARKS.md)"),
    Lever("length cap + overlong penalty", {"rollout": 0.5},
          note="the long tail cut; `posttrain systems` computes the factor for its workload's lengths"),
    Lever("each prompt once per group", {"reference": 0.68, "train": 0.65},
          note="rl.update.share_prompt, SmolLM2: 1.47× reference, 1.54× update (BENCHMARKS.md)"),
    Lever("skip rows with no gradient", {"train": 0.55},
          note="rl.update.skip_inert_rows: ~half the rows at mid training"),
    Lever("no reference pass", {"reference": 0.0},
          note="β = 0 and rl.kl.track false (or the reference in the engine)"),
    Lever("parallel verifier", {"verifier": 0.25}, note="score on 4 processes"),
    Lever("weight sync by broadcast", {"sync": 0.1}, note="NCCL/IPC instead of an object store"),
]


def allocate_levers(times: RoleTimes, topology: str, levers: list[Lever], budget: int,
                    max_staleness: int = 1) -> list[LeverGain]:
    """Spend a budget of `budget` optimisations one at a time, each on the lever that saves
    the most seconds of the step *as the levers already chosen left it* (lesson 28's
    allocator). So every gain is measured after the ones before it: Amdahl's law shrinks a
    second lever on a role the first has already cut, and once async makes the step a max,
    a lever on the side that does not bind saves nothing. Stops early when no lever left
    saves time. Returns the chosen levers in order, each with the step before and after."""
    if budget < 0:
        raise ValueError(f"budget={budget}: the number of optimisations to spend, >= 0")
    chosen: list[LeverGain] = []
    left = list(levers)
    for _ in range(budget):
        ranked = rank_levers(times, topology, left, max_staleness) if left else []
        if not ranked or ranked[0].saved_seconds <= 0:
            break
        best = ranked[0]
        chosen.append(best)
        times, topology = times.scaled(best.lever.factors), best.lever.topology or topology
        left.remove(best.lever)
    return chosen
