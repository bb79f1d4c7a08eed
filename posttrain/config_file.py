"""A config as a dict, as a JSON or TOML file (`--config FILE`, a run's config.json), and back.

    to_dict(cfg)               what a run directory's config.json holds
    from_dict(cls, data)       a (partial) dict back into the dataclass: an unknown key is an
                               error that lists the valid ones, a renamed one says its new name
    load_file(path)            a JSON or TOML file as a dict, or an error naming the file
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import tomllib

from posttrain.config import ConfigError

# Settings that changed name: a config file that still uses the old one gets told the new one.
RENAMED = {"eval_size": "heldout_size", "rl.eval_size": "rl.dev_size"}


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def from_dict(cls: type, data: dict[str, Any], prefix: str = "", base: Any = None) -> Any:
    """Build `cls` from a (possibly partial) dict; unknown keys are an error, not ignored.
    The keys the dict leaves out keep their value in `base` (default: the dataclass
    defaults), so `from_dict(TrainConfig, file, base=rlhf_config())` is a file over rlhf's
    defaults."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        renamed = [f"{prefix + k} is now {RENAMED[prefix + k]}" for k in unknown if prefix + k in RENAMED]
        raise ConfigError(f"unknown setting(s) {[prefix + k for k in unknown]}"
                          + (f" ({'; '.join(renamed)})" if renamed else "")
                          + f"; valid ones: {sorted(prefix + n for n in names)}")
    kwargs = {}
    for key, value in data.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{prefix}{key} must be a section (a mapping), got {value!r}")
            kwargs[key] = from_dict(hint, value, f"{prefix}{key}.", None if base is None else getattr(base, key))
        else:
            kwargs[key] = _coerce(value, hint, prefix + key)
    return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert a JSON value to the field's type, or say why not."""
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{name}={value!r} is not allowed: expected true or false")
    if hint in (int, float):
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}={value!r} is not allowed: expected {'an integer' if hint is int else 'a number'}") from None
        if hint is int and isinstance(value, float) and number != value:
            raise ConfigError(f"{name}={value!r} is not allowed: expected an integer")
        return number
    if hint is str:
        return str(value)
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
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path!r} does not exist")
    try:
        if p.suffix == ".toml":
            return tomllib.loads(p.read_text())
        return json.loads(p.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"config file {path!r} is not valid {p.suffix.lstrip('.').upper() or 'JSON'}: {error}") from None
