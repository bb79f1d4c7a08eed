"""Does model M fit on cluster C for an RL job, and where will a step's time go?

`plan` puts the other modules together for one question: the memory per GPU of the job's
copies (rl_memory.py) with its activations and KV cache, whether that fits, and if not the
first change that would make it (a higher ZeRO stage, then LoRA); then the five terms of a
step at the device's derated ceilings (throughput.py), the step time colocated and async,
the straggler tax on decode, and the levers ranked. `render_plan` writes it as the
`posttrain systems` command prints it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from posttrain.systems.hardware import GB, Cluster, Device
from posttrain.systems.kv_cache import kv_bytes_per_token, paged_vs_contiguous
from posttrain.systems.memory import (PRECISIONS, activation_bytes, lora_parameter_count, lora_training_bytes,
                                      training_state_bytes)
from posttrain.systems.rl_memory import Fit, fits, rl_memory
from posttrain.systems.roofline import crossover_rows
from posttrain.systems.shapes import ModelShape, parameter_count
from posttrain.systems.stragglers import expected_lengths, expected_max
from posttrain.systems.throughput import (DEFAULT_LEVERS, Lever, LeverGain, RoleTimes, Workload, bottleneck,
                                          rank_levers, rollout_seconds, roofline_role_times, step_seconds)


@dataclass(frozen=True)
class JobSettings:
    """How the RL job trains: what `posttrain systems` takes besides the model and the cluster."""

    algo: str = "grpo"
    precision: str = "mixed"  # a key of memory.PRECISIONS
    zero_stage: int = 3
    lora_r: int = 0
    micro_batch_rows: int = 1  # rows per forward/backward on each GPU
    checkpointing: bool = True
    compute_efficiency: float = 0.5  # the fraction of peak FLOP/s real kernels reach
    memory_efficiency: float = 0.7  # the fraction of peak bandwidth decoding reaches
    usable_memory_fraction: float = 0.9  # of each GPU's memory: the rest is CUDA context and allocator slack
    # GPUs per rollout engine; 0 = the fewest whose share of the weights is at most a quarter of a GPU
    rollout_tensor_parallel: int = 0


def engine_tensor_parallel(parameters: float, weight_bytes: float, device_bytes: float, gpus: int) -> int:
    """The fewest GPUs (a power of two, at most `gpus`) over which an engine's weights take at
    most a quarter of each GPU, leaving the rest to the trainer's state and the KV cache."""
    tp = 1
    while tp < gpus and parameters * weight_bytes / tp > device_bytes / 4:
        tp *= 2
    return min(tp, gpus)


@dataclass(frozen=True)
class Plan:
    shape: ModelShape
    parameters: int
    cluster: Cluster
    job: JobSettings
    workload: Workload
    fit: Fit
    fix: str  # "" when it fits; else the first change that makes it fit, or why none does
    times: RoleTimes
    expected_max_tokens: float  # E[longest response of the batch]
    crossover_rows: float  # the decode batch at which decode turns compute-bound
    levers: list[LeverGain]


def job_memory(shape: ModelShape, cluster: Cluster, job: JobSettings, w: Workload) -> Fit:
    """The job's memory per GPU (rl_memory.rl_memory) and whether it fits."""
    precision = PRECISIONS[job.precision]
    parameters = parameter_count(shape)
    gpus = cluster.gpus
    lora = None
    if job.lora_r:
        lora = lora_training_bytes(parameters, lora_parameter_count(shape, job.lora_r), precision)
        lora = dataclasses.replace(lora, weights=lora.weights / (gpus if job.zero_stage == 3 else 1))
    longest = w.prompt_tokens + int(expected_max(w.rows, w.mean_response_tokens, w.response_cv))
    activations = activation_bytes(shape, job.micro_batch_rows, longest, precision.weight_bytes,
                                   checkpointing=job.checkpointing)
    # the rollout engines' caches: each of the cluster's engines holds its share of the rows, paged,
    # at full length (an upper bound: the short rows finish before the long ones end)
    lengths = [w.prompt_tokens + L for L in expected_lengths(w.rows, w.mean_response_tokens, w.response_cv)]
    kv = paged_vs_contiguous(shape, lengths, max(lengths), 16, w.kv_bytes).paged_bytes / gpus
    tp = job.rollout_tensor_parallel or engine_tensor_parallel(parameters, w.weight_bytes, cluster.device.memory_bytes,
                                                               gpus)
    memory = rl_memory(job.algo, parameters, precision, job.zero_stage, gpus, activation_bytes_per_gpu=activations,
                       kv_cache_bytes_per_gpu=kv, frozen_bytes_per_weight=w.weight_bytes, lora_state=lora,
                       rollout_tensor_parallel=tp)
    return fits(memory, cluster.device.memory_bytes, job.usable_memory_fraction)


