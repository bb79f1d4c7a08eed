"""Configuration: one dataclass per command, the only source of truth for a setting.

`TrainConfig` drives `posttrain run`, `train`, `compare` and `rlhf`; `EvalConfig` drives
`posttrain eval`; `BonConfig` drives `posttrain bon`. Every field carries the reason for
its default in a comment, and that comment is the field's `--help` text. `validate()`
checks values (ranges, combinations) and names the field, its value and what is allowed.

Data only: this package imports nothing else from posttrain.
`pipelines/checks.py::check_config` runs every check before anything starts: types
(config/type_checks.py), `validate()`, then names, files and data only the library can judge.

Values come from the dataclass defaults < a JSON/TOML file (`--config`, config/files.py) <
command-line flags (`--rl.lr 3e-4`, cli/), addressed with a dot as in a run's config.json.

    checks.py     ConfigError and the value checks every section's validate() runs
    sections.py   model, env, sampling, sft: the sections every training command shares
    rl.py         rl, with its sub-sections rl.rm (reward model) and rl.curation
    dist.py       dist: where the rollout and trainer roles run
    run.py        TrainConfig, the whole run; parse_stages; rlhf_config
    scoring.py    the commands that score: eval, winrate, bon, search, verify, think
    commands.py   the other commands with settings of their own: star, prm, systems
    type_checks.py  every setting's declared type and a finite value, before validate()
    files.py      a config as a dict and as a JSON or TOML file, and back (run directories' config.json)

The training settings are importable from here, `from posttrain.config import TrainConfig`;
the other commands' from their module, `from posttrain.config.scoring import EvalConfig`.
"""

from __future__ import annotations

from posttrain.config.checks import (
    DEVICES,
    DTYPES,
    ConfigError,
    check,
    check_device,
    check_non_negative,
    check_positive,
)
from posttrain.config.dist import TOPOLOGIES, DistConfig
from posttrain.config.rl import (
    CURATION_MATCHES,
    CURATION_ORDERS,
    CURATION_WEIGHTS,
    MONITORS,
    ON_ALERT,
    CurationConfig,
    RewardModelConfig,
    RLConfig,
)
from posttrain.config.run import TRACKERS, TrainConfig, parse_stages, rlhf_config
from posttrain.config.sections import SAMPLER_WEIGHTS, EnvConfig, ModelConfig, SamplingParams, SFTConfig

__all__ = [
    "ConfigError", "check", "check_positive", "check_non_negative", "check_device", "DEVICES", "DTYPES",
    "ModelConfig", "EnvConfig", "SamplingParams", "SAMPLER_WEIGHTS", "SFTConfig",
    "RLConfig", "RewardModelConfig", "CurationConfig", "ON_ALERT", "MONITORS",
    "CURATION_WEIGHTS", "CURATION_ORDERS", "CURATION_MATCHES",
    "DistConfig", "TOPOLOGIES",
    "TrainConfig", "TRACKERS", "parse_stages", "rlhf_config",
]
