"""A config as a dict, as a JSON or TOML file (`--config FILE`, a run's config.json), and back.

    to_dict(cfg)               what a run directory's config.json holds
    from_dict(cls, data)       a (partial) dict back into the dataclass: an unknown key is an
                               error that lists the valid ones, a renamed one says its new name,
                               and a key that moved into a section (MOVED) is read at its new place
    upgraded(data)             a whole config's dict (a run's config.json) in today's layout
    load_file(path)            a JSON or TOML file as a dict, or an error naming the file

A value must already have its setting's type: `true` is not a number (bool is an int to
Python, so it would silently be 1), 2.0 is not a count, a number is not text, and a number
must be finite (JSON's 1e400 overflows to inf, and NaN, Infinity and TOML's inf parse).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types
import typing
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # tomllib is the standard library's from 3.11; tomli is the package it was made from, same API
    import tomli as tomllib

from posttrain.config.checks import ConfigError
from posttrain.config.rl import RLConfig
from posttrain.config.run import TrainConfig
from posttrain.config.sections import EnvConfig

# Settings that changed name: a config file that still uses the old one gets told the new one.
RENAMED = {"eval_size": "heldout_size", "rl.eval_size": "rl.dev_size"}

# Settings that moved into a section of their own concern (rl.optim, rl.reward, env.arithmetic,
# ...): a file that still has the old key is read with its value at the new place, silently,
# because run directories written before the move must still resume and load with --config.
# An env key moves into the section of the file's own env.name when that section has it
# (env.level of an arithmetic_think run is env.arithmetic_think.level), else as listed here.
# A flag is the user's own words, so the old flag is refused with the new one (cli/flags.py).
MOVED = {
    "rl.lr": "rl.optim.lr", "rl.warmup_steps": "rl.optim.warmup_steps",
    "rl.final_lr_fraction": "rl.optim.final_lr_fraction", "rl.adam_beta2": "rl.optim.adam_beta2",
    "rl.weight_decay": "rl.optim.weight_decay", "rl.grad_clip": "rl.optim.grad_clip",
    "rl.epochs": "rl.update.epochs", "rl.minibatches": "rl.update.minibatches",
    "rl.micro_batch_size": "rl.update.micro_batch_size", "rl.skip_inert_rows": "rl.update.skip_inert_rows",
    "rl.share_prompt": "rl.update.share_prompt",
    "rl.reward": "rl.reward.terms", "rl.reward_timeout": "rl.reward.timeout",
    "rl.length_penalty": "rl.reward.length_penalty", "rl.length_free": "rl.reward.length_free",
    "rl.length_reward": "rl.reward.length_reward", "rl.length_reward_start": "rl.reward.length_reward_start",
    "rl.kl_target": "rl.kl.target", "rl.kl_horizon": "rl.kl.horizon", "rl.track_kl": "rl.kl.track",
    "rl.track_kl_rows": "rl.kl.track_rows",
    "rl.pairs": "rl.preference.pairs", "rl.pairs_columns": "rl.preference.pairs_columns",
    "rl.pair_prompts": "rl.preference.pair_prompts", "rl.online_rounds": "rl.preference.online_rounds",
    "rl.refresh_reference": "rl.preference.refresh_reference", "rl.self_reward": "rl.preference.self_reward",
    "rl.on_alert": "rl.alerts.action", "rl.stop_on": "rl.alerts.monitors",
    "env.level": "env.arithmetic.level", "env.levels": "env.arithmetic.levels",  # level: arithmetic_think's too
    "env.think_mode": "env.arithmetic_think.think_mode", "env.budget_demos": "env.arithmetic_think.budget_demos",
    "env.pool_size": "env.reasoning_gym.pool_size", "env.task_config": "env.reasoning_gym.task_config",
    "env.worked_steps": "env.reasoning_gym.worked_steps",
    "env.tool_demos": "env.tool_arithmetic.tool_demos", "env.step_cost": "env.tool_arithmetic.step_cost",
    "env.malformed_penalty": "env.tool_arithmetic.malformed_penalty", "env.thinking": "env.tool_arithmetic.thinking",
    # into another section: the cap corrects every sampler that is not the trainer, not only async's
    "dist.tis_cap": "rl.mismatch.cap",
}
# the key every command gives the two sections that moved settings (TrainConfig.rl, *.env)
MOVED_SECTIONS: dict[type, str] = {RLConfig: "rl", EnvConfig: "env"}


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type, data: dict[str, Any], prefix: str = "", base: Any = None) -> Any:
    """Build `cls` from a (possibly partial) dict; unknown keys are an error, not ignored.
    The keys the dict leaves out keep their value in `base` (default: the dataclass
    defaults), so `from_dict(TrainConfig, file, base=rlhf_config())` is a file over rlhf's
    defaults."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    if not prefix:  # a whole config: a setting that moved to another section first
        data = moved_across_sections(data, names)
    if cls in MOVED_SECTIONS:
        data = moved_in_section(MOVED_SECTIONS[cls], data, prefix)
    unknown = sorted(set(data) - names)
    if unknown:
        renamed = [f"{prefix + k} is now {RENAMED[prefix + k]}" for k in unknown if prefix + k in RENAMED]
        raise ConfigError(f"unknown setting(s) {[prefix + k for k in unknown]}"
                          + (f" ({'; '.join(renamed)})" if renamed else "")
                          + f"; valid ones: {valid_keys(cls, prefix)}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a section's class, never an instance
            if not isinstance(value, dict):
                raise ConfigError(f"{prefix}{key} must be a section (a mapping), got {value!r}")
            kwargs[key] = from_dict(hint, value, f"{prefix}{key}.", None if base is None else getattr(base, key))
        else:
            kwargs[key] = coerce(value, hint, prefix + key)
    return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)


