"""How right are Monte-Carlo step labels? An audit on reasoning-gym's leg_counting.

`posttrain prm --labels mc` labels a step by rolling the policy out from it
(rewards/monte_carlo_labels.py), because the task has no step checker. leg_counting's worked
steps (envs/reasoning_gym_tasks.py::leg_counting_steps) can be checked after the fact,
though: a line is right when its arithmetic is the demonstration's (what follows "N animal:
", which the answer depends on), and a step's true label (first-error, as verifiers/steps.py
labels arithmetic) is "this line and every line before it are right". The "N animal" in
front is a copy of the question's words; a miscopied one ("4 bees" for "4 beetles") changes
no number, so it is counted apart and not called wrong. This script reads a prm run's
labelled samples and counts where Monte-Carlo labels and the truth disagree:

    right steps labelled wrong    the policy failed from a right prefix in every rollout
                                  (a weak policy, or too few rollouts)
    wrong steps labelled right    some rollout ended right after a wrong line: the policy
                                  repaired the mistake later, or the mistake changed no
                                  total (a wrong count of a 0-legged animal)

    PYTHONPATH=. python benchmarks/mc_labels_audit.py runs/<prm run>

A line whose arithmetic is written differently from the demonstration's but means the same
("4*3=12" for "3*4=12") counts as wrong here; the policy imitates the demonstrations' format,
so this is rare (the script prints how many steps it could not parse as a leg line at all).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from posttrain.data.stepwise import load_stepwise
from posttrain.envs.reasoning_gym_tasks import leg_counting_steps
from posttrain.eval.calibration import grouped_bootstrap_ci


def demonstration(prompt: str) -> list[str]:
    """The lines a demonstration writes for a leg_counting prompt, answer line last."""
    listed = re.search(r"if you have (.*)\?\n", prompt).group(1).split(", ")
    animals = {}
    for item in listed:
        count, name = item.split(" ", 1)
        animals[name[:-1] if int(count) > 1 else name] = int(count)  # "3 spiders" -> spider: 3
    steps = leg_counting_steps({"metadata": {"animals": animals}})
    total = int(steps[-1].rsplit("=", 1)[1])
    return steps + [f"<answer>{total}</answer>"]


def arithmetic(line: str) -> str:
    """What a line computes: the text after its "N animal: " (the answer line whole)."""
    return line.split(": ", 1)[-1]


def true_labels(prompt: str, steps: list[str]) -> list[bool]:
    """First-error labels: True while every line so far computes what the demonstration's does."""
    right, labels, ok = demonstration(prompt), [], True
    for k, step in enumerate(steps):
        ok = ok and k < len(right) and arithmetic(step) == arithmetic(right[k])
        labels.append(ok)
    return labels


def miscopied(prompt: str, steps: list[str]) -> int:
    """Lines whose "N animal" is not the question's, whatever their arithmetic."""
    right = demonstration(prompt)
    return sum(": " in step and k < len(right) - 1 and step.split(": ", 1)[0] != right[k].split(": ", 1)[0]
               for k, step in enumerate(steps))


def rate(groups: list[tuple[list[float], list[float]]], keep: bool | None) -> dict:
    """The share of steps whose Monte-Carlo label disagrees with the truth, among the steps
    whose truth is `keep` (None: all steps), with a 95% CI resampling whole completions (the
    steps of one completion share their first error)."""
    def statistic(mc, truth):
        chosen = [(m, t) for m, t in zip(mc, truth) if keep is None or (t > 0.5) == keep]
        return sum((m > 0.5) != (t > 0.5) for m, t in chosen) / len(chosen) if chosen else float("nan")
    return grouped_bootstrap_ci(groups, statistic)


def audit(path: Path) -> dict:
    records = load_stepwise(path)
    groups = [(r.labels, [float(t) for t in true_labels(r.prompt, r.steps)]) for r in records]
    truth = [t for _, ts in groups for t in ts]
    leg_line = re.compile(r"\d+ [a-z ]+: \d+\*\d+=\d+(, \d+\+\d+=\d+)?|<answer>.*</answer>")
    return {
        "file": str(path),
        "completions": len(records),
        "steps": len(truth),
        "truly_wrong_steps": sum(t < 0.5 for t in truth),
        "disagreement": rate(groups, None),
        "right_steps_labelled_wrong": rate(groups, True),
        "wrong_steps_labelled_right": rate(groups, False),
        "steps_not_a_leg_line": sum(not leg_line.fullmatch(s) for r in records for s in r.steps),
        "lines_with_a_miscopied_animal": sum(miscopied(r.prompt, r.steps) for r in records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a `posttrain prm --labels mc` run directory on leg_counting")
    args = parser.parse_args()
    results = [audit(args.run / name) for name in ("prm_train.jsonl", "prm_heldout.jsonl")]
    print(json.dumps(results, indent=2))
    (args.run / "mc_labels_audit.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
