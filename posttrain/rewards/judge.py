"""LLM-as-judge with a soft label: a local model rates a completion on one criterion, read
from its next-token distribution in one forward pass, never from a sampled reply.

The judge is asked a fixed question (JUDGE_PROMPT, below: the criterion, the question, the
answer, and how to reply), and its turn is started for it with the scale's answer prefix
("Score: "), so the very next token is its verdict. Instead of sampling that token we read
the probabilities p(label) the judge puts on each label token (RLAIF's soft labels; Lee et
al. 2023, arXiv:2309.00267, Sec. 2.1):

    mass     = Σ_l p(l)                          how much of the judge's belief is an answer at all
    q(l)     = p(l) / mass                       the verdict, renormalised over the labels
    expected = Σ_l q(l) · value(l)               e.g. 3.6 on the 1..5 scale
    score    = (expected − min value) / (max value − min value)        in [0, 1]

Why soft: a sampled "4" throws away that the judge was torn between 3 and 5; the expectation
keeps it, is deterministic (one forward pass, no random draw) and moves smoothly as the
completion improves, which is what a policy gradient wants from a reward.

`mass` is reported in every judgement: a judge that puts 3% of its probability on the labels
did not understand the question (it wanted to write "The answer..."), and its expectation over
the remaining 3% is noise. Below `min_label_mass` the judgement is a failure, scored 0 with a
reason, as is a prompt too long for the judge, a completion that is not text, or a forward
pass that raises: a judge never crashes the reward and never pays for its own failure.

Any local model with the library's calling convention judges: a gpt_mini checkpoint
(character tokens: the digits scale), a transformers directory or "smollm2-135m"
(`Judge.load`), or the policy itself, which is Kimi K2's self-critique (the judge only
switches it to eval mode for the pass, and back).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.models.device import autocast, model_device
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.models.policy import Policy
from posttrain.rewards.rubric import Rubric, RubricCriterion, message
from posttrain.roles.engines.contract import encode_prompt
from posttrain.types import Example, Tokenizer
from posttrain.verifiers.contract import admit

# The fixed prompt, one per criterion through {criterion} and {description}. Changing a word
# changes the instrument: JUDGE_PROMPT_VERSION is in every judge rubric's spec (Judge.version).
JUDGE_PROMPT_VERSION = "judge-prompt-v1"
JUDGE_PROMPT = (
    "You are grading an answer on one criterion only.\n"
    "Criterion: {criterion}. {description}\n\n"
    "Question:\n{question}\n\n"
    "Answer:\n{completion}\n\n"
    "{instruction}\n"
)
# The compact prompt for a model that cannot read the one above: gpt_mini is a character-level
# model with 96 positions, trained on "Q: 7+5+9\n" + a chain, so its judge prompt is the
# question and the answer as it wrote them, then the scale's instruction ("Correct?"): about
# 60 characters on arithmetic. It follows no instruction by itself; judge demonstrations mixed
# into SFT teach it what the verdict means (data/judge_demos.py, the self-rewarding paper's
# "evaluation fine-tuning" data)
COMPACT_JUDGE_PROMPT_VERSION = "compact-judge-v1"
COMPACT_JUDGE_PROMPT = "{question}{completion}\n{instruction}"
JUDGE_PROMPTS = {JUDGE_PROMPT_VERSION: JUDGE_PROMPT, COMPACT_JUDGE_PROMPT_VERSION: COMPACT_JUDGE_PROMPT}


@dataclass(frozen=True)
class LabelScale:
    """The labels the judge answers with (each must be ONE token of the judge's tokenizer),
    what each is worth, the instruction that ends the prompt, and the text that starts the
    judge's reply so that its next token is the label."""

    labels: tuple[str, ...]
    values: tuple[float, ...]
    instruction: str
    answer_prefix: str

    def __post_init__(self) -> None:
        if len(self.labels) < 2 or len(self.labels) != len(self.values) or len(set(self.values)) < 2:
            raise ValueError(f"a LabelScale needs at least 2 labels, one value each, not all equal; got labels "
                             f"{self.labels} and values {self.values}")


FIVE_POINT = LabelScale(("1", "2", "3", "4", "5"), (1.0, 2.0, 3.0, 4.0, 5.0),
                        "Reply with one digit from 1 (very poor) to 5 (excellent).", "Score: ")
# " Yes" with its space: after "Answer:" a BPE tokenizer writes the space into the word's token
YES_NO = LabelScale((" Yes", " No"), (1.0, 0.0), "Reply Yes or No.", "Answer:")
# the compact prompt's scale: one character each, so a character-level model has a one-token verdict
CORRECT_YN = LabelScale(("Y", "N"), (1.0, 0.0), "Correct?", " ")

# Kimi K2's production rubric (the spec's five criteria), each with the question the judge is asked
PRODUCTION_CRITERIA: dict[str, str] = {
    "Accuracy": "Is everything the answer states correct, its final answer included?",
    "Relevance": "Does the answer address the question that was asked, without drifting off topic?",
    "Completeness": "Does the answer cover every part of the question?",
    "Clarity": "Is the answer clearly written and easy to follow?",
    "Helpfulness": "Would the answer actually help the person who asked?",
}


@dataclass(frozen=True)
class Judgement:
    """One soft label. `score` in [0, 1] (0 on failure); `expected` on the scale's values
    (None on failure); `label_mass` the judge's probability on all labels together;
    `probs` each label's share of that mass."""

    score: float
    reason: str
    label_mass: float = 0.0
    expected: float | None = None
    probs: tuple[float, ...] = ()


class Judge:
    """A local model as a judge. `rate(criterion, description, examples, completions)` gives
    a Judgement per completion, `max_rows` judge prompts per forward pass."""

    max_rows = 8  # prompts per forward pass: each holds the whole question and answer, so keep batches small

    def __init__(self, model: Policy, tokenizer: Tokenizer, scale: LabelScale = FIVE_POINT,
                 min_label_mass: float = 0.25, source: str = "", prompt: str = JUDGE_PROMPT_VERSION) -> None:
        """`min_label_mass`: below it, most of the judge's probability is on tokens that are
        not a verdict at all, and the judgement is refused (score 0). 0.25 keeps a weak judge
        that still answers in the format (SmolLM2-135M puts 0.5–0.75 on the digits).
        `source` names the model in `version` (Judge.load sets it to the name it was given).
        `prompt`: a key of JUDGE_PROMPTS, the judge's question (the compact one for gpt_mini)."""
        if not 0.0 <= min_label_mass <= 1.0:
            raise ValueError(f"min_label_mass {min_label_mass!r} must be in [0, 1]")
        if prompt not in JUDGE_PROMPTS:
            raise ValueError(f"judge prompt {prompt!r} is unknown: expected one of {sorted(JUDGE_PROMPTS)}")
        self.model, self.tokenizer, self.scale, self.min_label_mass = model, tokenizer, scale, min_label_mass
        self.source, self.prompt = source or type(model).__name__, prompt
        self.label_ids = torch.tensor(label_ids(tokenizer, scale))  # (L,)
        self.values = torch.tensor(scale.values, dtype=torch.float32)  # (L,)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike, **kwargs: Any) -> Judge:
        """A judge from a gpt_mini checkpoint, a transformers model directory or a known name
        ("smollm2-135m"); offline, like every model in posttrain."""
        directory = resolve_model_dir(name_or_path)
        kwargs.setdefault("source", str(name_or_path))
        return cls(load_checkpoint_model(directory), load_tokenizer(directory), **kwargs)

    @property
    def version(self) -> str:
        """What scored, for a rubric's spec: the model, the prompt's version, the labels, the threshold."""
        labels = "/".join(label.strip() for label in self.scale.labels)
        return f"judge({self.source}, {self.prompt}, labels={labels}, min_mass={self.min_label_mass:g})"

    def prompt_ids(self, criterion: str, description: str, example: Example, completion: str) -> list[int]:
        """The judge's input (judge_prompt_ids, with this judge's prompt and scale)."""
        return judge_prompt_ids(self.tokenizer, self.scale, criterion, description, example, completion, self.prompt)

    def rate(self, criterion: str, description: str, examples: Sequence[Example],
             completions: Sequence[str]) -> list[Judgement]:
        """A Judgement per (example, completion); never raises on a row."""
        if len(examples) != len(completions):
            raise ValueError(f"{len(examples)} examples but {len(completions)} completions; give one example each")
        judgements: list[Judgement | None] = [None] * len(completions)
        rows: list[tuple[int, list[int]]] = []  # (index, prompt ids) of the rows the model judges
        limit = self.model.config.max_seq_len
        for i, (example, completion) in enumerate(zip(examples, completions)):
            checked, reason, error = admit(example, completion)
            if checked is None:
                judgements[i] = Judgement(0.0, f"{reason}: {error}")
                continue
            ids = self.prompt_ids(criterion, description, checked, completion)
            if len(ids) > limit:
                judgements[i] = Judgement(0.0, f"too_long: the judge prompt is {len(ids)} tokens, the judge model "
                                               f"holds {limit}; judge shorter completions or use a longer judge")
                continue
            rows.append((i, ids))
        for first in range(0, len(rows), self.max_rows):
            chunk = rows[first : first + self.max_rows]
            try:
                logp = self.next_token_logp([ids for _, ids in chunk])  # (n, V)
            except Exception as error:
                for i, _ in chunk:
                    judgements[i] = Judgement(0.0, f"judge_error: the forward pass raised {type(error).__name__}: "
                                                   f"{message(error)}")
                continue
            for (i, _), row in zip(chunk, logp):
                judgements[i] = self.soft_label(row)
        return judgements  # type: ignore[return-value]  # no None left: each row was refused or judged above

    @torch.no_grad()
    def next_token_logp(self, rows: list[list[int]]) -> torch.Tensor:
        """log p(next token) after each row (N, V), one forward pass for all rows. Rows are
        left-padded so that every row's last real token is the last column; position ids
        follow the real tokens (the models' default), so padding does not change a row's
        result beyond float rounding."""
        model = self.model
        device = model_device(model)
        N, T = len(rows), max(len(r) for r in rows)
        input_ids = torch.full((N, T), self.tokenizer.pad_id, dtype=torch.long)  # (N, T)
        attention_mask = torch.zeros(N, T)  # (N, T)
        for i, r in enumerate(rows):
            input_ids[i, T - len(r) :] = torch.tensor(r)
            attention_mask[i, T - len(r) :] = 1.0
        was_training = model.training  # the policy itself may be the judge (self-critique): restore its mode
        model.eval()
        try:
            with autocast(model):
                hidden = model.hidden_states(input_ids.to(device), attention_mask.to(device))  # (N, T, D)
                logits = model.lm_head(hidden[:, -1])  # (N, V): only the next token's are needed
        finally:
            model.train(was_training)
        return torch.log_softmax(logits.float().cpu(), dim=-1)  # (N, V), float32 whatever the model ran in

    def soft_label(self, logp: torch.Tensor) -> Judgement:
        """One row's log-probs (V,) -> the expected label value, normalised to [0, 1]."""
        p = logp[self.label_ids].exp()  # (L,)
        mass = float(p.sum())
        if not math.isfinite(mass):
            return Judgement(0.0, "judge_error: the judge's probabilities are not finite (NaN/inf logits)")
        labels = self.scale.labels
        if mass < self.min_label_mass or mass == 0.0:
            return Judgement(0.0, f"judge_unsure: only {mass:.1%} of the judge's next-token probability is on the "
                                  f"labels {labels} (min_label_mass={self.min_label_mass:g}): it did not answer in "
                                  "the format", label_mass=mass)
        q = p / mass  # (L,)
        expected = float((q * self.values).sum())
        low, high = float(self.values.min()), float(self.values.max())
        score = min(1.0, max(0.0, (expected - low) / (high - low)))
        shares = ", ".join(f"{label.strip()} {share:.2f}" for label, share in zip(labels, q.tolist()))
        return Judgement(score, f"expected {expected:.2f} ({shares}); {mass:.0%} of the probability on the labels",
                         label_mass=mass, expected=expected, probs=tuple(q.tolist()))

    def criterion(self, name: str, description: str, weight: float = 1.0) -> RubricCriterion:
        """A rubric criterion this judge scores, a batch at a time. The reason carries the
        label mass, so a rubric's details show when the judge did not understand."""

        def judged(examples: list[Example], completions: list[str]) -> list[tuple[float, str]]:
            return [(j.score, j.reason) for j in self.rate(name, description, examples, completions)]

        return RubricCriterion(name, weight, description, judged, batched=True)


def label_ids(tokenizer: Tokenizer, scale: LabelScale) -> list[int]:
    """The token id of each of the scale's labels; ValueError when a label is not exactly one
    token of `tokenizer`, or two labels share one (the judge's next token is read)."""
    ids = []
    for label in scale.labels:
        encoded = tokenizer.encode(label)
        if len(encoded) != 1:
            raise ValueError(f"the label {label!r} is {len(encoded)} tokens {encoded} for this judge's tokenizer; every "
                             "label must be one token (the judge's next token is read): pick a scale whose labels "
                             "are single tokens, e.g. FIVE_POINT's digits")
        ids += encoded
    if len(set(ids)) != len(ids):
        raise ValueError(f"labels {scale.labels} share tokens {ids}; each needs its own token")
    return ids


def judge_prompt_ids(tokenizer: Tokenizer, scale: LabelScale, criterion: str, description: str, example: Example,
                     completion: str, prompt: str = JUDGE_PROMPT_VERSION) -> list[int]:
    """A judge's input: the prompt JUDGE_PROMPTS[prompt] as the user's turn (in the chat
    template when the judge has one), then the answer prefix as the start of the judge's own
    turn, so that the next token is the verdict. A function of its arguments only, so that
    judge demonstrations (data/judge_demos.py) train on exactly the ids a Judge reads."""
    text = JUDGE_PROMPTS[prompt].format(criterion=criterion, description=description, question=example.prompt,
                                        completion=completion, instruction=scale.instruction)
    return encode_prompt(tokenizer, text) + (tokenizer.encode(scale.answer_prefix) if scale.answer_prefix else [])


def self_critique_rubric(judge: Judge, weights: dict[str, float] | None = None) -> Rubric:
    """The production rubric: Accuracy, Relevance, Completeness, Clarity, Helpfulness, each
    scored by `judge` with its question from PRODUCTION_CRITERIA. Equal weights unless
    `weights` says otherwise (a missing name keeps 1.0): the five are the spec's, their
    relative worth is a task's choice. Pass the policy as the judge for Kimi K2's self-critique."""
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(PRODUCTION_CRITERIA))
    if unknown:
        raise ValueError(f"weights for unknown criteria {unknown}; the production criteria are "
                         f"{list(PRODUCTION_CRITERIA)}")
    return Rubric([judge.criterion(name, question, weights.get(name, 1.0))
                   for name, question in PRODUCTION_CRITERIA.items()], name="self_critique", scored_by=judge.version)
