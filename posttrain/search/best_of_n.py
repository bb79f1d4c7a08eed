"""Loop B — select: best-of-N over candidates that already exist. Nothing is trained.

For each prompt we hold N candidate completions, score every one, and keep the one with
the highest reward. That changes the *decision rule* applied to samples of a fixed policy,
not the policy: pass@1 stays what it was, only the chosen output gets better.

Metrics, for P prompts with n candidates each, c_p of them correct (reward == 1):

    pass@1 (first sample)  mean over prompts of correct(candidate 0): what one draw, with
                           no selection, would have scored on this pack
    pass@k (unbiased)      mean over prompts of 1 - C(n - c_p, k) / C(n, k), k = 1..n
                           (Chen et al. 2021, eq. 1; `stats.pass_at_k`). pass@1 here is
                           the mean of c_p / n: the same quantity as the row above,
                           estimated from all n samples instead of one, so less noisy.
    BoN pass rate          mean over prompts of correct(chosen candidate)

Oracle warning: when the candidates are selected with the SAME verifier that evaluates
them (the default), best-of-N's pass rate equals pass@n exactly: any correct candidate
wins. That is an upper bound on what selection can buy, reached only by a perfect
selector. Pass `eval_fn` to select with one scorer (a reward model, a hackable spec) and
grade with another, and the gap between the two is what the selector costs.

Tie-break: among candidates with equal reward the smallest candidate id (string order)
wins, so a rerun picks the same candidate; the chosen id is logged per prompt.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.table import Table

from posttrain.eval.packs import example_of, file_sha256, pack_path, read_jsonl_records
from posttrain.eval.stats import noise_rule, paired_bootstrap_diff, pass_at_k
from posttrain.runs.rundir import RunDir
from posttrain.types import Example
from posttrain.verifiers import get_verifier

ScoreFn = Callable[[Example, str], dict]  # the scorer contract: -> {"reward", "details"}


@dataclass(frozen=True)
class Candidate:
    id: str  # stable across runs: the tie-break and the log both use it
    completion: str


@dataclass(frozen=True)
class PromptCandidates:
    example: Example
    candidates: tuple[Candidate, ...]  # in sampling order: candidates[0] is "the first sample"


def pick_best(scored: Sequence[tuple[Candidate, float]]) -> Candidate:
    """The highest-reward candidate; among equal rewards, the smallest id."""
    return min(scored, key=lambda pair: (-pair[1], pair[0].id))[0]


def best_of_n(
    candidates_by_prompt: Sequence[PromptCandidates],
    score_fn: ScoreFn,
    n: int,
    eval_fn: ScoreFn | None = None,
) -> dict[str, Any]:
    """Best-of-n on the first n candidates of every prompt.

    score_fn selects; eval_fn (default: score_fn, the oracle case) decides what counts as
    correct for every reported metric. Returns {"rows": one dict per prompt, "summary"}."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not candidates_by_prompt:
        raise ValueError("no prompts to select on; pass at least one PromptCandidates")
    oracle = eval_fn is None
    eval_fn = eval_fn or score_fn
    rows = []
    for group in candidates_by_prompt:
        if len(group.candidates) < n:
            raise ValueError(
                f"prompt {group.example.id!r} has {len(group.candidates)} candidates, fewer "
                f"than n={n}; lower n or add candidates"
            )
        pool = group.candidates[:n]
        ids = [c.id for c in pool]
        if len(set(ids)) != n:
            raise ValueError(f"prompt {group.example.id!r} has duplicate candidate ids {ids}")
        select_rewards = [score_fn(group.example, c.completion)["reward"] for c in pool]
        graded = [eval_fn(group.example, c.completion) for c in pool]
        correct = [g["reward"] == 1.0 for g in graded]
        chosen = pick_best(list(zip(pool, select_rewards)))
        k = ids.index(chosen.id)
        rows.append({
            "id": group.example.id,
            "prompt": group.example.prompt,
            "expected_answer": group.example.expected_answer,
            "chosen_id": chosen.id,
            "chosen_completion": chosen.completion,
            "chosen_select_reward": select_rewards[k],
            "chosen_correct": correct[k],
            "chosen_details": graded[k]["details"],
            "first_correct": correct[0],
            "n_correct": sum(correct),  # c in pass@k
            "candidate_rewards": dict(zip(ids, select_rewards)),
        })
    return {"rows": rows, "summary": summarize(rows, n, oracle)}


