"""Outcome and process reward models: a probability that a solution (ORM) or each of its
steps (PRM) is right.

Both are the Bradley–Terry reward model's network (rewards/reward_model.py: a causal LM
body and a scalar head on a hidden state), trained with binary cross-entropy on 0/1 labels
instead of a ranking loss, so the head's output is a logit and σ(logit) a probability:

    ORM   one score per completion, read at its <eos> (RewardModel's "last" readout), trained
          on the outcome verifier's reward (Cobbe et al. 2021, "Training Verifiers to Solve
          Math Word Problems")
    PRM   one score per step, read at the token right after the step, trained on step labels
          (Lightman et al. 2023, "Let's Verify Step by Step"; Uesato et al. 2022)

    tokens   [bos Q : _ 7 + 5 \\n 7 + 5 = 1 2 , 1 2 + 9 = 2 1 \\n F i n a l : _ 2 1 eos]
    PRM reads                                 ^                 ^                     ^
    ORM reads                                                                         ^

Why the token after the step and not its last character: at "12+9=2" the model cannot know
whether "1" follows, so a score read there would have to serve "12+9=2" and "12+9=21" alike;
at the separator the step is over. The separator after a list's last step is the format's
own: <eos> after an ending step (arithmetic's "Final: ..." line, reasoning-gym's
"<answer>...</answer>" line), else the text that would continue it ("," for an arithmetic
chain step, a newline for a line step), so a partial solution is scored as the search will
extend it. Causal attention makes the score of step k depend only on the text up to its
separator: scoring steps[:k] alone gives the first k scores of scoring all the steps, with
one exception in the arithmetic format, the last chain step, which is followed by a newline
(the Final line comes next) in the whole solution and by ',' when it ends a partial one.

Steps are tokenized one by one and concatenated (as TRL's PRMTrainer does), so a subword
tokenizer cannot merge a step's last token with the separator and blur the boundary. For
the character tokenizer that is the same as tokenizing the whole text.

Aggregating a PRM's step scores into one score per completion (`AGGREGATIONS`): min (the
weakest step; Lightman et al. use the product, Wang et al. the min), product (the chance
every step is right, if errors were independent), last (the last step's score, which under
the first-error labels of verifiers/steps.py already means "all right so far").

`StepRewardScorer` is the batched scoring API the search jobs build on:
`score_steps(prompts, steps) -> [[p, ...], ...]` and `score_outcomes(prompts, completions)
-> [p, ...]`, probabilities, one forward pass per batch of rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from posttrain.models import load_tokenizer
from posttrain.models.device import autocast, model_device
from posttrain.rewards.reward_model import (
    RewardModel,
    collate_texts,
    encode_for_reward,
    load_reward_model,
    save_reward_model,
)
from posttrain.rewards.reward_model_training import reward_model_trainer, shuffled_batches
from posttrain.roles.trainer import quiet
from posttrain.types import Tokenizer
from posttrain.verifiers.steps import FINAL_PREFIX, newline_separators, split_steps, step_separators

KINDS = ("orm", "prm")


# --------------------------------------------------------------------------------------
# Step formats: where the steps are and what text joins them
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepFormat:
    name: str
    split: Callable[[str], list[str]]  # completion -> steps
    separators: Callable[[Sequence[str]], list[str]]  # the text after each step in the completion; "" after the last
    continues: str  # after a list's last step that does not end the solution: where the next step would start
    ends: Callable[[str], bool]  # whether a step ends the solution (then <eos> follows it)

    def join(self, steps: Sequence[str]) -> str:
        return "".join(step + separator for step, separator in zip(steps, self.separators(steps)))


def _split_lines(completion: str) -> list[str]:
    return [line.strip() for line in completion.split("\n") if line.strip()]


STEP_FORMATS = {
    # the arithmetic chain of thought: "7+5=12,12+9=21\nFinal: 21" (verifiers/steps.py)
    "arithmetic": StepFormat("arithmetic", split_steps, step_separators, ",", lambda s: s.startswith(FINAL_PREFIX)),
    # one step per line, TRL's default separator; no step is known to end the solution
    "newline": StepFormat("newline", _split_lines, newline_separators, "\n", lambda s: False),
    # one step per line, and the line with the answer tag ends the solution: reasoning-gym's worked
    # steps ("3 cats: 3*4=12\n<answer>12</answer>", envs/reasoning_gym_tasks.py)
    "answer_tag": StepFormat("answer_tag", _split_lines, newline_separators, "\n", lambda s: "<answer>" in s),
}


def get_step_format(name: str) -> StepFormat:
    if name not in STEP_FORMATS:
        raise ValueError(f"unknown step format {name!r}; known: {list(STEP_FORMATS)} (arithmetic: 'a+b=c' steps "
                         "joined by ',' and a Final line; newline: one step per line; answer_tag: one step per "
                         "line, ended by the <answer> line)")
    return STEP_FORMATS[name]


def task_step_format(env_name: str) -> str:
    """The step format a task's completions are written in: the arithmetic chain for
    "arithmetic", lines ended by the answer tag for "reasoning_gym:NAME", else lines."""
    family = env_name.partition(":")[0]
    return {"arithmetic": "arithmetic", "reasoning_gym": "answer_tag"}.get(family, "newline")


def encode_steps(tokenizer: Tokenizer, prompt: str, steps: Sequence[str], step_format: StepFormat,
                 max_len: int) -> tuple[list[int], list[int]]:
    """(ids, positions): [bos] prompt, then each step followed by its separator, and the
    position of each separator's last token (module docstring), where the PRM reads the
    step's score. ValueError when the text does not fit `max_len` tokens: a step cut off
    would have no score, and a score for a step the model never saw would be made up."""
    ids = ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + tokenizer.encode(prompt)
    positions = []
    separators = step_format.separators(steps)
    for i, step in enumerate(steps):
        ids += tokenizer.encode(step)
        after = separators[i] if i < len(steps) - 1 else ("" if step_format.ends(step) else step_format.continues)
        ids += tokenizer.encode(after) if after else [tokenizer.eos_id]
        positions.append(len(ids) - 1)
    if len(ids) > max_len:
        raise ValueError(f"prompt {prompt[:40]!r}... with {len(steps)} steps is {len(ids)} tokens, more than the "
                         f"reward model's max_seq_len={max_len}: shorten the solution or use a longer-context body")
    return ids, positions


# --------------------------------------------------------------------------------------
# The readouts and the loss
# --------------------------------------------------------------------------------------


def logits_at(model: RewardModel, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The head's logit at given positions: tokens (B, T) right padded, positions (B, S)
    with -1 for padding -> logits (B, S) (padding positions hold the logit of token 0;
    mask them). The same body and head as RewardModel's "last" readout, read at S places."""
    device = model_device(model)
    tokens, positions = tokens.to(device), positions.to(device)
    with autocast(model.body):
        h = model.body.hidden_states(tokens).float()  # (B, T, D); causal: right padding is never seen
    picked = h.gather(1, positions.clamp(min=0)[..., None].expand(-1, -1, h.shape[-1]))  # (B, S, D)
    return model.head(picked).squeeze(-1)  # (B, S)


