"""The data that flows between the six roles.

    Example      one task instance: a prompt and the answer a verifier checks against.
    PreferencePair, UnpairedExample
                 what the DPO family and reward models learn from: chosen over rejected,
                 or one response with a thumbs up or down (KTO).
    Episode      one sampled completion of one Example, ragged (no padding), as the
                 rollout role produced it and the environment scored it.
    Turn         one segment of a multi-turn Episode: tokens the model sampled, or tokens
                 the environment appended (tool output) that the policy must never train on.
    TurnResult   a multi-turn environment's answer to one model turn.
    RolloutBatch many Episodes collated into padded (B, T) tensors for the trainer.

and the two collaborators every band names, declared as structural protocols (any class
with these members fits; none needs to inherit from them):

    Environment  a task: prompts (`sample`, `fixed_set`), a reference answer (`solution`)
                 and its verifier (`score`). envs/ holds the shipped ones.
    Tokenizer    text to token ids and back, with the special ids the sampler needs and the
                 layout a prompt is sampled from (`prompt_ids`):
                 models/tokenizer.py::CharTokenizer, models/hf.py::HFTokenizer.

Layout of a RolloutBatch row (right-padded, one row per episode):

    tokens          [ p0 p1 p2 p3 | r0 r1 r2 EOS | pad pad ]
    attention_mask  [  1  1  1  1 |  1  1  1   1 |   0   0 ]
    response_mask   [  0  0  0  0 |  1  1  1   1 |   0   0 ]
    old_logp        [  0  0  0  0 |  l  l  l   l |   0   0 ]

Every per-token tensor is aligned with `tokens`: `old_logp[b, t]` is
log π_old(tokens[b, t] | tokens[b, :t]). The EOS a model sampled is an action like any
other, so it sits inside the response mask. Right padding means a real token only ever
attends to real tokens under the causal mask, so the trainer's forward pass needs no
padding mask at all.

A multi-turn episode's response is its turns, in order; the environment's tokens (tool
output, tokenised once) stay in `tokens` for the model to read but are not actions:

    tokens          [ p0 p1 p2 | m0 m1 | o0 o1 o2 | m2 EOS | pad ]
    response_mask   [  0  0  0 |  1  1 |  0  0  0 |  1   1 |   0 ]
    old_logp        [  0  0  0 |  l  l |  0  0  0 |  l   l |   0 ]

Under the keep_last / drop thinking policies a later model turn was sampled in a context
without the earlier turns' thinking (`Turn.context_ids`), so the episode becomes one row per
model turn (`Episode.training_rows`), each the ids that turn read followed by the ids it
drew, and `row_weights` makes the group statistics count the episode once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

import torch

# meta key of an Example whose prompt is a conversation (a list of {"role", "content"} turns):
# an instruct model's chat template renders the turns, and Example.prompt holds their plain
# text (envs/problem_rows.py)
PROMPT_MESSAGES = "prompt_messages"


@dataclass(frozen=True)
class Example:
    """One task instance. `expected_answer` is what the verifier compares against; the
    scorer never computes it from the prompt."""

    prompt: str
    expected_answer: str
    id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PreferencePair:
    """`chosen` is preferred over `rejected` as a response to `prompt`. The scores, when
    the ranker gave numbers (a verifier's rewards, a reward model's or a judge's scores,
    UltraFeedback's `score_chosen` / `score_rejected` columns), are kept beside the texts:
    DPO's gap weighting reads score_chosen − score_rejected (None: an unscored pair)."""

    prompt: str
    chosen: str
    rejected: str
    meta: dict[str, Any] = field(default_factory=dict)
    score_chosen: float | None = None
    score_rejected: float | None = None


@dataclass(frozen=True)
class UnpairedExample:
    """One response with a binary label: desirable (thumbs up) or not (KTO's data)."""

    prompt: str
    completion: str
    desirable: bool
    meta: dict[str, Any] = field(default_factory=dict)


# who produced the tokens of a Turn
MODEL_TURN, ENVIRONMENT_TURN = "model", "environment"


@dataclass
class Turn:
    """One segment of a multi-turn trajectory, token-in/token-out: a model turn holds the ids
    the sampler drew (never re-tokenised from its text) with their log π_old; an environment
    turn holds the ids of a tool's output (or any observation), tokenised once and appended."""

    source: str  # MODEL_TURN (trained) or ENVIRONMENT_TURN (state, not action: response_mask 0)
    token_ids: list[int]
    logp: list[float] | None = None  # model turns: log π_old of each token; None for environment turns
    text: str = ""  # the decoded text, for parsing and for reading samples.jsonl
    # a model turn sampled in a context that is NOT the trajectory so far (the prompt and every
    # earlier turn as drawn): under the keep_last / drop thinking policies earlier turns lose
    # their <think> tokens before the next one is sampled (roles/thinking.py). These are the ids
    # the model read, prompt included; None: the trajectory so far, the default (keep_all)
    context_ids: list[int] | None = None


@dataclass
class TurnResult:
    """What a multi-turn environment answers to one model turn (roles/environment.py)."""

    observation: str = ""  # appended to the trajectory as an environment turn; "" appends nothing
    done: bool = False  # the episode ends here
    reward: float | None = None  # the episode's reward, given when done
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """One completion of one prompt, exactly as sampled (no padding anywhere)."""

    example: Example
    group_id: int  # index of the prompt within its step: the K samples of a prompt share it
    prompt_ids: list[int]
    response_ids: list[int]  # includes the stop token (EOS) when the model emitted one
    response_logp: list[float]  # log π_old of each response token, captured while sampling
    completion: str = ""  # decoded response text, stop token removed
    reward: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    weight_version: int = 0  # which weights sampled it (roles/weight_sync.py); under partial rollouts, its first token
    finished: bool = True  # False when max_new_tokens cut it off before a stop token
    # log π_ref of each response token, kept when the reference never changes (preference pairs)
    ref_logp: list[float] | None = None
    # a multi-turn episode: its turns in order; response_ids is their concatenation, and only
    # the MODEL_TURN tokens are in the response mask (None: one model turn, the whole response)
    turns: list[Turn] | None = None
    # a training row cut from a multi-turn episode (`training_rows`): how many rows that episode
    # became; the group statistics count each row 1 / episode_rows, so each episode once
    episode_rows: int = 1
    token_versions: list[int] | None = None  # partial rollouts: each response token's weight version

    def training_rows(self) -> list[Episode]:
        """The rows the trainer sees for this episode: the episode itself, unless a model
        turn was sampled in a context other than the trajectory before it (`Turn.context_ids`:
        thinking dropped from earlier turns). Then no single sequence holds every model turn
        in the context it was sampled in, and each model turn becomes its own row,
        `context_ids + the turn's ids`, sharing the episode's reward and group. The
        environment's tokens are in the contexts only: never trained on either way."""
        model_turns = [turn for turn in self.turns or [] if turn.source == MODEL_TURN]
        if not any(turn.context_ids is not None for turn in model_turns):
            return [self]
        rows, context = [], list(self.prompt_ids)
        for turn in self.turns or []:
            if turn.source == MODEL_TURN:
                row_context = context if turn.context_ids is None else turn.context_ids
                rows.append(replace(self, prompt_ids=list(row_context), response_ids=list(turn.token_ids),
                                    response_logp=list(turn.logp or [0.0] * len(turn.token_ids)), turns=None,
                                    completion=turn.text, ref_logp=None, episode_rows=len(model_turns)))
            context += turn.token_ids
        return rows

    @property
    def observed(self) -> bool:
        """Whether the environment answered this episode at least once (a tool environment:
        the model called a tool); False for a single-turn episode."""
        return any(turn.source != MODEL_TURN for turn in self.turns or [])


PER_TERM_FIELDS = ("reward_terms", "reward_term_weights")  # a RolloutBatch's (B, K): a column per term, not token


@dataclass
class RolloutBatch:
    """Padded tensors for B episodes. Optional fields are filled in by later roles:
    the reference role sets `ref_logp`, the algorithm sets `advantages` (and `returns`,
    `values` for PPO)."""

    tokens: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) float, 1 on prompt and response tokens
    response_mask: torch.Tensor  # (B, T) float, 1 on tokens the policy generated
    old_logp: torch.Tensor  # (B, T) float, log π_old(token | prefix); 0 off the response
    rewards: torch.Tensor  # (B,) float, one scalar reward per episode
    group_ids: torch.Tensor  # (B,) long, which prompt each row answers
    temperature: float = 1.0  # the logits are divided by this before every log-prob
    ref_logp: torch.Tensor | None = None  # (B, T) float, log π_ref(token | prefix)
    advantages: torch.Tensor | None = None  # (B, T) float, per-token advantage
    returns: torch.Tensor | None = None  # (B, T) float, value targets (PPO)
    values: torch.Tensor | None = None  # (B, T) float, V(prefix) at sampling time (PPO)
    process_rewards: torch.Tensor | None = None  # (B, T) float, per-token rewards of an implicit PRM (PRIME)
    # a frozen teacher's scores of the same tokens (roles/teacher.py; on-policy distillation, OPD):
    teacher_logp: torch.Tensor | None = None  # (B, T) float, log π_teacher(token | prefix); 0 off the response
    teacher_topk_logp: torch.Tensor | None = None  # (B, T, k) float, the teacher's k likeliest next tokens' log-probs
    teacher_topk_ids: torch.Tensor | None = None  # (B, T, k) long, which tokens those are; 0 off the response
    # (B,) bool, False on rows the update may leave out (Algorithm.rows_with_gradient); None = train all
    rows_with_gradient: torch.Tensor | None = None
    # (B,) float, 1 / the rows its episode became (Episode.training_rows): the weight a group
    # statistic gives the row, so an episode cut into one row per model turn counts once. None: 1
    row_weights: torch.Tensor | None = None
    # (B,) bool, rows the budget cut off before a stop token (not Episode.finished): overlong filtering drops them
    truncated: torch.Tensor | None = None
    # (B,) float, a preference row's pair weight in the loss (DPO's gap weighting: a function
    # of its pair's score gap, mean 1 over the step's pairs; both rows of a pair hold it). None: 1
    pair_weights: torch.Tensor | None = None
    # (B, K) float, each reward term's raw value per row and its weight this step (stack.py::term_table),
    # for GDPO's per-term normalisation (rl.reward.normalize per_term). None: the summed reward only
    reward_terms: torch.Tensor | None = None
    reward_term_weights: torch.Tensor | None = None
    episodes: list[Episode] = field(default_factory=list)  # the B source episodes, in order

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(dim=1)  # (B,)

    def select(self, rows: torch.Tensor | list[int]) -> RolloutBatch:
        """The sub-batch of the given rows (for minibatches and dynamic sampling)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.tokens.device)
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                picked[f.name] = value[rows]
            elif f.name == "episodes" and value:
                picked[f.name] = [value[i] for i in rows.tolist()]
        return replace(self, **picked)

    def without_trailing_padding(self) -> RolloutBatch:
        """The batch cut after its longest row. Rows are right-padded and attention is causal,
        so no real token reads a column past its row's end: a sub-batch of short rows (a
        micro-batch, the rows left after skipping) need not run the longest row's padding."""
        width = int(self.attention_mask.sum(dim=1).max().item())
        if width == self.tokens.shape[1]:
            return self
        per_token = {f.name: getattr(self, f.name) for f in fields(self)}
        cut: dict[str, Any] = {name: value[:, :width] for name, value in per_token.items()  # (B, T) and (B, T, k)
                               if isinstance(value, torch.Tensor) and value.dim() >= 2 and name not in PER_TERM_FIELDS}
        return replace(self, **cut)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor on `device` (the policy's: models/device.py)."""
        if self.tokens.device == torch.device(device):
            return self
        return replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                if isinstance(getattr(self, f.name), torch.Tensor)})

    @staticmethod
    def collate(episodes: list[Episode], pad_id: int, temperature: float = 1.0) -> RolloutBatch:
        """Right-pad `prompt + response` of each episode into one (B, T) batch; `ref_logp`
        too when every episode carries its cached reference log-probs. A multi-turn episode
        (`turns`) gets response_mask 1 on its MODEL_TURN tokens only (`model_token_mask`)."""
        if not episodes:
            raise ValueError("cannot collate an empty list of episodes")
        B = len(episodes)
        T = max(len(e.prompt_ids) + len(e.response_ids) for e in episodes)
        # assembled on the CPU from Python lists, whatever the policy's device: a row-by-row write
        # into a GPU tensor would be one host-to-device copy per row; `.to(device)` moves it once
        cpu = torch.device("cpu")
        tokens = torch.full((B, T), pad_id, dtype=torch.long, device=cpu)
        attention_mask = torch.zeros(B, T, device=cpu)
        response_mask = torch.zeros(B, T, device=cpu)
        old_logp = torch.zeros(B, T, device=cpu)
        cached_ref = all(e.ref_logp is not None for e in episodes)
        ref_logp = torch.zeros(B, T, device=cpu) if cached_ref else None
        for b, e in enumerate(episodes):
            P, R = len(e.prompt_ids), len(e.response_ids)
            tokens[b, : P + R] = torch.tensor(e.prompt_ids + e.response_ids, dtype=torch.long, device=cpu)
            attention_mask[b, : P + R] = 1.0
            # only the model's own tokens are actions; tool output is state, like the prompt
            response_mask[b, P : P + R] = 1.0 if e.turns is None else torch.tensor(model_token_mask(e), device=cpu)
            old_logp[b, P : P + R] = torch.tensor(e.response_logp, dtype=torch.float32, device=cpu)
            old_logp[b] *= response_mask[b]  # 0 off the model's tokens, whatever an episode put there
            if ref_logp is not None:  # every episode carries its cached reference log-probs
                ref_logp[b, P : P + R] = torch.tensor(e.ref_logp, dtype=torch.float32, device=cpu)
        return RolloutBatch(
            tokens=tokens,
            attention_mask=attention_mask,
            response_mask=response_mask,
            old_logp=old_logp,
            rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=cpu),
            group_ids=torch.tensor([e.group_id for e in episodes], dtype=torch.long, device=cpu),
            temperature=temperature,
            ref_logp=ref_logp,
            row_weights=(torch.tensor([1.0 / e.episode_rows for e in episodes], device=cpu)
                         if any(e.episode_rows != 1 for e in episodes) else None),
            truncated=torch.tensor([not e.finished for e in episodes], dtype=torch.bool, device=cpu),
            episodes=list(episodes),
        )