def summarize(rows: list[dict], n: int, oracle: bool) -> dict[str, Any]:
    P = len(rows)
    first = [float(r["first_correct"]) for r in rows]
    chosen = [float(r["chosen_correct"]) for r in rows]
    pass_k = {k: sum(pass_at_k(n, r["n_correct"], k) for r in rows) / P for k in range(1, n + 1)}
    # paired over prompts: is what selection bought more than luck on this set of prompts?
    gain = paired_bootstrap_diff(chosen, first)
    gain["noise_rule"] = noise_rule(gain["mean_diff"], P)
    by_count = Counter(r["n_correct"] for r in rows)
    return {
        "n_prompts": P,
        "n": n,
        "pass@1_first_sample": sum(first) / P,
        "pass@k": pass_k,
        "bon_pass_rate": sum(chosen) / P,
        "selection_is_oracle": oracle,
        "selection_gain": gain,
        "prompts_by_n_correct": {c: by_count[c] for c in range(n + 1)},
        "chosen_ids": Counter(r["chosen_id"] for r in rows).most_common(),
    }


def print_table(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    n, P = summary["n"], summary["n_prompts"]
    table = Table(title=f"Loop B (best-of-{n}) on {P} prompts")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("pass@1, first sample only", f"{summary['pass@1_first_sample']:.3f}")
    for k, value in summary["pass@k"].items():
        table.add_row(f"pass@{k}, unbiased (c of {n})", f"{value:.3f}")
    oracle = " (oracle: selected by the grader)" if summary["selection_is_oracle"] else ""
    table.add_row(f"best-of-{n} pass rate{oracle}", f"{summary['bon_pass_rate']:.3f}")
    gain = summary["selection_gain"]
    interval = f"[{gain['ci_low']:+.3f}, {gain['ci_high']:+.3f}]"
    table.add_row("selection gain vs first sample", f"{gain['mean_diff']:+.3f} {interval} {gain['verdict']}")
    table.add_row(f"noise rule ({P} prompts)", gain["noise_rule"]["verdict"])
    console.print(table)
    counts = ", ".join(f"{c}: {m}" for c, m in summary["prompts_by_n_correct"].items())
    console.print(f"prompts by number of correct candidates -> {counts}")
    if not summary["selection_is_oracle"] and "select_spec_version" in summary:
        console.print(f"selected with {summary['select_spec_version']}, "
                      f"graded with {summary['spec_version']}")
    if summary["selection_is_oracle"]:
        console.print("best-of-N selected with the verifier it is graded by: an upper bound, "
                      "not what a learned selector would achieve")


def load_candidates(path: str | Path) -> list[PromptCandidates]:
    """A best-of-N pack: one prompt per line with its `candidates` [{id, completion}, ...]
    (and, for a code problem, its tests in `meta.tests`)."""
    groups = []
    for number, record in enumerate(read_jsonl_records(path, ("prompt", "expected_answer", "candidates")), 1):
        try:
            candidates = tuple(Candidate(str(c["id"]), c["completion"]) for c in record["candidates"])
            groups.append(PromptCandidates(example_of(record), candidates))
        except (TypeError, KeyError, ValueError) as error:
            raise ValueError(f"{path}: record {number}: {error}; each record needs a prompt, an expected_answer "
                             "(str or int) and candidates: [{\"id\": ..., \"completion\": ...}, ...]") from None
    return groups


def run_bon(pack_path_or_name: str | Path, n: int, spec_version: str, out_dir: str, name: str,
            select_spec_version: str | None = None) -> dict[str, Any]:
    """Best-of-n on a pack (a path or "bon"), graded with `spec_version` (any registered
    verifier); selected with `select_spec_version` if given (else the oracle). Prints the
    table, writes a run directory, returns the summary."""
    path = pack_path(pack_path_or_name)
    grader = get_verifier(spec_version)
    selector = get_verifier(select_spec_version) if select_spec_version else grader
    result = best_of_n(load_candidates(path), selector, n,
                       eval_fn=None if selector is grader else grader)
    summary = {**result["summary"], "spec_version": spec_version,
               "select_spec_version": selector.version, "pack": str(path)}
    run = RunDir.create(out_dir, name)
    run.write_json("config.json", {"pack": str(path), "n": n, "spec_version": spec_version,
                                   "select_spec_version": selector.version,
                                   "out_dir": str(out_dir), "name": name})
    run.write_meta({"loop": "B (best-of-N)", "spec_version": spec_version,
                    "select_spec_version": selector.version,
                    "dataset": {"file": str(path), "sha256": file_sha256(path),
                                "n_prompts": summary["n_prompts"]},
                    "selection": {"n": n, "tie_break": "smallest candidate id"}})
    run.write_jsonl("samples.jsonl", result["rows"])
    summary["run_dir"] = str(run.path)
    run.write_json("summary.json", summary)
    print_table(summary)
    print(f"run directory: {run.path}")
    return summary
