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

Partial rollouts (dist.partial_rollout_tokens = C > 0). Without them a push waits in each
worker's queue behind the batches sampled ahead, so every token of a batch comes from the
version that began it. With them a batch sampled ahead is sampled a chunk at a time and its
rows stay in the worker (roles/engines/contract.py::PartialRows) between calls:

    sample(s)   begin the batch of step s + k: its first C tokens a row; gather the batch of step s
    push()      after the update: the new weights; then finish the batch due next (its rows run
                to their end) and draw C more tokens a row of every later batch in flight, all
                under the new weights

The finish is sent first, so the trainer never waits behind a chunk of a batch it does not
need yet. A push thus lands between two chunks, and the tokens after it are drawn by the new
weights; each keeps the log-prob of the weights that drew it (Episode.token_versions), which is what the
mismatch correction reads as π_behaviour. The boundaries are fixed by the step schedule, never
by wall time: a worker runs its calls in the order they were sent, and the controller sends
them in the same order in every run, so a run's draws are a pure function of its settings and
kill -9 resume stays exact. A checkpoint waits for the batch being finished and saves its
episodes, and copies the rows of the later batches (after the calls sent before it, without
finishing them); a resumed run trains on the one and gives the others back to the workers.

An episode is as stale as its oldest token (the first, drawn when its batch began): at most k
updates, by construction. Before a batch is trained its episodes staler than max_staleness are
dropped and their prompts sampled again from the current weights (same prompts, a seed of
their own), so the bound is checked on the data, not assumed; under this schedule the drop
never fires (partial/dropped_stale logs it), and it is there so that a schedule that sends
batches further ahead cannot train past the bound. A worker restarted mid-batch lost its rows:
its shards are sampled again from their start by the current weights.