def first_fix(shape: ModelShape, cluster: Cluster, job: JobSettings, w: Workload) -> str:
    """The first change, cheapest in code, that makes the job fit: a higher ZeRO stage,
    then LoRA (rank 16), then fewer rows per engine; or why nothing here does."""
    for stage in range(job.zero_stage + 1, 4):
        if job_memory(shape, cluster, dataclasses.replace(job, zero_stage=stage), w).fits:
            return f"fits with ZeRO stage {stage} (--zero_stage {stage})"
    best = dataclasses.replace(job, zero_stage=3)
    if not job.lora_r and job_memory(shape, cluster, dataclasses.replace(best, lora_r=16), w).fits:
        return "fits with ZeRO-3 and LoRA rank 16 (--zero_stage 3 --lora_r 16)"
    weights_only = training_state_bytes(parameter_count(shape), PRECISIONS[job.precision], 3, cluster.gpus).total
    if weights_only > cluster.device.memory_bytes * job.usable_memory_fraction:
        where = f"sharded over all {cluster.gpus} GPUs" if cluster.gpus > 1 else "on its one GPU"
        return f"does not fit: even the policy's training state {where} is {weights_only / GB:.1f} GB per GPU; add GPUs"
    return "does not fit: activations or KV cache too large; fewer prompts per step, shorter responses, or more GPUs"


def plan(shape: ModelShape, cluster: Cluster, job: JobSettings, w: Workload) -> Plan:
    if job.precision not in PRECISIONS:
        raise ValueError(f"precision={job.precision!r}: expected one of {sorted(PRECISIONS)}")
    fit = job_memory(shape, cluster, job, w)
    device = cluster.device.derated(job.compute_efficiency, job.memory_efficiency)
    tp = job.rollout_tensor_parallel or engine_tensor_parallel(parameter_count(shape), w.weight_bytes,
                                                               cluster.device.memory_bytes, cluster.gpus)
    times = roofline_role_times(shape, device, dataclasses.replace(w, checkpointing=job.checkpointing), cluster.gpus,
                                rollout_tensor_parallel=tp)
    if job.algo == "dpo":  # offline: no rollout, no weight sync, no verifier
        times = dataclasses.replace(times, rollout=0.0, verifier=0.0, sync=0.0)
    return Plan(shape, parameter_count(shape), cluster, job, w, fit, "" if fit.fits else first_fix(shape, cluster, job, w),
                times, expected_max(w.rows, w.mean_response_tokens, w.response_cv),
                crossover_rows(shape, device, w.prompt_tokens + w.mean_response_tokens / 2, w.weight_bytes, w.kv_bytes),
                rank_levers(times, "colocated", levers_for(shape, device, w, cluster.gpus, tp)))


CAP_TIMES_MEAN = 4  # the length cap the plan prices: 4 × the mean response, above 98% of a cv-1 log-normal


