"""On-policy distillation against GRPO at one sample budget, over several seeds (issue #41, item 1).

One teacher: gpt_mini after SFT on 300 worked solutions (the default arithmetic task). For each
seed, `posttrain compare` trains one weaker start (SFT on 120 solutions) and from it two rows
with the same steps × prompts × samples: GRPO on the verifier's reward, and OPD on the
teacher's per-token reverse KL. Both are scored greedily on the same held-out problems, so
each seed gives a paired difference with its bootstrap CI.

    PYTHONPATH=. .venv/bin/python benchmarks/opd_vs_grpo.py --out /tmp/opd [--seeds 0,1,2,3,4]
    PYTHONPATH=. .venv/bin/python benchmarks/opd_vs_grpo.py --out /tmp/opd --report   # read what is there

A seed whose compare directory already exists under --out is read, not rerun, so an
interrupted run continues where it stopped. The table goes to <out>/table.md, the chart to
<out>/opd_vs_grpo.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS, HELDOUT = 40, 300  # 40 steps × 32 prompts × 8 samples = 10,240 samples drawn per row
TEACHER_EXAMPLES, START_EXAMPLES = 300, 120


def posttrain(args: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "w") as f:
        done = subprocess.run([sys.executable, "-m", "posttrain", *args], stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise RuntimeError(f"`posttrain {' '.join(args)}` failed (exit {done.returncode}); see {log}")


def only_run(directory: Path) -> Path | None:
    """The one run directory under `directory` (a command's --out_dir), or None before it ran."""
    runs = sorted(p for p in directory.glob("*/") if (p / "config.json").exists()) if directory.exists() else []
    return runs[-1] if runs else None


def teacher(out: Path) -> Path:
    found = only_run(out / "teacher")
    if found is None:
        posttrain(["train", "--sft.num_examples", str(TEACHER_EXAMPLES), "--rl.steps", "0", "--heldout_size",
                   str(HELDOUT), "--threads", "1", "--out-dir", str(out / "teacher")], out / "teacher.log")
        found = only_run(out / "teacher")
    assert found is not None
    return found


def compare(out: Path, seed: int, teacher_run: Path | None) -> list[dict] | None:
    """The compare rows of `seed`, run first when `teacher_run` is given and they are missing."""
    directory = out / f"seed{seed}"
    table = next(directory.glob("*/compare.json"), None) if directory.exists() else None
    if table is None and teacher_run is not None:
        posttrain(["compare", "--row", "grpo", "--row", f"opd:rl.algo=opd,opd.teacher={teacher_run}",
                   "--sft.num_examples", str(START_EXAMPLES), "--rl.steps", str(STEPS), "--heldout_size", str(HELDOUT),
                   "--seed", str(seed), "--threads", "1", "--out-dir", str(directory)], out / f"seed{seed}.log")
        table = next(directory.glob("*/compare.json"))
    return json.loads(table.read_text()) if table is not None else None


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def report(out: Path, results: dict[int, list[dict]]) -> str:
    lines = ["| seed | start (SFT on 120) | GRPO | OPD | OPD − GRPO, paired (95% CI) |", "|---:|---:|---:|---:|---:|"]
    gains = []
    for seed, rows in sorted(results.items()):
        grpo, opd = (next(r for r in rows if r["algo"] == name) for name in ("grpo", "opd"))
        diff = opd["vs_first"]
        gains.append(diff["mean_diff"])
        lines.append(f"| {seed} | {percent(grpo['sft']['mean'])} | {percent(grpo['rl']['mean'])} | "
                     f"{percent(opd['rl']['mean'])} | {100 * diff['mean_diff']:+.1f} "
                     f"[{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}] |")
    spread = statistics.stdev(gains) if len(gains) > 1 else 0.0
    lines.append(f"\nOver {len(gains)} seeds OPD − GRPO is {100 * statistics.fmean(gains):+.1f} points "
                 f"(seed-to-seed sd {100 * spread:.1f}; from {100 * min(gains):+.1f} to {100 * max(gains):+.1f}), "
                 f"{STEPS} steps × 32 prompts × 8 samples each, {HELDOUT} held-out problems.")
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    draw(out, results)
    return text


def draw(out: Path, results: dict[int, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for seed, rows in sorted(results.items()):
        grpo, opd = (next(r for r in rows if r["algo"] == name) for name in ("grpo", "opd"))
        start = 100 * grpo["sft"]["mean"]
        ax.plot([0, STEPS * 256], [start, 100 * grpo["rl"]["mean"]], color="#0072B2", marker="o", alpha=0.8,
                label="GRPO" if seed == min(results) else None)
        ax.plot([0, STEPS * 256], [start, 100 * opd["rl"]["mean"]], color="#D55E00", marker="s", alpha=0.8,
                label="OPD" if seed == min(results) else None)
    ax.set_xlabel("completions sampled for training")
    ax.set_ylabel("held-out pass@1 (%), greedy")
    ax.set_title(f"OPD vs GRPO from the same start, {len(results)} seeds")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "opd_vs_grpo.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the runs, the table and the chart go")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds of the student's start and RL")
    parser.add_argument("--report", action="store_true", help="read the seeds already run; train nothing")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    teacher_run = None if args.report else teacher(out)
    results = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        rows = compare(out, seed, teacher_run)
        if rows is not None:
            results[seed] = rows
    if not results:
        raise SystemExit(f"no seed has finished under {out}")
    print(report(out, results))


if __name__ == "__main__":
    main()
