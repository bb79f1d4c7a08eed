"""`posttrain train --stages sft,dpo,grpo`: post-training stages that compose, in one run.

The whole recipe on the default task — SFT on worked solutions, preference optimisation on
pairs the verifier ranks from the policy's own samples, RL against the verifier — as one
command, each stage a function `posttrain train` already runs (sft.py, preference.py,
rl.py), each starting where the one before stopped:

    start ──sft──▶ checkpoint ──dpo──▶ checkpoint ──grpo──▶ checkpoint
      │                │                  │                    │
    eval             eval               eval                 eval     (the same held-out problems)

The start is --init, or the model as built (gpt_mini's random weights, saved as checkpoint
`init`). A stage begins from the last checkpoint of the stage before, and that checkpoint is
also its reference: DPO's π_ref and GRPO's KL anchor are the policy the stage started from,
as in a two-stage run. `stages.json` records, per stage, the checkpoint it started from and
the one it ended at, each with the sha256 of the weights the process actually held
(runs/checkpoints.py::weights_digest): the evidence that stage k started from exactly what
stage k−1 saved.

`summary.md` holds one table: each stage's held-out pass@1 with its bootstrap CI, and the
paired difference to the stage before on the same problems (eval/stats.py).

Resume: every stage checkpoints as it goes (runs/stage.py), and each held-out result is
written to summary.json as soon as it is measured. A resumed run loads a finished stage's
last checkpoint without running it, continues an interrupted one from its last checkpoint,
and measures only what is not in summary.json: a killed run ends exactly where an
uninterrupted one does (tests/test_stages.py).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from posttrain.config import TrainConfig
from posttrain.config.files import to_dict
from posttrain.models.device import use_threads
from posttrain.models.policy import SavablePolicy
from posttrain.envs import make_env
from posttrain.eval.stats import paired_bootstrap_diff
from posttrain.pipelines.build import is_preference, sampling_params
from posttrain.pipelines.distill import distill_stage
from posttrain.pipelines.preference import preference_stage
from posttrain.pipelines.rl import rl_stage
from posttrain.pipelines.run import evaluate_and_log, print_warnings, starting_policy
from posttrain.pipelines.sft import sft_stage
from posttrain.pipelines.stage_plan import SFT, Stage, stage_plan
from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights, weights_digest
from posttrain.runs.console import console
from posttrain.runs.report import collapse_warnings, diagnosis_lines, stage_diagnosis, write_plots
from posttrain.runs.rundir import RunDir
from posttrain.runs.trackers import reporting
from posttrain.types import Environment, Tokenizer

START = "start"  # the held-out result of the policy before the first stage


def run_stages(cfg: TrainConfig, run: RunDir, env: Environment | None = None) -> dict:
    """Every stage of cfg.stages in order, a held-out evaluation after each, one summary;
    with a copy of the held-out results in each tracker of --report_to. Safe to call again
    on a partly finished run directory. `env` as in pipelines/run.py::start_run."""
    with reporting(run, cfg.trackers(), to_dict(cfg)) as trackers:
        summary = train_stages(cfg, run, env)
        for stage in summary["stages"]:
            ci = summary[stage["name"]]
            trackers.log_metrics(stage["name"], stage["steps"], {"heldout_pass@1": ci["mean"],
                                                                "heldout_ci_low": ci["ci_low"],
                                                                "heldout_ci_high": ci["ci_high"], "heldout_n": ci["n"]})
    return summary


def train_stages(cfg: TrainConfig, run: RunDir, env: Environment | None = None) -> dict:
    """The stages themselves; the summary they write, as a dict."""
    use_threads(cfg.threads)
    env = make_env(cfg.env.name, **cfg.env.kwargs()) if env is None else env
    plan = stage_plan(cfg)
    heldout = env.fixed_set("heldout", cfg.heldout_size, seed=0)
    console.print(f"[bold]run[/] {run.path}  model={cfg.model.name}  spec={env.spec_version}  "
                  f"stages={' → '.join(stage.name for stage in plan)}")
    print_warnings(cfg, env)
    # the model before any stage: --init, or the model as built (gpt_mini's init saved as checkpoint "init")
    policy, tokenizer, start = starting_policy(dataclasses.replace(cfg, sft=dataclasses.replace(cfg.sft, steps=0)),
                                               run, env)
    eval_params = dataclasses.replace(sampling_params(cfg), temperature=0.0)
    results = run.read_json("summary.json") or {}
    if START not in results:
        results[START] = evaluate_and_log(run, START, policy, tokenizer, env, heldout, eval_params, "of the start")
        run.write_json("summary.json", results)

    records = {r["name"]: r for r in run.read_json("stages.json") or []}
    for stage in plan:
        began, started = {"checkpoint": where(run, start), "sha256": weights_digest(policy)}, time.perf_counter()
        # a stage with env.* settings of its own trains on that task; every stage is scored on the run's held-out set
        stage_env = env if stage.cfg.env == cfg.env else make_env(stage.cfg.env.name, **stage.cfg.env.kwargs())
        end = train_stage(stage, run, stage_env, tokenizer, policy, start)
        seconds = time.perf_counter() - started
        before = records.get(stage.name)  # recorded when it finished: a resume skipped it, and keeps its time
        records[stage.name] = {"name": stage.name, "kind": stage.kind, "steps": stage.steps, "start": began,
                               "end": {"checkpoint": where(run, end), "sha256": weights_digest(policy)},
                               "seconds": before["seconds"] if before else seconds}
        run.write_json("stages.json", list(records.values()))
        if stage.name not in results:
            results[stage.name] = evaluate_and_log(run, stage.name, policy, tokenizer, env, heldout, eval_params)
            run.write_json("summary.json", results)
        if stage.kind != SFT and stage.steps:
            write_plots(run, stage.name)
        start = end
    return write_stages_summary(run, cfg, plan, results, [records[s.name] for s in plan], env.spec_version)


def train_stage(stage: Stage, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
                start: Path) -> Path:
    """Run stage from `policy`, which holds the weights saved at `start`; afterwards `policy`
    holds exactly the weights of the checkpoint returned (`start` for a stage of 0 steps). A
    stage that finished before a resume is not run again: its last checkpoint is loaded."""
    if stage.steps == 0:
        return start
    last = latest_checkpoint(run, stage.name)
    if last is None or last.name != f"step_{stage.steps - 1:06d}":
        if stage.kind == SFT:  # on the worked solutions, or on sft.teacher's verified samples (R1's distillation)
            (distill_stage if stage.cfg.sft.teacher else sft_stage)(stage.cfg, run, env, tokenizer, policy,
                                                                      stage=stage.name)
        elif is_preference(stage.cfg.rl):
            preference_stage(stage.cfg, run, env, tokenizer, policy, start, stage=stage.name)
        else:
            rl_stage(stage.cfg, run, env, tokenizer, policy, start, stage=stage.name)
        last = latest_checkpoint(run, stage.name)
    # the next stage starts from what was saved, not from whatever the trainer left in memory
    policy.load_state_dict(load_checkpoint_weights(last, policy.config).state_dict())
    return last


def where(run: RunDir, checkpoint: Path) -> str:
    """A checkpoint's path as stages.json records it: inside the run, relative to it."""
    try:
        return str(Path(checkpoint).resolve().relative_to(run.path.resolve()))
    except ValueError:  # --init: outside the run
        return str(checkpoint)


