"""The jobs as Python functions: what `import posttrain` offers beside the command line.

    posttrain.train(config, env=None)        `posttrain train` itself: every check, a run
                                             directory, SFT → held-out eval → RL → held-out
                                             eval; returns a TrainResult
    posttrain.evaluate(model, env=None, ...) held-out pass@1 of a checkpoint (or a
                                             TrainResult, or a model) with its 95% CI

The task is config.env (a registered environment: "arithmetic", "jsonl", ...) or `env`, your
own: an object with `spec_version` (a name for its scoring rule, recorded with every result),
`sample(split, n, seed)` and `fixed_set(split, n, seed)` returning `Example`s,
`score(example, completion) -> {"reward": float, "details": dict}`, and `solution(example)`
(a worked answer, needed only when SFT runs); or a class of such objects, built with
config.env's changed settings as keyword arguments. Nothing here reads a setting that
`posttrain train` does not: a run started from Python is the same run, in the same folder
layout, as one started from the shell.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from posttrain.config import ConfigError, SamplingParams, TrainConfig, parse_stages
from posttrain.envs import make_env
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.run import run_pipeline, start_run
from posttrain.pipelines.stages import START, run_stages
from posttrain.roles.engines import make_engine
from posttrain.roles.engines.contract import encode_prompt
from posttrain.runs.checkpoints import latest_checkpoint, read_task
from posttrain.runs.rundir import RunDir, read_json
from posttrain.types import Environment

# What the pipeline calls on an environment; `solution` only when SFT runs
ENV_METHODS = ("sample", "fixed_set", "score")


@dataclass
class TrainResult:
    """What posttrain.train leaves: where, and the held-out pass@1 before and after RL, each
    {"mean", "ci_low", "ci_high", "n", "mean_reward"} (mean = the fraction solved)."""

    run_dir: Path  # absolute: config.json, metrics.jsonl, samples.jsonl, summary.md, plots, checkpoints/
    before: dict  # held-out pass@1 of the policy RL starts from (after SFT, if SFT ran)
    after: dict  # held-out pass@1 after RL (or the preference stage)
    summary: dict  # the whole summary.json: both of the above, the gain, step count, warnings
    checkpoint: Path  # the final policy, loadable by evaluate() and `posttrain eval --checkpoint`


def own_environment(cfg: TrainConfig, env: Environment | type) -> tuple[TrainConfig, Environment]:
    """(cfg recording `env`, env built and checked): a class is built from cfg.env's changed
    settings; an object missing a method the pipeline calls is refused by name, now."""
    if isinstance(env, type):
        env = make_env(env, **cfg.env.kwargs())
    kind = type(env).__name__
    sft = any(kind == "sft" for _, kind, _ in parse_stages(cfg.stages)) if cfg.stages else cfg.sft.steps and not cfg.init
    needed = ENV_METHODS + (("solution",) if sft else ())
    missing = [name for name in needed if not callable(getattr(env, name, None))]
    if missing:
        raise ConfigError(f"env={kind} has no method(s) {missing}: an environment offers sample(split, n, seed) and "
                          "fixed_set(split, n, seed) returning Examples, score(example, completion) -> {'reward', "
                          "'details'}, and solution(example) for SFT's demonstrations (or set sft.steps=0)")
    if not isinstance(getattr(env, "spec_version", None), str):
        raise ConfigError(f"env={kind} has no spec_version: give the class a string attribute naming its scoring "
                          "rule (e.g. spec_version = 'my-task-v1'); every result records which rule scored it")
    # config.json says what ran: a Python object, which the CLI cannot rebuild (a resume names it)
    source = f"python:{type(env).__module__}.{type(env).__qualname__}"
    name = cfg.name or f"{kind}-{cfg.rl.algo}"
    return dataclasses.replace(cfg, name=name, env=dataclasses.replace(cfg.env, name=source)), env


def train(config: TrainConfig | None = None, env: Environment | type | None = None) -> TrainResult:
    """Run `posttrain train` with `config` (TrainConfig() when None) on config.env's task or
    on `env` (see the module's docstring); ConfigError before anything starts when a setting
    cannot work, as the command line would say it."""
    cfg = config or TrainConfig()
    if env is not None:
        cfg, env = own_environment(cfg, env)
    check_config(cfg, env)
    run = start_run(cfg, "python: posttrain.train", env)
    with run:  # holds the run's lock; a failure before the first step leaves no directory
        summary = (run_stages if cfg.stages else run_pipeline)(cfg, run, env)
    final = summary["final_stage"]
    checkpoint = final_weights(run, final) or resolve_model_dir(cfg.init or cfg.model.name)
    before = summary[START] if cfg.stages else summary["sft"]  # with stages: the policy before the first one
    return TrainResult(run.path.resolve(), before, summary[final], summary, checkpoint.resolve())


def final_weights(run: RunDir, final_stage: str) -> Path | None:
    """A run's newest weights: its last stage's checkpoint, else where that stage started (SFT's,
    gpt_mini's saved init); None when the run trained nothing and started from a model."""
    return next((c for stage in (final_stage, "sft", "init") if (c := latest_checkpoint(run, stage))), None)


def evaluate(model: TrainResult | str | Path, env: Environment | str | type | None = None, split: str = "heldout",
             size: int = 500, seed: int = 0, max_new_tokens: int = 0) -> dict:
    """Greedy pass@1 of `model` (a checkpoint directory, a run directory (its newest weights),
    a TrainResult, or a model name or directory) on `size` problems of `split`: {"pass@1", "ci",
    "episodes"}. The task is `env` (a name, a class or an object), else the one the checkpoint
    records; the generation budget is max_new_tokens, else the checkpoint's run's, else 64.
    With the defaults, a TrainResult's checkpoint scores what the run reported as `after`."""
    directory = model.checkpoint if isinstance(model, TrainResult) else resolve_model_dir(model)
    summary = read_json(directory / "summary.json")
    if isinstance(summary, dict) and summary.get("final_stage"):  # a training run's directory
        directory = final_weights(RunDir(directory), summary["final_stage"]) or directory
    task = read_task(directory)
    if env is None:
        if task is None or task.env.name.startswith("python:"):
            trained = "" if task is None else f" (it was trained on {task.env.name}, a Python object)"
            raise ConfigError(f"{directory} records no task evaluate() can rebuild{trained}: pass env=, a registered "
                              "name such as 'arithmetic', your environment's class or an object of it")
        env, cot = make_env(task.env.name, **task.env.kwargs()), task.env.cot
    else:
        cot = task.env.cot if task else True
        env = make_env(env) if isinstance(env, (str, type)) else env
    policy = load_checkpoint_model(directory)
    tokenizer = load_tokenizer(directory)  # with the system prompt it was trained with
    examples = env.fixed_set(split, size, seed=seed)
    room = policy.config.max_seq_len - max(len(encode_prompt(tokenizer, e.prompt)) for e in examples)
    if room < 1:
        raise ConfigError(f"{directory}: the longest {split} prompt leaves none of the model's "
                          f"{policy.config.max_seq_len} positions for an answer; evaluate on shorter prompts")
    budget = max_new_tokens or (task.max_new_tokens if task else 64)
    params = SamplingParams(temperature=0.0, max_new_tokens=min(budget, room), stop_at_newline=not cot)
    return evaluate_pass_at_1(make_engine(policy, tokenizer, params), env, examples)
