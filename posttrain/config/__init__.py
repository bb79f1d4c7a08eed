"""Configuration: one dataclass per command, the only source of truth for a setting.

`TrainConfig` drives `posttrain run`, `train`, `compare` and `rlhf`; `EvalConfig` drives
`posttrain eval`; `BonConfig` drives `posttrain bon`. Every field carries the reason for
its default in a comment, and that comment is the field's `--help` text. `validate()`
checks values (ranges, combinations) and names the field, its value and what is allowed.

Data only: this package imports nothing else from posttrain.
`pipelines/checks.py::check_config` runs every check before anything starts: types
(config/type_checks.py), `validate()`, then names, files and data only the library can judge.

Values come from the dataclass defaults < a JSON/TOML file (`--config`, config/files.py) <
command-line flags (`--rl.optim.lr 3e-4`, cli/), addressed with a dot as in a run's config.json.

    checks.py     ConfigError and the value checks every section's validate() runs
    sections.py   model, env (with a section per environment), sampling, sft: the sections
                  every training command shares
    rl.py         rl, and its sections rl.optim, rl.update, rl.kl, rl.mismatch, rl.alerts (the
                  docstring says why each is one)
    reward.py     rl.reward (the training reward's terms and length shaping) and rl.rm
    prompts.py    rl.curation (which prompts) and rl.preference (a preference loss's pairs)
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
from posttrain.config.prompts import (
    CURATION_MATCHES,
    CURATION_ORDERS,
    CURATION_WEIGHTS,
    CurationConfig,
    PreferenceConfig,
)
from posttrain.config.reward import RewardConfig, RewardModelConfig
from posttrain.config.rl import (
    MISMATCH_MODES,
    MONITORS,
    ON_ALERT,
    AlertsConfig,
    EntropyConfig,
    KLConfig,
    MismatchConfig,
    OptimConfig,
    RLConfig,
    UpdateConfig,
)
from posttrain.config.run import TRACKERS, TrainConfig, parse_stages, rlhf_config
from posttrain.config.sections import (
    ENV_SECTIONS,
    SAMPLER_WEIGHTS,
    ArithmeticConfig,
    ArithmeticThinkConfig,
    EnvConfig,
    ModelConfig,
    ReasoningGymConfig,
    SamplingParams,
    SFTConfig,
    ToolArithmeticConfig,
)

__all__ = [
    "ConfigError", "check", "check_positive", "check_non_negative", "check_device", "DEVICES", "DTYPES",
    "ModelConfig", "EnvConfig", "SamplingParams", "SAMPLER_WEIGHTS", "SFTConfig",
    "ENV_SECTIONS", "ArithmeticConfig", "ArithmeticThinkConfig", "ReasoningGymConfig", "ToolArithmeticConfig",
    "RLConfig", "OptimConfig", "UpdateConfig", "KLConfig", "EntropyConfig", "AlertsConfig", "RewardConfig", "PreferenceConfig",
    "RewardModelConfig", "CurationConfig", "ON_ALERT", "MONITORS", "MismatchConfig", "MISMATCH_MODES",
    "CURATION_WEIGHTS", "CURATION_ORDERS", "CURATION_MATCHES",
    "DistConfig", "TOPOLOGIES",
    "TrainConfig", "TRACKERS", "parse_stages", "rlhf_config",
]
