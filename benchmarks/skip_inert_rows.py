"""What leaving inert rows out of the update saves: one GRPO update with every row, and
with the rows whose advantage is 0 left out (rl.update.skip_inert_rows), side by side.

    cd benchmarks && ../.venv/bin/python skip_inert_rows.py [--threads 2] [--repeats 3]

The batch is sampled once per model; then a chosen fraction of its groups is made flat
(every sample scored alike: advantage 0) and the rest mixed, as late in `make run`, where
91% of groups are flat on average over 200 steps. The two updates alternate, so load on
a shared machine hits both alike; each reports its median. The bound is the rows that
have a gradient: leaving out a fraction f of the rows can at best divide the time by 1/(1 − f).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from ceilings import describe, machine

FLAT_FRACTIONS = (0.0, 0.5, 0.75, 0.9)


def sampled_batch(policy, tokenizer, prompts: int, group: int, new_tokens: int):
    from posttrain.config import SamplingParams
    from posttrain.envs import make_env
    from posttrain.roles.engines import RolloutEngine
    from posttrain.types import RolloutBatch

    env = make_env("arithmetic", level=3, cot=True)
    engine = RolloutEngine(policy, tokenizer, SamplingParams(temperature=1.0, max_new_tokens=new_tokens),
                           shares_weights=True)
    episodes = engine.generate(env.sample("train", prompts, seed=0), group, torch.Generator().manual_seed(0))
    return RolloutBatch.collate(episodes, tokenizer.pad_id)


def with_flat_groups(batch, fraction: float, group: int):
    """The batch with the first `fraction` of its groups all right and every other group
    half right: advantage 0 on exactly the flat groups' rows."""
    groups = batch.batch_size // group
    flat = round(fraction * groups)
    rewards = torch.tensor([1.0 if g < flat else float(i % 2) for g in range(groups) for i in range(group)])
    return dataclasses.replace(batch, rewards=rewards)


def time_updates(policy, batch, algo, repeats: int, micro_batch: int) -> tuple[float, float, float]:
    """(median seconds with every row, median seconds with inert rows left out, skipped fraction)."""
    from posttrain.roles.trainer import Trainer

    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    skipping = dataclasses.replace(batch, rows_with_gradient=algo.rows_with_gradient(batch))
    trainer = Trainer(policy, lr=1e-9, total_steps=2 * repeats + 2, micro_batch_size=micro_batch)
    times: dict[str, list[float]] = {"full": [], "skip": []}
    trainer.update(batch, algo)  # warm-up: optimizer state, allocator
    for _ in range(repeats):
        for name, b in (("full", batch), ("skip", skipping)):
            start = time.perf_counter()
            trainer.update(b, algo)
            times[name].append(time.perf_counter() - start)
    skipped = 1.0 - skipping.rows_with_gradient.float().mean().item()
    return statistics.median(times["full"]), statistics.median(times["skip"]), skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="gpt_mini,smollm2-135m", help="comma-separated: which setups to time")
    parser.add_argument("--flat", default=",".join(str(f) for f in FLAT_FRACTIONS),
                        help="comma-separated fractions of flat groups")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "skip_inert_rows.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from posttrain.algorithms import make_algorithm
    from posttrain.config import ModelConfig
    from posttrain.models import make_policy

    m = machine()
    print(describe(m))
    # (model, prompts, group, new tokens, micro-batch): make run's shape, and issue #18's SmolLM2 shape
    setups = [("gpt_mini", 32, 8, 48, 0), ("smollm2-135m", 8, 8, 64, 8)]
    results = []
    chosen = args.models.split(",")
    for name, prompts, group, new_tokens, micro_batch in [s for s in setups if s[0] in chosen]:
        policy, tokenizer = make_policy(ModelConfig(name=name))
        batch = sampled_batch(policy, tokenizer, prompts, group, new_tokens)
        algo = make_algorithm("grpo", max_len=new_tokens)
        print(f"\n{name}: {prompts} prompts x {group} samples, <= {new_tokens} new tokens, "
              f"{batch.tokens.shape[1]} columns, micro-batch {micro_batch or 'all'}")
        print(f"  {'flat groups':>11} {'all rows':>9} {'skipping':>9} {'speed-up':>9} {'bound':>6}")
        for fraction in [float(f) for f in args.flat.split(",")]:
            full, skip, skipped = time_updates(policy, with_flat_groups(batch, fraction, group), algo, args.repeats,
                                               micro_batch)
            bound = 1 / (1 - skipped)
            print(f"  {fraction:>11.0%} {full:>8.2f}s {skip:>8.2f}s {full / skip:>8.2f}x {bound:>5.1f}x")
            results.append({"model": name, "flat_fraction": fraction, "skipped_rows": skipped,
                            "full_seconds": full, "skip_seconds": skip, "speedup": full / skip, "bound": bound})
    print("\nreproduce: cd benchmarks && ../.venv/bin/python skip_inert_rows.py")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": m, "args": vars(args), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
