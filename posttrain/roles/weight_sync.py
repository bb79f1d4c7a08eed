"""Weight sync: the trainer's fresh weights reach the engine that samples, with a new version.

Without this step the engine keeps sampling from the weights it started with, and every
batch after the first is off-policy by a growing margin. Each push bumps a version number
that the engine stamps on every episode it samples, so staleness is visible (`step's
weight_version - episode.weight_version`).

    SharedWeights        the engine samples from the trainer's own module: the optimizer step
                         has already changed what it reads, so a push is a version bump
    InProcessWeightSync  the engine holds its own copy in this process: a push copies the state dict
    make_weight_sync     the one an engine needs (Engine.shares_weights)

An engine in another process (a Ray worker: distributed/rollout_workers.py) is sent the state
dict and the version, and loads them with the same Engine.load_weights.
"""

from __future__ import annotations

from typing import Protocol

from posttrain.models.policy import Policy
from posttrain.roles.engines import Engine


class WeightSync(Protocol):
    version: int  # the weight version the engine samples with

    def push(self, version: int | None = None) -> int:
        """Publish the trainer's weights as the next version (or as `version`, a saved number
        a resumed run restores); returns the version the engine now samples with."""
        ...


class InProcessWeightSync:
    def __init__(self, source: Policy, engine: Engine):
        self.source = source
        self.engine = engine
        self.version = engine.weight_version

    def push(self, version: int | None = None) -> int:
        self.engine.load_weights(self.source.state_dict())
        self.version = self.version + 1 if version is None else version
        self.engine.weight_version = self.version
        return self.version


class SharedWeights:
    """Weight sync for an engine that samples from the trainer's own module: the optimizer
    step has already updated the weights it reads, so a push only bumps the version the
    engine stamps on episodes (and an int8 engine quantises again on a new version)."""

    def __init__(self, source: Policy, engine: Engine):
        if not engine.shares_weights:
            raise ValueError("SharedWeights needs an engine built on the trainer's own module "
                             "(make_engine(policy, ..., shares_weights=True)); an engine with its own copy "
                             "needs InProcessWeightSync")
        self.engine = engine
        self.version = engine.weight_version

    def push(self, version: int | None = None) -> int:
        self.version = self.version + 1 if version is None else version
        self.engine.weight_version = self.version
        return self.version


def make_weight_sync(source: Policy, engine: Engine) -> WeightSync:
    """How `engine` receives `source`'s weights: a version bump when it shares them, a copy when not."""
    return SharedWeights(source, engine) if engine.shares_weights else InProcessWeightSync(source, engine)
