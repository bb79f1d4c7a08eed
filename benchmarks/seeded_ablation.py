"""An ablation as `posttrain compare` rows, repeated over seeds, read back as one table and one chart.

Each seed is one `posttrain compare` (one SFT start, every row trained from it), so each row
has a paired held-out difference to the first row per seed; over the seeds the table gives the
mean, every seed's paired CI and the seeds pooled (each (seed, problem) one pair of the paired
bootstrap, as benchmarks/pooled_gain.py pools: a CI over problems, which does not cover a seed
that trains differently; the seeds' own CIs show that), and the chart one metric of
metrics.jsonl over the RL steps (the mean over seeds, per row) beside held-out pass@1.

    # run: the seeds, then the report (a seed whose compare.json exists is read, not rerun)
    PYTHONPATH=. .venv/bin/python benchmarks/seeded_ablation.py --out /tmp/entropy --seeds 0,1,2 --metric entropy \
        -- --rl.steps 100 --threads 1 --row none --row top20:rl.entropy.top_quantile=0.2
    # report only, from the seeds already there
    PYTHONPATH=. .venv/bin/python benchmarks/seeded_ablation.py --out /tmp/entropy --metric entropy --report

The runs of seed S are under <out>/seed<S>/ (or any directory under <out> whose compare.json
has the seed in its config); the table goes to <out>/table.md, the chart to <out>/ablation.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from pooled_gain import rows as eval_rows  # this directory: the script's own, first on sys.path
from posttrain.eval.comparison import paired_change

ROOT = Path(__file__).resolve().parents[1]
LAST = 10  # the metric's "late" value: its mean over the last LAST steps


def run_seed(out: Path, seed: int, compare_args: list[str]) -> None:
    directory = out / f"seed{seed}"
    if next(directory.glob("*/compare.json"), None) is not None:
        return
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    log = out / f"seed{seed}.log"
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "posttrain", "compare", *compare_args, "--seed", str(seed),
                               "--out-dir", str(directory)], stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise RuntimeError(f"seed {seed}: posttrain compare failed (exit {done.returncode}); see {log}")


def seeds_found(out: Path) -> dict[int, Path]:
    """seed -> its compare directory, for every finished compare under `out`."""
    found = {}
    for table in sorted(out.glob("**/compare.json")):
        config = json.loads((table.parent / "config.json").read_text())
        found[int(config["seed"])] = table.parent
    return found


def row_name(row: dict) -> str:
    """The row's name: its run directory's suffix after the date and time (`20261202-120344-none`)."""
    return row["run"].split("-", 2)[2]


def metric_curve(directory: Path, metric: str) -> list[tuple[int, float]]:
    rows = (json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines() if line.strip())
    return [(r["step"], float(r[metric])) for r in rows if r.get("stage") == "rl" and metric in r]


def points(value: float) -> str:
    return f"{100 * value:+.1f}"


def report(out: Path, seeds: dict[int, Path], metric: str) -> str:
    tables = {seed: json.loads((d / "compare.json").read_text()) for seed, d in seeds.items()}
    names = [row_name(r) for r in next(iter(tables.values()))]
    heldout = {n: [] for n in names}
    diffs = {n: [] for n in names}
    late = {n: [] for n in names}
    left_out = {n: [] for n in names}  # share of rows the update skipped: the metric then averages the rest
    curves: dict[str, list[list[tuple[int, float]]]] = {n: [] for n in names}
    after_rl: dict[str, list[dict]] = {n: [] for n in names}  # every seed's eval_rl rows, ids prefixed by seed
    starts = []
    for seed, rows in sorted(tables.items()):
        starts.append(rows[0]["sft"]["mean"])
        for row in rows:
            name = row_name(row)
            heldout[name].append(row["rl"]["mean"])
            if "vs_first" in row:
                diffs[name].append(row["vs_first"])
            after_rl[name] += eval_rows(seeds[seed] / row["run"] / "eval_rl.jsonl", str(seed))
            curve = metric_curve(seeds[seed] / row["run"], metric)
            if curve:  # a row that does not log the metric (reward_flat_groups/* only under GDPO) shows none
                curves[name].append(curve)
                late[name].append(statistics.fmean(v for _, v in curve[-LAST:]))
            skipped = metric_curve(seeds[seed] / row["run"], "skipped_rows")[-LAST:]
            left_out[name].append(statistics.fmean(v for _, v in skipped) if skipped else 0.0)
    first = names[0]
    lines = [f"| row | held-out pass@1, mean over {len(tables)} seeds (each) | vs {first}, paired: mean "
             f"(each seed's 95% CI) | vs {first}, pooled over the seeds (95% CI) | {metric}, last {LAST} steps | "
             f"share of rows left out of the update, last {LAST} |", "|---|---|---|---|---|---|"]
    for name in names:
        each = ", ".join(f"{100 * v:.1f}" for v in heldout[name])
        if diffs[name]:
            cis = "; ".join(f"{points(d['mean_diff'])} [{points(d['ci_low'])}, {points(d['ci_high'])}]"
                            for d in diffs[name])
            versus = f"{points(statistics.fmean(d['mean_diff'] for d in diffs[name]))} ({cis})"
        else:
            versus = ""
        pooled = paired_change(after_rl[name], after_rl[first]) if diffs[name] else None
        together = f"{points(pooled['mean_diff'])} [{points(pooled['ci_low'])}, {points(pooled['ci_high'])}]" if pooled else ""
        lines.append(f"| {name} | {100 * statistics.fmean(heldout[name]):.1f}% ({each}) | {versus} | {together} | "
                     f"{f'{statistics.fmean(late[name]):.4f}' if late[name] else '—'} | "
                     f"{100 * statistics.fmean(left_out[name]):.0f}% |")
    lines.append(f"\nStart (the SFT checkpoint every row of a seed trains from): "
                 f"{', '.join(f'{100 * s:.1f}%' for s in starts)} held-out pass@1 for seeds "
                 f"{', '.join(str(s) for s in sorted(tables))}.")
    if any(statistics.fmean(v) > 0 for v in left_out.values()):
        lines.append(f"A row that leaves rows out of its update (groups whose samples all scored alike) logs "
                     f"{metric} over the rows it trained only, so its {metric} is not comparable with a row "
                     "that trains every row (docs/algorithms/entropy_control.md, Conventions).")
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    draw(out, names, curves, heldout, metric, {n for n in names if statistics.fmean(left_out[n]) > 0})
    return text


def mean_curve(curves: list[list[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """The steps every seed has, and the metric's mean over the seeds at each."""
    steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
    by_seed = [dict(c) for c in curves]
    return steps, [statistics.fmean(c[s] for c in by_seed) for s in steps]