def model_token_mask(episode: Episode) -> list[float]:
    """1.0 on each response token a MODEL_TURN sampled, 0.0 on environment tokens, for a
    multi-turn episode; ValueError when its response is not exactly its turns, in order
    (then the mask would fall on the wrong tokens and train on tool output)."""
    turns = episode.turns or []
    joined = [i for turn in turns for i in turn.token_ids]
    if joined != episode.response_ids:
        raise ValueError(
            f"episode {episode.example.id or episode.example.prompt[:40]!r}: response_ids ({len(episode.response_ids)} "
            f"tokens) is not the concatenation of its {len(turns)} turns' token_ids ({len(joined)} tokens), so the "
            "response mask cannot tell model tokens from environment tokens: build response_ids from the turns "
            "(roles/agent.py does), and never edit one without the other")
    if len(episode.response_logp) != len(episode.response_ids):
        raise ValueError(f"episode {episode.example.id or episode.example.prompt[:40]!r}: {len(episode.response_logp)} "
                         f"log-probs for {len(episode.response_ids)} response tokens: give one per token (0 on "
                         "environment tokens)")
    for turn in turns:
        if turn.source not in (MODEL_TURN, ENVIRONMENT_TURN):
            raise ValueError(f"a turn's source is {turn.source!r}: expected {MODEL_TURN!r} or {ENVIRONMENT_TURN!r}")
    return [1.0 if turn.source == MODEL_TURN else 0.0 for turn in turns for _ in turn.token_ids]