def valid_keys(cls: type, prefix: str = "") -> list[str]:
    """The keys a file may give `cls`, sorted: its settings, and its sections' settings one
    level down ("rl.optim.lr"), so that a key in the wrong place finds its section."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            keys += [f"{prefix}{f.name}.{inner.name}" for inner in dataclasses.fields(hints[f.name])]
        else:
            keys.append(prefix + f.name)
    return sorted(keys)


def moved_in_section(section: str, data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`data`, the settings of `section` ("rl" or "env"), with every MOVED key at its new
    place: {"lr": 3e-4} -> {"optim": {"lr": 3e-4}}. A key whose new home is a section of the
    same name moves only while it holds a plain value ("reward": "r1" -> reward.terms)."""
    if not isinstance(data, dict):
        return data
    moves = {old[len(section) + 1:]: new[len(section) + 1:] for old, new in MOVED.items()
             if old.startswith(section + ".")}
    if section == "env":  # the run's own environment's section first, when it has the setting
        own = EnvConfig(name=str(data.get("name", EnvConfig.name))).section()
        own_fields = {f.name for f in dataclasses.fields(getattr(EnvConfig(), own))} if own else set()
        moves |= {key: f"{own}.{key}" for key in moves if key in own_fields}
    old_keys = [key for key in data if key in moves and not isinstance(data[key], dict)]
    out = {key: value for key, value in data.items() if key not in old_keys}
    for key in old_keys:
        parent, leaf = moves[key].split(".")  # every move goes one section down
        if not isinstance(out.get(parent, {}), dict):
            raise ConfigError(f"{prefix}{parent}={out[parent]!r} is not allowed: expected a section (a mapping)")
        place = out[parent] = dict(out.get(parent, {}))  # a copy: the caller's dict stays as read
        if leaf in place:
            raise ConfigError(f"{prefix}{key} and {prefix}{moves[key]} are one setting ({prefix}{key} is its name "
                              f"before it moved) and both are set: keep {prefix}{moves[key]}")
        place[leaf] = data[key]
    return out


