"""`posttrain systems`: does a model fit on a cluster for an RL job, where will a step's time
go, and (with --run) where did a run's time go.

The settings (config/commands.SystemsConfig) become a ModelShape, a Cluster, JobSettings and
a Workload, and posttrain/systems/plan.py answers from them; nothing trains, nothing is
downloaded (a model is its config numbers). `--gpu cpu` measures this machine's two
ceilings first (posttrain/systems/hardware.py, a few seconds).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from posttrain.cli.flags import parse_settings
from posttrain.config.commands import SystemsConfig
from posttrain.systems.hardware import GB, Cluster, device_named, measure_cpu
from posttrain.systems.plan import JobSettings, plan, render_plan
from posttrain.systems.shapes import dtype_bytes, load_shape
from posttrain.systems.throughput import Workload
from posttrain.systems.wallclock import render, where_time_goes

SUMMARY = ("does a model fit on a cluster for an RL job, and where will a step's time go (no training, no "
           "download: config numbers and roofline ceilings); --run RUN_DIR: where a run's time went")


def parse(argv: list[str]) -> SystemsConfig:
    return parse_settings(SystemsConfig, argv, "posttrain systems", SUMMARY)


def cluster_of(cfg: SystemsConfig) -> Cluster:
    if cfg.gpu != "cpu":
        return Cluster(device_named(cfg.gpu, cfg.gpu_memory_gb), cfg.gpus)
    device = measure_cpu(cfg.threads)
    print(f"measured {device.name}: {device.flops_per_second / GB:.0f} GFLOP/s, {device.bytes_per_second / GB:.1f} GB/s\n")
    if cfg.gpu_memory_gb:
        device = dataclasses.replace(device, memory_bytes=cfg.gpu_memory_gb * GB)
    return Cluster(device, cfg.gpus)


def cmd_systems(argv: list[str]) -> int:
    cfg = parse(argv)
    if cfg.model or not cfg.run:
        shape = load_shape(cfg.model or "smollm2-135m")
        element = dtype_bytes(cfg.dtype)
        workload = Workload(cfg.prompts, cfg.samples_per_prompt, cfg.prompt_tokens, cfg.response_tokens,
                            cfg.response_cv, weight_bytes=element, kv_bytes=element,
                            verifier_seconds_per_sample=cfg.verifier_ms / 1000)
        job = JobSettings(cfg.algo, cfg.precision, cfg.zero_stage, cfg.lora_r, cfg.micro_batch_rows, cfg.checkpointing,
                          cfg.compute_efficiency, cfg.memory_efficiency)
        print(render_plan(plan(shape, cluster_of(cfg), job, workload)))
    if cfg.run:
        # imported here for start-up time: runs/ loads torch for checkpoints
        from posttrain.runs.rundir import read_jsonl

        rows = [r for r in read_jsonl(Path(cfg.run) / "metrics.jsonl") if r.get("stage") == "rl"]
        print(("\n" if cfg.model else "") + f"## Where did the time go? ({cfg.run})\n")
        print(render(where_time_goes(rows)))
    return 0
