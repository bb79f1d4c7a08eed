"""The async topology: workers sample the next batch(es) while the trainer updates.

With max_staleness = k, the controller keeps the requests of steps s, s+1, ..., s+k in
flight while it trains on step s. A worker runs its calls in the order they were sent,
so the request for step s+j, sent before the update of step s, is sampled by weights of
version ≤ s and trained on at version s+j: staleness ≤ j ≤ k, by construction (and
checked on every batch, see off_policy.staleness_stats). Weight pushes do not wait for
the workers — waiting would mean waiting for the batches already queued ahead of the
push — so the trainer never idles on a push.

The price is off-policy data, corrected with importance weights (rl.mismatch,
roles/mismatch.py). Extra dynamic-sampling rounds (DAPO) are sampled on demand with the
current weights.

Checkpoints. The batches in flight were sampled by weights older than the checkpoint's,
so a resumed run cannot re-sample them. `state_dict()` waits for them and saves the
episodes; the run then trains on these "ready" batches instead of the futures. Waiting
changes no draw: each worker runs the calls of this one controller in the order they
were sent (Ray's ordering for a synchronous actor without task retries), so a request
still runs after the pushes sent before it and before those sent after it. A resumed
run trains on the saved episodes and requests the next batches after the same pushes
as the uninterrupted run, so its numbers are the same. The cost: a checkpoint waits for
up to max_staleness batches to finish sampling.
"""

from __future__ import annotations

from typing import Any

from posttrain.config import DistConfig
from posttrain.distributed.rollout_workers import RayRollout
from posttrain.models.policy import Policy
from posttrain.roles.mismatch import MismatchCorrection
from posttrain.roles.off_policy import staleness_stats
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, RolloutBatch


class AsyncRayRollout(RayRollout):
    topology = "async"

    def __init__(self, dist: DistConfig, *args: Any, horizon: int | None = None, **kwargs: Any):
        self.max_staleness = dist.max_staleness
        # stale episodes are never the trainer's current policy: always corrected (rl.mismatch's defaults
        # when the caller names no correction)
        kwargs.setdefault("correction", MismatchCorrection())
        self.horizon = horizon  # the number of steps of the run: nothing is sampled past it
        self.in_flight: dict[int, tuple[list, int]] = {}  # step -> (shard calls, K), still sampling
        self.ready: dict[int, tuple[list[Episode], float]] = {}  # step -> (episodes, sampling seconds), finished
        super().__init__(dist, *args, **kwargs)

    def push(self, version: int | None = None, wait: bool = False) -> int:
        # no waiting by default: a push queues behind the batches the workers are sampling
        return super().push(version, wait=wait)

    def sample(self, step: int, round: int = 0) -> list[Episode]:
        if round > 0:  # a dynamic-sampling retry: on-policy, now
            return super().sample(step, round)
        last = step + self.max_staleness if self.horizon is None else min(step + self.max_staleness, self.horizon - 1)
        for ahead in range(step, last + 1):
            if ahead not in self.in_flight and ahead not in self.ready:
                request = self.request(ahead, 0)
                self.in_flight[ahead] = (self.submit(request, 0), request.samples_per_prompt)
        if step in self.ready:  # gathered for a checkpoint, or restored from one
            episodes, self.rollout_compute = self.ready.pop(step)
            return episodes
        calls, k = self.in_flight.pop(step)
        return self.gather(calls, k, min_version=0)

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The batches sampled ahead, finished: waits for those still in flight."""
        for step in sorted(self.in_flight):
            calls, k = self.in_flight.pop(step)
            self.ready[step] = (self.gather(calls, k, min_version=0), self.rollout_compute)
        return {**super().state_dict(), "ready": dict(self.ready)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.ready = dict(state.get("ready", {}))  # none in a checkpoint from before batches were saved

    def off_policy_correction(self, batch: RolloutBatch, trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict]:
        stats = staleness_stats(batch, self.version, self.max_staleness)
        batch, mismatch = self.correction.correct(batch, trainer)
        return batch, {**stats, **mismatch}
