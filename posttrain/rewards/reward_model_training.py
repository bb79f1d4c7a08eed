"""Training the learned reward models, through the one Trainer (roles/trainer.py).

A reward model trains as the policy does: the Trainer's AdamW, learning-rate schedule,
gradient clipping, micro-batch accumulation and resumable state. What is particular to the
model (how it reads its batch, what it is scored on) is a loss object handed to
`Trainer.step` (algorithms/contract.py::ModelLoss), never a loop of its own:

    shuffled_batches       epochs of shuffled indices: the order a reward model sees its data in
    PairBatch, pair_batches  preference pairs, encoded once, batch after batch
    BradleyTerryLoss       rewards/reward_model.py::bt_loss on a PairBatch, as the Trainer minimises it
    reward_model_trainer   the Trainer as the reward models train (AdamW β2 0.999, constant
                           learning rate; warmup, clipping and micro-batches when asked)
    train_reward_model     fit a Bradley–Terry model, then centre its rewards on the training data
    default_reward_config  the small body it builds when given no model

The ORM and PRM (rewards/process_reward_model.py) train with the same trainer settings and
batch order, on their own loss object (StepBCELoss).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from posttrain.models.device import model_device
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.reward_model import RewardModel, bt_loss, collate_texts, encode_for_reward, reward_of
from posttrain.roles.trainer import Trainer
from posttrain.types import PreferencePair, Tokenizer


def default_reward_config(vocab_size: int) -> GPTMiniConfig:
    """A small body: one layer of width 32 (~20k parameters) learns the bundled sentiment
    pairs to ~80% held-out accuracy in a few CPU seconds (measured: wider or deeper bodies
    gained nothing at this data size); review plus prompt fit in 96 characters."""
    return GPTMiniConfig(vocab_size=vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=96, max_seq_len=96)


def shuffled_batches(n: int, batch_size: int, seed: int) -> Iterator[list[int]]:
    """Indices of batch after batch, endlessly: each pass a fresh shuffle of range(n), the
    next pass appended before the current one runs out, so every batch is full."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            order += epoch
        batch, order = order[:batch_size], order[batch_size:]
        yield batch


@dataclass(frozen=True)
class PairBatch:
    """Preference pairs as the reward model reads them: the ids of each pair's chosen and
    rejected text ([bos] prompt completion [eos]) and its margin m. Ids, not a padded
    tensor: each micro-batch is padded to its own longest text."""

    chosen: list[list[int]]
    rejected: list[list[int]]
    margin: torch.Tensor | None  # (B,) on the model's device; None: the plain BT loss (m = 0)
    pad_id: int

    @property
    def batch_size(self) -> int:  # pairs: what the trainer's micro_batch_size counts
        return len(self.chosen)


def pair_batches(pairs: Sequence[PreferencePair], tokenizer: Tokenizer, max_len: int, batch_size: int, seed: int,
                 margin_key: str | None = None, device: torch.device | None = None) -> Iterator[PairBatch]:
    """Batch after batch of `batch_size` pairs (shuffled_batches: reshuffled every epoch),
    each text encoded once; margins from `pair.meta[margin_key]`, on `device`. The same
    seed gives the same batches, so a resumed run skips the ones it has trained on."""
    chosen = [encode_for_reward(tokenizer, p.prompt, p.chosen, max_len)[0] for p in pairs]
    rejected = [encode_for_reward(tokenizer, p.prompt, p.rejected, max_len)[0] for p in pairs]
    margins = torch.tensor([float(p.meta[margin_key]) for p in pairs], device=device) if margin_key else None
    for idx in shuffled_batches(len(pairs), batch_size, seed):
        yield PairBatch([chosen[i] for i in idx], [rejected[i] for i in idx],
                        margins[idx] if margins is not None else None, tokenizer.pad_id)


