"""An algorithm's settings, typed: rl.algo_params read back into the algorithm's own dataclass.

A config file holds an algorithm's hyperparameters as `rl.algo_params`, the fields a run
changed ({"kl_coef": 0.04}): config/ is data only and cannot know the algorithms. Each
algorithm is a dataclass whose fields are those hyperparameters (posttrain/algorithms/),
the same one behind its `--grpo.*` flags; this module is where the two meet.

    algorithm_settings(rl)    rl.algo_params as rl.algo's dataclass (GRPO, DPO, ...), every
                              name one of its fields and every value of that field's type;
                              ConfigError naming the setting, its value and the valid fields

It runs whenever a config is read, before any model loads: a --config file (cli/flags.py),
a resumed run's config.json and every config check_config is given (pipelines/checks.py:
the Python API, each of compare's rows, each stage of --stages). A value's type follows
config/type_checks.py, as every other setting's does: true is not a number, 2.0 is not a
count, NaN and inf are not numbers.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.algorithms.preference import PREFERENCE_LOSSES, make_preference_loss
from posttrain.config import ConfigError, RLConfig
from posttrain.config.type_checks import KINDS, is_kind


def algorithm_settings(rl: RLConfig) -> Any:
    """rl.algo's dataclass with rl.algo_params set: an RL algorithm with its generation budget
    (max_len = rl.sampling.max_new_tokens, as pipelines/build.py builds it) or a preference loss."""
    registry = ALGORITHMS if rl.algo in ALGORITHMS else PREFERENCE_LOSSES
    if rl.algo not in registry:
        raise ConfigError(f"rl.algo={rl.algo!r} is not allowed: expected one of {sorted(ALGORITHMS)} (RL) or "
                          f"{sorted(PREFERENCE_LOSSES)} (preference)")
    cls = registry[rl.algo]
    hints = typing.get_type_hints(cls)
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls) if f.init}
    valid = ", ".join(f"{name}={default!r}" for name, default in defaults.items())
    for name, value in rl.algo_params.items():
        setting = f"rl.algo_params.{name}"
        if name not in defaults:
            close = difflib.get_close_matches(name, list(defaults), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{setting}={value!r} is not allowed: {rl.algo} has no setting {name!r}{hint}; "
                              f"its settings (with their defaults): {valid}")
        expected = kind_of(hints[name])
        if expected and not fits(value, hints[name]):
            raise ConfigError(f"{setting}={value!r} is not allowed: expected {expected} ({rl.algo}'s {name}, the "
                              f"flag --{rl.algo}.{name})")
    try:
        if registry is ALGORITHMS:
            return make_algorithm(rl.algo, budget=rl.sampling.max_new_tokens, **rl.algo_params)
        return make_preference_loss(rl.algo, **rl.algo_params)
    except ValueError as error:  # the algorithm's own range checks (__post_init__), in its words
        raise ConfigError(f"rl.algo_params={rl.algo_params!r} is not allowed: {error}") from None


def optional_inner(hint: Any) -> tuple[bool, Any]:
    """(True, X) for `X | None`, else (False, hint)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return True, inner[0] if len(inner) == 1 else hint
    return False, hint


def kind_of(hint: Any) -> str:
    """What a field of type `hint` takes, in words ('a finite number', 'an integer or null'); ''
    for a type the settings do not use (left to the algorithm's own checks)."""
    optional, inner = optional_inner(hint)
    if inner not in KINDS:
        return ""
    return KINDS[inner] + (" or null" if optional else "")


def fits(value: Any, hint: Any) -> bool:
    optional, inner = optional_inner(hint)
    return (optional and value is None) or is_kind(value, inner)