@dataclass
class PolicyOutputs:
    """What the trainer's forward pass hands to `algorithm.compute_loss`, aligned with
    `batch.tokens` exactly like `old_logp`."""

    logp: torch.Tensor  # (B, T) log π_θ(token | prefix), differentiable
    entropy: torch.Tensor  # (B, T) entropy of π_θ(· | prefix) at each position
    values: torch.Tensor | None = None  # (B, T) V_φ(prefix), only for algorithms with a critic
    # (B, T, k) log π_θ of the teacher's top-k tokens at each position, differentiable: only
    # when the batch carries batch.teacher_topk_ids (OPD's top-k forward KL)
    teacher_topk_logp: torch.Tensor | None = None


# ---- the collaborators every band names ----------------------------------------------------
# They live here, at the bottom of the house, so an environment, a sampler, a reward model and
# a job can all name them without importing the role that first used them.


class Environment(Protocol):
    """A task: a prompt distribution and how to score a completion (envs/ holds the shipped
    ones; roles/environment.py applies the verifier, and declares the multi-turn extension,
    MultiTurnEnvironment). `score` sees only text, so it cannot be backpropagated through:
    that is why RL needs a policy-gradient estimator at all."""

    @property
    def spec_version(self) -> str:
        """The scorer's name and version (recorded in meta.json: a reward is only comparable
        under the same spec)."""
        ...

    def sample(self, split: str, n: int, seed: int) -> list[Example]: ...

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]: ...

    def solution(self, example: Example) -> str: ...

    def score(self, example: Example, completion: str) -> dict[str, Any]: ...


class Tokenizer(Protocol):
    """What the library calls on a tokenizer. `encode` never adds special tokens: the caller
    decides where `bos_id` and `eos_id` go (the sampler stops on `eos_id`, SFT demonstrations
    end with it, `pad_id` fills the right of a RolloutBatch). The ids are read-only here, so a
    tokenizer may hold them as plain attributes or compute them."""

    @property
    def bos_id(self) -> int | None:
        """The id a raw prompt starts with; None for a model that has no <bos> (then a prompt
        starts with its first character)."""
        ...

    @property
    def eos_id(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    def __len__(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str: ...

    def prompt_ids(self, prompt: str, messages: list[dict[str, str]] | None = None) -> list[int]:
        """The tokens a prompt is sampled from (roles/engines/contract.py::encode_prompt): a
        model's own layout of it, special tokens included. `messages` are the prompt's turns
        when it is a conversation (PROMPT_MESSAGES), which a chat template renders; a
        tokenizer without one reads the plain text `prompt`, the same turns written out."""
        ...

    def save(self, directory: str | os.PathLike[str]) -> None: ...
