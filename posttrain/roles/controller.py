"""Controller: the loop that makes the other five roles take turns.

One RL step, in the order a paper's pseudocode gives it (`Controller.step`):

    1. sample    the rollout role draws K completions per prompt, capturing old_logp
    2. score     the environment's verifier (or a reward built on it) scores each completion
    3. reference the frozen reference scores the same tokens, as far as something reads them
    4. advantage the algorithm turns rewards into per-token advantages
    5. update    the trainer minimises the algorithm's loss, leaving out rows with no gradient
    6. sync      the fresh weights reach the rollout role, with a new version number
    7. metrics   what the step did, for the log

What only some runs add — a reward term that scores a sample against its group, a curated
prompt pool, PPO's critic, PRIME's implicit PRM, an adaptive KL coefficient — are step hooks
(roles/hooks.py) the controller calls at fixed points of every step, each a no-op where the
hook does not act. The controller is handed its roles (pipelines/build.py makes them): it
never builds one, never asks which it has, and knows no algorithm, model, engine or topology
by name. Where the rollout runs (this process, Ray workers) and how many processes train are
the roles' business.

Every random draw of step s is seeded from (seed, purpose, s), never from a global stream,
so a run resumed from a checkpoint makes exactly the draws an uninterrupted run makes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from posttrain.algorithms.contract import Algorithm
from posttrain.algorithms.core import zero_variance_group_fraction
from posttrain.models.policy import Policy
from posttrain.roles.environment import score_episodes
from posttrain.roles.hooks import StepHook
from posttrain.roles.reference import NoReference, Reference, kl_to_reference
from posttrain.roles.rollout import Rollout
from posttrain.roles.trainer import Trainer
from posttrain.seeds import generator_for
from posttrain.types import MODEL_TURN, Episode, Example, RolloutBatch

Scorer = Callable[[Example, str], dict[str, Any]]


@dataclass
class StepSettings:
    """How a step runs (rl.* settings, read by pipelines/build.py)."""

    prompts_per_step: int  # groups a step trains on
    seed: int  # the run's seed: every draw of step s is derived from (seed, purpose, s)
    pad_id: int  # the tokenizer's padding id, for collating episodes into (B, T) tensors
    epochs: int = 1  # passes of the update over the batch
    minibatches: int = 1  # optimizer steps per epoch
    max_sampling_rounds: int = 1  # rounds of fresh prompts to refill groups the algorithm drops (DAPO)
    skip_inert_rows: bool = True  # leave rows with no gradient out of the update


class Controller:
    """The RL step loop over roles it is given.

    rollout    sample(step, round) -> episodes; push(); off_policy_correction(batch, trainer)
               (roles/rollout.py::Rollout)
    reward     score(example, completion) -> {reward, details}: the verifier or a reward on it
    algorithm  filter_batch, compute_advantages, rows_with_gradient, compute_loss
               (algorithms/contract.py)
    trainer    update(batch, algorithm, ...) (roles/trainer.py)
    settings   StepSettings
    reference  score(batch): ref_logp on the batch, or the KL on a sample of rows, or nothing
               (roles/reference.py)
    hooks      StepHooks, called in order at fixed points of the step (roles/hooks.py)
    """

    def __init__(self, rollout: Rollout, reward: Scorer, algorithm: Algorithm, trainer: Trainer[Policy],
                 settings: StepSettings, reference: Reference | NoReference = NoReference(),
                 hooks: Sequence[StepHook] = ()):
        self.rollout, self.reward, self.algorithm, self.trainer = rollout, reward, algorithm, trainer
        self.settings, self.reference, self.hooks = settings, reference, list(hooks)
        self.timings: dict[str, float] = defaultdict(float)  # wall time per role, reset every step
        self.round_metrics: dict[str, list[float]] = defaultdict(list)  # the hooks' metrics of each sampling round

    @contextmanager
    def timed(self, role: str | None) -> Iterator[None]:
        """Wall time of the block, added to the step's time/{role} (None: not timed)."""
        start = time.perf_counter()
        yield
        if role is not None:
            self.timings[f"time/{role}"] += time.perf_counter() - start

    def step(self, step: int) -> tuple[dict[str, float], list[Episode]]:
        """One RL step: (metrics, the episodes it trained on)."""
        self.timings.clear()
        self.round_metrics.clear()
        episodes, sampling_stats = self.informative_episodes(step)  # 1. sample and 2. score
        batch = sampled = self.collate(episodes)
        with self.timed("reference"):
            logged_kl = self.reference.score(batch)  # 3. reference
        hook_metrics = self.before_advantages(batch)  # the critic's values, PRIME's process rewards
        with self.timed("train"):
            # the (B, T) fields the algorithm sets, by name (Any: replace checks ** against every field's type)
            computed: dict[str, Any] = self.algorithm.compute_advantages(batch)
            batch = dataclasses.replace(batch, **computed)  # 4. advantage
            if self.settings.skip_inert_rows:
                batch.rows_with_gradient = self.algorithm.rows_with_gradient(batch)
            # async's stale episodes, int8's sampler: π_old recomputed (for the trained rows) and TIS
            batch, off_policy = self.rollout.off_policy_correction(batch, self.trainer)
            metrics = self.trainer.update(batch, self.algorithm, self.settings.epochs,  # 5. update
                                          self.settings.minibatches, generator_for(self.settings.seed, "rl-minibatch", step))
        with self.timed("sync"):
            self.rollout.push()  # 6. sync
        # 7. metrics: lengths and KL of every sampled token (the loss's mask may be smaller: overlong filtering)
        every_token = dataclasses.replace(batch, response_mask=sampled.response_mask)
        metrics.update(**rollout_metrics(every_token, episodes), **logged_kl, **sampling_stats, **off_policy,
                       **self.rollout.step_metrics(), **hook_metrics, **self.timings,
                       weight_version=self.rollout.version,
                       **{name: statistics.fmean(values) for name, values in self.round_metrics.items()})
        # the share of rows whose every token the algorithm took out of the loss (GRPO's overlong_filter)
        metrics["loss_dropped_rows"] = ((sampled.response_mask.sum(1) > 0)
                                        & (batch.response_mask.sum(1) == 0)).float().mean().item()
        metrics["pass_rate"] = sum(e.details.get("reason") == "ok" for e in episodes) / len(episodes)
        for hook in self.hooks:  # what reads the step's metrics: an adaptive β steers toward its target KL
            hook.finish_step(step, metrics)
        return metrics, episodes

    def before_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for hook in self.hooks:
            with self.timed(hook.timing):
                metrics.update(hook.before_advantages(batch))
        return metrics

    def sample_and_score(self, step: int, round: int) -> list[Episode]:
        with self.timed("rollout"):  # 1. sample
            episodes = self.rollout.sample(step, round)
        with self.timed("score"):  # 2. score
            episodes = score_episodes(self.reward, episodes)
            for hook in self.hooks:  # group terms of the reward, while group ids are this round's prompts
                for name, value in hook.scored(step, episodes).items():
                    self.round_metrics[name].append(value)
            return episodes

    def collate(self, episodes: list[Episode]) -> RolloutBatch:
        """The training rows of `episodes`, padded: one per episode, or one per model turn of
        a multi-turn episode whose turns saw different contexts (Episode.training_rows)."""
        rows = [row for episode in episodes for row in episode.training_rows()]
        batch = RolloutBatch.collate(rows, self.settings.pad_id, temperature=self.rollout.temperature)
        # on the policy's device from here on: the reference, the algorithm's advantages and the update all
        # read it there, and write ref_logp, values and advantages there (models/device.py)
        return batch.to(self.trainer.device)

    def informative_episodes(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """Sample rounds of fresh prompts, keeping the whole groups the algorithm's
        filter_batch keeps, until prompts_per_step groups are kept or the rounds run out.
        An algorithm that keeps everything (the default) is done after one round; DAPO's
        dynamic sampling drops groups whose rewards are all equal and draws again. A hook's
        keep_groups (a curated pool's online band) drops groups in the same loop."""
        n = self.settings.prompts_per_step
        kept: list[Episode] = []
        sampled_groups, sampled_rewards = 0, []
        for round in range(self.settings.max_sampling_rounds):
            episodes = self.sample_and_score(step, round)
            sampled_rewards += [e.reward for e in episodes]
            for e in episodes:  # group ids unique across rounds
                e.group_id += round * n
            sampled_groups += n
            # whole groups, so the episodes themselves, not the rows they became
            kept_groups = {row.group_id for row in self.algorithm.filter_batch(self.collate(episodes)).episodes}
            for hook in self.hooks:
                kept_groups &= hook.keep_groups(episodes)
            kept += [e for e in episodes if e.group_id in kept_groups]
            if len({e.group_id for e in kept}) >= n:
                break
        groups = sorted({e.group_id for e in kept})[:n]
        kept = [e for e in kept if e.group_id in set(groups)]
        # reward_mean describes the kept (hard) groups only; this one is comparable across algorithms
        stats = {"sampling_rounds": round + 1, "kept_group_fraction": len(groups) / sampled_groups,
                 "reward_sampled_mean": sum(sampled_rewards) / len(sampled_rewards)}
        # nothing informative at all: train on the last round, whose advantages are all 0
        return (kept or episodes), stats

    def state_dict(self) -> dict:
        """What a resumed run needs besides the weights and the optimizer: the weight version,
        what the rollout holds (the async topology's batches sampled ahead, waiting for those
        in flight), an algorithm's state between steps (REINFORCE's running-mean baseline),
        and each hook's (the adaptive KL coefficient, a curated pool's pass rates and draws)."""
        state = {"weight_version": self.rollout.version, "rollout": self.rollout.state_dict(),
                 "algorithm": self.algorithm.state_dict()}
        for hook in self.hooks:
            if hook.state_key is not None:
                state[hook.state_key] = hook.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.rollout.push(version=state["weight_version"])  # the engine must sample from the restored weights
        self.rollout.load_state_dict(state.get("rollout", {}))  # {}: a checkpoint from before rollouts had state
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        for hook in self.hooks:
            if hook.state_key is not None:
                hook.load_state_dict(state.get(hook.state_key))

    def close(self) -> None:
        self.rollout.close()  # stops the Ray workers (and the local cluster, if this run started it)
        self.trainer.close()  # stops the data-parallel trainer ranks, if any


def rollout_metrics(batch: RolloutBatch, episodes: list[Episode]) -> dict[str, float]:
    """What the step sampled (`episodes`) and trained on (`batch`: one row per episode, or
    per model turn under the keep_last / drop thinking policies); the means of rewards and
    lengths are per episode either way."""
    optional = {}  # metrics only some batches have
    if batch.ref_logp is not None:
        optional["kl_ref"] = kl_to_reference(batch, batch.ref_logp)
    multi_turn = [e for e in episodes if e.turns is not None]
    if multi_turn:  # model turns per episode: for a tool environment, its tool calls and its final answer
        model_turns = [t for e in episodes if e.turns is not None for t in e.turns if t.source == MODEL_TURN]
        optional["model_turns"] = len(model_turns) / len(multi_turn)
        # the share of episodes the environment answered at least once: for a tool environment,
        # those that called a tool
        optional["observed_episodes"] = sum(e.observed for e in multi_turn) / len(multi_turn)
    # the share of rows with no gradient, which the update left out (rl.update.skip_inert_rows)
    inert = 0.0 if batch.rows_with_gradient is None else 1.0 - batch.rows_with_gradient.float().mean().item()
    rewards = [e.reward for e in episodes]
    return {
        **optional,
        "skipped_rows": inert,
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.stdev(rewards) if len(rewards) > 1 else 0.0,
        "zero_variance_groups": zero_variance_group_fraction(batch.rewards, batch.group_ids),
        "response_length": batch.response_mask.sum().item() / len(episodes),  # model tokens per episode
        # cut off by max_new_tokens; a multi-turn episode: ended by a budget instead of its environment
        "truncated_fraction": sum(not e.finished for e in episodes) / len(episodes),
    }
