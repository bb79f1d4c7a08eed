"""Topology comparison on this machine: where an RL step's time goes when the rollout
role runs in the controller's process, on 2 Ray workers (sync), or on 2 Ray workers
sampling one batch ahead (async, 1-step off-policy).

The setup is `make run`'s GRPO stage (gpt_mini 0.8M parameters, 32 prompts × 8 samples,
≤48 new tokens) from a short SFT checkpoint made once at the start, so the three runs
start from the same weights and see the same prompts.

    python benchmarks/topology.py [--steps 12] [--sft-steps 200]

With `--partial C`, two topologies instead of four: today's async (k = 1, whole responses) and
async with partial rollouts (dist.partial_rollout_tokens = C: each batch draws C tokens a row
before the push, the rest under the new weights), alternated `--rounds` times in one run so
that both sides see the same drift in the machine's load; the ratio is of their mean steps.

    python benchmarks/topology.py --partial 16 --rounds 2 [--max-staleness 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

ROLES = ("rollout", "score", "reference", "train", "sync")
PROMPTS, SAMPLES = 32, 8  # make run's batch: rl.prompts_per_step × rl.samples_per_prompt (the defaults)


def config(out: str, **overrides):
    from posttrain.config import TrainConfig
    from posttrain.config.files import from_dict
    from posttrain.pipelines.checks import check_config

    data = {"out_dir": out, "heldout_size": 20, "threads": 2, "rl": {"dev_size": 20, "eval_every": 1000}}
    for key, value in overrides.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    cfg = from_dict(TrainConfig, data)
    check_config(cfg)
    return cfg


def train(cfg) -> tuple[Path, float]:
    from posttrain.pipelines.run import run_pipeline, start_run

    run = start_run(cfg, "bench")
    start = time.perf_counter()
    run_pipeline(cfg, run)
    return run.path, time.perf_counter() - start


def rl_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="RL steps per topology; the first and last are not timed")
    parser.add_argument("--sft-steps", type=int, default=200)
    parser.add_argument("--partial", type=int, default=0,
                        help="compare async with partial rollouts of this many tokens against today's async (0: the "
                             "four topologies)")
    parser.add_argument("--rounds", type=int, default=2, help="with --partial: alternations of the two sides")
    parser.add_argument("--init", default="", help="start from this SFT checkpoint instead of training one (a "
                        "checkpoint directory an earlier run of this script printed)")
    parser.add_argument("--max-staleness", type=int, default=1,
                        help="with --partial: k of both async sides (a batch draws C tokens a row per push, k pushes)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="posttrain-topology-")
    os.environ.setdefault("RAY_TMPDIR", tmp)

    if args.init:
        checkpoint = Path(args.init)
    else:
        sft_run, _ = train(config(tmp, name="sft", sft={"steps": args.sft_steps}, rl={"steps": 0}))
        checkpoint = sft_run / "checkpoints" / "sft" / (sft_run / "checkpoints" / "sft" / "latest").read_text().strip()
    print(f"SFT checkpoint: {checkpoint}")

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # started once, not timed
    # (label, run name, controller threads, dist settings). Workers use one thread each, so
    # with workers the controller gets one too: 2 cores, and no thread waits for a core
    async_k1 = {"workers": 2, "topology": "async", "max_staleness": 1}
    topologies = [
        ("colocated, 2 threads", "colocated-t2", 2, {}),
        ("colocated, 1 thread", "colocated-t1", 1, {}),
        ("sync, 2 workers", "sync", 1, {"workers": 2}),
        ("async k=1, 2 workers", "async", 1, async_k1),
    ]
    if args.partial:  # the two sides alternated, so that a change in the machine's load hits both
        k = args.max_staleness
        whole = (f"async k={k}, 2 workers", "async", 1, {**async_k1, "max_staleness": k})
        partial = (f"async k={k}, partial {args.partial}", "partial", 1,
                   {**async_k1, "max_staleness": k, "partial_rollout_tokens": args.partial})
        topologies = [(f"{label} (round {r + 1})", f"{name}-{r}", threads, dist) for r in range(args.rounds)
                      for label, name, threads, dist in (whole, partial)]
    results = {}
    load = [os.getloadavg()[0]]
    try:
        for label, name, threads, dist in topologies:
            cfg = config(tmp, name=name, init=str(checkpoint), threads=threads, rl={"steps": args.steps}, dist=dist)
            run, _ = train(cfg)
            # step 0 pays one-off costs (first weight push, warm caches); the last step also
            # runs the dev-set evaluation
            rows = rl_rows(run)[1:-1]
            timing = {role: statistics.mean(r.get(f"time/{role}", 0.0) for r in rows) for role in ROLES}
            timing["step"] = statistics.mean(r["time/step"] for r in rows)
            if "time/rollout_compute" in rows[0]:
                timing["worker sampling"] = statistics.mean(r["time/rollout_compute"] for r in rows)
            timing["reward"] = statistics.mean(r["reward_mean"] for r in rows)
            timing["staleness"] = max(r.get("staleness_max", 0) for r in rows)
            # response tokens per second of step: what a partial rollout might buy
            timing["tokens/s"] = sum(r["response_length"] * PROMPTS * SAMPLES for r in rows) / sum(
                r["time/step"] for r in rows)
            timing["token staleness"] = statistics.mean(r.get("staleness_token_mean", r.get("staleness_mean", 0))
                                                        for r in rows)
            timing["continued"] = statistics.mean(r.get("partial/continued_tokens", 0) for r in rows)
            results[label] = timing
    finally:
        ray.shutdown()
    load.append(os.getloadavg()[0])

    print(f"\n{args.steps - 2} timed RL steps each (seconds per step, mean), 32 prompts × 8 samples; "
          f"1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end (2 cores):\n")
    header = ["topology", "step", *ROLES, "worker sampling", "max staleness"]
    if args.partial:
        header += ["tokens/s", "token staleness", "tokens continued"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for label, t in results.items():
        cells = [label, f"{t['step']:.2f}", *(f"{t[r]:.3f}" for r in ROLES),
                 f"{t['worker sampling']:.3f}" if "worker sampling" in t else "—", str(t["staleness"])]
        if args.partial:
            cells += [f"{t['tokens/s']:.0f}", f"{t['token staleness']:.3f}", f"{t['continued']:.0f}"]
        print("| " + " | ".join(cells) + " |")
    if args.partial:
        whole = [t["step"] for label, t in results.items() if "partial" not in label]
        partial_steps = [t["step"] for label, t in results.items() if "partial" in label]
        print(f"\nmean step: async {statistics.mean(whole):.2f} s, async + partial {args.partial} "
              f"{statistics.mean(partial_steps):.2f} s; partial's throughput ÷ async's = "
              f"{statistics.mean(whole) / statistics.mean(partial_steps):.2f}")
    return results


if __name__ == "__main__":
    main()
