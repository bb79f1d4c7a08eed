"""posttrain: RL post-training for language models, from first principles.

From Python, everything a script needs is here (docs/guides/your-task.md, "posttrain from Python"):

    jobs           train(config, env=None, reward_funcs=, train_dataset=, model=, ...) -> TrainResult,
                   evaluate(model, env=None, ...)
    settings       TrainConfig and its sections ModelConfig, EnvConfig, SFTConfig, RLConfig,
                   SamplingParams, DistConfig; ConfigError for a setting that cannot work
    tasks          Example, Environment (the protocol your own task follows), make_env,
                   ENVIRONMENTS (the registered ones), VERIFIERS, get_verifier
    building       make_policy, load_checkpoint_model, load_tokenizer, ALGORITHMS,
    blocks         make_algorithm, make_engine, RolloutEngine, Trainer, Controller, Episode,
                   RolloutBatch, RewardStack, RunDir

This package face is the top of the house (ARCHITECTURE.md): it imports jobs and library alike,
and nothing in the package imports it. Each name is imported on first use (PEP 562
`__getattr__`), so `import posttrain` (and the command line's start-up) loads no torch.
"""

# the TYPE_CHECKING imports below are re-exports (__all__ lists them through PUBLIC), not unused
# ruff: noqa: F401
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Every public name and the module it lives in; a test checks this against the imports below
PUBLIC = {
    "__version__": "posttrain.version",
    "train": "posttrain.pipelines.api", "evaluate": "posttrain.pipelines.api", "TrainResult": "posttrain.pipelines.api",
    "TrainConfig": "posttrain.config", "ModelConfig": "posttrain.config", "EnvConfig": "posttrain.config",
    "SFTConfig": "posttrain.config", "RLConfig": "posttrain.config", "SamplingParams": "posttrain.config",
    "DistConfig": "posttrain.config", "ConfigError": "posttrain.config",
    "Example": "posttrain.types", "Episode": "posttrain.types", "RolloutBatch": "posttrain.types",
    "Environment": "posttrain.roles.environment", "make_env": "posttrain.envs", "ENVIRONMENTS": "posttrain.envs",
    "VERIFIERS": "posttrain.verifiers", "get_verifier": "posttrain.verifiers",
    "make_policy": "posttrain.models", "load_checkpoint_model": "posttrain.models",
    "load_tokenizer": "posttrain.models",
    "ALGORITHMS": "posttrain.algorithms", "make_algorithm": "posttrain.algorithms",
    "make_engine": "posttrain.roles.engines", "RolloutEngine": "posttrain.roles.engines",
    "Trainer": "posttrain.roles.trainer",
    "Controller": "posttrain.roles.controller", "RewardStack": "posttrain.rewards.stack",
    "RunDir": "posttrain.runs.rundir",
}

__all__ = list(PUBLIC)

if TYPE_CHECKING:  # the same names, for editors and type checkers (and for readers of the import graph)
    from posttrain.algorithms import ALGORITHMS, make_algorithm
    from posttrain.config import (
        ConfigError,
        DistConfig,
        EnvConfig,
        ModelConfig,
        RLConfig,
        SamplingParams,
        SFTConfig,
        TrainConfig,
    )
    from posttrain.envs import ENVIRONMENTS, make_env
    from posttrain.models import load_checkpoint_model, load_tokenizer, make_policy
    from posttrain.pipelines.api import TrainResult, evaluate, train
    from posttrain.rewards.stack import RewardStack
    from posttrain.roles.controller import Controller
    from posttrain.roles.environment import Environment
    from posttrain.roles.engines import RolloutEngine, make_engine
    from posttrain.roles.trainer import Trainer
    from posttrain.runs.rundir import RunDir
    from posttrain.types import Episode, Example, RolloutBatch
    from posttrain.verifiers import VERIFIERS, get_verifier
    from posttrain.version import __version__


def __getattr__(name: str):
    """posttrain.NAME for a name in PUBLIC: its module is imported now, the first time."""
    if name not in PUBLIC:
        raise AttributeError(f"module 'posttrain' has no attribute {name!r}; the public names are: "
                             f"{', '.join(sorted(PUBLIC))}")
    value = getattr(importlib.import_module(PUBLIC[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))
