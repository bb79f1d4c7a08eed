"""Three reference architectures of an RL job: where each model copy lives, which wire each
byte of a step crosses, and what the step then costs (lesson 24's whiteboard question).

    colocated       every GPU holds every copy and the roles take turns on it: sample,
                    score, reference, train, sync. The engine reads the trainer's weights
                    on the same GPU, so weight sync never leaves it
    disaggregated   the GPUs split into a trainer pool (the policy's training state, the
                    reference, a critic or a reward model) and a rollout pool (the engines
                    and their KV cache); the pools take turns, and the weights cross the
                    link between them after every update
    async           the disaggregated placement with the rollout pool sampling up to k
                    steps ahead: the same copies and wires, the step a max instead of a sum
                    (gantt.py), the batches up to k updates stale

Four paths carry a step's bytes:

    weights       trainer → engines after each update: the ZeRO-3 shards all-gathered,
                  cast, broadcast to the rollout pool, resharded (gantt.weight_sync)
    trajectories  engines → trainer: every row's token ids (int64) and old_logp (float32);
                  in one process they never move
    collectives   inside the trainer pool, per GPU: data parallelism all-reduces the
                  gradients (a ring moves 2(n − 1)/n of them); ZeRO-1/2 move the same bytes
                  as a reduce-scatter and an all-gather; ZeRO-3 also all-gathers the
                  weights for the backward, 3(n − 1)/n (Rajbhandari et al. 2020,
                  https://arxiv.org/abs/1910.02054, section 7), plus the frozen models'
                  weights once for their forward
    control       the controller's prompts out, completions (text, ~4 bytes a token) and
                  rewards back: small, but through Python and an object store, not NCCL

Every link here is the device's own (NVLink within a node, memory.Device.link); across
nodes InfiniBand is several times slower, which makes the weights path dearer still.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from posttrain.systems.gantt import weight_sync
from posttrain.systems.hardware import Cluster
from posttrain.systems.memory import PRECISIONS, lora_parameter_count
from posttrain.systems.plan import JobSettings, engine_tensor_parallel, job_memory
from posttrain.systems.rl_memory import ONLINE, Fit, RLMemory, fits
from posttrain.systems.shapes import ModelShape, parameter_count
from posttrain.systems.throughput import RoleTimes, Workload, roofline_role_times, step_seconds

ARCHITECTURES = ("colocated", "disaggregated", "async")
TOKEN_BYTES = 8 + 4  # an int64 token id and its float32 old_logp
TEXT_BYTES_PER_TOKEN = 4  # a token's text in UTF-8, roughly, as the verifier reads it


@dataclass(frozen=True)
class Pool:
    """A set of GPUs that hold the same copies: what each one holds and whether it fits."""

    name: str
    gpus: int
    fit: Fit  # fit.memory: bytes per GPU of this pool

    @property
    def memory(self) -> RLMemory:
        return self.fit.memory


@dataclass(frozen=True)
class Path:
    """One kind of traffic of a step: from where to where, how many bytes, how long."""

    name: str
    source: str
    destination: str
    wire: str  # "GPU memory", "link" (NVLink/PCIe), "controller" (Python, Ray's object store)
    bytes: float  # per step; per GPU for the collectives
    seconds: float


@dataclass(frozen=True)
class Placement:
    architecture: str
    pools: list[Pool]
    paths: list[Path]
    times: RoleTimes  # the five terms, each on the pool that runs it
    step_seconds: float  # composed by the architecture: a sum, or async's max
    max_staleness: int  # 0 unless async

    def path(self, name: str) -> Path:
        return next(p for p in self.paths if p.name == name)


def _engine(role: str) -> bool:
    return role.startswith("rollout engine")


def split_gpus(gpus: int, rollout_gpus: int) -> tuple[int, int]:
    """(trainer GPUs, rollout GPUs) of a disaggregated cluster; rollout_gpus 0 = half."""
    rollout = rollout_gpus or gpus // 2
    if gpus < 2 or not 1 <= rollout < gpus:
        raise ValueError(f"rollout_gpus={rollout} of {gpus} GPUs: a disaggregated job needs at least one GPU in each "
                         "pool (a 1-GPU cluster can only be colocated)")
    return gpus - rollout, rollout


def place(architecture: str, shape: ModelShape, cluster: Cluster, job: JobSettings, w: Workload,
          rollout_gpus: int = 0, max_staleness: int = 1) -> Placement:
    """Where each copy of the job lives on `cluster` under `architecture`, the bytes of its
    four paths, and its step time at the derated ceilings (JobSettings' efficiencies)."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture={architecture!r}: expected one of {ARCHITECTURES}")
    if job.algo not in ONLINE:
        raise ValueError(f"algo={job.algo!r}: expected one of {sorted(ONLINE)}")
    if architecture != "colocated" and not ONLINE[job.algo]:
        raise ValueError(f"algo={job.algo!r} is offline: nothing samples, so there is no rollout pool to split off; "
                         "place it colocated")
    if architecture == "async" and max_staleness < 1:
        raise ValueError(f"max_staleness={max_staleness}: async samples at least one step ahead")
    precision = PRECISIONS[job.precision]
    parameters = parameter_count(shape)
    device = cluster.device.derated(job.compute_efficiency, job.memory_efficiency)
    if architecture == "colocated":
        trainer_gpus = rollout_pool_gpus = cluster.gpus
        pools = [Pool("every GPU", cluster.gpus, job_memory(shape, cluster, job, w))]
    else:
        trainer_gpus, rollout_pool_gpus = split_gpus(cluster.gpus, rollout_gpus)
        trained = job_memory(shape, Cluster(cluster.device, trainer_gpus), job, w).memory
        sampled = job_memory(shape, Cluster(cluster.device, rollout_pool_gpus), job, w).memory
        trainer = RLMemory([c for c in trained.copies if not _engine(c.role)], trained.activation_bytes, 0.0)
        rollout = RLMemory([c for c in sampled.copies if _engine(c.role)], 0.0, sampled.kv_cache_bytes)
        usable = job.usable_memory_fraction
        pools = [Pool("trainer", trainer_gpus, fits(trainer, cluster.device.memory_bytes, usable)),
                 Pool("rollout", rollout_pool_gpus, fits(rollout, cluster.device.memory_bytes, usable))]
    colocated = architecture == "colocated"
    tp = job.rollout_tensor_parallel or engine_tensor_parallel(parameters, w.weight_bytes, cluster.device.memory_bytes,
                                                               rollout_pool_gpus)
    paths = _paths(shape, job, w, device, parameters, precision, trainer_gpus, tp, colocated)
    if not ONLINE[job.algo]:  # offline: no engine, so neither weights nor trajectories travel
        paths = [dataclasses.replace(p, bytes=0.0, seconds=0.0) if p.name in ("weights", "trajectories") else p
                 for p in paths]
    checkpointed = dataclasses.replace(w, checkpointing=job.checkpointing)
    roll = roofline_role_times(shape, device, checkpointed, rollout_pool_gpus, tp)
    train = roll if colocated else roofline_role_times(shape, device, checkpointed, trainer_gpus, tp)
    if not ONLINE[job.algo]:  # offline: no rollout, no verifier, no weights to send
        roll = dataclasses.replace(roll, rollout=0.0)
        train = dataclasses.replace(train, verifier=0.0)
    times = RoleTimes(roll.rollout, train.verifier, train.reference, train.train, paths[0].seconds)
    staleness = max_staleness if architecture == "async" else 0
    step = step_seconds(times, "async" if architecture == "async" else "sync", max(1, staleness))
    return Placement(architecture, pools, paths, times, step, staleness)


def _paths(shape, job, w, device, parameters, precision, trainer_gpus, tp, colocated) -> list[Path]:
    n = trainer_gpus
    where = "GPU memory" if colocated else "link"
    # weights: the shards exist only under ZeRO-3; below it every trainer GPU holds them whole
    gather_gpus = n if job.zero_stage == 3 else 1
    sync = weight_sync(parameters, train_gpus=gather_gpus, link_bytes_per_second=device.link_bytes_per_second,
                       memory_bytes_per_second=device.bytes_per_second, master_bytes=precision.weight_bytes,
                       engine_bytes=w.weight_bytes, colocated=colocated, engine_tensor_parallel=tp)
    gathered = (gather_gpus - 1) / gather_gpus * parameters * precision.weight_bytes
    weights = Path("weights", "trainer", "rollout engines", "link" if (gather_gpus > 1 or not colocated) else where,
                   gathered + (0.0 if colocated else parameters * w.weight_bytes), sync.total)
    tokens = w.rows * (w.prompt_tokens + w.mean_response_tokens)
    trajectories = Path("trajectories", "rollout engines", "trainer", where, 0.0 if colocated else tokens * TOKEN_BYTES,
                        0.0 if colocated else tokens * TOKEN_BYTES / device.link_bytes_per_second)
    # collectives, per trainer GPU: a ring moves (n − 1)/n of the tensor per pass. The
    # gradients of the trained parameters: an all-reduce below ZeRO-2 (a reduce-scatter and an
    # all-gather), a reduce-scatter and the updated shards' all-gather at ZeRO-2, a
    # reduce-scatter alone at ZeRO-3, which instead gathers every sharded model's weights for
    # each pass through it: forward and backward for a trained one, forward for a frozen one
    ring = (n - 1) / n
    trained = lora_parameter_count(shape, job.lora_r) if job.lora_r else parameters
    trained_models = 2 if job.algo == "ppo" else 1  # PPO also trains its critic
    frozen_models = 2 if job.algo == "ppo" else 1  # the reference (LoRA: the base, adapters off), PPO's reward model
    if job.zero_stage == 3:
        moved = ring * (trained_models * (trained * precision.grad_bytes + 2 * parameters * precision.weight_bytes)
                        + frozen_models * parameters * w.weight_bytes)
    else:
        moved = ring * trained_models * 2 * trained * precision.grad_bytes
    collectives = Path("collectives", "trainer GPUs", "trainer GPUs", "link" if n > 1 else "GPU memory", moved,
                       moved / device.link_bytes_per_second)
    text = w.prompts * w.prompt_tokens * 8 + w.rows * (w.mean_response_tokens * TEXT_BYTES_PER_TOKEN + 8)
    control = Path("control", "controller", "workers and verifier", "controller", text,
                   text / device.link_bytes_per_second)
    return [weights, trajectories, collectives, control]
