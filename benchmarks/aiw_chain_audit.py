"""Where does the reasoning specialist's chain go wrong? An audit of the capstone's held-out
answers (recipes/capstone_reasoning_specialist.toml).

The demonstrations' chain is one line, "5 sisters + Susan = 6" (envs/reasoning_gym_tasks.py::
aiw_steps), then "<answer>6</answer>". A greedy answer on a held-out puzzle can go wrong in
four places, each checked here against the question itself, read by its own pattern:

    count     the number before "sisters" is the question's count of sisters
              (and how often it is the count of brothers instead: the other number)
    name      the name is the girl the question is about
    sum       the number after "=" is that count + 1 (the trick, as arithmetic)
    answer    the tagged answer is the chain's own result

    PYTHONPATH=. python benchmarks/aiw_chain_audit.py runs/<capstone run> [runs/<another> ...]

It reads each run's eval_<stage>.jsonl (the held-out answers after every stage) and prints
one row per run and stage: the share of the held-out answers right in each place.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

CHAIN = re.compile(r"(?P<count>\d+) sisters \+ (?P<name>\w+) = (?P<sum>\d+)\n<answer>(?P<answer>[^<]*)</answer>")
QUESTION = re.compile(r"(?P<name>\w+) has (?:(?P<b1>\d+) brothers and she also has (?P<s1>\d+) sisters|"
                      r"(?P<s2>\d+) sisters and she also has (?P<b2>\d+) brothers)")


def audit(rows: list[dict]) -> dict[str, float]:
    """Shares of `rows` (an eval file's answers) right in each place of the chain."""
    counts = dict.fromkeys(("pass@1", "chain_parsed", "count_right", "count_is_brothers", "name_right",
                            "sum_is_count+1", "answer_is_sum"), 0)
    for row in rows:
        counts["pass@1"] += bool(row["details"]["correct"])
        question, chain = QUESTION.match(row["prompt"]), CHAIN.fullmatch(row["completion"].strip())
        if chain is None:
            continue
        sisters, brothers = int(question["s1"] or question["s2"]), int(question["b1"] or question["b2"])
        counts["chain_parsed"] += 1
        counts["count_right"] += int(chain["count"]) == sisters
        counts["count_is_brothers"] += int(chain["count"]) == brothers != sisters
        counts["name_right"] += chain["name"] == question["name"]
        counts["sum_is_count+1"] += int(chain["sum"]) == int(chain["count"]) + 1
        counts["answer_is_sum"] += chain["answer"] == chain["sum"]
    return {key: value / len(rows) for key, value in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="capstone run directories")
    args = parser.parse_args()
    header = None
    for run in map(Path, args.runs):
        for stage in [s["name"] for s in json.loads((run / "stages.json").read_text())]:
            path = run / f"eval_{stage}.jsonl"
            if not path.exists():
                continue
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            shares = audit(rows)
            if header is None:
                header = ["run", "stage", "n", *shares]
                print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
            print(f"| {run.name} | {stage} | {len(rows)} | " + " | ".join(f"{v:.1%}" for v in shares.values()) + " |")


if __name__ == "__main__":
    main()
