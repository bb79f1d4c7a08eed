"""The algorithm registry: a name -> class dict. Every entry follows the same contract
(`posttrain.algorithms.core.Algorithm`), so callers never special-case an algorithm.

    algo = make_algorithm("grpo", kl_coef=0.04)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from posttrain.algorithms.cispo import CISPO
from posttrain.algorithms.core import Algorithm
from posttrain.algorithms.dapo import DAPO
from posttrain.algorithms.dr_grpo import DrGRPO
from posttrain.algorithms.grpo import GRPO
from posttrain.algorithms.gspo import GSPO
from posttrain.algorithms.ppo import PPO
from posttrain.algorithms.reinforce import REINFORCE
from posttrain.algorithms.reinforce_pp import ReinforcePP
from posttrain.algorithms.rloo import RLOO

# The family tree, parent first: each entry is a small diff on the one it extends.
ALGORITHMS: dict[str, type] = {
    "reinforce": REINFORCE,  # the root: −(R − b) · log π
    "rloo": RLOO,  # REINFORCE, leave-one-out baseline
    "ppo": PPO,  # REINFORCE + critic, ratio and clip
    "reinforce_pp": ReinforcePP,  # PPO without the critic, batch-whitened reward-to-go
    "grpo": GRPO,  # PPO's clip, group baseline instead of a critic
    "dr_grpo": DrGRPO,  # GRPO without /std and /|o|
    "dapo": DAPO,  # GRPO + clip-higher, token-mean, overlong shaping, dynamic sampling
    "gspo": GSPO,  # GRPO with a sequence-level ratio
    "cispo": CISPO,  # GRPO's advantages, clipped stop-gradient IS weight instead of the clip
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


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "CISPO",
    "DAPO",
    "DrGRPO",
    "GRPO",
    "GSPO",
    "PPO",
    "REINFORCE",
    "RLOO",
    "ReinforcePP",
    "make_algorithm",
]
