"""Command-line start-up: how long `posttrain` takes to answer a typo'd flag, a bad value and
`--help`, each in a fresh process, side by side with `python -c "import torch"` alone (what any
answer that loads torch costs at least) and, with --against DIR, the same commands run from
another checkout (the main branch before a change, say).

Target (issue #39, item 7): `--help`, a typo'd flag and a bad value answered in under 2 s,
every row below but torch's own. A value of the right type outside an algorithm's range is
refused by the range checks the schema carries (cli/section_checks.py); the one check it
cannot carry (GRPO's adv_norm, whose message is built from a local) is its class's, after
torch: that row is timed, not held to the target.

    python benchmarks/cli_startup.py [--repeats 5] [--against ../main]

Each command runs as `python -m posttrain ...` with this checkout (or DIR) as the working
directory, so that its own package is the one imported; the two sides alternate, so that load
on a shared machine hits both alike. Wall seconds per run (median, min–max) and CPU seconds
(user + system, median), which a busy machine moves less; the exit status is checked, so a
row is the answer it names (2: refused, 0: the help), never a crash.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_SECONDS = 2.0

# (what the user did, the arguments, the exit status that answers it, whether the target applies)
CASES = [
    ("a typo'd flag", ["train", "--rl.stepz", "3"], 2, True),
    ("a typo'd algorithm section", ["train", "--grpoo.kl_coef", "0.1"], 2, True),
    ("a value of the wrong type", ["train", "--rl.steps", "x"], 2, True),
    ("a value out of range", ["train", "--rl.steps", "-1"], 2, True),
    ("an unknown algorithm", ["train", "--algo", "grop"], 2, True),
    ("a typo'd flag of an algorithm's section", ["train", "--grpo.kl_coeff", "0.1"], 2, True),
    ("a value of the wrong type in an algorithm's section", ["train", "--grpo.kl_coef", "x"], 2, True),
    ("a negative learning rate", ["train", "--rl.optim.lr", "-1"], 2, True),
    ("a probability above 1", ["train", "--rl.sampling.top_p", "2"], 2, True),
    ("a value out of an algorithm's range", ["train", "--grpo.clip_eps_low", "2"], 2, True),
    ("a value out of a preference loss's range", ["train", "--algo", "dpo", "--dpo.beta", "-1"], 2, True),
    ("a value out of range in another command's section", ["star", "--star.iterations", "-1"], 2, True),
    ("a check only the class makes", ["train", "--grpo.adv_norm", "zscore"], 2, False),
    ("train --help", ["train", "--help"], 0, True),
    ("train --algo grpo --help", ["train", "--algo", "grpo", "--help"], 0, True),
    ("rlhf --help", ["rlhf", "--help"], 0, True),
    ("eval --help", ["eval", "--help"], 0, True),
    ("doctor --help", ["doctor", "--help"], 0, True),
    ("check --help", ["check", "--help"], 0, True),
    ("demo NAME --help", ["demo", "bandit", "--help"], 0, True),
]


def time_run(command: list[str], cwd: Path, expected: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `command` in `cwd`; its output is discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expected:
        raise SystemExit(f"{' '.join(command)} (in {cwd}) exited {done.returncode}, not {expected}: "
                         f"{done.stderr[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def summary(runs: list[tuple[float, float]]) -> dict:
    walls = [wall for wall, _ in runs]
    return {"median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "cpu_median_s": statistics.median(cpu for _, cpu in runs)}


def shown(row: dict | None) -> str:
    if row is None:
        return "– | –"
    return f"{row['median_s']:.2f} s ({row['min_s']:.2f}–{row['max_s']:.2f}) | {row['cpu_median_s']:.2f} s"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command on each side (after a warm-up)")
    parser.add_argument("--against", type=Path,
                        help="another checkout, whose `python -m posttrain` runs beside this one's")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_startup.json")
    args = parser.parse_args()

    sides = {"this checkout": ROOT, **({f"--against {args.against}": args.against.resolve()} if args.against else {})}
    rows = []
    for what, argv, expected, targeted in [("import torch alone", None, 0, False), *CASES]:
        # torch alone is the same on either side: it runs once a round
        here = sides if argv else {"this checkout": ROOT}
        command = [sys.executable, *(["-m", "posttrain", *argv] if argv else ["-c", "import torch"])]
        times: dict[str, list[tuple[float, float]]] = {side: [] for side in here}
        for repeat in range(args.repeats + 1):  # the first round warms the file cache and is not counted
            for side, cwd in here.items():
                seconds = time_run(command, cwd, expected)
                if repeat:
                    times[side].append(seconds)
        rows.append({"what": what, "command": "posttrain " + " ".join(argv) if argv else "python -c 'import torch'",
                     "targeted": targeted, **{side: summary(t) for side, t in times.items()}})

    print(f"{cpu_name()}, {platform.machine()}, Python {platform.python_version()}, torch {version('torch')}; "
          f"{args.repeats} runs a row: wall seconds, median (min–max), and CPU seconds, median\n")
    names = list(sides)
    print("| what | command | " + " | ".join(f"{name} wall | cpu" for name in names)
          + (" | wall ratio |" if len(names) == 2 else " |"))
    print("|---" * (2 + 2 * len(names) + (len(names) == 2)) + "|")
    for row in rows:
        cells = [shown(row.get(side)) for side in names]
        if len(names) == 2:
            cells.append(f"{row[names[0]]['median_s'] / row[names[1]]['median_s']:.2f}×" if names[1] in row else "–")
        print(f"| {row['what']} | `{row['command']}` | " + " | ".join(cells) + " |")
    misses = [row["what"] for row in rows if row["targeted"] and row["this checkout"]["median_s"] >= TARGET_SECONDS]
    print(f"\ntarget: --help, a typo'd flag or a bad value answered in under {TARGET_SECONDS:.0f} s (median): "
          + ("met by every targeted row" if not misses else f"MISSED by {', '.join(misses)}"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu": cpu_name(), "repeats": args.repeats, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
