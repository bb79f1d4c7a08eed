"""The pre-run checks of the commands other than training (eval, bon, search, verify, think,
winrate, prm), and the three every command shares: the task builds, a fixed set holds as
many problems as asked, and the device and dtype exist here. `checks.check_config` calls
them by the config's type; training's own checks are in checks.py.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config.commands import PrmConfig
from posttrain.config import ConfigError, DistConfig, EnvConfig, check
from posttrain.envs import ENVIRONMENTS, env_family, make_env
from posttrain.models import read_model_dir
from posttrain.models.device import check_precision, resolve_device
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.pipelines.prm_labels import prm_task
from posttrain.rewards.process_reward_model import task_step_format
from posttrain.rewards.reward_model import check_reward_model_dir
from posttrain.roles.environment import is_multi_turn
from posttrain.runs.checkpoints import final_checkpoint, read_task
from posttrain.config.scoring import BonConfig, EvalConfig, SearchConfig, ThinkConfig, VerifyConfig, WinrateConfig
from posttrain.search.thinking_curve import fused_task
from posttrain.types import Environment, Example
from posttrain.verifiers import VERIFIERS
from posttrain.verifiers.steps import problem_of


def check_env(env: EnvConfig) -> Environment:
    """The environment `env` (an EnvConfig) names, built: a bad setting, an unreadable file
    or data that cannot train (envs/jsonl_file.py) fails now, not mid-run."""
    check(env_family(env.name) in ENVIRONMENTS, "env.name", env.name,
          f"one of {sorted(ENVIRONMENTS)} (reasoning_gym as reasoning_gym:TASK, e.g. reasoning_gym:chain_sum)")
    check(not env.spec_version or env.spec_version in VERIFIERS, "env.spec_version", env.spec_version,
          f"'' (the environment's own verifier) or one of {sorted(VERIFIERS)}")
    return make_env(env.name, **env.kwargs())


def check_placement(device_name: str, dtype_name: str, dist: DistConfig | None = None) -> None:
    """The device exists on this machine and the dtype can run there (models/device.py says
    what to pass instead). `dist`'s Ray workers and data-parallel ranks build their own CPU,
    float32 copies of the policy, so they refuse any other placement rather than sample or
    train in a precision the rest of the run does not use."""
    check_precision(device_name, dtype_name)  # ValueError: check_config turns it into a ConfigError
    device = resolve_device(device_name)
    if dist is None or (device.type == "cpu" and dtype_name == "float32"):
        return
    placement = f"device={device_name!r} (resolved to {device.type}) and dtype={dtype_name!r}"
    check(dist.workers == 0, "dist.workers", dist.workers,
          f"0 with {placement}: the Ray rollout workers hold CPU float32 copies of the policy and cannot follow it; "
          "sample in this process (--workers 0), or pass --device cpu --dtype float32")
    check(dist.trainer_ranks == 1, "dist.trainer_ranks", dist.trainer_ranks,
          f"1 with {placement}: the data-parallel ranks are CPU float32 processes joined by gloo; train in one "
          "process, or pass --device cpu --dtype float32")


def fixed_set(env: Environment, setting: str, split: str, n: int, seed: int) -> list[Example]:
    """env.fixed_set(split, n, seed), as the run will draw it, or ConfigError naming the
    setting when the split holds fewer than n problems (arithmetic levels 1-2, a small file)."""
    try:
        examples = env.fixed_set(split, n, seed=seed)
    except ValueError as error:
        raise ConfigError(f"{setting}={n} is not allowed: {error}") from None
    check(len(examples) == n, setting, n, f"at most {len(examples)}: split {split!r} holds only {len(examples)} "
          "problems (a file puts about 10% of its problems in each of dev and heldout, 80% in train); ask for "
          "at most that many, so that the run measures as many as it records")
    return examples


def check_eval(cfg: EvalConfig) -> None:
    check(cfg.spec_version in VERIFIERS, "spec_version", cfg.spec_version, f"one of {sorted(VERIFIERS)}")
    check_placement(cfg.device, cfg.dtype)
    env = check_env(cfg.env)
    if cfg.checkpoint:
        fixed_set(env, "size", cfg.split, cfg.size, cfg.seed)


def check_bon(cfg: BonConfig) -> None:
    for name in ("spec_version", "select_spec_version"):
        value = getattr(cfg, name)
        if value or name == "spec_version":
            check(value in VERIFIERS, name, value, f"one of {sorted(VERIFIERS)}")


def check_search(cfg: SearchConfig | VerifyConfig) -> None:
    """The task the checkpoint records (else cfg.env) builds, is single-turn, has cfg.size
    problems, and (for the steps search and verification grow) a step checker."""
    task = read_task(Path(cfg.checkpoint))
    env_cfg = task.env if task else cfg.env
    env = check_env(env_cfg)
    check(not is_multi_turn(env), "env.name", env_cfg.name, "a single-turn task: search extends one completion "
          "step by step, and a multi-turn environment's episodes are sampled by the agent loop")
    examples = fixed_set(env, "size", cfg.split, cfg.size, cfg.seed)
    if isinstance(cfg, VerifyConfig):
        check(all(problem_of(e) for e in examples), "env.name", env_cfg.name, "an arithmetic task: the "
              "meta-verifier is its step checker (verifiers/steps.py), and a task without one cannot be audited")


def check_think(cfg: ThinkConfig) -> None:
    fused_task(cfg.checkpoint)  # a checkpoint of a fused (arithmetic_think) run, or ValueError saying so


def check_winrate(cfg: WinrateConfig) -> None:
    """Both sides hold a policy checkpoint and the judge is on this disk, before anything loads."""
    for side in ("a", "b"):
        try:
            final_checkpoint(getattr(cfg, side))
        except FileNotFoundError as error:
            raise ConfigError(f"{side}={getattr(cfg, side)!r}: {error}") from None
    for directory in cfg.judge.rm_paths():
        try:
            check_reward_model_dir(directory)
        except ValueError as error:
            raise ConfigError(f"judge.rm={cfg.judge.rm!r}: {error}") from None
    if cfg.judge.llm:
        try:
            read_model_dir(resolve_model_dir(cfg.judge.llm))
        except ValueError as error:
            raise ConfigError(f"judge.llm={cfg.judge.llm!r}: not a model on this disk (never downloaded): "
                              f"{error}") from None


def check_prm(cfg: PrmConfig) -> None:
    """--init is on this disk (never a download) and the task builds; sampling it needs --init
    off arithmetic, the task's own step format, and a step checker for checker labels."""
    if cfg.init:
        read_model_dir(resolve_model_dir(cfg.init))
    env_cfg, _ = prm_task(cfg)
    env, own = check_env(env_cfg), task_step_format(env_cfg.name)
    if not cfg.data:
        check(bool(cfg.init) or env_family(env_cfg.name) == "arithmetic", "init", cfg.init, f"a checkpoint for "
              f"env {env_cfg.name!r}: without --init the policy is `posttrain run`'s SFT, on arithmetic; train one "
              f"with `posttrain train --env.name {env_cfg.name} --rl.steps 0 ...` and give its checkpoint")
        check(cfg.step_format in ("", own), "step_format", cfg.step_format,
              f"'' or {own!r} without --data: the policy's samples on {env_cfg.name} are split by its own format")
        check(cfg.labels == "mc" or all(problem_of(e) for e in fixed_set(env, "heldout_prompts", "dev", 1, 0)),
              "labels", cfg.labels, f"mc for env {env_cfg.name!r}: only arithmetic has a step checker "
              "(verifiers/steps.py); Monte-Carlo labels roll the policy out from every step and ask the verifier")
