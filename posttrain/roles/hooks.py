"""Step hooks: what some runs add to the controller's step, at fixed points, without the
controller asking whether it is there.

A hook's every method does nothing by default; a hook overrides the points it needs:

    scored(step, episodes)     after each sampling round is scored: terms that score a sample
                               against its group, a prompt pool's pass rates. Returns metrics,
                               averaged over the step's rounds
    keep_groups(episodes)      which groups of the round to train on (by default, every one)
    before_advantages(batch)   inputs of the advantage, written on the batch: a critic's
                               values, an implicit PRM's process rewards, each reward term's values
    finish_step(step, metrics) reads the step's metrics and may add to them: steer β from the KL,
                               the entropy coefficient from the entropy
    state_dict()               what a checkpoint keeps, under `state_key`

The hooks of this file wrap the objects build.py makes for them (a reward stack's group
terms, its per-term log and its term table for GDPO, a curated prompt pool, PRIME's implicit PRM,
the adaptive KL and entropy controllers, PPO's critic);
each is a handful of lines that says where in the step its object acts. An object whose class
lives in a band that imports roles/ is declared here by what the hook calls on it
(CuratedPool, OnlinePRM, KLController).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol

import torch

from posttrain.algorithms.contract import Algorithm
from posttrain.algorithms.core import zero_variance_group_fraction
from posttrain.algorithms.entropy_control import AdaptiveEntropyController
from posttrain.models.policy import Policy
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, Example, RolloutBatch


class CuratedPool(Protocol):
    """A curated prompt pool as the step uses it (data/curation.py::PromptPool): it gives each
    round's prompts (roles/rollout.py::StepPrompts), learns their pass rates from the scored
    groups, and says which groups to train on."""

    def draw(self, step: int, round: int, n: int) -> list[Example]: ...

    def observe(self, step: int, episodes: list[Episode]) -> None: ...

    def keep_groups(self, episodes: list[Episode]) -> set[int]: ...

    def step_metrics(self, step: int) -> dict[str, float]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class OnlinePRM(Protocol):
    """A process reward model that learns as the run goes (rewards/implicit_prm.py::ImplicitPRM):
    called on each batch, it steps on the batch's outcomes and gives its process rewards."""

    def __call__(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class KLController(Protocol):
    """What steers β (rewards/kl_control.py): update(KL measured, steps) -> the next β."""

    value: float  # β now

    def update(self, current_kl: float, n_steps: int) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def checkpointed(state: dict | None, what: str, setting: str) -> dict:
    """A hook's entry of a checkpoint, or ValueError when the checkpoint has none: it is of a
    run without `setting`."""
    if state is None:
        raise ValueError(f"the checkpoint holds no {what}: it is of a run without {setting}; resume with the "
                         "settings the run started with")
    return state


class StepHook:
    """A collaborator of the controller's step (see the module docstring)."""

    state_key: ClassVar[str | None] = None  # its entry in a checkpoint; None = it keeps nothing between steps
    timing: ClassVar[str | None] = None  # the time/ metric its before_advantages counts toward, if any

    def scored(self, step: int, episodes: list[Episode]) -> dict[str, float]:
        return {}

    def keep_groups(self, episodes: list[Episode]) -> set[int]:
        return {e.group_id for e in episodes}

    def before_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        return {}

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def state_dict(self) -> Any:
        return None

    def load_state_dict(self, state: Any) -> None:
        pass


class GroupTerms(StepHook):
    """Reward terms that score a sample against the others of its group (Kimi's length reward,
    rewards/length.py), and weights that depend on the step, added once a round is scored,
    while its group ids are still that round's prompts (rewards/stack.py::score_groups)."""

    def __init__(self, score_groups: Callable[[list[Episode], int], dict[str, float]]):
        self.score_groups = score_groups

    def scored(self, step: int, episodes: list[Episode]) -> dict[str, float]:
        return self.score_groups(episodes, step)


class RewardTerms(StepHook):
    """Each term of a reward stack logged on its own, beside the sum: its mean weighted value
    per sample of the round ("reward/<name>", rewards/stack.py::term_means), read once the
    round is scored and any group terms and step weights are in (after GroupTerms)."""

    def __init__(self, term_means: Callable[[list[Episode]], dict[str, float]]):
        self.term_means = term_means

    def scored(self, step: int, episodes: list[Episode]) -> dict[str, float]:
        return self.term_means(episodes)


class RewardTermTable(StepHook):
    """Each reward term's raw value and weight on every row of the batch (batch.reward_terms,
    batch.reward_term_weights), for an advantage that normalises each term within its group
    before the weighted sum (GDPO, rl.reward.normalize per_term: algorithms/grpo.py). Logs, per
    term, the share of groups in which it is flat ("reward_flat_groups/<name>"): a term flat in
    a group adds nothing there, under either normalisation."""

    def __init__(self, term_table: Callable[[list[Episode], int], tuple[list[str], list[list[float]], list[float]]]):
        self.term_table = term_table
        self.step = 0  # the step being scored: a scheduled weight is its value at this step

    def scored(self, step: int, episodes: list[Episode]) -> dict[str, float]:
        self.step = step
        return {}

    def before_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        names, values, weights = self.term_table(batch.episodes, self.step)
        device = batch.rewards.device
        batch.reward_terms = torch.tensor(values, dtype=torch.float32, device=device)  # (B, K)
        batch.reward_term_weights = torch.tensor(weights, device=device).expand_as(batch.reward_terms)  # (B, K)
        return {f"reward_flat_groups/{name}": zero_variance_group_fraction(batch.reward_terms[:, k], batch.group_ids)
                for k, name in enumerate(names)}


class CuratedPrompts(StepHook):
    """A curated prompt pool (data/curation.py): every sampled group is a fresh pass rate of
    its prompt, kept or not; its online band says which groups to train on."""

    state_key = "prompts"

    def __init__(self, pool: CuratedPool):
        self.pool = pool

    def scored(self, step: int, episodes: list[Episode]) -> dict[str, float]:
        self.pool.observe(step, episodes)
        return {}

    def keep_groups(self, episodes: list[Episode]) -> set[int]:
        return self.pool.keep_groups(episodes)

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        metrics.update(self.pool.step_metrics(step))

    def state_dict(self) -> dict:
        return self.pool.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.pool.load_state_dict(checkpointed(state, "curated prompt pool", "rl.curation"))


class CriticValues(StepHook):
    """PPO's critic: V of every response position under the weights that sampled, taken before
    any update (the trainer holds the value head: roles/trainer.py)."""

    timing = "reference"  # counted with the reference's pass, as one more forward over the batch

    def __init__(self, trainer: Trainer[Policy]):
        self.trainer = trainer

    def before_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        batch.values = self.trainer.values(batch)
        return {}


class ProcessRewards(StepHook):
    """PRIME's implicit PRM (rewards/implicit_prm.py): it learns from this batch's outcomes,
    then gives every token a process reward."""

    state_key = "process_reward"
    timing = "process_reward"

    def __init__(self, prm: OnlinePRM):
        self.prm = prm

    def before_advantages(self, batch: RolloutBatch) -> dict[str, float]:
        batch.process_rewards, metrics = self.prm(batch)
        return metrics

    def state_dict(self) -> dict:
        return self.prm.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.prm.load_state_dict(checkpointed(state, "process reward model", "an implicit PRM (rl.algo prime)"))


class AdaptiveKL(StepHook):
    """An adaptive KL coefficient (Ziegler et al. 2019; rewards/kl_control.py): after each step,
    β moves toward the value that keeps KL to the reference at the target."""

    state_key = "kl_controller"

    def __init__(self, controller: KLController, algorithm: Algorithm):
        self.controller, self.algorithm = controller, algorithm

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        metrics["kl_coef"] = self.algorithm.kl_coef  # the β this step trained with
        self.algorithm.kl_coef = self.controller.update(metrics["kl_ref"], 1)

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.controller.load_state_dict(checkpointed(state, "KL controller", "rl.kl.target"))
        self.algorithm.kl_coef = self.controller.value


class AdaptiveEntropy(StepHook):
    """An adaptive entropy coefficient (Skywork-OR1; algorithms/entropy_control.py): after each
    step, the entropy the update measured moves the coefficient the next step applies."""

    state_key = "entropy_controller"

    def __init__(self, controller: AdaptiveEntropyController, algorithm: Algorithm):
        self.controller, self.algorithm = controller, algorithm
        self.algorithm.entropy_coef = controller.applied()  # 0 until a step has measured entropy

    def finish_step(self, step: int, metrics: dict[str, float]) -> None:
        metrics["entropy_coef"] = self.algorithm.entropy_coef  # the coefficient this step trained with
        self.algorithm.entropy_coef = self.controller.update(metrics["entropy"])

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.controller.load_state_dict(checkpointed(state, "entropy controller", "rl.entropy.target"))
        self.algorithm.entropy_coef = self.controller.applied()