def _pct(ci: dict) -> str:
    return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"


def write_stages_summary(run: RunDir, cfg: TrainConfig, plan: list[Stage], results: dict, records: list[dict],
                         spec_version: str) -> dict:
    """summary.md's table and summary.json: each stage's held-out pass@1 with its CI, and
    the paired difference to the stage before on the same held-out problems."""
    def verdicts(name: str) -> dict[str, float]:
        return {r["id"]: r["reward"] for r in run.read_jsonl(f"eval_{name}.jsonl")}

    names = [START] + [stage.name for stage in plan]
    paired = {}
    for before, after in zip(names, names[1:]):
        a, b = verdicts(after), verdicts(before)
        shared = [i for i in b if i in a]
        paired[after] = paired_bootstrap_diff([a[i] for i in shared], [b[i] for i in shared])
    lines = [f"# {run.path.name}", "", f"spec `{spec_version}`, seed {cfg.seed}, stages `{cfg.stages}`; each stage "
             "starts from the last checkpoint of the one before (stages.json: paths and weight digests)", "",
             "| stage | kind | steps | held-out pass@1 (95% CI) | vs previous stage (paired, points) | time |",
             "|---|---|---:|---|---|---:|", f"| {START} | {'--init' if cfg.init else cfg.model.name} | | "
             f"{_pct(results[START])} | | |"]
    for stage, record in zip(plan, records):
        diff = paired[stage.name]
        lines.append(f"| {stage.name} | {stage.kind} | {stage.steps} | {_pct(results[stage.name])} | "
                     f"{100 * diff['mean_diff']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}] | "
                     f"{record['seconds']:.0f} s |")
    lines += ["", f"n = {results[START]['n']} held-out problems, greedy; the paired column is each stage's pass@1 minus "
                  "the previous row's on the same problems, a bootstrap CI over problems (one that excludes 0 is a "
                  "change this seed resolves). Time: the stage's training in the process that ran it."]
    metrics = run.read_jsonl("metrics.jsonl")
    warnings = [f"{stage.name} {w}" for stage in plan if stage.kind != SFT
                for w in collapse_warnings([r for r in metrics if r.get("stage") == stage.name])]
    if warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    findings = {stage.name: stage_diagnosis(run, stage.name) for stage in plan if stage.kind != SFT}
    for name, found in findings.items():
        lines += diagnosis_lines(found, f"Diagnosis of {name}") if found else []
    diagnosis = {name: [f.to_json() for f in found] for name, found in findings.items() if found}
    summary = {**{name: results[name] for name in names}, "stages": records, "paired": paired,
               "final_stage": plan[-1].name if plan else START, **({"warnings": warnings} if warnings else {}),
               **({"diagnosis": diagnosis} if diagnosis else {})}
    run.write_json("summary.json", summary)
    (run.path / "summary.md").write_text("\n".join(lines) + "\n")
    return summary
