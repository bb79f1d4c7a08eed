"""A Bradley–Terry reward model: a learned scorer for preferences no rule can check.

The Bradley–Terry model (Bradley & Terry 1952) says a rater prefers y_c over y_r with
probability σ(r(x, y_c) − r(x, y_r)) for some scalar "strength" r. Fitting r by maximum
likelihood on preference pairs gives the pairwise ranking loss of RLHF reward models
(Stiennon et al. 2020; Ouyang et al. 2022, InstructGPT, Eq. 1):

    loss = −log σ( r(x, y_c) − r(x, y_r) − m )

with an optional per-pair margin m ≥ 0 (Llama 2, Touvron et al. 2023, Sec. 3.2.2: a larger
m for pairs the raters found clearly different). Only differences of r are ever observed,
so r is defined up to a constant; `train_reward_model` (rewards/reward_model_training.py,
with the one Trainer) centres it on the training data.

Architecture: a transformer body with its LM head unused, and a linear head reading the
hidden state of the *last real token* of `[bos] prompt completion [eos]`. Under causal
attention that is the one position that has seen the whole text; ending every sequence
on <eos> means the head always reads the same kind of position.

    tokens     [bos  R  e  v  :  \\n  T  h  e  ...  .  eos  pad pad]
    hidden     (B, T, D)                                ^ last real token: r = w · h + b

Two other readouts (`pooling`):
    "mean"     the head on the mean hidden state over all real tokens (= the mean of a
               per-token score w · h_t + b): every position speaks for itself
    "loglik"   r = a · (1/(L−1)) Σ_t log π_body(tok_t | tok_<t) + b over every real token after
               <bos>: the body's own LM head scores the text, and the head is the scalar
               pair (a, b), starting at a = 1, b = 0. SimPO's implicit reward (mean log-prob)
               trained as a Bradley–Terry model. Initialised from the SFT policy, it starts
               as "how likely the policy finds this text", which already ranks most pairs
               on a task where errors are unlikely tokens (one wrong sum in a chain)
Measured on the arithmetic task's pairs (`posttrain rlhf`): see RewardModelConfig.pooling.

The body can be any local transformers causal LM, loaded as an `HFPolicy` (models/hf.py):
`RewardModel.from_policy(HFPolicy.load(dir)[0])` reads its last hidden layer or its LM
head exactly as it reads gpt_mini's, and `save_reward_model` / `load_reward_model` keep
which kind it was. (transformers' own `AutoModelForSequenceClassification` with
num_labels=1 is the same "last" readout: it pools the last non-pad token.)

`RewardModelScorer` wraps a trained model in the verifier contract
`score(example, completion) -> {"reward", "details"}`, so PPO / GRPO can train against
it exactly as they train against `final_int` (and show reward hacking when they do).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from posttrain.models import load_checkpoint_model
from posttrain.models.device import autocast, model_device
from posttrain.models.logprobs import token_logp
from posttrain.models.policy import PolicyShape, SavablePolicy
from posttrain.models.tokenizer import CharTokenizer
from posttrain.types import Example, PreferencePair, Tokenizer

POOLINGS = ("last", "mean", "loglik")


class RewardModel(nn.Module):
    """r(x, y): a causal LM body (GPTMini, or a transformers model as an HFPolicy) and a
    scalar head on its `pooling` readout (module docstring). The body needs what the
    rollout already asks of a policy: `body(tokens)` logits, `body.hidden_states(tokens)`,
    and `body.config.dim` / `.max_seq_len`."""

    def __init__(self, body: SavablePolicy, pooling: str = "last") -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is invalid; allowed: {POOLINGS} (the last real token's hidden "
                             "state, the mean over all real tokens, or the body's mean token log-likelihood)")
        self.body = body
        self.pooling = pooling
        self.head = nn.Linear(1 if pooling == "loglik" else body.config.dim, 1)
        # Start at r = 0 for every input: the first loss is exactly log 2 and the first
        # gradients come from the data, not from a random initial ranking.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        if pooling == "loglik":
            # a = 0 would also zero the body's gradient (r = a · loglik); a = 1 starts r at
            # the body's own mean log-likelihood, whose ranking is the point of this readout
            nn.init.ones_(self.head.weight)

    @property
    def config(self) -> PolicyShape:  # the body's: GPTMiniConfig or HFPolicyConfig
        return self.body.config

    @property
    def compute_dtype(self) -> torch.dtype:  # the body's forward passes set the precision
        return self.body.compute_dtype

    @classmethod
    def from_policy(cls, policy: SavablePolicy, pooling: str = "last") -> RewardModel:
        """Start from a copy of a (SFT) policy, as InstructGPT does: the body already reads
        the task's text; only the head is new."""
        return cls(copy.deepcopy(policy), pooling)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) right padded, lengths (B,) real tokens per row -> rewards (B,)."""
        device = model_device(self)  # its body's: a reward model started from the policy lives where it does
        tokens, lengths = tokens.to(device), lengths.to(device)
        positions = torch.arange(tokens.shape[1], device=device)  # (T,)
        if self.pooling == "loglik":
            with autocast(self.body):  # the body's precision; token_logp reads the logits in float32
                logits = self.body(tokens).float()  # (B, T, V)
            logp = token_logp(logits, tokens)  # (B, T), t = log π(tok_t | tok_<t); t = 0 is 0
            scored = (positions < lengths[:, None]).to(logp.dtype)  # (B, T) the real tokens
            scored[:, 0] = 0.0  # but not <bos>: it is given, not predicted
            loglik = (logp * scored).sum(1) / scored.sum(1).clamp(min=1)  # (B,) mean over real tokens
            return self.head(loglik[:, None]).squeeze(-1)  # (B,) a · loglik + b
        with autocast(self.body):
            h = self.body.hidden_states(tokens).float()  # (B, T, D); right padding needs no mask
        if self.pooling == "mean":
            real = (positions < lengths[:, None]).to(h.dtype)  # (B, T) 1 on real tokens
            pooled = (h * real[..., None]).sum(1) / lengths[:, None].to(h.dtype)  # (B, D) padding never counts
        else:
            pooled = h[torch.arange(tokens.shape[0], device=device), lengths - 1]  # (B, D) the last real token
        return self.head(pooled).squeeze(-1)  # (B,)


def bt_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, margin: torch.Tensor | None = None) -> torch.Tensor:
    """Bradley–Terry negative log-likelihood, mean over pairs: −log σ(r_c − r_r − m).
    r_chosen, r_rejected (B,); margin (B,) or a float, or None for 0."""
    diff = r_chosen - r_rejected  # (B,)
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff).mean()  # logsigmoid: exact where σ underflows


# --------------------------------------------------------------------------------------
# Encoding text (plumbing)
# --------------------------------------------------------------------------------------


def encode_for_reward(tokenizer: Tokenizer, prompt: str, completion: str, max_len: int) -> tuple[list[int], bool]:
    """[bos] prompt completion [eos] ([bos] only if the tokenizer has one), cut to max_len
    tokens by dropping the end of the text (the <eos> is always kept). Returns (ids, truncated)."""
    ids = ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + tokenizer.encode(prompt + completion)
    truncated = len(ids) + 1 > max_len
    return ids[: max_len - 1] + [tokenizer.eos_id], truncated


def collate_texts(sequences: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into tokens (B, T) and lengths (B,)."""
    T = max(len(s) for s in sequences)
    # on the CPU, from the lists: RewardModel.forward moves them to the model's device once
    cpu = torch.device("cpu")
    tokens = torch.full((len(sequences), T), pad_id, dtype=torch.long, device=cpu)
    for b, s in enumerate(sequences):
        tokens[b, : len(s)] = torch.tensor(s, device=cpu)
    return tokens, torch.tensor([len(s) for s in sequences], device=cpu)


