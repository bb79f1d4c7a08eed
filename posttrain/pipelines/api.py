"""The jobs as Python functions: what `import posttrain` offers beside the command line.

    posttrain.train(config, env=None)        `posttrain train` itself: every check, a run
                                             directory, SFT → held-out eval → RL → held-out
                                             eval; returns a TrainResult
    posttrain.train(config, reward_funcs=[f], train_dataset=rows, model=m)
                                             the same, handed Python objects as a TRL user
                                             would: functions, rows, a model (below)
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

The objects train() takes become the settings that would name them, so that config.json
still says what ran:
    reward_funcs   functions (any of the three signatures of rewards/user_function.py) or
                   "MODULE:FUNCTION" strings, with reward_weights (default 1 each): they
                   are rl.reward.terms, the whole reward as in TRL ("accuracy" in the list
                   keeps the verifier's 1/0); a function no import reaches (a lambda, one of
                   the running script or notebook) is named python:MODULE.NAME
    train_dataset  a list of dicts, a `datasets.Dataset` (or anything with `to_list()`) in
    eval_dataset   any row format envs/problem_rows.py reads: written once, by content, to
                   <out_dir>/datasets/<sha256>.jsonl, which env.path (env.heldout_path)
                   then names; the task is env.name jsonl unless it is math or code
    model          a model name or a transformers directory (model.name), or a transformers
                   model object with its tokenizer as processing_class, saved once, by
                   content, to <out_dir>/models/<sha256>/
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from posttrain.config import ConfigError, EnvConfig, RewardConfig, SamplingParams, TrainConfig, parse_stages
from posttrain.envs import make_env
from posttrain.files import write_atomic
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.pipelines.checks import check_config
from posttrain.pipelines.run import run_pipeline, start_run
from posttrain.pipelines.stages import START, run_stages
from posttrain.rewards.function_source import source_of
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


def train(config: TrainConfig | None = None, env: Environment | type | None = None, *,
          reward_funcs: Sequence[Callable[..., Any] | str] | None = None,
          reward_weights: Sequence[float] | None = None, train_dataset: Any = None, eval_dataset: Any = None,
          model: Any = None, processing_class: Any = None) -> TrainResult:
    """Run `posttrain train` with `config` (TrainConfig() when None) on config.env's task or
    on `env`, with the reward functions, data and model given as objects where given (see the
    module's docstring); ConfigError before anything starts when a setting cannot work, as
    the command line would say it."""
    cfg = config or TrainConfig()
    if reward_funcs is not None or reward_weights is not None:
        cfg = with_reward_funcs(cfg, reward_funcs, reward_weights)
    if train_dataset is not None or eval_dataset is not None:
        if env is not None:
            raise ConfigError("train_dataset and env= both give the task: pass one (rows are scored by "
                              "config.env.spec_version's verifier; your own scoring rule is an env or a reward_func)")
        cfg = with_datasets(cfg, train_dataset, eval_dataset)
    if model is not None:
        cfg = with_model(cfg, model, processing_class)
    elif processing_class is not None:
        raise ConfigError("processing_class is the tokenizer of a model object passed as model=; without one, the "
                          "tokenizer is the one saved beside config.model.name's weights")
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


def with_reward_funcs(cfg: TrainConfig, functions: Sequence[Callable[..., Any] | str] | None,
                      weights: Sequence[float] | None) -> TrainConfig:
    """cfg with rl.reward.terms = the weighted sum of `functions`, each named as
    rewards/function_source.py::source_of names it (a string is a term as written)."""
    if not functions:
        raise ConfigError("reward_funcs is empty: pass a list of reward functions (or leave it out for "
                          "config.rl.reward.terms)")
    if isinstance(functions, str) or callable(functions):
        functions = [functions]
    if cfg.rl.reward.terms != RewardConfig().terms:
        raise ConfigError(f"reward_funcs and config.rl.reward.terms={cfg.rl.reward.terms!r} both give the reward: "
                          "pass one (reward_funcs is the whole reward, as in TRL; put 'accuracy' in the list to keep "
                          "the verifier's 1/0)")
    weights = [1.0] * len(functions) if weights is None else list(weights)
    if len(weights) != len(functions):
        raise ConfigError(f"reward_weights has {len(weights)} weights for {len(functions)} reward_funcs; give one "
                          "weight per function")
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"reward_weights: {weight!r} is not a finite number")
    names: list[str] = []
    for function in functions:
        try:
            names.append(function if isinstance(function, str) else source_of(function, names))
        except ValueError as error:
            raise ConfigError(str(error)) from None
    terms = " + ".join(name if weight == 1 else f"{weight!r}*{name}" for weight, name in zip(weights, names))
    return dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, reward=dataclasses.replace(cfg.rl.reward,
                                                                                             terms=terms)))


# the tasks that read env.path: the data file tasks (envs/jsonl_file.py)
FILE_TASKS = ("jsonl", "math", "code", "gsm8k")


def with_datasets(cfg: TrainConfig, train_rows: Any, eval_rows: Any) -> TrainConfig:
    """cfg with env.path (and env.heldout_path) naming files of the given rows."""
    if train_rows is None:
        raise ConfigError("eval_dataset without train_dataset: pass the training rows too (or config.env.path)")
    name = cfg.env.name
    if name == EnvConfig().name:  # the default task: the rows replace it
        name = "jsonl"
    if name not in FILE_TASKS:
        raise ConfigError(f"train_dataset: config.env.name={name!r} generates its own problems and reads no rows; "
                          f"leave env.name at its default or set one of {FILE_TASKS}")
    if cfg.env.path:
        raise ConfigError(f"train_dataset and config.env.path={cfg.env.path!r} both give the problems: pass one")
    heldout_path = cfg.env.heldout_path
    if eval_rows is not None:
        if heldout_path:
            raise ConfigError(f"eval_dataset and config.env.heldout_path={heldout_path!r} both give the "
                              "held-out problems: pass one")
        heldout_path = rows_file(cfg.out_dir, eval_rows, "eval_dataset")
    path = rows_file(cfg.out_dir, train_rows, "train_dataset")
    return dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name=name, path=path, heldout_path=heldout_path))


def rows_file(out_dir: str, rows: Any, what: str) -> str:
    """The JSONL file of `rows` under out_dir/datasets/, named by its content (the same rows
    are written once, and a run's config.json names exactly what it trained on)."""
    if isinstance(rows, Mapping) and rows and all(hasattr(split, "to_list") for split in rows.values()):
        raise ConfigError(f"{what} is a dataset of splits {sorted(rows)}: pass one of them, e.g. "
                          "train_dataset=ds['train'], eval_dataset=ds['test']")
    if hasattr(rows, "to_list"):  # a datasets.Dataset
        rows = rows.to_list()
    if isinstance(rows, (str, Path)):
        raise ConfigError(f"{what}={str(rows)!r} is a path: set config.env.path (env.heldout_path) to a file; "
                          f"{what} takes rows")
    if isinstance(rows, Mapping) or not isinstance(rows, Sequence):
        raise ConfigError(f"{what} is a {type(rows).__name__}: pass a list of dicts (one per problem) or a "
                          "datasets.Dataset")
    if not rows:
        raise ConfigError(f"{what} has no rows")
    lines = []
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConfigError(f"{what}[{index}] is a {type(row).__name__}, not a dict: each row is a dict of "
                              "columns ({'prompt': ..., 'answer': ...})")
        try:
            lines.append(json.dumps(dict(row), ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"{what}[{index}] cannot be written as JSON ({error}): give its columns strings, "
                              "numbers, lists or dicts") from None
    text = "\n".join(lines) + "\n"
    path = Path(out_dir) / "datasets" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.is_file():
        write_atomic(path, text)
    return str(path)


def with_model(cfg: TrainConfig, model: Any, tokenizer: Any) -> TrainConfig:
    """cfg with model.name naming `model`: a name or directory as given, a transformers model
    object saved (with `tokenizer`) where its content names it."""
    if isinstance(model, (str, Path)):
        if tokenizer is not None:
            raise ConfigError("processing_class goes with a model object; the model named by a string brings the "
                              "tokenizer saved beside its weights")
        return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=str(model)))
    if not callable(getattr(model, "save_pretrained", None)):
        raise ConfigError(f"model is a {type(model).__name__}: pass a model name, a transformers model directory, "
                          "or a transformers model object (with its tokenizer as processing_class)")
    if not callable(getattr(tokenizer, "save_pretrained", None)):
        raise ConfigError(f"model={type(model).__name__} needs its tokenizer: pass processing_class="
                          "AutoTokenizer.from_pretrained(...) (the one the model was trained with)")
    models = Path(cfg.out_dir) / "models"
    models.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=models, prefix=".saving-"))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        digest = hashlib.sha256()
        for file in sorted(staging.rglob("*")):
            if file.is_file():
                digest.update(file.relative_to(staging).as_posix().encode())
                digest.update(file.read_bytes())
        saved = models / digest.hexdigest()[:16]
        if saved.is_dir():  # the same weights and tokenizer, saved before
            shutil.rmtree(staging)
        else:
            staging.rename(saved)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=str(saved)))


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
