"""Trainer: forward, backward, optimizer step. It knows no algorithm names.

The loss is an object handed in by the caller. Everything specific to an algorithm or a
model lives in that object; everything specific to optimisation (learning-rate schedule,
gradient clipping, micro-batch accumulation, epochs over a rollout batch, the state a
resumed run needs) lives here, once for every learned thing:

    update(batch, loss)   the policy: `loss` is a Loss (algorithms/contract.py), handed
                          this trainer's forward pass. An RL algorithm, a preference loss
                          (the DPO family), or `sft_loss` for supervised fine-tuning; a
                          value head (`critic`) trains here too, on its algorithm's loss
    step(batch, loss)     any other model: `loss` is a ModelLoss, which runs the model
                          itself. The reward models (rewards/reward_model.py), the PRMs
                          (rewards/process_reward_model.py), PRIME's implicit PRM
    fit(batches, loss, n) n steps, one per batch, with the seconds since the start

A Trainer is typed by the model it trains: Trainer[Policy] (a GPTMini, an HFPolicy) has
`update`, any Trainer has `step` and `fit` with a ModelLoss of its model, so a type checker
refuses a policy loss handed to a reward model's trainer, and the other way round.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any, Callable, Generic, Iterator, TypeVar

import torch

from posttrain.algorithms.contract import Loss, ModelLoss
from posttrain.algorithms.core import masked_mean, micro_batch_share
from posttrain.models.device import autocast, model_device
from posttrain.models.logprobs import response_logp_and_entropy, response_logp_at
from posttrain.models.policy import Policy, Trainable
from posttrain.models.shared_prefix import batch_hidden_states
from posttrain.types import PolicyOutputs, RolloutBatch


def warmup_cosine(warmup_steps: int, total_steps: int, final_fraction: float = 0.1) -> Callable[[int], float]:
    """Learning-rate multiplier: linear warmup, then cosine decay to `final_fraction`.
    Warmup keeps Adam's first, badly-estimated second moments from taking huge steps."""

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

    return multiplier


