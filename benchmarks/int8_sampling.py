"""int8 vs float32 sampling (rl.sampling.weights): the same engine, prompts, seed and number
of new tokens, side by side in one process, for gpt_mini at `make run`'s batch and for
SmolLM2-135M-Instruct at 8 prompts × 8 completions × 64 tokens.

    python benchmarks/int8_sampling.py [--threads 2] [--repeats 2] [--models gpt_mini,smollm2-135m]

Every row decodes exactly --new-tokens tokens on both sides (end-of-turn is ignored, as in
generation.py), so both do the same number of decode steps. Also reported: the one-time
cost of building the int8 copy, the cost of quantising it again after a weight update
(what every RL step pays), and the mismatch the update has to correct, mean
|log π_int8 − log π_float32| per sampled token (the float32 side from the trainer's forward).
gpt_mini here is untrained (random weights): its speed is representative, its mismatch
is not (a near-uniform distribution moves little); the RL run in BENCHMARKS.md measures
the mismatch of a trained policy. Last, the mismatch int8 *weights* alone would give
(weights rounded to int8 and back, float32 activations): torch's kernel also quantises
the activations, one scale per call, and that is most of its error on SmolLM2.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from ceilings import best_time
from generation import NeverStop

from posttrain.config import SamplingParams, TrainConfig
from posttrain.envs import make_env
from posttrain.models import make_policy
from posttrain.models.hf import HFPolicy
from posttrain.models.int8 import Int8Sampler
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.trainer import Trainer
from posttrain.types import RolloutBatch


def load(name: str):
    """(policy, tokenizer, examples, samples per prompt, new tokens) for one model's workload."""
    if name == "gpt_mini":
        cfg = TrainConfig()  # make run's defaults: 32 prompts × 8 samples × ≤48 tokens
        policy, tokenizer = make_policy(cfg.model)
        env = make_env(cfg.env.name, **cfg.env.kwargs())
        return (policy, tokenizer, env.fixed_set("dev", cfg.rl.prompts_per_step, seed=0),
                cfg.rl.samples_per_prompt, cfg.rl.sampling.max_new_tokens)
    policy, tokenizer = HFPolicy.load(name, system_prompt="Add the numbers.")
    env = make_env("arithmetic", level=3, cot=True)
    return policy, tokenizer, env.fixed_set("dev", 8, seed=0), 8, 64


def compare(name: str, repeats: int) -> dict:
    policy, tokenizer, examples, samples, new_tokens = load(name)
    policy.requires_grad_(False)
    float_params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    int8_params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, weights="int8")
    engine = RolloutEngine(policy, NeverStop(tokenizer), float_params, shares_weights=True)
    start = time.perf_counter()
    engine.decoding_model(int8_params)  # the first int8 call builds the copy
    build = time.perf_counter() - start
    engine.weight_version += 1  # as after an optimizer step: the next int8 call quantises again
    engine.decoding_model(int8_params)
    requantize = engine.requantize_seconds

    seed = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    run = {"float32": lambda: engine.generate(examples, samples, seed(), params=float_params),
           "int8": lambda: engine.generate(examples, samples, seed(), params=int8_params)}
    seconds = {}
    for label in ("float32", "int8", "float32", "int8"):  # interleaved: a burst of load hits both sides
        t = best_time(run[label], max(1, repeats // 2))
        seconds[label] = min(t, seconds.get(label, float("inf")))

    episodes = run["int8"]()
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    with torch.no_grad():
        float_logp = Trainer(policy.requires_grad_(True), lr=1e-6, total_steps=1).forward(batch).logp
    mask = batch.response_mask.bool()
    gap = (float_logp - batch.old_logp)[mask]
    tokens = len(episodes) * new_tokens
    return {"model": name, "rows": len(episodes), "new_tokens": new_tokens,
            "float32_s": seconds["float32"], "int8_s": seconds["int8"],
            "float32_tok_s": tokens / seconds["float32"], "int8_tok_s": tokens / seconds["int8"],
            "speedup": seconds["float32"] / seconds["int8"], "build_int8_s": build, "requantize_s": requantize,
            "logp_mismatch_mean": gap.abs().mean().item(), "logp_mismatch_p99": gap.abs().quantile(0.99).item(),
            "is_weight_max": gap.exp().max().item(), "is_weight_min": gap.exp().min().item(),
            "weight_only_logp_mismatch_mean": weight_only_mismatch(policy, tokenizer, examples, samples, new_tokens)}


class RoundedWeights(torch.nn.Module):
    """A Linear whose weight is rounded to row-wise int8 and back, multiplied in float32:
    the error of int8 *weights* alone (weight-only int8), without the kernel's activation
    quantisation. Slow; for the accuracy comparison only."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127  # (out, 1), as models/int8.py
        self.weight, self.bias = torch.round(w / scale) * scale, linear.bias

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight, self.bias)


def weight_only_mismatch(policy, tokenizer, examples, samples: int, new_tokens: int) -> float:
    """Mean |log π_weight-only-int8 − log π_float32| per sampled token (float32 samples)."""
    engine = RolloutEngine(policy, tokenizer, SamplingParams(max_new_tokens=new_tokens), shares_weights=True)
    batch = RolloutBatch.collate(engine.generate(examples, samples, torch.Generator().manual_seed(0)),
                                 tokenizer.pad_id)
    rounded = Int8Sampler(policy)
    for parent, name, linear in rounded.linears:
        setattr(parent, name, RoundedWeights(linear))
    with torch.no_grad():
        logp = Trainer(rounded.module.requires_grad_(True), lr=1e-6, total_steps=1).forward(batch).logp
    return (logp - batch.old_logp)[batch.response_mask.bool()].abs().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt_mini,smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "int8_sampling.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()[0]
    results = []
    for name in args.models.split(","):
        r = compare(name, args.repeats)
        results.append(r)
        print(f"{name:14s} {r['rows']:3d} rows × {r['new_tokens']} tokens: float32 {r['float32_s']:6.2f} s "
              f"({r['float32_tok_s']:6.0f} tok/s) | int8 {r['int8_s']:6.2f} s ({r['int8_tok_s']:6.0f} tok/s) | "
              f"int8/float32 speed {r['speedup']:.2f}x | build {r['build_int8_s']:.3f} s, re-quantise "
              f"{r['requantize_s']:.3f} s | mean |Δlogp| {r['logp_mismatch_mean']:.4f}/token "
              f"(p99 {r['logp_mismatch_p99']:.4f}), π_float/π_int8 in [{r['is_weight_min']:.3f}, "
              f"{r['is_weight_max']:.3f}]; with int8 weights alone (float32 activations, simulated) mean |Δlogp| "
              f"{r['weight_only_logp_mismatch_mean']:.4f}/token", flush=True)
    loads = (load_before, os.getloadavg()[0])
    print(f"{args.threads} threads, torch {torch.__version__}; 1-minute load average {loads[0]:.2f} before, "
          f"{loads[1]:.2f} after (2-core machine shared with other jobs)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"threads": args.threads, "load_average": loads, "runs": results},
                                         indent=2) + "\n")


if __name__ == "__main__":
    main()
