"""The gold reward (the verifier's) of several `posttrain rlhf` runs over their PPO steps, one
plot: how docs/guides/preference.md's ensemble-vs-single figure was drawn.

    python benchmarks/plot_rlhf_gold.py OUT.png "single RM, seed 0=runs/A" "min of 3, seed 0=runs/B" ...

Each run's rlhf.json holds its trajectory (step, proxy reward, gold reward); the curve is a
10-step trailing mean, as in each run's own rlhf_reward.png.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

WINDOW = 10  # steps in the trailing mean: one step's 256 samples are noisy


def trailing_mean(values: list[float], window: int = WINDOW) -> list[float]:
    return [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
            for i in range(len(values))]


def main(out: str, labelled_runs: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for item in labelled_runs:
        label, _, run = item.rpartition("=")
        trajectory = json.loads((Path(run) / "rlhf.json").read_text())["trajectory"]
        ax.plot([p["step"] for p in trajectory], trailing_mean([p["gold_reward"] for p in trajectory]),
                label=label or run)
    ax.set_xlabel("PPO step")
    ax.set_ylabel(f"gold reward (verifier), {WINDOW}-step mean")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
