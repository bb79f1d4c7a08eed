"""RL's held-out gain over several seeds of one command: each run's paired change, and the runs pooled.

Each run scored the same held-out problems before and after RL (eval_sft.jsonl or eval_start.jsonl,
and eval_rl.jsonl). Pooled, every (seed, problem) pair is one item of the paired bootstrap
(posttrain/eval/comparison.py::paired_change), so the CI says how sure the mean gain over these
seeds is, problem noise included; the seed-to-seed spread is printed beside it, since a CI over
problems does not cover a seed that trains differently.

    PYTHONPATH=. .venv/bin/python benchmarks/pooled_gain.py runs/<seed 0 run> runs/<seed 1 run> runs/<seed 2 run>
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from posttrain.eval.comparison import paired_change


def rows(path: Path, seed: str) -> list[dict]:
    """An eval file's rows, each id prefixed with its run's seed so that seeds pool apart."""
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{**row, "id": f"{seed}:{row['id']}"} for row in found]


def before_file(run: Path) -> Path:
    for name in ("eval_sft.jsonl", "eval_start.jsonl"):
        if (run / name).exists():
            return run / name
    raise SystemExit(f"{run}: no eval_sft.jsonl or eval_start.jsonl, the held-out scores before RL")


def points(change: dict) -> str:
    return (f"{100 * change['mean_diff']:+.1f} points (95% CI {100 * change['ci_low']:+.1f} to "
            f"{100 * change['ci_high']:+.1f}, n={change['n']})")


def main() -> None:
    runs = [Path(p) for p in sys.argv[1:]]
    if not runs:
        raise SystemExit(__doc__)
    pooled_after, pooled_before, gains = [], [], []
    for run in runs:
        seed = str(json.loads((run / "config.json").read_text())["seed"])
        after, before = rows(run / "eval_rl.jsonl", seed), rows(before_file(run), seed)
        change = paired_change(after, before)
        if change is None:
            raise SystemExit(f"{run}: its eval rows cannot be paired by id")
        gains.append(change["mean_diff"])
        print(f"seed {seed}: {100 * change['mean_b']:.1f}% -> {100 * change['mean_a']:.1f}%, {points(change)}  {run}")
        pooled_after += after
        pooled_before += before
    pooled = paired_change(pooled_after, pooled_before)
    assert pooled is not None
    spread = f", seed-to-seed sd {100 * statistics.stdev(gains):.1f}" if len(gains) > 1 else ""
    print(f"pooled over {len(runs)} seeds: {points(pooled)}{spread}")


if __name__ == "__main__":
    main()