def levers_for(shape: ModelShape, device: Device, w: Workload, gpus: int, tp: int) -> list[Lever]:
    """DEFAULT_LEVERS, with the length cap's factor computed for this workload: its rollout
    time with every response cut at CAP_TIMES_MEAN × the mean, over its time without."""
    engines = max(1, gpus // tp)
    cap = CAP_TIMES_MEAN * w.mean_response_tokens
    factor = (rollout_seconds(shape, device, dataclasses.replace(w, cap_tokens=cap), engines)
              / rollout_seconds(shape, device, w, engines))
    capped = Lever(f"length cap at {cap:,.0f} tokens + overlong penalty", {"rollout": factor},
                   note=f"the longest response {expected_max(w.rows, w.mean_response_tokens, w.response_cv):,.0f} → "
                        f"{cap:,.0f} tokens (stragglers.overlong_penalty teaches the policy to stop before it)")
    return [capped if lever.name.startswith("length cap") else lever for lever in DEFAULT_LEVERS]


def _gb(x: float) -> str:
    return f"{x / GB:.2f}" if x < 10 * GB else f"{x / GB:.1f}"


def _count(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def render_plan(p: Plan) -> str:
    s, w, job, m = p.shape, p.workload, p.job, p.fit.memory
    kv_token = kv_bytes_per_token(s, w.kv_bytes)
    lines = [f"model {s.name}: {_count(p.parameters)} parameters, {s.n_layers} layers, {s.attention} "
             f"({s.n_heads} query heads, {s.n_kv_heads} KV heads of {s.head_dim}), KV cache {kv_token / 1024:.0f} KiB "
             f"per token at {w.kv_bytes:g} bytes",
             f"cluster: {p.cluster.describe()}",
             f"job: {job.algo}, {PRECISIONS[job.precision].name} ({PRECISIONS[job.precision].bytes_per_parameter:g} "
             f"bytes/parameter trained), ZeRO-{job.zero_stage}" + (f", LoRA r={job.lora_r}" if job.lora_r else "")
             + f"; {w.prompts} prompts × {w.samples_per_prompt} samples, {w.prompt_tokens} prompt tokens, responses "
               f"{w.mean_response_tokens:g} tokens on average (cv {w.response_cv:g})",
             "", "## Does it fit? (memory per GPU)", "", "| what | parameters | trained | GB per GPU |", "|---|---|---|---|"]
    lines += [f"| {c.role} | {_count(c.parameters)} | {'yes' if c.trained else 'no'} | {_gb(c.bytes_per_gpu)} |"
              for c in m.copies]
    lines += [f"| activations ({job.micro_batch_rows} row{'s' if job.micro_batch_rows > 1 else ''}, "
              f"{'checkpointed' if job.checkpointing else 'all kept'}) | | | {_gb(m.activation_bytes)} |",
              f"| KV cache (paged, every row at full length) | | | {_gb(m.kv_cache_bytes)} |",
              f"| **total** | | | **{_gb(m.total_bytes)}** of {_gb(p.fit.usable_bytes)} usable |", ""]
    lines.append(f"fits: yes, {_gb(p.fit.headroom_bytes)} GB to spare per GPU" if p.fit.fits else f"fits: NO — {p.fix}")
    t = p.times
    colocated, overlapped = step_seconds(t, "colocated"), step_seconds(t, "async", 1)
    lines += ["", f"## Where will the time go? (one step at {job.compute_efficiency:g} of peak FLOP/s and "
                  f"{job.memory_efficiency:g} of peak bandwidth)", "", "| role | seconds | share |", "|---|---|---|"]
    lines += [f"| {role} | {sec:.2f} | {sec / colocated:.0%} |" for role, sec in t.as_dict().items()]
    lines += ["", f"step: {colocated:.1f} s colocated or sync (sum); {overlapped:.1f} s async one step ahead "
                  f"(max of rollout and the trainer side); bottleneck: {bottleneck(t, 'colocated')}",
              f"decode waits for the longest of {w.rows} responses: E[max] = {p.expected_max_tokens:,.0f} tokens, "
              f"{p.expected_max_tokens / w.mean_response_tokens:.1f}× the mean (the straggler tax); decode is "
              + (f"compute-bound from {p.crossover_rows:,.0f} rows per engine on" if p.crossover_rows != float("inf") else
                 "bandwidth-bound at any batch (each row's KV cache reads take longer than its FLOPs)"), "",
              "levers, alone, ranked by seconds saved per step:", ""]
    lines += [f"- {g.lever.name}: {g.before_seconds:.1f} → {g.after_seconds:.1f} s ({g.speedup:.2f}×) — {g.lever.note}"
              for g in p.levers if g.saved_seconds > 0]
    return "\n".join(lines)
