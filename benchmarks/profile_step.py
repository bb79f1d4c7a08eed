"""Where the time goes: torch.profiler over posttrain's sampler (decode at 8 and 64 rows)
and one trainer update, on SmolLM2-135M-Instruct, grouped into a few kinds of work.

    cd benchmarks && ../.venv/bin/python profile_step.py [--model DIR] [--threads 2]

`--model` also takes a gpt_mini checkpoint directory; with `--rows 256 --new-tokens 48
--update-rows 256 --micro-batch 0 --threads 1` and make run's SFT checkpoint it profiles
make run's RL step (32 prompts x 8 samples, up to 48 new tokens, one update of all rows).

The groups answer one question: how much of the time is the matmuls the roofline counts,
and how much is everything else (attention, the softmax over 49k logits, sampling, cache
bookkeeping, elementwise ops, framework overhead)? A workload whose time is mostly GEMMs
can only get faster by running those GEMMs faster; one whose time is mostly the rest has
headroom a better implementation can take.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ceilings import describe, machine

# aten op name -> group; the first matching prefix wins, anything unmatched is "other"
GROUPS = [
    ("matmul (GEMM)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
    ("attention (SDPA)", ("aten::_scaled_dot_product", "aten::scaled_dot_product")),
    ("softmax / log-softmax", ("aten::_softmax", "aten::_log_softmax", "aten::softmax", "aten::log_softmax",
                               "aten::logsumexp")),
    ("sampling", ("aten::multinomial", "aten::exponential", "aten::argmax", "aten::sort", "aten::cumsum",
                  "aten::searchsorted", "aten::uniform")),
    ("cache and indexing", ("aten::index", "aten::copy_", "aten::cat", "aten::index_select", "aten::gather",
                            "aten::scatter", "aten::index_put", "aten::slice", "aten::select", "aten::masked_fill")),
    ("elementwise", ("aten::mul", "aten::add", "aten::sub", "aten::div", "aten::silu", "aten::pow", "aten::rsqrt",
                     "aten::mean", "aten::neg", "aten::exp", "aten::sum", "aten::where", "aten::clamp", "aten::sigmoid",
                     "aten::fill_", "aten::zero_", "aten::ne", "aten::eq", "aten::lt", "aten::gt", "aten::ge")),
]


def group_of(name: str) -> str:
    for group, prefixes in GROUPS:
        if name.startswith(prefixes):
            return group
    return "other"


def grouped(prof) -> tuple[dict[str, float], list[tuple[str, float]], float]:
    """(share of self CPU time per group, top ops by self time, total seconds)."""
    per_op = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(per_op.values())
    groups: dict[str, float] = defaultdict(float)
    for name, us in per_op.items():
        groups[group_of(name)] += us
    top = sorted(per_op.items(), key=lambda kv: -kv[1])[:8]
    return ({g: v / total for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            [(name, us / total) for name, us in top], total / 1e6)


def profile_generation(policy, tokenizer, env, rows: int, new_tokens: int) -> dict:
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams

    engine = RolloutEngine(policy, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=new_tokens),
                           shares_weights=True)
    examples = env.sample("train", max(1, rows // 8), seed=0)
    group = rows // len(examples)
    engine.generate(examples, group, torch.Generator().manual_seed(0))  # warm-up
    start = time.perf_counter()
    engine.generate(examples, group, torch.Generator().manual_seed(1))
    wall = time.perf_counter() - start  # unprofiled: the profiler itself adds time per op
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        episodes = engine.generate(examples, group, torch.Generator().manual_seed(1))
    shares, top, seconds = grouped(prof)
    tokens = sum(len(e.response_ids) for e in episodes)
    return {"workload": f"sampler, {rows} rows, <= {new_tokens} new tokens", "seconds": seconds, "wall_seconds": wall,
            "tokens": tokens, "groups": shares, "top_ops": top}


def profile_update(policy, tokenizer, env, rows: int, new_tokens: int, micro_batch: int) -> dict:
    from posttrain.algorithms import make_algorithm
    from posttrain.roles.environment import score_episodes
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams
    from posttrain.roles.trainer import Trainer
    from posttrain.types import RolloutBatch

    engine = RolloutEngine(policy, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=new_tokens),
                           shares_weights=True)
    episodes = score_episodes(env.score, engine.generate(env.sample("train", rows // 8, seed=0), 8,
                                                         torch.Generator().manual_seed(0)))
    for i, e in enumerate(episodes):  # a spread of rewards, so advantages and gradients are not 0
        e.reward = float(i % 3 == 0)
    algo = make_algorithm("grpo", max_len=new_tokens)
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    trainer = Trainer(policy, lr=1e-6, total_steps=3, micro_batch_size=micro_batch)
    trainer.update(batch, algo)  # warm-up: optimizer state, allocator
    start = time.perf_counter()
    trainer.update(batch, algo)
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.update(batch, algo)
    shares, top, seconds = grouped(prof)
    return {"workload": f"trainer update, {rows} rows x {batch.tokens.shape[1]} tokens, micro-batch {micro_batch}",
            "seconds": seconds, "wall_seconds": wall, "groups": shares, "top_ops": top}


def load(model: str):
    """(policy, tokenizer): a checkpoint directory (gpt_mini or transformers), or a known name."""
    from posttrain.models import load_checkpoint_model, load_tokenizer
    from posttrain.models.hf import HFPolicy

    if Path(model).is_dir():
        return load_checkpoint_model(Path(model)), load_tokenizer(Path(model))
    return HFPolicy.load(model, system_prompt="Add the numbers.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rows", default="8,64", help="comma-separated sampler batches, 8 samples per prompt")
    parser.add_argument("--update-rows", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=8, help="rows per backward pass (0: all at once)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "profile.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from posttrain.envs import make_env

    m = machine()
    print(describe(m))
    policy, tokenizer = load(args.model)
    env = make_env("arithmetic", level=3, cot=True)
    results = [profile_generation(policy, tokenizer, env, int(rows), args.new_tokens) for rows in args.rows.split(",")]
    results.append(profile_update(policy, tokenizer, env, args.update_rows, args.new_tokens, args.micro_batch))
    for r in results:
        print(f"\n{r['workload']}: {r['wall_seconds']:.1f} s wall unprofiled, {r['seconds']:.1f} s in aten ops profiled")
        for group, share in r["groups"].items():
            print(f"  {group:<24} {100 * share:5.1f}%")
        print("  top ops: " + ", ".join(f"{name} {100 * share:.1f}%" for name, share in r["top_ops"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": m, "args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
