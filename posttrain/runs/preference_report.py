"""The preference stage's own section of summary.md: what pair balancing dropped
(<stage>_pair_balance.json, pipelines/preference_rounds.py) and the start-against-trained
diagnostics (<stage>_diagnostics.json, pipelines/preference_diagnostics.py): temperature
sensitivity and an out-of-distribution check."""

from __future__ import annotations

from posttrain.runs.rundir import RunDir


def preference_section(run: RunDir, stage: str) -> tuple[list[str], dict]:
    """summary.md's "Preference diagnostics" lines and what summary.json keeps of them
    ({} and [] when the stage wrote neither file)."""
    balance, record = run.read_json(f"{stage}_pair_balance.json"), run.read_json(f"{stage}_diagnostics.json")
    lines, kept = [], {}
    if balance:
        kept["pair_balance"] = balance
        lines += ["Pairs curated before training (rl.preference.max_pairs_per_prompt / balance_topics / balance_lengths), "
                  "before → kept:", ""]
        lines += [f"- round {r}, {part}: " + ", ".join(f"{bucket} {n['before']} → {n['kept']}"
                                                      for bucket, n in buckets.items())
                  for r, report in balance.items() for part, buckets in report.items()]
    if record and "trained" in record:
        kept["diagnostics"] = record
        lines += ([""] if lines else []) + diagnostics_lines(record)
    return (["", "## Preference diagnostics", ""] + lines if lines else []), kept


def diagnostics_lines(record: dict) -> list[str]:
    """The record as markdown tables, start beside trained (runs/report.py's summary.md section)."""
    start, trained = record.get("start", {}), record.get("trained", {})
    lines: list[str] = []
    if "temperatures" in trained:
        before = {r["temperature"]: r for r in start.get("temperatures", [])}
        # mean reward beside pass@1 only where it says something else (partial credit, a graded verifier)
        graded = any(r["reward_mean"] != r["pass@1"] for r in trained["temperatures"] + start.get("temperatures", []))
        keys = [("pass@1", "pass@1", "p")] + ([("reward_mean", "mean reward", "r")] if graded else [])
        keys.append(("response_length", "length", "l"))
        lines += ["| temperature | " + " | ".join(f"{name} start | {name} trained" for _, name, _ in keys) + " |",
                  "|---|" + "---|---|" * len(keys)]
        for row in trained["temperatures"]:
            was = before.get(row["temperature"], {})
            lines.append(f"| {row['temperature']:g} | "
                         + " | ".join(f"{fmt(was.get(k), kind)} | {fmt(row[k], kind)}" for k, _, kind in keys) + " |")
        lines.append(f"\n(one completion each of {trained['temperatures'][0]['n']} held-out problems; T = 0 is greedy)")
    if "ood" in trained:
        was = start.get("ood", {})
        lines += ["", "| policy | held-out pass@1 (greedy) | out-of-distribution pass@1 (greedy) |", "|---|---|---|"]
        for name, part in (("start", was), ("trained", trained["ood"])):
            lines.append(f"| {name} | {fmt(part.get('heldout_pass@1'), 'p')} | {fmt(part.get('ood_pass@1'), 'p')} |")
        lines.append(f"\n(n = {trained['ood']['n_heldout']} held-out and {trained['ood']['n_ood']} "
                     "out-of-distribution problems)")
    return lines


def fmt(value: float | None, kind: str) -> str:
    """A percentage (kind "p"), a reward ("r") or a length ("l"); "–" where the start was not measured."""
    if value is None:
        return "–"
    return f"{100 * value:.1f}%" if kind == "p" else f"{value:.3f}" if kind == "r" else f"{value:.1f}"