@torch.no_grad()
def reward_of(model: RewardModel, tokenizer: Tokenizer, prompts: Sequence[str], completions: Sequence[str],
              batch_size: int = 64) -> torch.Tensor:
    """r(x, y) for many (prompt, completion) texts, (N,)."""
    model.eval()
    out = []
    for start in range(0, len(prompts), batch_size):
        seqs = [encode_for_reward(tokenizer, p, c, model.config.max_seq_len)[0]
                for p, c in zip(prompts[start : start + batch_size], completions[start : start + batch_size])]
        out.append(model(*collate_texts(seqs, tokenizer.pad_id)))
    return torch.cat(out) if out else torch.zeros(0, device=model_device(model))


def pairwise_accuracy(model: RewardModel, pairs: Sequence[PreferencePair], tokenizer: Tokenizer | None = None) -> float:
    """Fraction of pairs with r(chosen) > r(rejected); a tie counts as half (a coin flip)."""
    tokenizer = tokenizer or CharTokenizer()
    prompts = [p.prompt for p in pairs]
    r_c = reward_of(model, tokenizer, prompts, [p.chosen for p in pairs])  # (B,)
    r_r = reward_of(model, tokenizer, prompts, [p.rejected for p in pairs])  # (B,)
    return ((r_c > r_r).float() + 0.5 * (r_c == r_r).float()).mean().item()


