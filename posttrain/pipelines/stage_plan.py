"""What each stage of `--stages` runs with: the run's settings, with the stage's own on top.

    --stages "sft,dpo[rl.optim.lr=3e-5,rl.steps=100,dpo.nll_coef=1],grpo[rl.steps=200]"

gives three stages, each a full TrainConfig that pipelines/stages.py hands to the stage
functions `posttrain train` already uses (sft.py, preference.py, rl.py):

    sft    the run's sft section;      its brackets take sft.* keys
    dpo    the run's rl section with rl.algo = dpo and the dpo section's parameters;
           its brackets take rl.* and dpo.* keys (dpo.nll_coef lands in rl.algo_params)
    grpo   likewise, with grpo's

Every stage's brackets also take env.* keys: the stage trains on the task with those
settings (Qwen3's think-only cold start, `sft[env.arithmetic_think.think_mode=think]`), while
the held-out problems every stage is scored on stay the run's, so the summary's rows still
pair problem by problem. env.name stays the run's: a stage changes how the task is posed,
not which task it is.

The algorithm's parameters start from the run's rl.algo_params when the run's rl.algo is
the stage's kind (a --config file's), else from the algorithm's defaults. Values in
brackets are text, typed here against their setting exactly as a --config file's are
(config.files.from_dict), so `rl.steps=1.5` is refused by name as `--rl.steps 1.5` is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.config import ConfigError, TrainConfig, parse_stages
from posttrain.config.files import from_dict

SFT = "sft"
KINDS = (SFT, *ALGORITHMS, *PREFERENCE_LOSSES)


@dataclass(frozen=True)
class Stage:
    name: str  # checkpoints/<name>/, eval_<name>.jsonl, the "stage" of its metrics rows
    kind: str  # "sft", an RL algorithm or a preference loss
    cfg: TrainConfig  # the settings it runs with (stages = "": one stage's config is a plain run's)

    @property
    def steps(self) -> int:
        return self.cfg.sft.steps if self.kind == SFT else self.cfg.rl.steps


def stage_plan(cfg: TrainConfig) -> list[Stage]:
    """The stages of cfg.stages, each with its settings; ConfigError naming the stage and
    the setting that cannot be used."""
    base = dataclasses.replace(cfg, stages="")
    return [Stage(name, kind, stage_config(base, name, kind, settings))
            for name, kind, settings in parse_stages(cfg.stages)]


def stage_config(base: TrainConfig, name: str, kind: str, settings: dict[str, str]) -> TrainConfig:
    if kind not in KINDS:
        raise ConfigError(f"stages: unknown stage {kind!r}; a stage is one of {list(KINDS)}")
    sections = (SFT, "env") if kind == SFT else ("rl", kind, "env")
    nested: dict = {}
    for key, value in settings.items():
        section, _, rest = key.partition(".")
        if key in ("rl.algo", "rl.algo_params"):
            raise ConfigError(f"stages: {name}[{key}=...] is not allowed: the stage's name is its algorithm, and "
                              f"its parameters are {kind}.* keys (e.g. {kind}[{kind}.FIELD=VALUE])")
        if section not in sections or not rest:
            raise ConfigError(f"stages: {name}[{key}=...] is not allowed: a {kind} stage takes "
                              + " and ".join(f"{s}.* keys" for s in sections))
        *parents, leaf = rest.split(".")
        place = nested.setdefault(section, {})
        for parent in parents:
            place = place.setdefault(parent, {})
        place[leaf] = value
    if "name" in nested.get("env", {}):
        raise ConfigError(f"stages: {name}[env.name=...] is not allowed: every stage is scored on the run's "
                          f"held-out problems, so a stage keeps the run's task (env.name={base.env.name!r}); "
                          f"change the task with --env.name, and how a stage poses it with its env.* settings")
    if "env" in nested:
        base = dataclasses.replace(base, env=from_dict(type(base.env), nested.pop("env"), f"stages: {name}: env.",
                                                       base.env))
    if kind == SFT:
        # typed against the sft section as a --config file is; the prefix names the stage in errors
        return dataclasses.replace(base, sft=from_dict(type(base.sft), nested.get(SFT, {}), f"stages: {name}: sft.",
                                                       base.sft))
    registry = ALGORITHMS if kind in ALGORITHMS else PREFERENCE_LOSSES
    params = dict(base.rl.algo_params) if base.rl.algo == kind else {}
    if kind in nested:
        # each value typed against the algorithm's own field (the dataclass behind --<kind>.* flags)
        typed = from_dict(registry[kind], nested[kind], f"stages: {name}: {kind}.", registry[kind]())
        params.update({field: getattr(typed, field) for field in nested[kind]})
    rl = dataclasses.replace(base.rl, algo=kind, algo_params=params)
    return dataclasses.replace(base, rl=from_dict(type(rl), nested.get("rl", {}), f"stages: {name}: rl.", rl),
                               sft=dataclasses.replace(base.sft, steps=0))  # only an sft stage runs SFT
