"""Controller: the loop that makes the other five roles take turns.

One RL step, in the order a paper's pseudocode gives it (`Controller.step`):

    1. sample    the rollout role draws K completions per prompt, capturing old_logp
    2. score     the environment's verifier (or a reward built on it) scores each completion;
                 a reward that compares a sample with its group (Kimi's length reward) then
                 scores each group
    3. reference the frozen reference scores the same tokens (when the loss reads it), or an evenly
                 spaced sample of rows (when only the KL log does);
                 an implicit PRM (PRIME) learns from this batch's outcomes and gives per-token rewards
    4. advantage the algorithm turns rewards into per-token advantages
    5. update    the trainer minimises the algorithm's loss, leaving out rows with no gradient
    6. sync      the fresh weights reach the rollout role, with a new version number
    7. metrics   what the step did, for the log

The controller is handed its roles (pipelines/build.py makes them): it never builds one,
and it knows no algorithm, model or topology by name. Where the rollout runs (this
process, Ray workers) and how many processes train are the roles' business.

Every random draw of step s is seeded from (seed, purpose, s), never from a global stream,
so a run resumed from a checkpoint makes exactly the draws an uninterrupted run makes.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable

from posttrain.algorithms.core import kl_k3, masked_mean, zero_variance_group_fraction
from posttrain.roles.environment import score_episodes
from posttrain.seeds import generator_for
from posttrain.types import MODEL_TURN, Episode, Example, RolloutBatch

Scorer = Callable[[Example, str], dict[str, Any]]


class Controller:
    """The RL step loop over roles it is given.

    rollout      sample(step, round) -> episodes; push(); off_policy_correction(batch, trainer);
                 step_metrics(); version; state_dict() / load_state_dict() (distributed/backend.py)
    reward       score(example, completion) -> {reward, details}: the verifier or a reward on it
    group_reward group_reward(episodes, step) -> metrics: adds the terms that score a sample
                 against its group (rewards/stack.py::RewardStack.score_groups), or None
    algorithm    compute_advantages, compute_loss (algorithms/contract.py)
    trainer      update(batch, loss, ...), values(batch) for a critic (roles/trainer.py)
    reference    logp(batch), or None when nothing reads π_ref (roles/reference.py)
    kl_log_rows  rows the reference scores when only the KL log reads it (no KL term in the loss,
                 no implicit PRM): a mean needs a sample, not every row. 0 = every row
    process_reward  process_reward(batch) -> (per-token rewards, metrics), updating itself online;
                 state_dict() / load_state_dict(); None unless the algorithm asks for one
                 (PRIME's implicit PRM, rewards/implicit_prm.py)
    kl_controller  steers algorithm.kl_coef toward a target KL, or None (rewards/kl_control.py)
    prompts      the curated prompt pool the rollout draws from, or None (data/curation.py): it
                 observe(step, episodes)s every sampled group's pass rate, keep_groups(episodes)
                 says which groups its online band keeps; step_metrics(step); state_dict()
    """

    def __init__(self, rollout, reward: Scorer, algorithm, trainer, *, pad_id: int, prompts_per_step: int,
                 seed: int, epochs: int = 1, minibatches: int = 1, max_sampling_rounds: int = 1, reference=None,
                 kl_controller=None, skip_inert_rows: bool = True, process_reward=None, group_reward=None,
                 prompts=None, kl_log_rows: int = 0):
        self.rollout, self.reward, self.algorithm, self.trainer = rollout, reward, algorithm, trainer
        self.group_reward = group_reward
        self.reference, self.kl_controller, self.process_reward = reference, kl_controller, process_reward
        self.kl_log_rows = kl_log_rows
        self.prompts = prompts
        self.pad_id, self.prompts_per_step, self.seed = pad_id, prompts_per_step, seed
        self.epochs, self.minibatches, self.max_sampling_rounds = epochs, minibatches, max_sampling_rounds
        self.skip_inert_rows = skip_inert_rows  # leave rows with no gradient out of the update
        self.timings: dict[str, float] = defaultdict(float)  # wall time per role, reset every step
        self.reward_metrics: dict[str, list[float]] = defaultdict(list)  # the group terms' means, per round

    @contextmanager
    def timed(self, role: str):
        start = time.perf_counter()
        yield
        self.timings[f"time/{role}"] += time.perf_counter() - start

    def step(self, step: int) -> tuple[dict[str, float], list[Episode]]:
        """One RL step: (metrics, the episodes it trained on)."""
        self.timings.clear()
        self.reward_metrics.clear()
        episodes, sampling_stats = self.informative_episodes(step)  # 1. sample and 2. score
        batch = sampled = self.collate(episodes)
        logged_kl = {}
        with self.timed("reference"):  # 3. reference (and the critic's values at sampling time)
            if self.reference is not None and self.scores_every_row(batch):
                batch.ref_logp = self.reference.logp(batch)
            elif self.reference is not None:  # only the log reads it: KL on a sample of the rows
                logged = batch.select(evenly_spaced_rows(batch.batch_size, self.kl_log_rows))
                logged_kl = {"kl_ref": kl_to_reference(logged, self.reference.logp(logged))}
            if self.algorithm.uses_critic:
                batch.values = self.trainer.values(batch)
        process_metrics = {}
        if self.process_reward is not None:  # PRIME: the implicit PRM steps on this batch, then scores it
            with self.timed("process_reward"):
                batch.process_rewards, process_metrics = self.process_reward(batch)
        with self.timed("train"):
            batch = dataclasses.replace(batch, **self.algorithm.compute_advantages(batch))  # 4. advantage
            if self.skip_inert_rows:
                batch.rows_with_gradient = self.algorithm.rows_with_gradient(batch)
            # async's stale episodes, int8's sampler: π_old recomputed (for the trained rows) and TIS
            batch, off_policy = self.rollout.off_policy_correction(batch, self.trainer)
            metrics = self.trainer.update(batch, self.algorithm, self.epochs, self.minibatches,  # 5. update
                                          generator_for(self.seed, "rl-minibatch", step))
        with self.timed("sync"):
            self.rollout.push()  # 6. sync
        # lengths and KL of every sampled token: the loss's mask may be smaller (overlong filtering)
        every_token = dataclasses.replace(batch, response_mask=sampled.response_mask)
        metrics.update(**rollout_metrics(every_token, episodes), **logged_kl, **sampling_stats, **off_policy,
                       **self.rollout.step_metrics(), **process_metrics, **self.timings,
                       weight_version=self.rollout.version,
                       **{name: statistics.fmean(values) for name, values in self.reward_metrics.items()},
                       **(self.prompts.step_metrics(step) if self.prompts is not None else {}))
        # the share of rows whose every token the algorithm took out of the loss (GRPO's overlong_filter)
        metrics["loss_dropped_rows"] = ((sampled.response_mask.sum(1) > 0)
                                        & (batch.response_mask.sum(1) == 0)).float().mean().item()
        metrics["pass_rate"] = sum(e.details.get("reason") == "ok" for e in episodes) / len(episodes)
        if self.kl_controller is not None:  # steer β for the next step from this step's KL
            metrics["kl_coef"] = self.algorithm.kl_coef
            self.algorithm.kl_coef = self.kl_controller.update(metrics["kl_ref"], 1)
        return metrics, episodes

    def scores_every_row(self, batch: RolloutBatch) -> bool:
        """Whether the reference must score every row of this batch: something besides the
        KL log reads ref_logp (a KL term in the loss, which an adaptive KL controller always
        has, its β being multiplied and never 0; an implicit PRM), or a sample would be the
        whole batch anyway."""
        return (self.algorithm.uses_reference or self.process_reward is not None
                or not 0 < self.kl_log_rows < batch.batch_size)

    def sample_and_score(self, step: int, round: int) -> list[Episode]:
        with self.timed("rollout"):  # 1. sample
            episodes = self.rollout.sample(step, round)
        with self.timed("score"):  # 2. score
            episodes = score_episodes(self.reward, episodes)
            if self.group_reward is not None:  # each group's terms, while group ids are this round's prompts
                for name, value in self.group_reward(episodes, step).items():
                    self.reward_metrics[name].append(value)
            return episodes

    def collate(self, episodes: list[Episode]) -> RolloutBatch:
        """The training rows of `episodes`, padded: one per episode, or one per model turn of
        a multi-turn episode whose turns saw different contexts (Episode.training_rows)."""
        rows = [row for episode in episodes for row in episode.training_rows()]
        batch = RolloutBatch.collate(rows, self.pad_id, temperature=self.rollout.engine.params.temperature or 1.0)
        # on the policy's device from here on: the reference, the algorithm's advantages and the update all
        # read it there, and write ref_logp, values and advantages there (models/device.py)
        return batch.to(self.trainer.device)

    def informative_episodes(self, step: int) -> tuple[list[Episode], dict[str, float]]:
        """Sample rounds of fresh prompts, keeping the whole groups the algorithm's
        filter_batch keeps, until prompts_per_step groups are kept or the rounds run out.
        An algorithm that keeps everything (the default) is done after one round; DAPO's
        dynamic sampling drops groups whose rewards are all equal and draws again. A curated
        pool's online filter drops, in the same loop, the groups outside its pass-rate band."""
        kept: list[Episode] = []
        sampled_groups, sampled_rewards = 0, []
        for round in range(self.max_sampling_rounds):
            episodes = self.sample_and_score(step, round)
            sampled_rewards += [e.reward for e in episodes]
            for e in episodes:  # group ids unique across rounds
                e.group_id += round * self.prompts_per_step
            sampled_groups += self.prompts_per_step
            # whole groups, so the episodes themselves, not the rows they became
            kept_groups = {row.group_id for row in self.algorithm.filter_batch(self.collate(episodes)).episodes}
            if self.prompts is not None:  # every group is a fresh pass rate of its prompt, kept or not
                self.prompts.observe(step, episodes)
                kept_groups &= self.prompts.keep_groups(episodes)
            kept += [e for e in episodes if e.group_id in kept_groups]
            if len({e.group_id for e in kept}) >= self.prompts_per_step:
                break
        groups = sorted({e.group_id for e in kept})[: self.prompts_per_step]
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
        the adaptive KL coefficient, a curated pool's pass rates and draws."""
        state = {"weight_version": self.rollout.version, "rollout": self.rollout.state_dict(),
                 "algorithm": self.algorithm.state_dict()}
        if self.kl_controller is not None:
            state["kl_controller"] = self.kl_controller.state_dict()
        if self.process_reward is not None:
            state["process_reward"] = self.process_reward.state_dict()
        if self.prompts is not None:
            state["prompts"] = self.prompts.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.rollout.push(version=state["weight_version"])  # the engine must sample from the restored weights
        self.rollout.load_state_dict(state.get("rollout", {}))  # {}: a checkpoint from before rollouts had state
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        if self.kl_controller is not None:
            self.kl_controller.load_state_dict(state["kl_controller"])
            self.algorithm.kl_coef = self.kl_controller.value
        if self.process_reward is not None:
            self.process_reward.load_state_dict(state["process_reward"])
        if self.prompts is not None:
            if "prompts" not in state:
                raise ValueError("the checkpoint holds no curated prompt pool: it is of a run without "
                                 "rl.curation; resume with the settings the run started with")
            self.prompts.load_state_dict(state["prompts"])

    def close(self) -> None:
        self.rollout.close()  # stops the Ray workers (and the local cluster, if this run started it)
        self.trainer.close()  # stops the data-parallel trainer ranks, if any


def evenly_spaced_rows(batch_size: int, n: int) -> list[int]:
    """n of batch_size rows, evenly spaced: rows are grouped by prompt, so every part of the
    batch is represented, and the choice is the same on a resumed run."""
    return [i * batch_size // n for i in range(n)]


def kl_to_reference(batch: RolloutBatch, ref_logp) -> float:
    """KL(π_old ‖ π_ref) estimated on the sampled tokens with k3 (unbiased, never negative)."""
    return masked_mean(kl_k3(batch.old_logp, ref_logp), batch.response_mask).item()


def rollout_metrics(batch: RolloutBatch, episodes: list[Episode]) -> dict[str, float]:
    """What the step sampled (`episodes`) and trained on (`batch`: one row per episode, or
    per model turn under the keep_last / drop thinking policies); the means of rewards and
    lengths are per episode either way."""
    optional = {}  # metrics only some batches have
    if batch.ref_logp is not None:
        optional["kl_ref"] = kl_to_reference(batch, batch.ref_logp)
    multi_turn = [e for e in episodes if e.turns is not None]
    if multi_turn:  # model turns per episode: for a tool environment, its tool calls and its final answer
        optional["model_turns"] = sum(sum(t.source == MODEL_TURN for t in e.turns) for e in multi_turn) / len(multi_turn)
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