class BradleyTerryLoss:
    """bt_loss on a PairBatch, as the one Trainer minimises it (roles/trainer.py::step;
    algorithms/contract.py::ModelLoss). A mean over pairs, so a micro-batch weighs by its
    share of the pairs. Metrics: loss, accuracy (r_c > r_r on the batch), reward_margin."""

    def share(self, batch: PairBatch, rows: torch.Tensor) -> float:
        return len(rows) / batch.batch_size

    def compute_loss(self, model: RewardModel, batch: PairBatch,
                     rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        idx = rows.tolist()
        # one forward pass over [chosen rows; rejected rows]
        tokens, lengths = collate_texts([batch.chosen[i] for i in idx] + [batch.rejected[i] for i in idx],
                                        batch.pad_id)
        r = model(tokens, lengths)  # (2b,)
        r_c, r_r = r[: len(idx)], r[len(idx) :]  # (b,), (b,)
        loss = bt_loss(r_c, r_r, batch.margin[rows] if batch.margin is not None else None)
        return loss, {"loss": loss.item(), "accuracy": (r_c > r_r).float().mean().item(),
                      "reward_margin": (r_c - r_r).mean().item()}


def reward_model_trainer(model: RewardModel, lr: float, steps: int, micro_batch_size: int = 0,
                         warmup_steps: int = 0, grad_clip: float = 0.0) -> Trainer[RewardModel]:
    """The one Trainer (roles/trainer.py) as the reward models and PRMs train: AdamW with
    torch's default β2 0.999 and no weight decay, the settings their measured accuracies
    were trained with, and a constant learning rate after `warmup_steps` of linear warmup.
    The defaults (no warmup, no clipping, the whole batch in one pass) give exactly the
    weights of the plain AdamW loop these models once had; micro_batch_size changes only
    the memory a step takes, not its gradient."""
    return Trainer(model, lr, total_steps=steps, warmup_steps=warmup_steps, final_lr_fraction=1.0,
                   adam_beta2=0.999, weight_decay=0.0, grad_clip=grad_clip, micro_batch_size=micro_batch_size)


def train_reward_model(
    pairs: Sequence[PreferencePair],
    model: RewardModel | None = None,
    tokenizer: Tokenizer | None = None,
    steps: int = 250,
    lr: float = 1e-3,
    batch_size: int = 16,
    margin_key: str | None = None,
    seed: int = 0,
    micro_batch_size: int = 0,
    warmup_steps: int = 0,
    grad_clip: float = 0.0,
) -> tuple[RewardModel, list[dict[str, float]]]:
    """Fit a Bradley–Terry reward model on preference pairs; return (model, metrics per step).

    model:      a RewardModel to train in place; default a fresh one with
                `default_reward_config` (or start from a policy: RewardModel.from_policy).
    steps, lr, batch_size: AdamW steps over batches of pairs (reshuffled every epoch);
                1e-3 suits the small default body trained from scratch (3e-3 stalled at
                loss log 2 for one seed in three); use ~1e-5
                when starting from a pretrained policy. Fresh pairs beat repeated ones: on
                the sentiment set, 3,000 pairs seen about once gave ~0.8 held-out accuracy
                where 400 pairs seen six times gave ~0.75 (memorised, not learned).
    margin_key: read a per-pair margin m from `pair.meta[margin_key]` (e.g. a rating gap);
                None trains the plain BT loss.
    micro_batch_size, warmup_steps, grad_clip: the trainer's (reward_model_trainer): pairs
                per forward and backward pass (0 = the whole batch at once; a large body's
                activations want fewer), warmup steps, the gradient norm clipped to (0 = none).

    Metrics per step: loss, accuracy (on the batch), reward_margin, grad_norm, lr, seconds.
    After training the head's bias is shifted so the mean reward over the training
    responses is 0 (rewards are only defined up to a constant; a centred scale is easier
    on PPO's value function and on a reader of the numbers).
    """
    if not pairs:
        raise ValueError("train_reward_model got no pairs")
    tokenizer = tokenizer or CharTokenizer()
    torch.manual_seed(seed)
    if model is None:
        model = RewardModel(GPTMini(default_reward_config(tokenizer.vocab_size)))
    batches = pair_batches(pairs, tokenizer, model.config.max_seq_len, batch_size, seed, margin_key,
                           model_device(model))
    trainer = reward_model_trainer(model, lr, steps, micro_batch_size, warmup_steps, grad_clip)
    history = trainer.fit(batches, BradleyTerryLoss(), steps)

    # centre: mean reward over all training responses -> 0
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    mean_reward = reward_of(model, tokenizer, [p.prompt for p in pairs] * 2, texts).mean()
    with torch.no_grad():
        model.head.bias.sub_(mean_reward)
    model.eval()
    return model, history
