"""A config as a dict, as a JSON or TOML file (`--config FILE`, a run's config.json), and back.

    to_dict(cfg)               what a run directory's config.json holds
    from_dict(cls, data)       a (partial) dict back into the dataclass: an unknown key is an
                               error that lists the valid ones, a renamed one says its new name
    load_file(path)            a JSON or TOML file as a dict, or an error naming the file

A value must already have its setting's type: `true` is not a number (bool is an int to
Python, so it would silently be 1), 2.0 is not a count, a number is not text, and a number
must be finite (JSON's 1e400 overflows to inf, and NaN, Infinity and TOML's inf parse).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

import tomllib

from posttrain.config.checks import ConfigError

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
            kwargs[key] = coerce(value, hint, prefix + key)
    return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)


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
                          'write one such as {"rl": {"lr": 0.0001}}')
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