class SFTLoss:
    """Teacher-forced cross-entropy on the response tokens only: the prompt is given, not
    learned. A mean over every response token of the batch."""

    loss_agg = "token-mean"

    def compute_loss(self, outputs: PolicyOutputs, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        nll = -masked_mean(outputs.logp, batch.response_mask)
        return nll, {"loss": nll.item(), "entropy": masked_mean(outputs.entropy, batch.response_mask).item()}

    __call__ = compute_loss


sft_loss = SFTLoss()


def rows_to_train(minibatch: RolloutBatch, rows: torch.Tensor) -> torch.Tensor:
    """`rows` of the minibatch less those it marks as having no gradient, but never none:
    when every row is inert, the first one still runs. Its gradient is exactly 0, and the
    optimizer must see that 0 rather than no gradient at all: AdamW skips a parameter whose
    .grad is None, but moves one whose gradient is 0 (momentum, weight decay), as it would
    after the full minibatch."""
    if minibatch.rows_with_gradient is None:
        return rows
    kept = rows[minibatch.rows_with_gradient[rows]]
    return kept if len(kept) else rows[:1]


def metrics_of_trained_rows(sums: dict[str, float]) -> dict[str, float]:
    """Metrics accumulated by Trainer.accumulate, as means over the rows that trained. With
    rows left out (a "trained_share" below 1), the share-weighted sums miss those rows'
    weight; dividing by the share makes each metric (entropy, clip fraction) the mean over
    the rows that trained, and the loss their loss."""
    sums = dict(sums)
    share = sums.pop("trained_share", None)
    if not share:
        return sums
    return {key: value / share for key, value in sums.items()}


def backward_share(value: torch.Tensor, share: float, metrics: dict[str, float], sums: dict[str, float]) -> None:
    """Backward through one micro-batch's loss weighted by its `share` of the whole batch's,
    and add its metrics, weighted the same, to `sums`. A loss that is not finite stops the
    run here, before it reaches the weights."""
    if not torch.isfinite(value):
        raise FloatingPointError(
            f"the loss is {value.item()} (not finite); the last metrics were {metrics}. "
            "Lower the learning rate or check the rewards for NaN/inf."
        )
    (value * share).backward()
    for key, metric in metrics.items():
        sums[key] += metric * share


def quiet(step: int, metrics: dict[str, float]) -> None:
    """Trainer.fit's default `on_step`: no progress display."""


# the model a Trainer trains. Covariant: a Trainer[GPTMini] is a Trainer[Policy], whose
# methods below take `self: Trainer[Policy]`
ModelT = TypeVar("ModelT", bound=Trainable, covariant=True)


class Trainer(Generic[ModelT]):
    def __init__(
        self,
        model: ModelT,
        lr: float,
        total_steps: int,
        warmup_steps: int = 0,
        final_lr_fraction: float = 0.1,
        adam_beta2: float = 0.95,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        micro_batch_size: int = 0,
        critic: torch.nn.Module | None = None,
        share_prompt: bool = True,
    ):
        if not (micro_batch_size >= 0 and warmup_steps >= 0 and grad_clip >= 0):
            raise ValueError(f"micro_batch_size={micro_batch_size}, warmup_steps={warmup_steps}, "
                             f"grad_clip={grad_clip}: each must be >= 0 (0 = the whole batch at once, no warmup, "
                             "no clipping)")
        self.model = model
        # a value head on the policy's hidden states, for algorithms that use one; on the policy's device
        self.critic = critic.to(model_device(model)) if critic is not None else None
        # only what trains: with LoRA the frozen base weights get no optimizer state at all
        parameters = [p for p in model.parameters() if p.requires_grad]
        if not parameters:
            raise ValueError("the model has no trainable parameters (requires_grad is False everywhere). "
                             "An engine that owns its model freezes it: give it a copy "
                             "(make_engine(copy.deepcopy(policy), ...)) and train the original")
        parameters += list(self.critic.parameters()) if self.critic is not None else []
        # AdamW's β2 0.95 by default: the shorter second-moment memory that LLM training
        # commonly uses, so the step size adapts quickly when the reward signal shifts
        self.optimizer = torch.optim.AdamW(parameters, lr=lr, betas=(0.9, adam_beta2), weight_decay=weight_decay)
        schedule = warmup_cosine(warmup_steps, total_steps, final_lr_fraction)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.grad_clip = grad_clip
        self.micro_batch_size = micro_batch_size
        self.share_prompt = share_prompt  # each group's prompt computed once (models/shared_prefix.py)

    @property
    def device(self) -> torch.device:
        """The policy's device: batches are moved here before a forward pass (models/device.py)."""
        return model_device(self.model)

    def forward(self: Trainer[Policy], batch: RolloutBatch) -> PolicyOutputs:
        with autocast(self.model):  # the policy's precision (models/device.py): bf16 matmuls when asked
            hidden = batch_hidden_states(self.model, batch, self.share_prompt)  # (B, T, D)
            # logits only at the response positions, chunked: see core.response_logp_and_entropy;
            # logp and entropy come back float32 whatever the precision
            logp, entropy = response_logp_and_entropy(hidden, self.model.lm_head, batch.tokens,
                                                      batch.response_mask, batch.temperature)  # (B, T) each
            # the critic's values in float32 too: the value loss squares their differences from the returns
            values = self.critic(hidden).float() * batch.response_mask if self.critic is not None else None  # (B, T)
            # log π_θ of a teacher's top-k tokens, for a loss that reads them (OPD's top-k forward KL)
            teacher_topk = (None if batch.teacher_topk_ids is None else
                            response_logp_at(hidden, self.model.lm_head, batch.teacher_topk_ids, batch.response_mask,
                                             batch.temperature))  # (B, T, k)
        return PolicyOutputs(logp=logp, entropy=entropy, values=values, teacher_topk_logp=teacher_topk)

    @torch.no_grad()
    def values(self: Trainer[Policy], batch: RolloutBatch) -> torch.Tensor:
        """V of every response position under the current weights, (B, T): PPO's
        `batch.values`, taken right after sampling and before any update."""
        if self.critic is None:
            raise ValueError("Trainer.values reads the critic's values, and this trainer has none: build it with "
                             "critic=ValueHead(...) (an algorithm with a critic, e.g. PPO)")
        with autocast(self.model):
            return self.critic(batch_hidden_states(self.model, batch, self.share_prompt)).float() * batch.response_mask

    def update(
        self: Trainer[Policy],
        batch: RolloutBatch,
        loss: Loss,
        epochs: int = 1,
        minibatches: int = 1,
        generator: torch.Generator | None = None,
    ) -> dict[str, float]:
        """`epochs` passes over the batch, each split into `minibatches` optimizer steps.
        One epoch, one minibatch (the default) is the purely on-policy update. The
        learning-rate schedule advances once per call: one call = one controller step."""
        self.model.train()
        batch = batch.to(self.device)  # a no-op for the controller's batches, already there
        sums: dict[str, float] = defaultdict(float)
        count = 0
        B = batch.batch_size
        for _ in range(epochs):
            # drawn on the CPU, where the seeded generators live (seeds.py): the same seed gives the
            # same minibatches on every device; select() moves the indices to the batch's device
            order = (torch.randperm(B, generator=generator, device="cpu") if minibatches > 1
                     else torch.arange(B, device="cpu"))
            for rows in order.chunk(minibatches):
                metrics = self._step(batch.select(rows), loss)
                for key, value in metrics.items():
                    sums[key] += value
                count += 1
        self.scheduler.step()
        out = {key: value / count for key, value in sums.items()}
        out["lr"] = float(self.scheduler.get_last_lr()[0])  # a float here (torch types it float | Tensor)
        return out

    def _step(self: Trainer[Policy], minibatch: RolloutBatch, loss: Loss) -> dict[str, float]:
        """One optimizer step on the minibatch's gradient, accumulated over micro-batches."""
        self.optimizer.zero_grad(set_to_none=True)
        rows = torch.arange(minibatch.batch_size, device=minibatch.tokens.device)
        metrics = metrics_of_trained_rows(self.accumulate(minibatch, rows, loss))
        metrics["grad_norm"] = self.clip_and_step()
        return metrics

    def clip_and_step(self) -> float:
        """Clip the accumulated gradient to `grad_clip` (global norm; 0 = never) and take the
        optimizer step; the gradient's norm before clipping."""
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(parameters, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        return norm.item()

    def accumulate(self: Trainer[Policy], minibatch: RolloutBatch, rows: torch.Tensor, loss: Loss) -> dict[str, float]:
        """Backward through the loss of `rows` of the minibatch, micro_batch_size rows at a
        time, each micro-batch's loss weighted by its share of the whole minibatch's
        (core.micro_batch_share: of its tokens for token-mean, of its rows otherwise), so
        the summed gradient is exactly the minibatch's whatever the micro-batch size, and
        whatever slice of the rows this process holds (distributed/data_parallel.py). The
        metrics are weighted the same way.

        Rows the minibatch marks as having no gradient (`rows_with_gradient`) are left out:
        their share of the loss is 0 either way, so the gradient is the same, for less work.
        The sums then carry "trained_share", the share of the minibatch that did train, for
        `metrics_of_trained_rows`."""
        rows = rows_to_train(minibatch, rows)
        size = self.micro_batch_size or max(1, len(rows))
        sums: dict[str, float] = defaultdict(float)
        for start in range(0, len(rows), size):
            micro = minibatch.select(rows[start : start + size]).without_trailing_padding()
            share = micro_batch_share(loss.loss_agg, micro.response_mask, minibatch.response_mask)
            if minibatch.rows_with_gradient is not None:
                sums["trained_share"] += share
            value, metrics = loss.compute_loss(self.forward(micro), micro)
            backward_share(value, share, metrics, sums)
        return dict(sums)

    def step(self, batch: Any, loss: ModelLoss[ModelT]) -> dict[str, float]:
        """One optimizer step of a model whose loss runs its own forward pass (ModelLoss: a
        reward model, a PRM), on the whole batch's gradient: accumulated micro_batch_size
        rows at a time, each micro-batch's loss weighted by its share of the batch's
        (`loss.share`), then clipped and stepped as the policy's is. The learning-rate
        schedule advances once per call. Metrics: the loss's, as means over the batch,
        with grad_norm (before clipping) and lr."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        rows = torch.arange(batch.batch_size, device="cpu")  # indices, on the CPU whatever the model's device
        sums: dict[str, float] = defaultdict(float)
        for micro in rows.split(self.micro_batch_size or max(1, len(rows))):
            value, metrics = loss.compute_loss(self.model, batch, micro)
            backward_share(value, loss.share(batch, micro), metrics, sums)
        sums["grad_norm"] = self.clip_and_step()
        self.scheduler.step()
        sums["lr"] = float(self.scheduler.get_last_lr()[0])
        return dict(sums)

    def fit(self, batches: Iterator[Any], loss: ModelLoss[ModelT], steps: int,
            on_step: Callable[[int, dict[str, float]], None] = quiet) -> list[dict[str, float]]:
        """`steps` calls of `step`, one per batch drawn from `batches`: the one training loop
        of the reward models and PRMs. Returns the metrics of each step, with "seconds", the
        wall time since the start; `on_step(step, metrics)` after each (a progress line).
        A resumed run loads `state_dict()` and the model's weights, skips the batches already
        used, and fits the rest: the weights it ends with are the uninterrupted run's."""
        history = []
        start = time.perf_counter()
        for step in range(steps):
            metrics = self.step(next(batches), loss)
            metrics["seconds"] = time.perf_counter() - start
            history.append(metrics)
            on_step(step, metrics)
        return history

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])

    def close(self) -> None:
        """Release what the trainer started: nothing here; a data-parallel rank 0 stops its
        follower processes (posttrain/distributed/data_parallel.py)."""
