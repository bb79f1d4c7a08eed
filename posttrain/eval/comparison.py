"""Comparing two measurements without fooling yourself: `posttrain diff`, and any job that
puts two numbers side by side (a run's before/after summary; compare's rows).

Two rules, applied in this order:

1. Locked room. A number depends on the model *and* on how it was measured: the scorer/spec
   version, the dataset (which problems), the prompt template the model saw, and the sampling
   settings. Two runs that differ in any of these measured different things, and the
   difference between their numbers mixes the model with the instrument. `check_comparable`
   reads both runs' meta.json and refuses such a pair, naming each difference, unless told
   `allow_different`; then it returns the differences, to be printed beside the result.

2. Noise. Scored on the same items, the paired bootstrap (stats.paired_bootstrap_diff) says
   how much of the difference a different draw of problems could undo, and the course's noise
   rule (stats.noise_rule: under 100 items, 5 points or less is likely noise) is printed
   beside it.

What is compared, from meta.json (the writers: eval/completions.py, eval/loop_a.py,
pipelines/run.py, search/best_of_n.py):

    spec_version   the scorer that turned completions into rewards
    dataset        its "version" when the writer records one (a hash of the problems: ids,
                   prompts, expected answers), else everything recorded about it but the path
    prompt         the prompt template: how a problem's text reached the model
    sampling       temperature, top_p, budget, ...: the same weights sampled differently
                   are a different measurement (greedy pass@1 vs sampled pass@1)

A field neither run records is not compared (there is nothing to compare); a field only one
records is a difference, shown as "(not set)" on the other side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from posttrain.eval.stats import noise_rule, noise_rule_line, paired_bootstrap_diff
from posttrain.runs.lineage import MISSING, differing_keys
from posttrain.runs.rundir import RunDir
from posttrain.verifiers.contract import is_solved

# meta.json field -> what it is, as the refusal names it
INSTRUMENT = {
    "spec_version": "scorer/spec version",
    "dataset": "dataset version",
    "prompt": "prompt template",
    "sampling": "sampling settings",
}


class IncomparableRunsError(ValueError):
    """Two runs measured differently, compared without allow_different: the message names
    every difference. A ValueError, so the command line prints it without a traceback."""


def instrument(meta: dict[str, Any]) -> dict[str, Any]:
    """The fields of a run's meta.json its numbers depend on besides the model (INSTRUMENT),
    those it records. The dataset is its version when it has one: a completions file's own
    hash changes with every model's completions, its problems' hash does not."""
    found = {}
    for field in INSTRUMENT:
        value = meta.get(field)
        if field == "dataset" and isinstance(value, dict):
            value = {"version": value["version"]} if "version" in value else {
                k: v for k, v in value.items() if k != "file"}  # where a file lies is not what it holds
        if value is not None:
            found[field] = value
    return found


def instrument_differences(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> list[dict[str, Any]]:
    """Each instrument setting that differs: {"what", "key", "a", "b"}, in INSTRUMENT's order."""
    changed = differing_keys(instrument(meta_a), instrument(meta_b))
    order = list(INSTRUMENT)
    rows = [{"what": INSTRUMENT[key.split(".")[0]], "key": key, "a": a, "b": b} for key, (a, b) in changed.items()]
    return sorted(rows, key=lambda row: order.index(row["key"].split(".")[0]))


