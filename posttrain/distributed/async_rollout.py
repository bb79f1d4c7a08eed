"""The async topology: workers sample the next batch(es) while the trainer updates.

With max_staleness = k, the controller keeps the requests of steps s, s+1, ..., s+k in
flight while it trains on step s. A worker runs its calls in the order they were sent,
so the request for step s+j, sent before the update of step s, is sampled by weights of
version ≤ s and trained on at version s+j: staleness ≤ j ≤ k, by construction (and
checked on every batch, see off_policy.staleness_stats). Weight pushes do not wait for
the workers — waiting would mean waiting for the batches already queued ahead of the
push — so the trainer never idles on a push.

The price is off-policy data, corrected with truncated importance sampling
(off_policy.py). Extra dynamic-sampling rounds (DAPO) are sampled on demand with the
current weights.
"""

from __future__ import annotations


from posttrain.distributed.off_policy import apply_tis, current_logp, staleness_stats
from posttrain.distributed.rollout_workers import RayRollout
from posttrain.types import Episode, RolloutBatch


class AsyncRayRollout(RayRollout):
    topology = "async"

    def __init__(self, dist, *args, horizon: int | None = None, **kwargs):
        self.max_staleness = dist.max_staleness
        self.tis_cap = dist.tis_cap
        self.horizon = horizon  # the number of steps of the run: nothing is sampled past it
        self.in_flight: dict[int, tuple[list, int]] = {}  # step -> (shard calls, K)
        super().__init__(dist, *args, **kwargs)

    def push(self, version: int | None = None, wait: bool = False) -> int:
        # no waiting by default: a push queues behind the batches the workers are sampling
        return super().push(version, wait=wait)

    def sample(self, step: int, round: int = 0) -> list[Episode]:
        if round > 0:  # a dynamic-sampling retry: on-policy, now
            return super().sample(step, round)
        last = step + self.max_staleness if self.horizon is None else min(step + self.max_staleness, self.horizon - 1)
        for ahead in range(step, last + 1):
            if ahead not in self.in_flight:
                request = self.request(ahead, 0)
                self.in_flight[ahead] = (self.submit(request, 0), request.samples_per_prompt)
        calls, k = self.in_flight.pop(step)
        return self.gather(calls, k, min_version=0)

    def off_policy_correction(self, batch: RolloutBatch, trainer) -> tuple[RolloutBatch, dict]:
        stats = staleness_stats(batch, self.version, self.max_staleness)
        batch, tis = apply_tis(batch, current_logp(trainer, batch), self.tis_cap)
        return batch, {**stats, **tis}