def draw(out: Path, names: list[str], curves: dict, heldout: dict, metric: str, partial: set[str]) -> None:
    """`partial`: rows whose update left rows out, so their metric averages the rows trained (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    for name in (n for n in names if curves[n]):
        steps, values = mean_curve(curves[name])
        label, style = (f"{name} (rows trained only)", "--") if name in partial else (name, "-")
        left.plot(steps, values, style, label=label, alpha=0.85)
    left.set_xlabel("RL step")
    left.set_ylabel(f"{metric} (mean over seeds)")
    left.set_yscale("log")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    for i, name in enumerate(names):
        right.scatter([i] * len(heldout[name]), [100 * v for v in heldout[name]], color="#555555", s=14)
        right.bar(i, 100 * statistics.fmean(heldout[name]), alpha=0.5)
    right.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    right.set_ylabel("held-out pass@1 (%), each seed and mean")
    low = min(100 * min(v) for v in heldout.values())
    right.set_ylim(max(0.0, low - 10), 100)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(out / "ablation.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the seeds' runs, the table and the chart go")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds to run")
    parser.add_argument("--metric", default="entropy", help="the metrics.jsonl column to plot over the RL steps")
    parser.add_argument("--report", action="store_true", help="read the seeds already run; train nothing")
    parser.add_argument("compare_args", nargs="*", help="after --: the `posttrain compare` flags, rows included")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        if not args.compare_args:
            raise SystemExit("give the posttrain compare flags after --, or --report to read what is there")
        for seed in (int(s) for s in args.seeds.split(",")):
            run_seed(out, seed, args.compare_args)
    seeds = seeds_found(out)
    if not seeds:
        raise SystemExit(f"no finished compare (compare.json) under {out}")
    print(report(out, seeds, args.metric))


if __name__ == "__main__":
    main()
