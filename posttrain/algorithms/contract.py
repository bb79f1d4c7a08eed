"""The contract every RL algorithm follows, and the checks that keep its fields honest.

An algorithm is a `@dataclass` of hyperparameters with `compute_advantages(batch)` and
`compute_loss(outputs, batch)`; because every algorithm has this same shape, the registry
(`posttrain/algorithms/__init__.py`) is a plain dict of classes.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Protocol

import torch

from posttrain.algorithms.core import LOSS_AGG_MODES
from posttrain.types import PolicyOutputs, RolloutBatch


class Algorithm(Protocol):
    """What the controller and trainer need from an RL algorithm.

    An algorithm is a `@dataclass` whose fields are its hyperparameters (each default
    commented with its source), validated in `__post_init__` (a bad value raises
    ValueError naming the field, the value and what is allowed). Because every
    algorithm has this same shape, the registry is a plain dict of classes.

    The controller runs, once per rollout batch::

        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))

    and the trainer, for each (mini)batch and each epoch::

        loss, metrics = algo.compute_loss(outputs, batch)
        loss.backward()
    """

    name: ClassVar[str]  # the registry key, e.g. "grpo"

    @property
    def uses_reference(self) -> bool:
        """True when `compute_loss` reads `batch.ref_logp` (e.g. a KL penalty is on);
        the controller skips the reference forward pass otherwise."""
        ...

    @property
    def uses_critic(self) -> bool:
        """True when the algorithm trains a value head (PPO); it then reads
        `outputs.values` and `batch.values` / `batch.returns`."""
        ...

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """Return at least {"advantages": (B, T), zero off the response}; may add
        "returns" (B, T). Runs without gradients: advantages are constants in the loss."""
        ...

    def compute_loss(
        self, outputs: PolicyOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Return (scalar loss to minimise, metrics as python floats)."""
        ...


def check_field(algo: object, field: str, ok: bool, allowed: str) -> None:
    """Raise ValueError if `ok` is False, naming the class, the field, its value and what
    is allowed; for use in an algorithm's `__post_init__`. Write conditions so that NaN
    fails them (`x >= 0`, not `not x < 0`)."""
    if not ok:
        value = getattr(algo, field)
        raise ValueError(f"{type(algo).__name__}.{field}={value!r} is invalid; allowed: {allowed}")


def check_loss_fields(algo: object) -> None:
    """The checks every algorithm with `loss_agg`, `entropy_coef` and `max_len` fields
    shares: a known aggregation, a non-negative entropy bonus, and a generation budget
    whenever the aggregation divides by one (Dr.GRPO's seq-mean-token-sum-norm)."""
    loss_agg = getattr(algo, "loss_agg")
    check_field(algo, "loss_agg", loss_agg in LOSS_AGG_MODES, f"one of {list(LOSS_AGG_MODES)}")
    check_field(algo, "entropy_coef", getattr(algo, "entropy_coef") >= 0.0, "a number >= 0")
    if loss_agg == "seq-mean-token-sum-norm":
        max_len = getattr(algo, "max_len")
        check_field(algo, "max_len", isinstance(max_len, int) and max_len > 0,
                    "a positive int with loss_agg='seq-mean-token-sum-norm' (the generation budget, max_new_tokens)")


def make_from_registry(registry: dict[str, type], kind: str, name: str, params: dict) -> object:
    """Build `registry[name](**params)`, or raise ValueError listing the valid names (for an
    unknown name) or the valid fields with their defaults (for a bad parameter)."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(registry)}")
    cls = registry[name]
    fields = [f for f in dataclasses.fields(cls)]
    help_text = ", ".join(
        f"{f.name}={f.default if f.default is not dataclasses.MISSING else f.default_factory()!r}"
        if f.default_factory is not dataclasses.MISSING or f.default is not dataclasses.MISSING
        else f"{f.name}=<required>" for f in fields)
    unknown = sorted(set(params) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {kind} {name!r}; valid fields (with defaults): {help_text}")
    try:
        return cls(**params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{err}\nvalid fields of {name!r} (with defaults): {help_text}") from err
