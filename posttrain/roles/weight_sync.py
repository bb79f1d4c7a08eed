"""Weight sync: copy the trainer's fresh weights into the rollout engine's policy.

Without this step the rollout engine keeps sampling from the weights it started with,
and every batch after the first is off-policy by a growing margin. Each push bumps a
version number that the engine stamps on every episode it samples, so staleness is
visible (`step's weight_version - episode.weight_version`).

Today's implementation is an in-process copy. The interface (`push() -> version`) is
the one a distributed implementation keeps when the engine lives in another process.
"""

from __future__ import annotations

import torch

from posttrain.roles.rollout import RolloutEngine


class InProcessWeightSync:
    def __init__(self, source: torch.nn.Module, engine: RolloutEngine):
        self.source = source
        self.engine = engine
        self.version = engine.weight_version

    @torch.no_grad()
    def push(self) -> int:
        self.engine.model.load_state_dict(self.source.state_dict())
        self.version += 1
        self.engine.weight_version = self.version
        return self.version


class SharedWeights:
    """Weight sync for an engine that samples from the trainer's own module
    (`RolloutEngine(..., shares_weights=True)`): the optimizer step has already updated
    the weights it reads, so a push only bumps the version the engine stamps on episodes."""

    def __init__(self, source: torch.nn.Module, engine: RolloutEngine):
        if engine.model is not source:
            raise ValueError("SharedWeights needs an engine built on the trainer's own module; "
                             "an engine with its own copy needs InProcessWeightSync")
        self.engine = engine
        self.version = engine.weight_version

    def push(self) -> int:
        self.version += 1
        self.engine.weight_version = self.version
        return self.version
