"""The check every setting gets before its own: the type its annotation declares, and a
finite value. One pass over every field of every config dataclass, so no section repeats it.

    check_types(cfg)     raises ConfigError naming the first setting of the wrong type

What it refuses, and why each is worth a message of its own:
    true / false where a number is wanted    bool is a subclass of int in Python, so
                                             `"steps": true` would silently be 1 step
    2.0 or 2.5 where an integer is wanted    a count is an integer; rounding would guess
    inf and NaN                              `--rl.optim.lr inf` passes every "> 0" test, and the
                                             sampler crashes on NaN logits after SFT; NaN
                                             fails every comparison, so the range checks
                                             downstream would report it confusingly
    a number or null where text is wanted    `"out_dir": null` would be a directory "None"

The range of each value (positive, in [0, 1), ...) is its section's own `validate()` in
config/; names, files and registries are pipelines/checks.py::check_config's. This module
imports nothing from posttrain but config, so config/ stays data only.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from posttrain.config.checks import ConfigError

KINDS = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}


def check_types(cfg: Any, prefix: str = "") -> None:
    """Every field of the dataclass `cfg`, and of the sections inside it, has the type its
    annotation names; every number is finite, including those in a mapping (rl.algo_params)."""
    hints = typing.get_type_hints(type(cfg))
    for field in dataclasses.fields(cfg):
        name, value, hint = prefix + field.name, getattr(cfg, field.name), hints[field.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a section's class, never an instance
            if not isinstance(value, hint):
                raise ConfigError(f"{name}={value!r} is not allowed: expected a section (a mapping of settings)")
            check_types(value, name + ".")
        elif typing.get_origin(hint) is dict:
            if not isinstance(value, dict):
                raise ConfigError(f"{name}={value!r} is not allowed: expected a mapping")
            for key, item in value.items():
                if isinstance(item, float) and not math.isfinite(item):
                    raise ConfigError(f"{name}.{key}={item!r} is not allowed: expected a finite number")
        elif hint in KINDS and not is_kind(value, hint):
            raise ConfigError(f"{name}={value!r} is not allowed: expected {KINDS[hint]}")


def is_kind(value: Any, hint: type) -> bool:
    """Whether `value` is a `hint` (bool, int, float or str) as a setting: bool is not a
    number here, an int is a float (1 is 1.0), and a float must be finite."""
    if hint is bool or isinstance(value, bool):
        return hint is bool and isinstance(value, bool)
    if hint is float:
        try:
            return isinstance(value, (int, float)) and math.isfinite(value)
        except OverflowError:  # an int with more digits than a float holds (10**400)
            return False
    return isinstance(value, hint)
