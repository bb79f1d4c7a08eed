"""Loop A — measure: score a checkpoint's held-out completions and save everything.

Nothing is trained or selected here. The environment's own verifier scores (whichever
is registered: `--env.name math --env.path FILE` is scored by math/boxed-or-final-v2).
The run directory records `loop: A`, the spec version that scored it, and every raw
completion with its score details, so a number can always be traced back to the strings
that produced it.

Which task: a checkpoint written by a training run records the one it was trained on
(`posttrain_task.json`, runs/checkpoints.py) and is scored on it, with its run's generation
budget, so that the same problems get the pass@1 its run reported. `--env.*` flags (or a
--config file's env section) that ask for another task win, with a warning naming both. A
checkpoint without the file (older, or any transformers model) is scored on the flags' task,
the defaults without flags, and the eval says so: a score on the wrong task looks like any
other (a level-2 model scored on level 3 reads 0.000, as if it had learnt nothing).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from posttrain.config import ConfigError, EnvConfig, SamplingParams
from posttrain.config.files import to_dict
from posttrain.envs import make_env
from posttrain.eval.completions import print_report, score_records, summarise_scored
from posttrain.eval.evaluate import evaluate_pass_at_k, sampler, solved
from posttrain.eval.packs import problems_version
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.models.device import device_record, place, resolve_device
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines import Engine, make_engine
from posttrain.roles.engines.contract import example_prompt_ids, prompt_template
from posttrain.runs.checkpoints import TASK_FILE, read_task
from posttrain.runs.lineage import describe_changes, record_parent
from posttrain.runs.rundir import RunDir
from posttrain.config.scoring import EvalConfig
from posttrain.seeds import derive_seed
from posttrain.types import Environment

# The generation budget of a checkpoint that does not record its run's: above the longest
# level-3 chain of thought (~40 characters) with room to spare
DEFAULT_MAX_NEW_TOKENS = 64

# env.allow_weak_sandbox is a permission of this machine, not part of the task: a checkpoint
# from elsewhere must not switch the namespace sandbox off, so it always comes from the flags
NOT_THE_TASK = frozenset({"allow_weak_sandbox"})


def settings(env: EnvConfig, names) -> str:
    """'env.arithmetic.level=2, env.cot=false': the settings `names` of `env`, spelled as flags."""

    def text(value):
        return ("true" if value else "false") if isinstance(value, bool) else (value if value != "" else "''")
    values = env.settings()
    return ", ".join(f"env.{name}={text(values[name])}" for name in names)


def describe(env: EnvConfig) -> str:
    """The task in one phrase: its name, level and cot for arithmetic, and every setting changed."""
    values, defaults = env.settings(), EnvConfig().settings()
    changed = {name for name in values if values[name] != defaults[name]  # a section's only if the env reads it
               and ("." not in name or name.partition(".")[0] == env.section())}
    shown = {"name", *changed} | ({"arithmetic.level", "cot"} if env.name == "arithmetic" else set())
    return settings(env, [name for name in values if name in shown - NOT_THE_TASK])


def choose_task(cfg: EvalConfig, given: set[str]) -> tuple[EvalConfig, str, str]:
    """The task to score `cfg.checkpoint` on: (cfg with that env, where it came from,
    "checkpoint" or "flags", and the line to print). `given` names the env settings the user
    set, by flag or --config file (`--env.arithmetic.level 3` gives "arithmetic.level")."""
    trained = read_task(Path(cfg.checkpoint))
    given = set(given) - NOT_THE_TASK
    if trained is None:
        origin = "the --env.* settings given" if given else "the defaults"
        return cfg, "flags", (f"{cfg.checkpoint} does not record the task it was trained on (no {TASK_FILE}: "
                              f"written by an older posttrain, or not by posttrain); scoring on {origin}: "
                              f"{describe(cfg.env)}; if it was trained on another task, give its --env.* flags")
    own = dataclasses.replace(trained.env, allow_weak_sandbox=cfg.env.allow_weak_sandbox)
    if not given:
        if own.path and not Path(own.path).is_file():
            raise ConfigError(f"{cfg.checkpoint} was trained on env.path={own.path}, which does not exist here: "
                              f"give --env.path FILE, the same problems, to score it on its own task")
        return (dataclasses.replace(cfg, env=own), "checkpoint",
                f"scoring on the task the checkpoint was trained on ({TASK_FILE}): {describe(own)}")
    # the flags change the checkpoint's task setting by setting; another env is the flags' alone,
    # since the checkpoint's other settings (a level, a path) belong to its own env
    if cfg.env.name == own.name:
        asked = own.replaced({name: cfg.env.settings()[name] for name in given})
    else:
        asked = cfg.env
    asked_values, own_values = asked.settings(), own.settings()
    differ = [name for name in asked_values if name not in NOT_THE_TASK and asked_values[name] != own_values[name]]
    if not differ:
        return dataclasses.replace(cfg, env=asked), "flags", f"scoring on {describe(asked)}, as asked and as trained"
    if "name" in differ:  # a different env: each side in full
        was, now = describe(own), describe(asked)
    else:
        was, now = settings(own, differ), settings(asked, differ)
    return (dataclasses.replace(cfg, env=asked), "flags",
            f"warning: the checkpoint was trained on {was}; scoring on {now} as asked")


def evaluate_checkpoint(cfg: EvalConfig, task_source: str = "flags", parent: str = "") -> dict:
    """Score cfg.checkpoint on cfg.env's problems; `task_source` (choose_task's) is recorded,
    and so is `parent` (the run directory this one changes, if any) with the settings changed."""
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    trained = read_task(Path(cfg.checkpoint))
    if task_source == "checkpoint" and trained is not None and trained.spec_version not in ("", env.spec_version):
        print(f"warning: the checkpoint was scored by {trained.spec_version} in training; this posttrain's "
              f"{cfg.env.name} env scores by {env.spec_version} (set --env.spec_version to score as it was)")
    model = place(load_checkpoint_model(Path(cfg.checkpoint), None), resolve_device(cfg.device), cfg.dtype)
    tokenizer = load_tokenizer(Path(cfg.checkpoint))  # with the system prompt the checkpoint was trained with
    examples = env.fixed_set(cfg.split, cfg.size, seed=cfg.seed)
    max_new = model.config.max_seq_len - max(len(example_prompt_ids(tokenizer, e)) for e in examples)
    # its run's budget: the problems of its run's held-out eval get the same completions, so the same pass@1
    budget = cfg.max_new_tokens or (trained.max_new_tokens if trained else DEFAULT_MAX_NEW_TOKENS)
    # greedy: pass@1 becomes a property of the weights, not of a sampling seed
    engine = make_engine(model, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=min(budget, max_new),
                                                            stop_at_newline=not cfg.env.cot))
    # meta travels with the record: a code problem's tests are in it
    if is_multi_turn(env):  # the agent loop's episodes, each scored by the environment as it ended
        episodes = sampler(env)(engine, examples, 1, params=engine.params)
        records = [{"id": e.example.id, "prompt": e.example.prompt, "expected_answer": e.example.expected_answer,
                    "meta": e.example.meta, "completion": e.completion, "reward": e.reward, "details": e.details}
                   for e in episodes]
        result = summarise_scored(records, env.spec_version)
    else:
        episodes = engine.generate(examples, 1)
        records = [{"id": e.example.id, "prompt": e.example.prompt, "expected_answer": e.example.expected_answer,
                    "meta": e.example.meta, "completion": e.completion} for e in episodes]
        result = score_records(records, env.spec_version)  # the same report as for a completions file

    # which task, and why: the flags', or the one the checkpoint records (also in config.json's env)
    task = {"source": task_source, "env": to_dict(cfg.env), "trained_on": to_dict(trained.env) if trained else None}
    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "A (eval)", "spec_version": env.spec_version, "checkpoint": str(cfg.checkpoint),
                    "dataset": {"version": problems_version(examples), "env": cfg.env.name,
                                "level": cfg.env.arithmetic_level(), "cot": cfg.env.cot, "path": cfg.env.path, "split": cfg.split, "size": cfg.size},
                    "prompt": {"template": prompt_template(tokenizer)},
                    "task": task,
                    "sampling": {"temperature": 0.0, "decoding": "greedy", "max_new_tokens": min(budget, max_new)},
                    "device": device_record(cfg.device, cfg.dtype)})
    if parent:
        print(describe_changes(record_parent(run, parent)))
    run.write_jsonl("samples.jsonl", result.pop("samples"))
    summary = {**result, "eval": result["ci"], "task": task}
    print_report(result)
    if cfg.samples:
        summary["pass_at_k"] = sampled_pass_at_k(cfg, engine, env, examples, run)
    run.write_json("summary.json", summary)
    print(f"run directory: {run.path}")
    return result["ci"]


def sampled_pass_at_k(cfg: EvalConfig, greedy: Engine, env: Environment, examples: list, run: RunDir) -> dict:
    """cfg.samples completions per problem at cfg.temperature, from the greedy engine's model and
    budget; pass@k for each of cfg.ks with its bootstrap CI over problems, printed and returned;
    every sample with its score in samples_pass_at_k.jsonl. Seeded from cfg.seed: the same
    command gives the same samples."""
    params = dataclasses.replace(greedy.params, temperature=cfg.temperature)
    engine = make_engine(greedy.model, greedy.tokenizer, params, shares_weights=True)
    generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "pass_at_k"))
    result = evaluate_pass_at_k(engine, env, examples, cfg.samples, cfg.pass_ks(), generator)
    run.write_jsonl("samples_pass_at_k.jsonl", [
        {"id": e.example.id, "sample": i % cfg.samples, "completion": e.completion, "reward": e.reward,
         "solved": solved(e), "details": e.details} for i, e in enumerate(result["episodes"])])
    print(f"{cfg.samples} samples per problem at temperature {cfg.temperature:g} (unbiased estimator, 95% CI "
          "over problems):")
    for k, ci in result["ci"].items():
        print(f"  pass@{k}  {ci['mean']:.3f} ({ci['ci_low']:.3f}-{ci['ci_high']:.3f})")
    return {"samples": cfg.samples, "temperature": cfg.temperature, "n_correct": result["n_correct"],
            **{f"pass@{k}": ci for k, ci in result["ci"].items()}}