def moved_across_sections(data: dict[str, Any], names: set[str] | None = None) -> dict[str, Any]:
    """`data`, a whole config's settings, with every MOVED key that left its section for another
    one at its new place: {"dist": {"tis_cap": 3}} -> {"dist": {}, "rl": {"mismatch": {"cap": 3}}}.
    Only into a section `names` has (None: any)."""
    out = dict(data)  # copies all the way down the new path: the caller's dict stays as read
    for old, new in MOVED.items():
        section, leaf = old.split(".", 1)
        *parents, last = new.split(".")
        if parents[0] == section or (names is not None and parents[0] not in names) \
                or not isinstance(out.get(section), dict) or leaf not in out[section]:
            continue
        value = out[section][leaf]
        out[section] = {key: v for key, v in out[section].items() if key != leaf}
        place = out
        for depth, name in enumerate(parents):
            if not isinstance(place.get(name, {}), dict):
                raise ConfigError(f"{'.'.join(parents[:depth + 1])}={place[name]!r} is not allowed: expected a "
                                  "section (a mapping)")
            place[name] = dict(place.get(name, {}))
            place = place[name]
        if last in place:
            raise ConfigError(f"{old} and {new} are one setting ({old} is its name before it moved) and both are "
                              f"set: keep {new}")
        place[last] = value
    return out


def upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A whole config's dict, e.g. an old run's config.json, in today's layout, so that it
    compares key by key with today's (runs/lineage.py): its rl and env sections read and
    written back, every MOVED key at its new place and the settings new since then at their
    defaults; a section that cannot be read has its keys moved and is otherwise left as it is."""
    out = data = moved_across_sections(data)
    for cls, key in MOVED_SECTIONS.items():
        if isinstance(data.get(key), dict):
            try:
                out[key] = to_dict(from_dict(cls, data[key], f"{key}."))
            except ConfigError:
                out[key] = moved_in_section(key, data[key])
    # the other sections (model, sft, dist, ...) moved nothing, but gain settings too: those at their defaults
    defaults = to_dict(TrainConfig())
    for key, section in out.items():
        if key not in MOVED_SECTIONS.values() and isinstance(section, dict) and isinstance(defaults.get(key), dict):
            out[key] = {**defaults[key], **section}
    return out


def coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert a JSON value (or the text of a flag) to the field's type, or say why not.
    An optional field (`int | None`) takes null, or "none" / "null" as text."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return coerce(value, inner[0], name) if len(inner) == 1 else value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{name}={value!r} is not allowed: expected true or false")
    if hint in (int, float):
        expected = "an integer" if hint is int else "a finite number"
        if isinstance(value, bool) or (hint is int and isinstance(value, float)):
            raise ConfigError(f"{name}={value!r} is not allowed: expected {expected}")
        try:
            number = hint(value)  # "3" and "1e-4" (text) are read as the numbers they spell
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{name}={value!r} is not allowed: expected {expected}") from None
        if hint is float and not math.isfinite(number):
            raise ConfigError(f"{name}={value!r} is not allowed: expected {expected} (1e400 overflows to inf)")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}={value!r} is not allowed: expected a string (in quotes)")
        return value
    if typing.get_origin(hint) is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ConfigError(f"{name}={value!r} is not allowed: expected a JSON object, e.g. '{{\"kl_coef\": 0.04}}'") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={value!r} is not allowed: expected a mapping")
        return value
    return value


def load_file(path: str) -> dict[str, Any]:
    """The settings of a .toml file, or of any other file read as JSON (a run's config.json);
    a .yaml/.yml file is refused rather than misread as JSON."""
    p = Path(path)
    if p.suffix.lower() in (".yaml", ".yml"):
        raise ConfigError(f"config file {path!r}: YAML is not supported; use JSON or TOML (the same keys, e.g. "
                          "a run's config.json)")
    if not p.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    kind = "TOML" if p.suffix.lower() == ".toml" else "JSON"
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"config file {path!r} cannot be read as text: {error}") from None
    try:
        data = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except (ValueError, RecursionError) as error:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"config file {path!r} is not valid {kind}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} holds {json.dumps(data)[:60]}, not an object of settings: "
                          'write one such as {"rl": {"optim": {"lr": 0.0001}}}')
    where = _not_finite(data)
    if where:
        raise ConfigError(f"config file {path!r}: {where} is not allowed: expected a finite number (a JSON number "
                          "beyond ~1.8e308, such as 1e400, overflows to inf)")
    return data


def _not_finite(data: Any, prefix: str = "") -> str:
    """'key=value' of the first inf or NaN anywhere in `data`, or ''."""
    for key, value in data.items():
        if isinstance(value, dict):
            if found := _not_finite(value, f"{prefix}{key}."):
                return found
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{prefix}{key}={value!r}"
    return ""