What it buys, and what it costs (BENCHMARKS.md, docs/guides/scaling-out.md): the tokens after
a push are fresher (logged per token as staleness_token_mean; continued tokens as
partial/continued_tokens), while the rows still running after the last push before their
step finish while the trainer waits (with k = 1, all but the first C tokens of a row), and
every chunk after the first prefills its rows' text again: new weights cannot reuse keys and
values computed by the old ones.
"""

from __future__ import annotations

from typing import Any

from posttrain.config import DistConfig
from posttrain.distributed.rollout_workers import RayRollout
from posttrain.models.policy import Policy
from posttrain.roles.mismatch import MismatchCorrection
from posttrain.roles.off_policy import staleness_stats
from posttrain.roles.rollout import RolloutRequest, Shard, split_shards
from posttrain.roles.trainer import Trainer
from posttrain.seeds import derive_seed
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
        self.chunk = dist.partial_rollout_tokens  # 0: whole responses (the module docstring)
        self.partial: dict[int, tuple[list[Shard], int]] = {}  # step -> (shards, K) sampling in chunks in the workers
        self.finishing: dict[int, tuple[list, int]] = {}  # step -> (finish calls, K): the batch due next
        self.redraw: dict[int, tuple[int, int]] = {}  # step -> (seed, K) a stale group of its batch is drawn again with
        self.dropped_stale = 0  # episodes dropped for staleness in the last batch
        super().__init__(dist, *args, **kwargs)

    def push(self, version: int | None = None, wait: bool = False) -> int:
        # no waiting by default: a push queues behind the batches the workers are sampling
        restored = version is not None  # a resumed run's weights: its rows in flight come with its checkpoint
        version = super().push(version, wait=wait)
        if self.partial and not restored:
            self.finish(min(self.partial))  # first, so that its gather waits for nothing else
            for step in sorted(self.partial):  # C more tokens a row, under the new weights
                for shard in self.partial[step][0]:
                    self.worker_of(shard).advance_partial.remote((step, shard.index), self.chunk)
        return version

    def sample(self, step: int, round: int = 0) -> list[Episode]:
        if round > 0:  # a dynamic-sampling retry: on-policy, now
            return super().sample(step, round)
        if self.chunk:
            return self.sample_partial(step)
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

    # -- partial rollouts ---------------------------------------------------------------------

    def worker_of(self, shard: Shard) -> Any:
        return self.workers[shard.index % len(self.workers)]

    def begin(self, step: int) -> None:
        """Split the request of `step` into shards and have each worker draw their first chunk."""
        request = self.request(step, 0)
        shards = split_shards(request, self.shards)
        for shard in shards:
            self.worker_of(shard).start_partial.remote((step, shard.index), shard, request.samples_per_prompt,
                                                       self.chunk)
        self.partial[step] = (shards, request.samples_per_prompt)
        self.redraw[step] = (derive_seed(request.seed, "stale"), request.samples_per_prompt)

    def finish(self, step: int) -> None:
        """Have the workers run the rows of `step`'s batch to their end."""
        shards, k = self.partial.pop(step)
        self.finishing[step] = ([(s, self.worker_of(s).finish_partial.remote((step, s.index))) for s in shards], k)

    def sample_partial(self, step: int) -> list[Episode]:
        if not any(step in held for held in (self.ready, self.partial, self.finishing)):
            self.begin(step)  # the first step: nothing began it yet
        if step in self.partial:  # no push finished it (the first step): before the next batch begins
            self.finish(step)
        last = step + self.max_staleness if self.horizon is None else min(step + self.max_staleness, self.horizon - 1)
        for ahead in range(step + 1, last + 1):
            if not any(ahead in held for held in (self.ready, self.partial, self.finishing)):
                self.begin(ahead)
        if step in self.ready:  # gathered for a checkpoint, or restored from one
            episodes, self.rollout_compute = self.ready.pop(step)
        else:
            calls, k = self.finishing.pop(step)
            episodes = self.gather(calls, k, min_version=0)
        if step not in self.redraw:  # a batch from a checkpoint of before partial rollouts
            return episodes
        seed, k = self.redraw.pop(step)
        return self.drop_stale(episodes, k, seed)

    def drop_stale(self, episodes: list[Episode], k: int, seed: int) -> list[Episode]:
        """The episodes within max_staleness of the weights they will train, and in place of
        each group that held a staler one, the same prompt sampled again by the current weights
        (from `seed`, so a resumed run draws the same)."""
        stale_groups = sorted({e.group_id for e in episodes if self.version - e.weight_version > self.max_staleness})
        self.dropped_stale = sum(e.group_id in stale_groups for e in episodes)
        if not stale_groups:
            return episodes
        examples = [next(e.example for e in episodes if e.group_id == g) for g in stale_groups]
        fresh = self.gather(self.submit(RolloutRequest(examples, k, seed), self.version), k, self.version)
        for e in fresh:  # back to the group ids of the prompts they replace
            e.group_id = stale_groups[e.group_id]
        kept = [e for e in episodes if e.group_id not in set(stale_groups)] + fresh
        return sorted(kept, key=lambda e: e.group_id)  # stable: a group's K samples stay in their order

    def step_metrics(self) -> dict[str, float]:
        if not self.chunk:
            return super().step_metrics()
        return {**super().step_metrics(), "partial/dropped_stale": self.dropped_stale}

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The batches sampled ahead, finished: waits for those still in flight. Under partial
        rollouts, a copy of the rows each worker holds, left running."""
        if self.chunk:
            for step in sorted(self.finishing):
                calls, k = self.finishing.pop(step)
                self.ready[step] = (self.gather(calls, k, min_version=0), self.rollout_compute)
            partials = {}
            for held in self.ray.get([w.partial_states.remote() for w in self.workers]):
                partials.update(held)
            return {**RayRollout.state_dict(self), "ready": dict(self.ready), "redraw": dict(self.redraw),
                    "partial": {step: (shards, k, {s.index: partials.get((step, s.index)) for s in shards})
                                for step, (shards, k) in self.partial.items()}}
        for step in sorted(self.in_flight):
            calls, k = self.in_flight.pop(step)
            self.ready[step] = (self.gather(calls, k, min_version=0), self.rollout_compute)
        return {**super().state_dict(), "ready": dict(self.ready)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.ready = dict(state.get("ready", {}))  # none in a checkpoint from before batches were saved
        self.redraw = dict(state.get("redraw", {}))
        for step, (shards, k, rows) in state.get("partial", {}).items():
            for shard in shards:  # a shard whose rows were lost with a worker is sampled again when it is due
                if rows.get(shard.index) is not None:
                    self.worker_of(shard).put_partials.remote({(step, shard.index): rows[shard.index]})
            self.partial[step] = (shards, k)

    def off_policy_correction(self, batch: RolloutBatch, trainer: Trainer[Policy]) -> tuple[RolloutBatch, dict]:
        stats = staleness_stats(batch, self.version, self.max_staleness)
        if self.chunk:
            stats.update(token_staleness(batch.episodes, self.version))
        batch, mismatch = self.correction.correct(batch, trainer)
        return batch, {**stats, **mismatch}


def token_staleness(episodes: list[Episode], version: int) -> dict[str, float]:
    """Per response token: the mean staleness against the trainer's `version`, and the tokens
    drawn by newer weights than their row's first token (continued across a push)."""
    versions = [v for e in episodes for v in (e.token_versions or [e.weight_version] * len(e.response_ids))]
    continued = sum(v > e.weight_version for e in episodes for v in (e.token_versions or []))
    return {"staleness_token_mean": sum(version - v for v in versions) / max(1, len(versions)),
            "partial/continued_tokens": continued}
