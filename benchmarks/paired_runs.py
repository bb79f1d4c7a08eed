"""Two training runs that differ in one setting (the precision, the sampling engine), read side
by side from their run directories: seconds per RL step, the mismatch diagnostics, held-out
pass@1 with its CI, and the paired difference on the held-out problems both scored.

    python benchmarks/paired_runs.py RUN_A RUN_B [RUN_A2 RUN_B2 ...]

Runs are taken in pairs (A, B): each pair's difference is B − A, paired item by item
(eval.comparison.paired_change over the two eval_<stage>.jsonl files, so two runs that
scored different problems are refused rather than compared). With more than one pair (one
per seed) a pooled line follows, over every (seed, problem) item: it reads the mean
difference across seeds, and its bootstrap treats each item of each seed as independent, so
it says nothing about how far another seed would land.

Nothing here trains: it reads what `posttrain train` wrote. The commands that made the runs
are in BENCHMARKS.md ("bf16 on this CPU: GRPO runs", "vLLM against the built-in engine").
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from posttrain.eval.comparison import paired_change, paired_scores, solved_by_id

# over the run's steps: the mean of each of these, and the worst step of those (ESS: the lowest)
MEAN_OF = ("mismatch/kl", "mismatch/k3_kl", "mismatch/logp_diff_mean", "mismatch/truncated_fraction")
WORST_OF = {"mismatch/logp_diff_max": max, "mismatch/ratio_max": max, "mismatch/ratio_min": min,
            "mismatch/ess": min}
TIMES = ("time/step", "time/rollout", "time/reference", "time/train", "time/sync")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def describe_run(run: Path) -> dict[str, Any]:
    """What one run directory says: its setting, step times, mismatch and final held-out score."""
    config = json.loads((run / "config.json").read_text())
    meta = json.loads((run / "meta.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    stage = summary["final_stage"]
    steps = [row for row in read_jsonl(run / "metrics.jsonl") if row.get("stage") == stage and "time/step" in row]
    if not steps:
        raise SystemExit(f"{run}: metrics.jsonl has no {stage} step with time/step; is the run finished?")
    # step 0 pays for first-call allocations and, with vLLM, the first full weight load: left out
    timed = steps[1:] or steps
    row: dict[str, Any] = {
        "run": run.name, "dtype": config.get("dtype"), "engine": config["rl"]["sampling"].get("engine", "torch"),
        "device": meta.get("device"), "steps": len(steps), "heldout": summary[stage],
        "rl_wall_seconds": summary.get("rl_wall_seconds"),
        "median_seconds": {key.split("/")[1]: round(statistics.median(r.get(key, 0.0) for r in timed), 2)
                           for key in TIMES},
    }
    mismatch = {}
    for key in MEAN_OF:
        values = [r[key] for r in steps if key in r]
        if values:
            mismatch[f"{key.split('/')[1]} (mean)"] = statistics.fmean(values)
    for key, worst in WORST_OF.items():
        values = [r[key] for r in steps if key in r]
        if values:
            mismatch[f"{key.split('/')[1]} ({worst.__name__})"] = worst(values)
    row["mismatch"] = mismatch
    row["eval_rows"] = read_jsonl(run / f"eval_{stage}.jsonl")
    return row


def percent(ci: dict[str, Any]) -> str:
    return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}] (n={ci['n']})"


def signed_points(diff: dict[str, Any]) -> str:
    return (f"{100 * diff['mean_diff']:+.1f} points [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}] "
            f"over {diff['n_shared']} problems: {diff['verdict']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories, in pairs: A B [A B ...]; B − A")
    parser.add_argument("--json", action="store_true", help="print every number as JSON instead of lines")
    args = parser.parse_args()
    if len(args.runs) % 2:
        parser.error(f"{len(args.runs)} run directories given: they are read in pairs (A B), so pass an even number")
    described = [describe_run(run) for run in args.runs]
    pairs, pooled_a, pooled_b = [], {}, {}
    for index in range(0, len(described), 2):
        a, b = described[index], described[index + 1]
        diff = paired_change(b["eval_rows"], a["eval_rows"])
        if diff is None:
            raise SystemExit(f"{a['run']} and {b['run']}: their held-out rows cannot be paired by id")
        pairs.append({"a": a["run"], "b": b["run"], "b_minus_a": diff})
        pooled_a.update({f"{index}:{k}": v for k, v in solved_by_id(a["eval_rows"]).items()})
        pooled_b.update({f"{index}:{k}": v for k, v in solved_by_id(b["eval_rows"]).items()})
    pooled = paired_scores(pooled_b, pooled_a) if len(pairs) > 1 else None
    for row in described:
        del row["eval_rows"]
    if args.json:
        print(json.dumps({"runs": described, "pairs": pairs, "pooled": pooled}, indent=2))
        return
    for row in described:
        print(f"{row['run']}: dtype {row['dtype']}, engine {row['engine']}, {row['steps']} RL steps, "
              f"held-out pass@1 {percent(row['heldout'])}")
        print(f"  median seconds a step (steps 1-): {row['median_seconds']}")
        print("  mismatch: " + ", ".join(f"{k} {v:.3g}" for k, v in row["mismatch"].items()))
    for pair in pairs:
        print(f"{pair['b']} − {pair['a']}: {signed_points(pair['b_minus_a'])}")
    if pooled is not None:
        print(f"pooled over {len(pairs)} pairs: {signed_points(pooled)}")


if __name__ == "__main__":
    main()
