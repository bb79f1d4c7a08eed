"""The algorithm registry: a name -> class dict. Every entry follows the same contract
(`posttrain.algorithms.core.Algorithm`), so callers never special-case an algorithm.

    algo = make_algorithm("grpo", kl_coef=0.04)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posttrain.algorithms.core import Algorithm
from posttrain.algorithms.grpo import GRPO

ALGORITHMS: dict[str, type] = {
    "grpo": GRPO,
}


def _fields_help(cls: type) -> str:
    """'name=default, ...' for the hyperparameters of an algorithm dataclass."""
    parts = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "<required>"
        parts.append(f"{f.name}={default!r}")
    return ", ".join(parts)


def make_algorithm(name: str, **params: Any) -> Algorithm:
    """Build the algorithm registered as `name` with hyperparameters `params`.

    Raises ValueError for an unknown name (listing the valid names) and for an unknown
    or invalid hyperparameter (listing the valid fields with their defaults)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    cls = ALGORITHMS[name]
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - valid)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for algorithm {name!r}; valid fields (with defaults): "
            f"{_fields_help(cls)}"
        )
    try:
        return cls(**params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{err}\nvalid fields of {name!r} (with defaults): {_fields_help(cls)}") from err


__all__ = ["ALGORITHMS", "Algorithm", "GRPO", "make_algorithm"]