def collate_positions(position_lists: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad per-row position lists to (B, S) with -1; return (positions, mask (B, S) bool)."""
    S = max((len(p) for p in position_lists), default=0)
    positions = torch.full((len(position_lists), max(S, 1)), -1, dtype=torch.long)
    for b, row in enumerate(position_lists):
        positions[b, : len(row)] = torch.tensor(row, dtype=torch.long)
    return positions, positions >= 0


def masked_bce(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits, mean over the unmasked entries. labels may be soft
    (Monte-Carlo fractions in [0, 1]). logits, labels, mask: (B, S)."""
    per_entry = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")  # (B, S), stable in the logit
    return (per_entry * mask).sum() / mask.sum().clamp(min=1)


# --------------------------------------------------------------------------------------
# Aggregation of step scores (pure functions)
# --------------------------------------------------------------------------------------


def _checked(scores: Sequence[float]) -> Sequence[float]:
    if len(scores) == 0:
        raise ValueError("no step scores to aggregate: a completion with no steps has no process score "
                         "(StepRewardScorer.score_outcomes scores it as one empty step)")
    return scores


def aggregate_min(scores: Sequence[float]) -> float:
    """The weakest step: a solution is as good as its worst step."""
    return float(min(_checked(scores)))


def aggregate_product(scores: Sequence[float]) -> float:
    """The chance that every step is right if the step scores were independent; falls with
    the number of steps, so it prefers short solutions."""
    return float(math.prod(_checked(scores)))


def aggregate_last(scores: Sequence[float]) -> float:
    """The last step's score alone."""
    return float(_checked(scores)[-1])


AGGREGATIONS = {"min": aggregate_min, "product": aggregate_product, "last": aggregate_last}


# --------------------------------------------------------------------------------------
# Training data, and the loss the one Trainer minimises (roles/trainer.py::step)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    """One labelled solution, TRL's stepwise-supervision row plus the outcome."""

    prompt: str
    steps: list[str]
    labels: list[float]  # one per step, 0/1 (or a Monte-Carlo fraction)
    outcome: float  # the verifier's reward of the whole completion, 0/1: the ORM's label


@dataclass(frozen=True)
class StepBatch:
    """Labelled solutions as an ORM or PRM reads them: each row's token ids, the positions
    its head reads (each step's separator for a PRM, the <eos> for an ORM) and the label
    at each. Ids, not a padded tensor: each micro-batch is padded to its own longest row."""

    ids: list[list[int]]
    positions: list[list[int]]
    labels: list[list[float]]  # one per position: 0/1, or a Monte-Carlo fraction
    pad_id: int

    @property
    def batch_size(self) -> int:  # solutions: what the trainer's micro_batch_size counts
        return len(self.ids)


def step_batches(records: Sequence[StepRecord], tokenizer: Tokenizer, kind: str, step_format: StepFormat,
                 max_len: int, batch_size: int, seed: int) -> Iterator[StepBatch]:
    """Batch after batch of `batch_size` records (shuffled_batches, as the Bradley–Terry
    model's), each encoded once: a PRM reads every step's label at its separator, an ORM the
    outcome at the <eos> (RewardModel's "last" readout)."""
    if kind == "prm":
        encoded = [encode_steps(tokenizer, r.prompt, r.steps, step_format, max_len) for r in records]
        targets = [list(map(float, r.labels)) for r in records]
    else:
        encoded = []
        for r in records:
            ids, _ = encode_for_reward(tokenizer, r.prompt, step_format.join(r.steps), max_len)
            encoded.append((ids, [len(ids) - 1]))
        targets = [[float(r.outcome)] for r in records]
    for idx in shuffled_batches(len(records), batch_size, seed):
        yield StepBatch([encoded[i][0] for i in idx], [encoded[i][1] for i in idx], [targets[i] for i in idx],
                        tokenizer.pad_id)


class StepBCELoss:
    """masked_bce of the head's logits at a StepBatch's positions against their labels, as
    the one Trainer minimises it (algorithms/contract.py::ModelLoss). A mean over the
    labelled positions, so a micro-batch weighs by its share of them (a PRM's rows hold
    different numbers of steps). Metrics over the same positions: loss, accuracy, positive_rate."""

    def share(self, batch: StepBatch, rows: torch.Tensor) -> float:
        return sum(len(batch.positions[i]) for i in rows.tolist()) / sum(len(p) for p in batch.positions)

    def compute_loss(self, model: RewardModel, batch: StepBatch,
                     rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        idx = rows.tolist()
        tokens, _ = collate_texts([batch.ids[i] for i in idx], batch.pad_id)
        positions, mask = collate_positions([batch.positions[i] for i in idx])  # (b, S) each
        labels = torch.zeros(mask.shape, device="cpu")  # (b, S), 0 where mask is False
        for b, i in enumerate(idx):
            labels[b, : len(batch.labels[i])] = torch.tensor(batch.labels[i], device="cpu")
        logits = logits_at(model, tokens, positions)  # (b, S)
        labels, mask = labels.to(logits.device), mask.to(logits.device)
        loss = masked_bce(logits, labels, mask.float())
        hit = ((logits > 0).float() == (labels > 0.5).float()).float()  # (b, S)
        return loss, {"loss": loss.item(), "accuracy": ((hit * mask).sum() / mask.sum()).item(),
                      "positive_rate": ((labels > 0.5).float() * mask).sum().item() / mask.sum().item()}


def train_step_reward_model(
    model: RewardModel,
    tokenizer: Tokenizer,
    records: Sequence[StepRecord],
    kind: str = "prm",
    step_format: str = "arithmetic",
    steps: int = 300,
    lr: float = 3e-4,
    batch_size: int = 32,
    seed: int = 0,
    on_step: Callable[[int, dict], None] = quiet,
    micro_batch_size: int = 0,
    warmup_steps: int = 0,
    grad_clip: float = 0.0,
) -> list[dict[str, float]]:
    """Fit `model` in place with BCE: on step labels at each step's separator (prm) or on
    the outcome at the <eos> (orm), through the one Trainer (reward_model_trainer: its
    micro_batch_size, warmup_steps and grad_clip; the defaults train as this model always
    has). Returns metrics per step: loss, accuracy (thresholded at 0.5, on the batch's
    labelled entries), positive_rate, grad_norm, lr, seconds; `on_step(step, metrics)` is
    called after each step (progress display).

    The default lr suits a small body copied from an SFT policy; `posttrain prm` measured
    its own setting on arithmetic (config/commands.PrmConfig.lr, docs/guides/search.md, "Process reward
    models"). A large pretrained body wants ~1e-5, as the Bradley–Terry model does."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; choose one of {KINDS} (orm: one score per completion, prm: one per step)")
    usable = [r for r in records if r.steps]
    if not usable:
        raise ValueError(f"none of the {len(records)} records has a step: nothing to train on")
    batches = step_batches(usable, tokenizer, kind, get_step_format(step_format), model.config.max_seq_len,
                           batch_size, seed)
    torch.manual_seed(seed)
    trainer = reward_model_trainer(model, lr, steps, micro_batch_size, warmup_steps, grad_clip)
    history = trainer.fit(batches, StepBCELoss(), steps, on_step)
    model.eval()
    return history


# --------------------------------------------------------------------------------------
# The scoring API the search jobs use
# --------------------------------------------------------------------------------------


class StepRewardScorer:
    """Probabilities from a trained ORM or PRM, batched: every call is one forward pass per
    `batch_size` rows, never one completion at a time.

        score_steps(prompts, steps)          PRM: one probability per step of each row
        score_outcomes(prompts, completions) ORM: σ(logit at <eos>); PRM: the completion split
                                             into steps, scored, and aggregated (min by default)
    """

    def __init__(self, model: RewardModel, tokenizer: Tokenizer, kind: str, step_format: str = "arithmetic",
                 aggregation: str = "min", batch_size: int = 64) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}; choose one of {KINDS}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation={aggregation!r}; choose one of {list(AGGREGATIONS)}")
        if model.pooling != "last":
            raise ValueError(f"a step reward model reads hidden states at positions (pooling 'last'), got pooling="
                             f"{model.pooling!r}: build it as RewardModel(body) or RewardModel.from_policy(policy)")
        self.model = model.eval().requires_grad_(False)
        self.tokenizer, self.kind, self.format = tokenizer, kind, get_step_format(step_format)
        self.aggregation, self.batch_size = aggregation, batch_size

    @torch.no_grad()
    def score_steps(self, prompts: Sequence[str], steps: Sequence[Sequence[str]]) -> list[list[float]]:
        if self.kind != "prm":
            raise ValueError("an outcome reward model scores whole completions, not steps: call score_outcomes, "
                             "or train a PRM (kind='prm')")
        if len(prompts) != len(steps):
            raise ValueError(f"got {len(prompts)} prompts but {len(steps)} step lists: give one list per prompt")
        max_len = self.model.config.max_seq_len
        out: list[list[float]] = []
        for first in range(0, len(prompts), self.batch_size):
            rows = [encode_steps(self.tokenizer, p, s, self.format, max_len)
                    for p, s in zip(prompts[first : first + self.batch_size], steps[first : first + self.batch_size])]
            tokens, _ = collate_texts([ids for ids, _ in rows], self.tokenizer.pad_id)
            positions, _ = collate_positions([pos for _, pos in rows])
            probs = torch.sigmoid(logits_at(self.model, tokens, positions)).cpu()  # (B, S)
            out += [probs[b, : len(pos)].tolist() for b, (_, pos) in enumerate(rows)]
        return out

    @torch.no_grad()
    def score_outcomes(self, prompts: Sequence[str], completions: Sequence[str]) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions: give one each")
        if self.kind == "prm":
            # a completion with no step (empty text) is scored as one empty step: read right after the prompt
            step_lists = [self.format.split(c) or [""] for c in completions]
            aggregate = AGGREGATIONS[self.aggregation]
            return [aggregate(scores) for scores in self.score_steps(prompts, step_lists)]
        max_len = self.model.config.max_seq_len
        out: list[float] = []
        for first in range(0, len(prompts), self.batch_size):
            ids = [encode_for_reward(self.tokenizer, p, c, max_len)[0]
                   for p, c in zip(prompts[first : first + self.batch_size],
                                   completions[first : first + self.batch_size])]
            tokens, lengths = collate_texts(ids, self.tokenizer.pad_id)
            out += torch.sigmoid(self.model(tokens, lengths)).cpu().tolist()  # the "last" readout: the <eos>
        return out


# --------------------------------------------------------------------------------------
# Saving and loading (plumbing): the reward model's own format, with the kind recorded
# --------------------------------------------------------------------------------------


def save_step_reward_model(model: RewardModel, directory: str | Path, tokenizer: Tokenizer, kind: str,
                           step_format: str, info: dict | None = None) -> Path:
    """save_reward_model's directory (body, head, tokenizer) with `kind` and `step_format`
    in its info, so load_step_scorer rebuilds the scorer as it was trained."""
    return save_reward_model(model, directory, tokenizer, {**(info or {}), "kind": kind, "step_format": step_format})


def load_step_scorer(directory: str | Path, aggregation: str = "min", batch_size: int = 64) -> StepRewardScorer:
    """A StepRewardScorer from a directory save_step_reward_model wrote, with the tokenizer
    saved beside the body."""
    model, info = load_reward_model(directory)
    if info.get("kind") not in KINDS:
        raise ValueError(f"{str(directory)!r} holds a reward model with no ORM/PRM kind (a Bradley–Terry reward "
                         "model?): load it with rewards.reward_model.load_reward_model")
    return StepRewardScorer(model, load_tokenizer(directory), info["kind"], info.get("step_format", "arithmetic"),
                            aggregation, batch_size)
