"""The whole job, `posttrain run` / `posttrain train`: SFT from scratch → held-out eval →
RL (or preference optimisation) → held-out eval → summary and plots. Safe to call again
on a partly finished run directory: finished pieces are skipped, the rest resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from rich.markup import escape

from posttrain.config import SamplingParams, TrainConfig, parse_stages
from posttrain.config.files import to_dict
from posttrain.envs import make_env
from posttrain.eval.comparison import paired_change
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.models import is_pretrained, load_checkpoint_model, load_tokenizer, make_policy
from posttrain.models.device import device_record, place, resolve_device, use_threads
from posttrain.models.hf import lora_policy
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.models.policy import SavablePolicy
from posttrain.pipelines.build import is_preference, sampling_params
from posttrain.pipelines.data_checks import run_warnings
from posttrain.pipelines.distill import distill_stage
from posttrain.pipelines.preference import preference_stage
from posttrain.pipelines.rl import rl_stage
from posttrain.pipelines.sft import sft_stage
from posttrain.roles.engines import make_engine
from posttrain.roles.engines.contract import prompt_template
from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights, save_checkpoint
from posttrain.runs.console import console
from posttrain.runs.lineage import describe_changes, record_parent
from posttrain.runs.report import write_plots, write_summary
from posttrain.runs.rundir import RunDir, sample_row
from posttrain.runs.trackers import reporting
from posttrain.seeds import derive_seed
from posttrain.types import Environment, Example, Tokenizer


def start_run(cfg: TrainConfig, command: str, env: Environment | None = None, parent: str = "") -> RunDir:
    """A new run directory, locked for this process, with its config.json and meta.json.
    `env`: an environment object to train on instead of the one cfg.env names (api.train).
    `parent`: the run directory this one changes; meta.json records the settings changed."""
    stages = "-".join(name for name, _, _ in parse_stages(cfg.stages))
    run = RunDir.create(cfg.out_dir, cfg.name or f"{cfg.env.name}-{stages or cfg.rl.algo}")
    try:
        run.write_json("config.json", to_dict(cfg))
        env = make_env(cfg.env.name, **cfg.env.kwargs()) if env is None else env
        run.write_meta({
            "loop": "C (train)",
            "entry_point": command,
            "seed": cfg.seed,
            # the directory a model name stood for today (a hub cache snapshot names its commit)
            "model_dir": str(resolve_model_dir(cfg.init or cfg.model.name)) if cfg.init or is_pretrained(cfg.model)
                         else "",
            "spec_version": env.spec_version,
            "dataset": {"env": cfg.env.name, "level": cfg.env.arithmetic_level(),
                        "split_rule": getattr(env, "split_rule", ""), "heldout_size": cfg.heldout_size},
            "sampling": {"train": dataclasses.asdict(cfg.rl.sampling),
                         "eval": {"temperature": 0.0, "decoding": "greedy"}},
            # what --device auto chose, and the GPU's name: the same config gives different timings there
            "device": device_record(cfg.device, cfg.dtype),
        })
        if parent:
            console.print(describe_changes(record_parent(run, parent)), highlight=False, markup=False, soft_wrap=True)
    except BaseException:
        # nothing has run: a directory without its config and meta (a full disk) could never
        # be resumed, only mistaken for a run
        run.discard()
        raise
    return run


def run_pipeline(cfg: TrainConfig, run: RunDir, env: Environment | None = None) -> dict:
    """SFT → held-out eval → RL → held-out eval → summary, with a copy of the metrics in
    each tracker of --report_to. Safe to call again on a partly finished run directory:
    finished pieces are skipped, the rest resumes. `env` as in start_run."""
    with reporting(run, cfg.trackers(), to_dict(cfg)) as trackers:  # nothing opens for report_to="none"
        summary = train_and_evaluate(cfg, run, env)
        # the held-out results, at each stage's last step + 1: the number of steps behind them
        stage_steps = {"sft": 0 if cfg.init else cfg.sft.steps, summary["final_stage"]: cfg.rl.steps}
        for stage, steps in stage_steps.items():
            ci = summary[stage]
            trackers.log_metrics(stage, steps, {"heldout_pass@1": ci["mean"], "heldout_ci_low": ci["ci_low"],
                                                "heldout_ci_high": ci["ci_high"], "heldout_n": ci["n"]})
    return summary


def starting_policy(cfg: TrainConfig, run: RunDir, env: Environment) -> tuple[SavablePolicy, Tokenizer, Path]:
    """(policy, tokenizer, start weights) on cfg.device: --init's checkpoint or model, or
    the model built from cfg.model and SFT'd on env's demonstrations (sft.steps > 0)."""
    device = resolve_device(cfg.device)
    if cfg.init:  # a run's checkpoint or any transformers model (a directory, or a name in the local cache)
        start = resolve_model_dir(cfg.init)
        policy, tokenizer = load_checkpoint_model(start, cfg.model), load_tokenizer(start, cfg.model)
        place(policy, device, cfg.dtype)  # loaded on the CPU; every role follows the policy from here
    else:
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        policy, tokenizer = make_policy(cfg.model)  # gpt_mini from scratch, or a pretrained model
        # initialised on the CPU (the same seed gives the same weights on every device), then moved
        place(policy, device, cfg.dtype)
        # RL starts from (and the reference is) the SFT result; with sft.steps=0 the model as
        # built: a pretrained one from its own directory, gpt_mini's random init from a copy
        if cfg.sft.steps:  # without SFT no demonstrations are drawn: a task needs no solutions
            # on the environment's worked solutions, or on sft.teacher's verified samples (R1's distillation)
            (distill_stage if cfg.sft.teacher else sft_stage)(cfg, run, env, tokenizer, policy)
            start = latest_checkpoint(run, "sft")
            policy.load_state_dict(load_checkpoint_weights(start, policy.config).state_dict())
        elif is_pretrained(cfg.model):
            start = resolve_model_dir(cfg.model.name)
        else:
            start = latest_checkpoint(run, "init") or save_checkpoint(run, "init", 0, policy, tokenizer)
    state_weights(run, policy)
    return policy, tokenizer, start


def state_weights(run: RunDir, policy: SavablePolicy) -> None:
    """Say, on the console and in meta.json, what the policy's weights are when they are not
    what the model's name suggests (SmolLM2's: de-quantised 4-bit levels, models/smollm2.py)."""
    weights = getattr(policy.config, "weights", "")
    if weights:
        console.print(f"weights: {weights}", style="yellow", highlight=False, markup=False, soft_wrap=True)
        run.write_json("meta.json", {**(run.read_json("meta.json") or {}), "model_weights": weights})


def train_and_evaluate(cfg: TrainConfig, run: RunDir, env: Environment | None = None) -> dict:
    """The pipeline itself; the summary it writes, as a dict."""
    use_threads(cfg.threads)
    env = make_env(cfg.env.name, **cfg.env.kwargs()) if env is None else env
    heldout = env.fixed_set("heldout", cfg.heldout_size, seed=0)
    console.print(f"[bold]run[/] {run.path}  model={cfg.model.name}  spec={env.spec_version}  algo={cfg.rl.algo}")
    print_warnings(cfg, env)

    if resolve_device(cfg.device).type == "cpu" and cfg.dtype != "float32":
        console.print(f"[yellow]dtype {cfg.dtype} on the CPU: float32 weights, {cfg.dtype} forward passes. On the CPUs "
                      "measured (an Intel Xeon with AMX, an AMD EPYC with avx512_bf16) it learnt as float32 does and was no "
                      "faster for gpt_mini (BENCHMARKS.md, \"bf16 on this CPU\"); it is meant for GPUs")
    policy, tokenizer, start_weights = starting_policy(cfg, run, env)
    meta = run.read_json("meta.json") or {}
    if "prompt" not in meta:  # known once the tokenizer is: the experiment log's prompt template
        run.write_json("meta.json", {**meta, "prompt": {"template": prompt_template(tokenizer)}})

    results = run.read_json("summary.json") or {}
    eval_params = dataclasses.replace(sampling_params(cfg), temperature=0.0)
    if "sft" not in results:
        # kept under "sft" in summary.json either way: the policy RL starts from
        start = "after sft" if cfg.sft.steps and not cfg.init else "of the starting model (no SFT in this run)"
        results["sft"] = evaluate_and_log(run, "sft", policy, tokenizer, env, heldout, eval_params, start)
        run.write_json("summary.json", results)

    stage = "pref" if is_preference(cfg.rl) else "rl"
    if stage == "pref":
        preference_stage(cfg, run, env, tokenizer, policy, start_weights)
        trained = latest_checkpoint(run, "pref")  # none with rl.steps = 0: the policy is the start
        if trained is not None:
            policy.load_state_dict(load_checkpoint_weights(trained, policy.config).state_dict())
    else:
        if cfg.model.lora_r:  # train adapters only; the reference is the policy with them off
            lora = lora_policy(policy, cfg.model.lora_r)
            lora.add_lora(cfg.model.lora_r, cfg.model.lora_alpha, base=start_weights)
        rl_stage(cfg, run, env, tokenizer, policy, start_weights)
    if stage not in results:
        results[stage] = evaluate_and_log(run, stage, policy, tokenizer, env, heldout, eval_params)
    results["final_stage"] = stage
    # before/after on the same held-out problems: paired, with the noise rule beside the CI
    change = paired_change(run.read_jsonl(f"eval_{stage}.jsonl"), run.read_jsonl("eval_sft.jsonl"))
    if change is not None:
        results[f"{stage}_vs_sft"] = change
    write_summary(run, results, cfg, env.spec_version, start="sft" if cfg.sft.steps and not cfg.init else "start")
    write_plots(run, stage)
    return run.read_json("summary.json")


def print_warnings(cfg: TrainConfig, env: Environment) -> None:
    """What the pre-run checks found that can run but may not mean what it seems (small
    evaluation sets, partial credit, demonstrations longer than the budget), before any step."""
    for line in run_warnings(cfg, env):
        console.print(f"[yellow]warning[/] {escape(line)}")


def evaluate_and_log(run: RunDir, stage: str, policy: SavablePolicy, tokenizer: Tokenizer, env: Environment,
                     examples: list[Example], params: SamplingParams, label: str = "") -> dict:
    engine = make_engine(policy, tokenizer, params, shares_weights=True)
    result = evaluate_pass_at_1(engine, env, examples)
    run.write_jsonl(f"eval_{stage}.jsonl", [sample_row(f"eval_{stage}", 0, e) for e in result["episodes"]])
    ci = result["ci"]
    # the mean reward only where it says something pass@1 does not: under partial credit
    beside = f"; mean reward {ci['mean_reward']:.3f}" if ci["mean_reward"] != ci["mean"] else ""
    console.print(f"[bold]held-out pass@1 {label or f'after {stage}'}[/]: {ci['mean']:.3f} "
                  f"(95% CI {ci['ci_low']:.3f}–{ci['ci_high']:.3f}, n={ci['n']}){beside}")
    return ci
