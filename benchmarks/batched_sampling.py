"""Sampling a large pair budget: one batch against batches of `RolloutEngine.max_rows` rows.

Offline DPO samples its whole budget before training (3,200 prompts × 8 samples in the
online-vs-offline comparison of docs/algorithms/dpo.md). Decoded as one batch, every row's
KV cache and logits are alive at once; `RolloutEngine.generate` splits a large call into
batches of whole prompt groups instead. Each mode runs in its own process, so each peak
RSS is its own.

    python benchmarks/batched_sampling.py [--prompts 1600]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def sample(prompts: int, max_rows: int) -> dict:
    import torch

    from posttrain.config import TrainConfig
    from posttrain.envs import make_env
    from posttrain.models import make_policy
    from posttrain.roles.engines import RolloutEngine
    from posttrain.config import SamplingParams

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = TrainConfig()
    policy, tokenizer = make_policy(cfg.model)  # untrained gpt_mini: every row runs to max_new_tokens
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    examples = env.sample("train", prompts, seed=0)
    engine = RolloutEngine(policy, tokenizer, SamplingParams(temperature=1.0,
                                                             max_new_tokens=cfg.rl.sampling.max_new_tokens))
    engine.max_rows = max_rows
    start = time.perf_counter()
    episodes = engine.generate(examples, cfg.rl.samples_per_prompt, torch.Generator().manual_seed(0))
    return {"samples": len(episodes), "seconds": time.perf_counter() - start,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=1600)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # max_rows, in a child process
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(sample(args.prompts, args.child)))
        return

    from posttrain.roles.engines import RolloutEngine

    batched_rows = RolloutEngine.max_rows
    results = {}
    for label, rows in (("one batch", 10**9), (f"batches of {batched_rows} rows", batched_rows)):
        out = subprocess.run([sys.executable, __file__, "--prompts", str(args.prompts), "--child", str(rows)],
                             capture_output=True, text=True, check=True)
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[label]
        print(f"{label:24s} {r['samples']} samples in {r['seconds']:6.1f} s, peak RSS {r['peak_rss_gb']:.2f} GB")
    one, batched = results.values()
    print(f"batched / one batch: time {batched['seconds'] / one['seconds']:.2f}x, "
          f"peak RSS {batched['peak_rss_gb'] / one['peak_rss_gb']:.2f}x")


if __name__ == "__main__":
    main()
