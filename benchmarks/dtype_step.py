"""One GRPO step (sample, reference, update) at --dtype float32 and bfloat16, side by side.

    cd benchmarks && ../.venv/bin/python dtype_step.py [--threads 2] [--repeats 3]
    cd benchmarks && ../.venv/bin/python dtype_step.py --model smollm2-135m --prompts 8 --micro-batch 8

The default gpt_mini at the default batch (32 prompts × 8 samples, up to 48 new tokens),
fresh weights, every row trained (a reward on the completion's length parity, so every group
has a gradient). The two controllers alternate step by step, so load on a shared machine
hits both alike; each reports its median per role. On a GPU bf16 is the faster one. On a
CPU it depends on what the CPU has: it prints the bf16 flags the kernel reports (avx512_bf16:
bf16 dot products in AVX-512; amx_bf16: Intel's matrix tiles), and BENCHMARKS.md ("bf16 on
this CPU") has what it measured where one has avx512_bf16 without AMX.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from ceilings import describe, machine

from posttrain.config import ModelConfig, TrainConfig
from posttrain.envs import make_env
from posttrain.models import make_policy, save_checkpoint_model
from posttrain.models.device import place
from posttrain.pipelines.build import build_controller

ROLES = ("time/rollout", "time/reference", "time/train")
# π_θ / π_old before the update: 1 up to rounding, since the sampler (KV cache, one token at
# a time) and the trainer (whole sequences) compute the same log-probs by different matmuls
AGREEMENT = ("ratio_max", "approx_kl")
# bf16's sampler is not the trainer: the update recomputes π_old (so ratio_max is 1) and the
# mismatch module reports the largest |log π_trainer − log π_sampler| it corrected
# (roles/mismatch.py); a float32 run has no such key, the two being one
SAMPLER_GAP = "mismatch/logp_diff_max"


def bf16_flags() -> list[str]:
    """The CPU flags /proc/cpuinfo reports that name bf16 (Linux only; [] elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return sorted({flag for flag in text.split() if "bf16" in flag})


def controller(dtype: str, start: Path, args: argparse.Namespace):
    cfg = TrainConfig(dtype=dtype, model=ModelConfig(name=args.model))
    cfg.rl.prompts_per_step = args.prompts or cfg.rl.prompts_per_step
    cfg.rl.samples_per_prompt, cfg.rl.update.micro_batch_size = args.samples, args.micro_batch
    torch.manual_seed(0)
    policy, tokenizer = make_policy(cfg.model)
    if not (start / "config.json").exists():
        save_checkpoint_model(policy, tokenizer, start)
    place(policy, "cpu", dtype)
    built = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, start)
    built.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    return built


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="gpt_mini", help="model.name: gpt_mini (from scratch) or smollm2-135m")
    parser.add_argument("--prompts", type=int, default=0, help="prompts a step; 0 = rl.prompts_per_step's default")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="rl.update.micro_batch_size: 0 = one backward over every row; SmolLM2 needs ~8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        controllers = {dtype: controller(dtype, Path(tmp) / "start", args) for dtype in ("float32", "bfloat16")}
        times: dict[str, dict[str, list[float]]] = {d: {key: [] for key in ROLES + AGREEMENT} for d in controllers}
        for step in range(args.repeats + 1):
            for dtype, c in controllers.items():
                metrics, _ = c.step(step)
                if step > 0:  # step 0 warms up allocators and kernels
                    for key in ROLES + AGREEMENT:
                        times[dtype][key].append(metrics[key])
                    if SAMPLER_GAP in metrics:
                        times[dtype].setdefault(SAMPLER_GAP, []).append(metrics[SAMPLER_GAP])
    result = {"machine": machine(), "bf16_flags": bf16_flags(), "threads": args.threads, "repeats": args.repeats, "model": args.model,
              "median_seconds": {d: {role.split("/")[1]: round(statistics.median(t[role]), 2) for role in ROLES}
                                 for d, t in times.items()},
              "max_over_steps": {d: {key: max(t[key]) for key in (*AGREEMENT, SAMPLER_GAP) if t.get(key)}
                                 for d, t in times.items()}}
    for d, medians in result["median_seconds"].items():
        medians["step"] = round(sum(medians.values()), 2)
    print(describe(result["machine"]) + f"; CPU bf16 flags: {', '.join(result['bf16_flags']) or 'none'}")
    print(json.dumps({key: result[key] for key in ("median_seconds", "max_over_steps")}, indent=2))


if __name__ == "__main__":
    main()
