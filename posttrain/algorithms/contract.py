"""The contract every RL algorithm follows, and the checks that keep its fields honest.

    Loss        what the trainer minimises for the policy: compute_loss(outputs, batch) and its loss_agg
    ModelLoss   what it minimises for a model that reads its batch its own way (a reward model,
                a PRM): share(batch, rows) and compute_loss(model, batch, rows); ModelLoss[M]
                runs a model of type M
    Algorithm   an RL algorithm: a Loss plus every hook the controller calls, with defaults

An algorithm is a `@dataclass` subclass of `Algorithm` whose fields are its
hyperparameters; because every algorithm has this same shape, the registry
(`posttrain/algorithms/__init__.py`) is a plain dict of classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch

from posttrain.algorithms.core import LOSS_AGG_MODES, advantage_metrics, agg_loss, masked_mean
from posttrain.algorithms.entropy_control import TokenSelection
from posttrain.types import PolicyOutputs, RolloutBatch

if TYPE_CHECKING:  # the type checker's name for "any @dataclass" (typeshed's; no module at run time)
    from _typeshed import DataclassInstance

# the kind of object a registry builds (an Algorithm, a PreferenceLoss): always a @dataclass
T = TypeVar("T", bound="DataclassInstance")


class Loss(Protocol):
    """What the trainer needs from anything it minimises (an RL algorithm, a preference loss,
    SFT's cross-entropy): the loss of a batch, and how that loss averages over the batch,
    so that micro-batches can be weighted to give exactly the whole batch's gradient."""

    @property
    def loss_agg(self) -> str: ...  # one of core.LOSS_AGG_MODES; read only, so a class constant fits

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """(scalar loss to minimise, metrics as python floats)."""
        ...


# the model a ModelLoss runs (a RewardModel, a policy for PRIME's implicit PRM). Contravariant:
# a loss that can run any torch.nn.Module can run a RewardModel
M = TypeVar("M", contravariant=True)


class ModelLoss(Protocol[M]):
    """What the trainer needs to train a model that is not the policy, whose loss runs the
    model itself (Trainer.step): a reward model on preference pairs, a PRM at each step's
    position, PRIME's implicit PRM on a rollout batch. A policy loss is handed the trainer's
    forward pass (PolicyOutputs); these models read their batch their own way (a scalar head
    at the last token, at each step's separator), so the loss brings its forward pass along.

    `batch` is the loss's own kind of batch; all the trainer asks of it is `batch.batch_size`,
    its number of rows, which it cuts into micro-batches (`rows`, a (b,) tensor of row
    indices, on the CPU). Σ over the micro-batches of share · loss is exactly the whole
    batch's loss, so the accumulated gradient is the batch's whatever the micro-batch size."""

    def share(self, batch: Any, rows: torch.Tensor) -> float:
        """The weight of the loss of `rows` within the whole batch's: their share of the rows
        for a mean over rows, of the labelled entries for a mean over entries."""
        ...

    def compute_loss(self, model: M, batch: Any, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """(scalar loss of the batch's `rows` under `model`, to minimise; metrics as python
        floats, each a mean over the same rows or entries as the loss, so the trainer can
        weight them by the same share)."""
        ...


class Algorithm:
    """What the controller and trainer need from an RL algorithm, every hook declared here
    with its default, so the controller calls them all and never asks which it has.

    An algorithm is a `@dataclass` subclass whose fields are its hyperparameters (each
    default commented with its source), validated in `__post_init__` (a bad value raises
    ValueError naming the field, the value and what is allowed). Because every algorithm
    has this same shape, the registry is a plain dict of classes.

    Per step, the controller calls::

        batch = algo.filter_batch(batch)          # which groups to train on (DAPO drops flat ones)
        batch.process_rewards = prm(batch)        # only with implicit_prm_settings(): PRIME
        batch.teacher_logp = teacher(batch)       # only with teacher_settings(): OPD
        batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
        batch.rows_with_gradient = algo.rows_with_gradient(batch)  # rl.update.skip_inert_rows
        trainer.update(batch, algo)               # algo.compute_loss on each micro-batch
        algo.kl_coef = kl_controller.update(kl)   # only with rl.kl.target: adaptive β
        algo.state_dict() / load_state_dict(...)  # what a checkpoint keeps between steps
    """

    name: ClassVar[str]  # the registry key, e.g. "grpo"
    # True when the baseline is the other samples of the same prompt (GRPO and its family,
    # RLOO; a property where a field decides it: REINFORCE's baseline, GRPO's adv_norm): with
    # one sample per prompt, or K identical ones, every advantage is 0 and nothing is learnt,
    # so the run is refused
    needs_groups: ClassVar[bool] = False
    # True when the loss is a policy-gradient surrogate with the advantage as a factor of
    # every term (GRPO's clipped ratio, CISPO's, GSPO's, REINFORCE's −A · log π): a row whose
    # advantages are all 0 then has a loss of exactly 0 and no gradient, and the trainer
    # may leave it out (rows_with_gradient). False for anything else, a new algorithm too,
    # until it says so: leaving out a row that does pull on the weights changes the update.
    zero_advantage_rows_are_inert: ClassVar[bool] = False
    # True when a row's advantage is its episode's reward against its group's (weighted by
    # RolloutBatch.row_weights), one number copied onto the row's tokens, and the loss reads
    # each token on its own: then an episode cut into one row per model turn (the keep_last
    # and drop thinking policies, Episode.training_rows) gets its episode's advantage on every
    # row. Under loss_agg="token-mean" the update is the one the episode would give as a row;
    # the seq-mean modes average over rows, so each turn counts as one sequence there.
    # False where advantages run along a row (a critic's GAE, reward-to-go), read its length
    # (DAPO's overlong shaping) or the loss reads the row as one sequence (GSPO's ratio).
    accepts_turn_rows: ClassVar[bool] = False
    # True when compute_advantages normalises each reward term within its group before the
    # weighted sum whenever the batch carries the terms (batch.reward_terms: GDPO, the
    # rl.reward.normalize per_term setting); False where advantages never read them
    accepts_reward_terms: ClassVar[bool] = False
    # True when compute_loss applies `token_selection` (rl.entropy's Clip-Cov, KL-Cov and
    # high-entropy tokens: algorithms/entropy_control.py); the checks refuse those settings elsewhere
    accepts_token_selection: ClassVar[bool] = False
    # which tokens carry policy gradient; pipelines/build.py sets it from rl.entropy. The default selects all
    token_selection: TokenSelection = TokenSelection()
    # Defaults of the fields most algorithms declare; a subclass's dataclass field replaces them.
    loss_agg: str = "token-mean"  # how per-token losses become one number (core.agg_loss)
    kl_coef: float = 0.0  # β of a KL term to the reference; 0 = none. The controller may steer it (rl.kl.target)
    entropy_coef: float = 0.0  # weight of an entropy bonus; 0 = none
    entropy_agg: str = "loss_agg"  # how the bonus aggregates: as the loss does, or "token-mean"
    max_len: int | None = None  # the generation budget, for loss_agg="seq-mean-token-sum-norm"
    # what @dataclass gives every subclass, declared so a type checker lets dataclasses.fields read it
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def uses_reference(self) -> bool:
        """True when the loss or the advantages read `batch.ref_logp` (a KL term is on); the
        controller skips the reference forward pass otherwise."""
        return self.kl_coef > 0

    @property
    def uses_critic(self) -> bool:
        """True when the algorithm trains a value head (PPO); it then reads `outputs.values`
        and `batch.values` / `batch.returns`."""
        return False

    def implicit_prm_settings(self) -> dict | None:
        """None, or the settings of an implicit process reward model the pipeline builds
        beside the policy (PRIME: rewards/implicit_prm.py::ImplicitPRM's keyword arguments
        beta, lr, update). The controller then has it fill `batch.process_rewards` (B, T)
        before compute_advantages, and update itself online on each batch."""
        return None

    def teacher_settings(self) -> dict | None:
        """None, or the frozen teacher the pipeline loads beside the policy (OPD: `teacher`,
        a checkpoint, run directory or model name, and `topk`, the teacher's likeliest tokens
        per position to keep; roles/teacher.py). The controller then has it fill
        `batch.teacher_logp` (B, T), and with topk > 0 `teacher_topk_logp` and
        `teacher_topk_ids` (B, T, k), before compute_advantages."""
        return None

    def rows_with_gradient(self, batch: RolloutBatch) -> torch.Tensor | None:
        """(B,) bool, False on each row whose loss provably has zero gradient, or None when
        no row can be left out. Needs the advantages. A row with advantage 0 everywhere (its
        whole group scored alike, 75-100% of the rows of `make run` late in training) adds
        nothing to the update unless another term reads it: a KL penalty or an entropy bonus
        pulls on every row, and a critic learns from every row's return; a token selection
        (Clip-Cov's covariance, the entropy quantile) is taken over every row's tokens."""
        if (not self.zero_advantage_rows_are_inert or self.kl_coef > 0 or self.entropy_coef > 0 or self.uses_critic
                or self.token_selection.active):
            return None
        return (require_advantages(batch) != 0).any(dim=1)  # NaN != 0: a broken row stays in, and fails loudly

    def filter_batch(self, batch: RolloutBatch) -> RolloutBatch:
        """The rows to train on, whole groups only. Keeping fewer makes the controller draw
        more prompts (rl.max_sampling_rounds) to refill the batch: DAPO's dynamic sampling."""
        return batch

    def compute_advantages(self, batch: RolloutBatch) -> dict[str, torch.Tensor]:
        """At least {"advantages": (B, T), zero off the response}; may add "returns" (B, T),
        and "response_mask" (B, T): the tokens the loss reads from here on, a subset of the
        sampled ones (GRPO's overlong_filter zeroes the rows the budget cut off, so every
        loss term, aggregation and micro-batch share leaves them out). Runs without
        gradients: advantages are constants in the loss."""
        raise NotImplementedError

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """(scalar loss to minimise, metrics as python floats)."""
        raise NotImplementedError

    def loss_tail(self, loss: torch.Tensor, outputs: PolicyOutputs,
                  batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """What every algorithm's loss ends with, written once: the entropy bonus
        (−entropy_coef · agg(H), aggregated like the loss), and the metrics that teach,
        entropy and the advantages' mean and std over response tokens."""
        mask = batch.response_mask  # (B, T)
        if self.entropy_coef > 0:
            # a bonus for keeping the policy stochastic, so exploration does not collapse. Under
            # entropy_agg="token-mean" (TRL's) entropy_coef means the same whatever loss_agg is;
            # under "loss_agg" (ours) the bonus weighs each token as the policy loss weighs it
            agg = "token-mean" if self.entropy_agg == "token-mean" else self.loss_agg
            loss = loss - self.entropy_coef * agg_loss(outputs.entropy, mask, agg, self.max_len)
        return loss, {"entropy": masked_mean(outputs.entropy.detach(), mask).item(),
                      **advantage_metrics(require_advantages(batch), mask)}

    def state_dict(self) -> dict:
        """State carried from step to step, as plain numbers (REINFORCE's running-mean
        baseline); {} for a stateless algorithm."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state between steps, but a checkpoint holds {state!r}")


def require_advantages(batch: RolloutBatch) -> torch.Tensor:
    """The batch's advantages (B, T), or ValueError when compute_advantages has not filled
    them in. Returned, not only checked, so the caller holds a Tensor, never an Optional."""
    if batch.advantages is None:
        raise ValueError("batch.advantages is None: run compute_advantages on the batch first")
    return batch.advantages


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
    check_field(algo, "entropy_agg", getattr(algo, "entropy_agg") in ("loss_agg", "token-mean"),
                "'loss_agg' (aggregate the bonus as the loss) or 'token-mean'")
    if loss_agg == "seq-mean-token-sum-norm":
        max_len = getattr(algo, "max_len")
        check_field(algo, "max_len", isinstance(max_len, int) and max_len > 0,
                    "a positive int with loss_agg='seq-mean-token-sum-norm' (the generation budget, max_new_tokens)")


def field_with_default(f: dataclasses.Field[Any]) -> str:
    """"name=default" (the factory's value for a default_factory), or "name=<required>"."""
    if f.default is not dataclasses.MISSING:
        return f"{f.name}={f.default!r}"
    if f.default_factory is not dataclasses.MISSING:
        return f"{f.name}={f.default_factory()!r}"
    return f"{f.name}=<required>"


def make_from_registry(registry: Mapping[str, type[T]], kind: str, name: str, params: dict[str, Any]) -> T:
    """Build `registry[name](**params)`, or raise ValueError listing the valid names (for an
    unknown name) or the valid fields with their defaults (for a bad parameter)."""
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {sorted(registry)}")
    cls = registry[name]
    fields = dataclasses.fields(cls)
    help_text = ", ".join(field_with_default(f) for f in fields)
    unknown = sorted(set(params) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"unknown parameter(s) {unknown} for {kind} {name!r}; valid fields (with defaults): {help_text}")
    try:
        return cls(**params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{err}\nvalid fields of {name!r} (with defaults): {help_text}") from err