# --------------------------------------------------------------------------------------
# Saving and loading: a transformers-loadable body plus the head (plumbing)
# --------------------------------------------------------------------------------------

HEAD_FILE = "reward_head.pt"  # {"weight": (1, D) or (1, 1) for loglik, "bias": (1,), "pooling": one of POOLINGS}
INFO_FILE = "reward_model.json"  # how it was trained and how well it ranks held-out pairs; written last


def save_reward_model(model: RewardModel, directory: str | Path, tokenizer: Tokenizer | None = None,
                      info: dict | None = None) -> Path:
    """Write the body as a transformers checkpoint directory (its own save_pretrained, with
    the tokenizer), the head and `info` into `directory`, atomically: everything goes to a
    temporary directory that is renamed into place once complete, so a kill leaves no
    half-written model."""
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.body.save_pretrained(tmp, tokenizer)
    torch.save({"weight": model.head.weight.detach().cpu().clone(), "bias": model.head.bias.detach().cpu().clone(),
                "pooling": model.pooling}, tmp / HEAD_FILE)
    (tmp / INFO_FILE).write_text(json.dumps(info or {}, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    return directory


def check_reward_model_dir(directory: str | Path) -> None:
    """Raise ValueError saying what is missing unless `directory` holds a saved reward model."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"no such directory {str(directory)!r}; pass a directory written by save_reward_model "
                         "(posttrain rlhf writes runs/<id>/reward_model)")
    missing = [name for name in ("config.json", "model.safetensors", HEAD_FILE, INFO_FILE)
               if not (directory / name).is_file()]
    if missing:
        raise ValueError(f"{str(directory)!r} is not a reward model directory: missing {missing} "
                         "(a policy checkpoint has no reward head)")


def reward_model_info(directory: str | Path) -> dict:
    """The info dict saved with a reward model (how it was trained, what it is for), read
    without loading its weights."""
    check_reward_model_dir(directory)
    return json.loads((Path(directory) / INFO_FILE).read_text())


def load_reward_model(directory: str | Path) -> tuple[RewardModel, dict]:
    """(model in eval mode, the info dict saved with it). The body loads as what it was
    saved from: a GPTMini, or a transformers model (models.load_checkpoint_model)."""

    info = reward_model_info(directory)
    directory = Path(directory)
    head = torch.load(directory / HEAD_FILE, weights_only=True, map_location="cpu")  # a GPU-trained head too
    model = RewardModel(load_checkpoint_model(directory), head.get("pooling", "last"))  # older files: last
    with torch.no_grad():
        model.head.weight.copy_(head["weight"])
        model.head.bias.copy_(head["bias"])
    return model.eval(), info


# --------------------------------------------------------------------------------------
# The verifier contract
# --------------------------------------------------------------------------------------


class RewardModelScorer:
    """`score(example, completion) -> {"reward": float, "details": dict}` from a trained
    RewardModel: the same shape every verifier returns, so an RL run can use a learned
    reward wherever it would use a rule.

    Like the verifiers it is deterministic and total on strings: any `str` gets a finite
    score (characters outside the vocabulary are <unk>; text longer than the model's
    context is cut, and details["truncated"] says so). A non-str completion is a pipeline
    bug and raises TypeError. `details["source"]` marks the reward as learned: a proxy,
    which a policy can over-optimise (Gao et al. 2022), unlike a verifier's check.
    """

    spec_version = "reward_model/bt-v1"

    def __init__(self, model: RewardModel, tokenizer: Tokenizer | None = None) -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer: Tokenizer = tokenizer or CharTokenizer()
        # a policy repeats itself (an SFT policy samples the same completion over and over):
        # the score is a pure function of the text, so each distinct text is run once
        self._memo: dict[tuple[str, str], tuple[float, bool]] = {}

    @torch.no_grad()
    def score(self, example: Example, completion: str) -> dict[str, Any]:
        if not isinstance(completion, str):
            raise TypeError(
                f"completion must be a str (the decoded model output), got {type(completion).__name__}; "
                "decode the tokens first"
            )
        key = (example.prompt, completion)
        if key not in self._memo:
            if len(self._memo) >= 200_000:  # bound the memory of a long run
                self._memo.clear()
            ids, truncated = encode_for_reward(self.tokenizer, example.prompt, completion,
                                               self.model.config.max_seq_len)
            tokens, lengths = collate_texts([ids], self.tokenizer.pad_id)
            self._memo[key] = (float(self.model(tokens, lengths)[0]), truncated)
        reward, truncated = self._memo[key]
        return {
            "reward": reward,
            "details": {"source": "reward_model", "truncated": truncated, "spec_version": self.spec_version},
        }

    __call__ = score
