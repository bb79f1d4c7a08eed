"""Loop A on a file: score completions someone already has, and look at the failures.

    {"id": "frozen-001", "prompt": "Q: 3+3+0+6+3\\n", "expected_answer": "15",
     "completion": "3+3=6,6+0=6,6+6=12,12+3=15\\nFinal: 15"}

One JSON object per line; `id` is optional (line numbers stand in), `expected_answer` may
be an int, `meta` reaches the verifier (a code problem's tests: `meta.tests`), and any
other fields are carried through to samples.jsonl untouched. Any registered verifier
scores them (`--spec_version`, posttrain/verifiers/__init__.py); a record it could never
score (a final_int expected answer that is not an integer, code without tests) is refused
before anything is scored.

No model runs here: this is measurement only, which is why the report shows more than a
mean. Averages hide reward hacking and spec bugs, so it also gives the reward
distribution, the count of every reason code, and the raw strings behind the best and
the worst scores.

`posttrain diff` (eval/comparison.py) answers "did it get better?" for two such runs: only
if both were measured the same way (a number from another instrument is another metric),
and only as far as a paired bootstrap over the shared items says the difference is not noise.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from posttrain.eval.packs import example_of, file_sha256, pack_path, problems_version, read_jsonl_records
from posttrain.eval.stats import NOISE_RULE_N, NOISE_RULE_POINTS, bootstrap_ci
from posttrain.runs.lineage import describe_changes, record_parent
from posttrain.runs.rundir import RunDir
from posttrain.verifiers import get_verifier
from posttrain.verifiers.code_replay import describe_verdicts, verdict_counts
from posttrain.verifiers.contract import as_example, is_solved

REQUIRED_FIELDS = ("prompt", "expected_answer", "completion")
N_SHOWN = 5  # top-5 / bottom-5: enough to spot a pattern, short enough to actually read
REPR_CHARS = 80  # raw completions are shown as repr(), cut here: escapes stay visible


def read_completions(path: str | Path) -> list[dict[str, Any]]:
    """The records of a completions file, each with a unique string `id`."""
    records = read_jsonl_records(path, REQUIRED_FIELDS)
    seen: dict[str, int] = {}
    for line, record in enumerate(records, start=1):
        if not isinstance(record["completion"], str):
            raise ValueError(
                f"{path}: record {line}: field 'completion' must be a string, got "
                f"{type(record['completion']).__name__} {record['completion']!r:.40}"
            )
        _, problem = as_example(record)  # prompt, expected_answer, meta as a verifier reads them
        if problem:
            raise ValueError(f"{path}: record {line}: {problem}")
        record["id"] = str(record.get("id") or f"line-{line}")
        if record["id"] in seen:
            raise ValueError(
                f"{path}: id {record['id']!r} appears in records {seen[record['id']]} and {line}; "
                "ids must be unique, because runs are compared item by item"
            )
        seen[record["id"]] = line
    return records


def short_repr(text: str, limit: int = REPR_CHARS) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def score_records(records: list[dict[str, Any]], spec_version: str) -> dict[str, Any]:
    """Score every record with one registered verifier and summarise. Returns the summary
    fields plus `samples` (each record with its reward and details)."""
    spec = get_verifier(spec_version)
    samples = []
    for record in records:
        result = spec(example_of(record), record["completion"])
        samples.append({**record, "reward": result["reward"], "details": result["details"]})
    return summarise_scored(samples, spec_version)


def summarise_scored(samples: list[dict[str, Any]], spec_version: str) -> dict[str, Any]:
    """The summary of records that already carry their reward and details (score_records's,
    or a multi-turn environment's, which scores an episode turn by turn)."""
    rewards = [s["reward"] for s in samples]
    # the CI is the pass rate's: under partial credit (reasoning-gym) the mean reward differs
    solved = [float(is_solved(s["reward"], s["details"])) for s in samples]
    ci = bootstrap_ci(solved)
    # Highest rewards first / lowest first; file order breaks ties, so the lists are stable.
    order = sorted(range(len(samples)), key=lambda i: (-rewards[i], i))
    top = [samples[i] for i in order[:N_SHOWN]]
    return {
        "spec_version": spec_version,
        "n": len(samples),
        "pass_rate": sum(solved) / len(solved),
        "mean_reward": sum(rewards) / len(rewards),
        "ci": ci,
        "reward_distribution": {f"{r:g}": c for r, c in sorted(Counter(rewards).items())},
        "reason_counts": dict(Counter(s["details"]["reason"] for s in samples).most_common()),
        # a code verifier's tests: who decided each (code_replay.VERDICTS); {} for other verifiers
        "verdict_counts": verdict_counts([s["details"] for s in samples]),
        "top": [_brief(s) for s in top],
        "bottom": [_brief(s) for s in _bottom_by_reason(samples)],
        "samples": samples,
    }


def _bottom_by_reason(samples: list[dict]) -> list[dict]:
    """Up to N_SHOWN failures (reason code not "ok"), taken round-robin over the reason
    codes, commonest code first, so five copies of the most frequent failure cannot hide
    the rarer ones. Returned grouped by reason code, file order within a code."""
    by_reason: dict[str, list[dict]] = {}
    for s in samples:
        if s["details"]["reason"] != "ok":
            by_reason.setdefault(s["details"]["reason"], []).append(s)
    codes = sorted(by_reason, key=lambda code: -len(by_reason[code]))  # stable on ties
    picked: dict[str, list[dict]] = {code: [] for code in codes}
    n_picked, depth = 0, 0
    while n_picked < min(N_SHOWN, len(samples)) and any(depth < len(by_reason[c]) for c in codes):
        for code in codes:
            if depth < len(by_reason[code]) and n_picked < N_SHOWN:
                picked[code].append(by_reason[code][depth])
                n_picked += 1
        depth += 1
    return [s for code in codes for s in picked[code]]


def _brief(sample: dict) -> dict:
    return {"id": sample["id"], "reward": sample["reward"], "reason": sample["details"]["reason"],
            "completion": short_repr(sample["completion"])}


def score_completions_file(path: str | Path, spec_version: str) -> dict[str, Any]:
    """Loop A on a completions file (or a shipped pack name, e.g. "frozen")."""
    path = pack_path(path)
    records, spec = read_completions(path), get_verifier(spec_version)
    for record in records:  # data no completion could ever pass is a dataset bug: say so now
        problem = spec.check_example(example_of(record))
        if problem:
            raise ValueError(f"{path}: record {record['id']!r}: {problem} (spec {spec_version})")
    result = score_records(records, spec_version)
    result["path"] = str(path)
    return result


def print_report(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    ci = result["ci"]
    console.print(
        f"[bold]Loop A (eval)[/bold] {result.get('path', '')}  spec={result['spec_version']}  "
        f"n={result['n']}\npass rate {result['pass_rate']:.3f} "
        f"(95% CI {ci['ci_low']:.3f}-{ci['ci_high']:.3f})   mean reward {result['mean_reward']:.3f}"
    )
    if result["n"] < NOISE_RULE_N:  # one number has no verdict, but what it can be compared with is worth saying
        console.print(f"noise rule: n = {result['n']} < {NOISE_RULE_N}, so a difference of "
                      f"{NOISE_RULE_POINTS:g} points or less from another run of this size is likely noise")
    dist = Table(title="reward distribution")
    dist.add_column("reward", justify="right")
    dist.add_column("count", justify="right")
    for reward, count in result["reward_distribution"].items():
        dist.add_row(reward, str(count))
    console.print(dist)

    reasons = Table(title="reason codes")
    reasons.add_column("reason")
    reasons.add_column("count", justify="right")
    reasons.add_column("share", justify="right")
    for reason, count in result["reason_counts"].items():
        reasons.add_row(reason, str(count), f"{count / result['n']:.0%}")
    console.print(reasons)
    if result.get("verdict_counts"):  # how far the pass rate can be trusted: a forgeable verdict is no verdict
        console.print(describe_verdicts(result["verdict_counts"]))

    for title, rows in ((f"top {N_SHOWN} (highest reward)", result["top"]),
                        (f"bottom {N_SHOWN} (lowest reward, grouped by reason code)", result["bottom"])):
        table = Table(title=title)
        for column in ("reason", "id", "reward", "completion (repr)"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(row["reason"], row["id"], f"{row['reward']:g}", row["completion"])
        console.print(table)


def run_eval_file(path: str | Path, spec_version: str, out_dir: str, name: str, parent: str = "") -> dict[str, Any]:
    """Score a completions file, print the report, write a run directory; return the summary.
    `parent`: the run directory this one changes; meta.json records the settings changed."""
    result = score_completions_file(path, spec_version)
    samples = result.pop("samples")
    run = RunDir.create(out_dir, name)
    run.write_json("config.json", {"path": result["path"], "spec_version": spec_version,
                                   "out_dir": str(out_dir), "name": name})
    run.write_meta({"loop": "A (eval)", "spec_version": spec_version,
                    # the version is the problems' (what `diff` compares); the file's hash also covers its completions
                    "dataset": {"version": problems_version([example_of(r) for r in samples]),
                                "file": result["path"], "sha256": file_sha256(result["path"]), "n": result["n"]},
                    "prompt": "as written in the file: the prompts are part of the dataset version",
                    "sampling": "none: completions read from a file"})
    if parent:
        print(describe_changes(record_parent(run, parent)))
    run.write_jsonl("samples.jsonl", samples)
    result["run_dir"] = str(run.path)
    run.write_json("summary.json", result)
    print_report(result)
    print(f"run directory: {run.path}")
    return result