def describe(difference: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """'sampling settings: sampling.temperature = 0.0 (A) vs 0.8 (B)'; a value one run does
    not record shows as (not set)."""
    def shown(value: Any) -> str:
        return value if value is MISSING else repr(value)
    return (f"{difference['what']}: {difference['key']} = {shown(difference['a'])} ({names[0]}) vs "
            f"{shown(difference['b'])} ({names[1]})")


def check_comparable(meta_a: dict[str, Any], meta_b: dict[str, Any], allow_different: bool = False,
                     names: tuple[str, str] = ("A", "B")) -> list[str]:
    """[] when the two runs were measured the same way. Otherwise IncomparableRunsError naming
    every difference, or, with `allow_different`, the differences as lines to print beside
    the comparison (a number from another instrument is another metric: say so)."""
    lines = [describe(d, names) for d in instrument_differences(meta_a, meta_b)]
    if lines and not allow_different:
        raise IncomparableRunsError(
            f"run {names[0]} and run {names[1]} were not measured the same way:\n  " + "\n  ".join(lines)
            + "\nA difference between their numbers would mix the model with the measurement (the locked-room "
              "rule: same scorer, data, prompt and sampling). Measure both the same way, or pass "
              "--allow-different to compare anyway, with these differences listed beside the result")
    return lines


def paired_scores(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
    """mean(a) - mean(b) over the item ids both score, with its paired bootstrap CI and verdict
    (stats.paired_bootstrap_diff) and the noise rule's verdict (stats.noise_rule) on the
    number of shared items. `a` and `b`: {item id: score}; items are taken in a's order."""
    shared = [i for i in a if i in b]
    if not shared:
        raise ValueError("the two measurements share no item ids: score both on one set of problems")
    diff = paired_bootstrap_diff([a[i] for i in shared], [b[i] for i in shared])
    return {**diff, "n_shared": len(shared), "only_in_a": len(a) - len(shared), "only_in_b": len(b) - len(shared),
            "noise_rule": noise_rule(diff["mean_diff"], len(shared))}


def diff_line(diff: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """'A - B = +0.017 (95% CI -0.033 to +0.067) -> difference within noise; noise rule: likely
    noise (N = 60 < 100 and |difference| = 1.7 <= 5 points)'."""
    verdict = "difference within noise" if diff["verdict"] == "within noise" else "real difference"
    return (f"{names[0]} - {names[1]} = {diff['mean_diff']:+.3f} (95% CI {diff['ci_low']:+.3f} to "
            f"{diff['ci_high']:+.3f}) -> {verdict}; {noise_rule_line(diff['mean_diff'], diff['n_shared'])}")


def solved_by_id(rows: list[dict[str, Any]]) -> dict[str, float]:
    """{id: 1.0 or 0.0} of scored rows (eval_<stage>.jsonl): solved by the verifier's own word
    (verifiers.contract.is_solved), as pass@1 counts it, never the raw reward."""
    return {str(row["id"]): float(is_solved(row["reward"], row.get("details") or {})) for row in rows}


def paired_change(after: list[dict[str, Any]], before: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A run's before/after (eval_<stage>.jsonl rows of the same held-out problems): the paired
    difference after - before in the fraction solved (paired_scores), or None when the rows
    cannot be paired item by item: one side missing (a run directory from before this record
    was kept), or ids that are empty or repeated (an environment that names no problems), where
    pairing by id would silently pair the wrong items."""
    for rows in (after, before):
        ids = [str(row.get("id", "")) for row in rows]
        if not rows or "" in ids or len(set(ids)) != len(ids):
            return None
    return paired_scores(solved_by_id(after), solved_by_id(before))


def scored_items(run: RunDir) -> dict[str, float]:
    """{item id: reward}: a Loop A run's samples.jsonl, or for a training run (its summary
    names a final_stage) the held-out evaluation after that stage, eval_<stage>.jsonl (its
    samples.jsonl holds the training samples, many per prompt)."""
    final = (run.read_json("summary.json") or {}).get("final_stage")
    return {str(s["id"]): s["reward"] for s in run.read_jsonl(f"eval_{final}.jsonl" if final else "samples.jsonl")}


def compare_runs(run_a: str | Path, run_b: str | Path, allow_different: bool = False,
                 console: Console | None = None) -> dict[str, Any]:
    """`posttrain diff`: paired comparison of two run directories on the items (ids) they
    share: Loop A runs' scored samples, or training runs' held-out evaluation after their
    last stage. Refuses runs measured differently (check_comparable) unless
    `allow_different`, which lists the differences first; then the paired CI, its verdict
    ("real" when the CI excludes 0, else "within noise") and the noise rule's."""
    console = console or Console()
    runs = [RunDir.open(str(run_a)), RunDir.open(str(run_b))]
    metas = [run.read_json("meta.json") or {} for run in runs]
    differences = check_comparable(*metas, allow_different=allow_different)
    if differences:
        console.print("[yellow]warning: comparing runs measured differently (--allow-different); the difference "
                      "below mixes the model with:[/yellow]\n  " + escape("\n  ".join(differences)), highlight=False)
    rewards = [scored_items(run) for run in runs]
    try:
        diff = paired_scores(rewards[0], rewards[1])
    except ValueError:
        raise ValueError(f"runs {run_a} and {run_b} share no item ids; evaluate both on one file") from None
    diff.update({"spec_a": metas[0].get("spec_version"), "spec_b": metas[1].get("spec_version"),
                 "differences": differences})
    console.print(escape(f"A {diff['mean_a']:.3f} vs B {diff['mean_b']:.3f} on {diff['n_shared']} shared items: "
                         f"{diff_line(diff)}"), highlight=False)
    return diff
